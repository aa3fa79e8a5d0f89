"""JSON files: atomic writes, readable layout, and clear errors on corrupt or truncated files."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from profiles.errors import CorruptProfileError


def dumps_readable(data: Any, indent: int = 1) -> str:
    """Like json.dumps(indent=...) but lists of scalars stay on one line (histograms, loads)."""

    def enc(node, level):
        pad = " " * (indent * level)
        inner = " " * (indent * (level + 1))
        if isinstance(node, dict):
            if not node:
                return "{}"
            items = [f"{inner}{json.dumps(str(k))}: {enc(v, level + 1)}" for k, v in node.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(node, (list, tuple)):
            if all(not isinstance(x, (dict, list, tuple)) for x in node):
                return json.dumps(list(node), allow_nan=False)
            return "[\n" + ",\n".join(inner + enc(x, level + 1) for x in node) + "\n" + pad + "]"
        return json.dumps(node, allow_nan=False)

    return enc(data, 0) + "\n"


def atomic_write_text(path: str, text: str) -> None:
    """Write to a temporary file in the same directory, fsync, then os.replace.

    Readers see either the old file or the new one, never a partial write
    (os.replace is atomic within a filesystem, hence the same directory).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str, what: str, fix: str) -> Any:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptProfileError(f"{what} {path} is not UTF-8 text (byte {e.start}): the file is corrupt. {fix}")
    if not text.strip():
        raise CorruptProfileError(f"{what} {path} is empty (an interrupted write?). {fix}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()):
            raise CorruptProfileError(
                f"{what} {path} is truncated: its JSON ends after {len(raw)} bytes in the middle of a value "
                f"({e.msg}). {fix}") from None
        raise CorruptProfileError(
            f"{what} {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}). {fix}") from None
