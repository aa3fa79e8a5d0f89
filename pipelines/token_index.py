"""TokenIndex: a vocabulary's token -> position lookup, its hash table built once and reused chunk after chunk.

`pyarrow.compute.index_in(tokens, value_set=vocabulary)` is the reference: it builds the vocabulary's
hash table on every call, 50-60 ms for 300 k tokens, where looking up a 32 k-row chunk takes about
1 ms. The optional native module (native/_token_index.c, built in place like the CSV scanner) keeps
the table; without it, or for tokens with nulls, the reference is used. tests/test_token_index.py
checks the two agree.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_native: Any = None
if os.environ.get("TPU_EMBED_NATIVE", "1") != "0":
    try:
        from pipelines import _token_index as _native
    except ImportError:  # pragma: no cover - a machine without a compiler
        pass


def _buffers(tokens: pa.Array):
    """(int64 offsets of the n tokens, data bytes) of a large_binary array, without copying."""
    _, off, data = tokens.buffers()
    offsets = np.frombuffer(off, np.int64, count=len(tokens) + 1, offset=8 * tokens.offset)
    return offsets, (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8))


def _large_binary(tokens: pa.Array) -> pa.Array:
    return tokens if tokens.type == pa.large_binary() else tokens.cast(pa.large_binary())


class TokenIndex:
    """Positions of tokens in `vocabulary` (distinct tokens; the first wins if not), -1 where absent."""

    def __init__(self, vocabulary: pa.Array):
        self.vocabulary = _large_binary(vocabulary)
        self._table = None
        if _native is not None and not self.vocabulary.null_count:
            n = len(self.vocabulary)
            slots = np.zeros(1 << max(4, (2 * n).bit_length()), np.int32)  # load factor <= 1/2
            hashes = np.empty(n, np.uint64)
            offsets, data = _buffers(self.vocabulary)
            _native.build(offsets, data, slots, hashes)
            self._table = (offsets, data, slots, hashes)

    def __len__(self) -> int:
        return len(self.vocabulary)

    def lookup(self, tokens: pa.Array) -> np.ndarray:
        """int64 positions of `tokens` (an Arrow binary or string array) in the vocabulary, -1 where absent."""
        if self._table is not None and not tokens.null_count:
            tokens = _large_binary(tokens)
            out = np.empty(len(tokens), np.int64)
            _native.lookup(*self._table, *_buffers(tokens), out)
            return out
        return reference_lookup(self.vocabulary, tokens)


def reference_lookup(vocabulary: pa.Array, tokens: pa.Array) -> np.ndarray:
    """The same with `pyarrow.compute.index_in` (a null token is absent)."""
    if not len(tokens):
        return np.zeros(0, np.int64)
    idx = pc.index_in(_large_binary(tokens), value_set=_large_binary(vocabulary))
    return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64)
