"""JSON files: atomic writes, readable layout, and clear errors on corrupt or truncated files; equality of plain
statistics as equality of their canonical JSON form.

Local paths and object stores (gs://...) alike: the bytes go through `tpu_embed.artifact.io`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from profiles.errors import CorruptProfileError
from tpu_embed.artifact import io as tio
from tpu_embed.core.canonical import canonical_json


class JsonEq:
    """Equal when their canonical JSON forms (`to_json`) are."""

    def to_json(self) -> dict:
        raise NotImplementedError

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return canonical_json(self.to_json()) == canonical_json(other.to_json())


# What json.dumps(x, allow_nan=False) writes, without the encoder json.dumps makes anew on every call that gives
# an argument (a profile's files are ~10,000 such calls).
_encode = json.JSONEncoder(allow_nan=False).encode


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
                return _encode(list(node))
            return "[\n" + ",\n".join(inner + enc(x, level + 1) for x in node) + "\n" + pad + "]"
        return _encode(node)

    return enc(data, 0) + "\n"


def atomic_write_text(path: str, text: str) -> tio.Written:
    """Write `text` (UTF-8) so that readers see either the old file or the new one, never a partial write.

    `tpu_embed.artifact.io.write_atomic`: locally a temporary file in the same directory, fsync, then os.replace;
    on an object store one upload (the object appears when it completes).
    """
    return tio.write_text_atomic(os.fspath(path), text)


def read_json(path: str, what: str, fix: str) -> Any:
    raw = tio.read_bytes(os.fspath(path))  # FileNotFoundError propagates
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptProfileError(
            f"{what} {path} is not UTF-8 text (byte {e.start}): the file is corrupt. {fix}") from None
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
