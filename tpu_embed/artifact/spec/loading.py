"""Loading a spec: a YAML file or an already-parsed mapping, validated into a `Spec`; a `SpecError` names the
file, and the line of the key where the file has it (YAML errors: line and column)."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

import yaml

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.spec.document import Spec
from tpu_embed.artifact.spec.spec_error import SpecError
from tpu_embed.artifact.spec.validation import validate


def load_spec(path: str) -> Spec:
    """Read and validate a YAML spec file. Relative input patterns resolve against its directory.

    Args:
      path: the spec file (local path or object-store URL).

    Returns:
      The validated `Spec`.

    Raises:
      SpecError: the file is missing, not valid YAML, or not a valid spec; the message names the
        key and the fix.
    """
    try:
        text = tio.read_text(path)
    except FileNotFoundError:
        raise SpecError(SpecError.FILE_KEY, "the spec file does not exist.", "pass the path of a YAML spec.",
                        where=path) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _yaml_error(path, e) from None
    where = path if tio.is_url(path) else os.path.abspath(path)
    try:
        return parse_spec(raw, base_dir=tio.dirname(where), source_path=where)
    except SpecError as e:
        line = _line_of(text, e.key)
        raise SpecError(e.key, e.problem, e.fix, where=path + (f", line {line}" if line else "")) from None


def _yaml_error(path: str, e: yaml.YAMLError) -> SpecError:
    """A YAML syntax error as one line naming the file, the line and column, and what the parser expected."""
    mark = getattr(e, "problem_mark", None)
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else path
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context, at = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and at is not None:
        problem += f" ({context} at line {at.line + 1}, column {at.column + 1})"
    return SpecError(SpecError.FILE_KEY, f"not valid YAML: {' '.join(problem.split())}.", "fix the YAML syntax there.",
                     where=where)


_KEY_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _line_of(text: str, key: str) -> Optional[int]:
    """The line (1-based) of spec key `key` (`categorical[3].vocabulary.top_k`) in the YAML `text`: of its deepest
    part the file has (a missing key: its section's), None if not even the first."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for name, index in _KEY_PART.findall(key):
        nxt = None
        if isinstance(node, yaml.MappingNode) and name:
            nxt = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == name), None)
        elif isinstance(node, yaml.SequenceNode) and index and int(index) < len(node.value):
            item = node.value[int(index)]
            nxt = (item, item)
        if nxt is None:
            break
        line, node = nxt[0].start_mark.line + 1, nxt[1]
    return line


def parse_spec(raw: Any, base_dir: str = ".", source_path: Optional[str] = None) -> Spec:
    """Validate a spec given as a dict (the parsed YAML).

    Args:
      raw: the spec as a mapping.
      base_dir: the directory relative input patterns resolve against.
      source_path: the file the spec came from, for messages.

    Returns:
      The validated `Spec`.

    Raises:
      SpecError: not a valid spec; the message names the key and the fix.
    """
    if not isinstance(raw, Mapping):
        raise SpecError("<root>", f"the spec must be a mapping, got {type(raw).__name__}.",
                        "see docs/reference/spec.md for the layout.")
    spec = validate(Spec, raw)
    spec._base_dir, spec._source_path = base_dir, source_path
    return spec
