"""Stable keys: sha256 over canonical JSON.

Python's `hash()` is salted per process and `repr()` of floats/dicts is not a
contract, so file names are derived from `json.dumps(..., sort_keys=True,
separators=(',', ':'))` of plain data, hashed with sha256.  A hex prefix of
KEY_HEX_CHARS characters (80 bits) keeps names short; collisions are caught
anyway because every file records the configuration it was hashed from and
`ProfileStore.read` re-derives the key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

KEY_HEX_CHARS = 20


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def stable_key(data: Any) -> str:
    return hashlib.sha256(canonical_json(data).encode("ascii")).hexdigest()[:KEY_HEX_CHARS]
