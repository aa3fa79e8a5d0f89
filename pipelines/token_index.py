"""TokenIndex: a vocabulary's token -> position lookup, its hash table built once and reused chunk after chunk.
TokenCounter: the counts of distinct tokens, added chunk after chunk, with the same hash table.

`pyarrow.compute.index_in(tokens, value_set=vocabulary)` is the reference: it builds the vocabulary's
hash table on every call, 50-60 ms for 300 k tokens, where looking up a 32 k-row chunk takes about
1 ms. The optional native module (native/_token_index.c, built in place like the CSV scanner) keeps
the table; without it, or for tokens with nulls, the reference is used. tests/pipelines/mapping/test_token_index.py
checks the two agree.

Counting has its reference in pyarrow too: `value_counts` per chunk, then `group_by(...).aggregate(sum)`
over the accumulated tables. Natively, one pass over a chunk's tokens adds them to one table of the
distinct tokens seen so far (first-seen order); at 2 M benchmark examples the pyarrow way spent about
4 s re-aggregating its tables.

`dictionary_encode`: a chunk's tokens as an Arrow DictionaryArray (each distinct token once, in first-seen
order, and an int32 code per value), natively with the same table, with `pyarrow.compute.dictionary_encode`
as the reference (the same array). The parser encodes each feature's tokens once; then counting, looking
up and hashing work on the distinct tokens (about an eighth of a 32 k-row Criteo chunk's tokens) and
the codes, and the read spill keeps the codes instead of the token bytes. `TokenCounter.add` and
`TokenIndex.lookup` take either form.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_native: Any = None
if os.environ.get("TPU_EMBED_NATIVE", "1") != "0":
    try:
        from pipelines import _token_index as _native  # type: ignore[attr-defined,no-redef]  # a C extension
    except ImportError:  # pragma: no cover - installed with TPU_EMBED_NATIVE=optional, the build failed
        pass


def _buffers(tokens: pa.Array):
    """(int64 offsets of the n tokens, data bytes) of a large_binary array, without copying."""
    _, off, data = tokens.buffers()
    offsets = np.frombuffer(off, np.int64, count=len(tokens) + 1, offset=8 * tokens.offset)
    return offsets, (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8))


def _large_binary(tokens: pa.Array) -> pa.Array:
    return tokens if tokens.type == pa.large_binary() else tokens.cast(pa.large_binary())


DICTIONARY_TYPE = pa.dictionary(pa.int32(), pa.large_binary())


def is_encoded(tokens: pa.Array) -> bool:
    return pa.types.is_dictionary(tokens.type)


def plain(tokens: pa.Array) -> pa.Array:
    """The tokens as large_binary (a dictionary-encoded array decoded)."""
    return _large_binary(tokens)


def dictionary_encode(tokens: pa.Array) -> pa.DictionaryArray:
    """`tokens` (binary or string, no nulls; or already encoded) as a DictionaryArray of type `DICTIONARY_TYPE`:
    the distinct tokens in first-seen order and each value's int32 position among them."""
    if is_encoded(tokens):
        return tokens if tokens.type == DICTIONARY_TYPE else _encoded(
            tokens.indices.cast(pa.int32()), _large_binary(tokens.dictionary))
    tokens = _large_binary(tokens)
    if tokens.null_count:
        raise ValueError("dictionary_encode: tokens must not be null (a null is no value: drop it first)")
    if _native is None:
        return reference_dictionary_encode(tokens)
    n = len(tokens)
    offsets, data = _buffers(tokens)
    nbytes = int(offsets[-1] - offsets[0]) if n else 0
    d_offsets = np.zeros(n + 1, np.int64)
    d_data = np.empty(max(nbytes, 1), np.uint8)
    state = np.zeros(2, np.int64)
    codes = np.empty(n, np.int32)
    added = _native.count(d_offsets, d_data, _slots(n), np.empty(n, np.int64), state, offsets, data,
                          np.zeros(0, np.int64), 0, codes)
    if added != n:  # the arrays hold n distinct tokens of all the bytes: cannot happen
        raise AssertionError(f"dictionary_encode: {added} of {n} tokens encoded")
    m, used = (int(x) for x in state)
    dictionary = pa.LargeBinaryArray.from_buffers(pa.large_binary(), m, [
        None, pa.py_buffer(d_offsets[:m + 1].copy()), pa.py_buffer(d_data[:used].copy())])
    return _encoded(pa.array(codes, pa.int32()), dictionary)


def _slots(n: int) -> np.ndarray:
    """A zeroed table for n tokens: a power of two above 2n of the native module's 16-byte slots (load factor
    <= 1/2; pipelines/native/token_table.h), one row each."""
    return np.zeros((1 << max(4, (2 * n).bit_length()), 2), np.uint64)


def _encoded(codes: pa.Array, dictionary: pa.Array) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(codes, dictionary)


def reference_dictionary_encode(tokens: pa.Array) -> pa.DictionaryArray:
    """The same with `pyarrow.compute.dictionary_encode` (first-seen order too)."""
    enc = pc.dictionary_encode(_large_binary(tokens))
    return _encoded(enc.indices.cast(pa.int32()), _large_binary(enc.dictionary))


def encoded_from_buffers(codes: np.ndarray, offsets: bytes, data: bytes) -> pa.DictionaryArray:
    """An encoded array (`DICTIONARY_TYPE`) from int32 codes and its dictionary's int64 offsets and bytes."""
    m = len(offsets) // 8 - 1
    dictionary = pa.Array.from_buffers(pa.large_binary(), m, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return _encoded(pa.array(codes, pa.int32()), dictionary)


def drop_empty(tokens: pa.DictionaryArray) -> Tuple[pa.DictionaryArray, Optional[np.ndarray]]:
    """(the encoded values other than the empty token, the mask of the values kept; None when none is empty).

    The same array as encoding the non-empty values alone: the empty token leaves the first-seen dictionary
    and the codes after it move down one. It looks at the dictionary (each token once) instead of at every
    value, which two Arrow passes per column did at about a third of the parse's time."""
    lengths = np.diff(_buffers(tokens.dictionary)[0])
    empty = np.flatnonzero(lengths == 0)
    if not empty.size:
        return tokens, None
    e = int(empty[0])
    codes = codes_of(tokens)
    keep = codes != e
    kept = codes[keep]
    kept = kept - (kept > e).astype(np.int32)
    d = tokens.dictionary
    dictionary = pa.concat_arrays([d.slice(0, e), d.slice(e + 1)])
    return _encoded(pa.array(kept, pa.int32()), dictionary), keep


def concat_encoded(parts: List[pa.Array]) -> pa.DictionaryArray:
    """Several arrays' values in order as one encoded array: their dictionaries one after the other (a token
    may then be in it more than once, which counting and lookups allow) and the codes shifted to match."""
    parts = [dictionary_encode(p) for p in parts]
    if len(parts) == 1:
        return parts[0]
    shift = np.cumsum([0] + [len(p.dictionary) for p in parts[:-1]])
    codes = np.concatenate([codes_of(p) + np.int32(s) for p, s in zip(parts, shift)]) if parts else \
        np.zeros(0, np.int32)
    dictionary = pa.concat_arrays([p.dictionary for p in parts]) if parts else pa.array([], pa.large_binary())
    return _encoded(pa.array(codes, pa.int32()), dictionary)


def distinct_and_codes(tokens: pa.Array) -> Tuple[pa.Array, Optional[np.ndarray]]:
    """(the tokens to compute on, the int32 codes that spread their results over the values, or None when
    `tokens` is not encoded: then the results are per value already)."""
    if is_encoded(tokens):
        return tokens.dictionary, codes_of(tokens)
    return tokens, None


def codes_of(tokens: pa.DictionaryArray) -> np.ndarray:
    """The int32 codes of an encoded array (no nulls), without a copy."""
    return tokens.indices.to_numpy(zero_copy_only=False)


def spread_ids(ids: np.ndarray, codes: Optional[np.ndarray], lengths: np.ndarray, found_limit: int
               ) -> Optional[Tuple[np.ndarray, np.ndarray, int]]:
    """Natively, in one pass without the GIL: (`ids[codes]` (codes None: `ids`, per value already), int32 per
    example of `lengths` the values whose id is outside [0, found_limit), how many there are); None without the
    native module or for codes other than int32 / int64. `pipelines.mapping.ids` holds the numpy rule."""
    if _native is None:
        return None
    ids = np.ascontiguousarray(ids, np.int64)
    if codes is None:
        codes = np.arange(ids.size, dtype=np.int64)
    if codes.dtype not in (np.int32, np.int64):
        return None
    codes = np.ascontiguousarray(codes)
    lengths = np.ascontiguousarray(lengths, np.int64)
    out, oov = np.empty(codes.size, np.int64), np.empty(lengths.size, np.int32)
    n_oov = _native.spread(ids, codes, codes.itemsize, lengths, int(found_limit), out, oov)
    return out, oov, int(n_oov)


def vocabulary_order(tokens: pa.Array, counts: np.ndarray) -> Optional[np.ndarray]:
    """Natively, without the GIL: the int64 positions of `tokens` (distinct, no nulls) by count descending, then
    bytes descending (a vocabulary's order; radix sorted, ~3x pyarrow's sort_indices on 400 k tokens); None
    without the native module. `pipelines.mapping.vocabulary.vocabulary_order` holds the readable rule (pyarrow's
    sort_indices, its fallback), which this is tested against."""
    if _native is None or tokens.null_count:
        return None
    offsets, data = _buffers(_large_binary(tokens))
    out = np.empty(len(tokens), np.int64)
    _native.order(offsets, data, np.ascontiguousarray(counts, np.int64), out)
    return out


class TokenIndex:
    """Positions of tokens in `vocabulary` (distinct tokens; the first wins if not), -1 where absent."""

    def __init__(self, vocabulary: pa.Array):
        self.vocabulary = _large_binary(vocabulary)
        self._table = None
        if _native is not None and not self.vocabulary.null_count:
            n = len(self.vocabulary)
            offsets, data = _buffers(self.vocabulary)
            slots = _slots(n)
            _native.build(offsets, data, slots)
            self._table = (offsets, data, slots)

    def __len__(self) -> int:
        return len(self.vocabulary)

    def lookup(self, tokens: pa.Array) -> np.ndarray:
        """int64 positions of `tokens` (an Arrow binary or string array, or one dictionary-encoded: then its
        distinct tokens are looked up) in the vocabulary, -1 where absent."""
        if is_encoded(tokens):
            return self.lookup(tokens.dictionary)[codes_of(tokens)]
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


_COMPACT_MIN_ROWS = 1 << 16  # the reference merges its tables once those added since hold this many rows


def _empty_counts() -> pa.Table:
    return pa.table({"token": pa.array([], pa.large_binary()), "count": pa.array([], pa.int64())})


def _table_of(tokens: pa.Array, counts: Optional[np.ndarray]) -> pa.Table:
    if counts is None:
        if not len(tokens):
            return _empty_counts()
        vc = pc.value_counts(tokens)
        return pa.table({"token": vc.field("values"), "count": vc.field("counts").cast(pa.int64())})
    return _sum_by_token(pa.table({"token": tokens, "count": pa.array(counts, pa.int64())}))


def _sum_by_token(t: pa.Table) -> pa.Table:
    t = t.group_by("token").aggregate([("count", "sum")])
    # group_by returns chunks that are slices of shared buffers, and pickling a slice writes the whole
    # buffer: one chunk keeps a pickled counter its own size.
    return pa.table({"token": t.column("token"), "count": t.column("count_sum")}).combine_chunks()


def reference_merge(tables: List[pa.Table]) -> pa.Table:
    """One Table(token, count) of the summed counts of (token, count) tables (pyarrow's group_by)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return _empty_counts()
    if len(tables) == 1:
        return tables[0]
    return _sum_by_token(pa.concat_tables(tables))


class TokenCounter:
    """How often each distinct token was added. Tokens are Arrow binary or string arrays; a null is no token.

    Picklable (its distinct tokens and counts only), so it can be a Beam CombineFn's accumulator.
    """

    def __init__(self):
        self._tables: Optional[List[pa.Table]] = None  # the reference (no native module)
        if _native is None:
            self._tables = []
            return
        self._state = np.zeros(2, np.int64)  # (distinct tokens, data bytes used)
        self._offsets = np.zeros(1025, np.int64)
        self._data = np.empty(1 << 14, np.uint8)
        self._counts = np.zeros(1024, np.int64)
        self._slots: Optional[np.ndarray] = _slots(1023)

    def __len__(self) -> int:
        if self._tables is not None:
            self._tables[:] = [reference_merge(self._tables)]
            return self._tables[0].num_rows
        return int(self._state[0])

    def add(self, tokens: pa.Array, counts: Optional[np.ndarray] = None) -> "TokenCounter":
        """Adds each token once, or counts[i] times (int64, one per token). A dictionary-encoded array adds
        its distinct tokens that occur, each with how often it does."""
        if is_encoded(tokens) and counts is None and not tokens.null_count:
            occurs = np.bincount(codes_of(tokens), minlength=len(tokens.dictionary))
            seen = np.flatnonzero(occurs)
            dictionary = tokens.dictionary
            if seen.size < len(dictionary):  # e.g. rows dropped after encoding: no token counted 0 times
                dictionary = dictionary.take(pa.array(seen))
            return self.add(dictionary, occurs[seen].astype(np.int64))
        tokens = _large_binary(tokens)
        if tokens.null_count:
            keep = pc.is_valid(tokens)
            tokens = tokens.filter(keep)
            counts = None if counts is None else counts[np.asarray(keep)]
        if counts is not None:
            counts = np.ascontiguousarray(counts, np.int64)
            if counts.size != len(tokens):
                raise ValueError(f"token counter: {counts.size} counts for {len(tokens)} tokens")
        if self._tables is not None:
            self._add_reference(tokens, counts)
            return self
        offsets, data = _buffers(tokens)
        weights = np.zeros(0, np.int64) if counts is None else counts
        if self._slots is None:  # restored from a pickle, not added to since
            self._slots = _slots(self._counts.size - 1)
            _native.build(self._offsets[:int(self._state[0]) + 1], self._data, self._slots)
        j, n = 0, len(tokens)
        while True:
            j = _native.count(self._offsets, self._data, self._slots, self._counts, self._state, offsets, data,
                              weights, j)
            if j >= n:
                return self
            self._grow(int(offsets[j + 1] - offsets[j]))

    def merge(self, other: "TokenCounter") -> "TokenCounter":
        return self.add(*other.items())

    def items(self) -> Tuple[pa.Array, np.ndarray]:
        """(the distinct tokens as large_binary, their int64 counts); natively in first-seen order."""
        if self._tables is not None:
            t = reference_merge(self._tables)
            self._tables[:] = [t]
            return (t.column("token").combine_chunks().cast(pa.large_binary()),
                    t.column("count").to_numpy().astype(np.int64))
        n, used = (int(x) for x in self._state)
        tokens = pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [
            None, pa.py_buffer(self._offsets[:n + 1].copy()), pa.py_buffer(self._data[:used].copy())])
        return tokens, self._counts[:n].copy()

    def _add_reference(self, tokens: pa.Array, counts: Optional[np.ndarray]) -> None:
        acc = self._tables
        assert acc is not None  # the reference's state
        acc.append(_table_of(tokens, counts))
        # Merge when the tables added since the last merge hold as many rows as its result: every token
        # is then re-aggregated O(log n) times.
        pending = sum(t.num_rows for t in acc[1:])
        if len(acc) > 1 and pending >= max(acc[0].num_rows, _COMPACT_MIN_ROWS):
            acc[:] = [reference_merge(acc)]

    def _grow(self, token_bytes: int) -> None:
        """Room for one more distinct token of token_bytes bytes (doubling what is full)."""
        n, used = (int(x) for x in self._state)
        if used + token_bytes > self._data.size:
            data = np.empty(max(2 * self._data.size, used + token_bytes), np.uint8)
            data[:used] = self._data[:used]
            self._data = data
        assert self._slots is not None  # built before anything is added
        if n + 1 > min(self._counts.size, len(self._slots) // 2):
            size = 2 * self._counts.size
            self._offsets = np.concatenate([self._offsets[:n + 1], np.zeros(size - n, np.int64)])
            self._counts = np.concatenate([self._counts[:n], np.zeros(size - n, np.int64)])
            self._slots = _slots(size - 1)
            _native.build(self._offsets[:n + 1], self._data, self._slots)

    def __reduce__(self):
        tokens, counts = self.items()
        return _restore_counter, (tokens, counts)


def _restore_counter(tokens: pa.Array, counts: np.ndarray) -> TokenCounter:
    """The counter of `__reduce__`'s distinct tokens and counts: natively, its arrays at their size and its
    table built in one pass when it is first added to (adding the tokens would probe each one and rebuild the
    table at every doubling; the vocabulary job's accumulators, one per key and bundle, are mostly only read)."""
    counter = TokenCounter()
    n = len(tokens)
    if counter._tables is not None or n == 0 or tokens.null_count:
        return counter.add(tokens, counts)
    offsets, data = _buffers(_large_binary(tokens))
    lo, hi = int(offsets[0]), int(offsets[n])
    size = 1 << n.bit_length()  # room for n + 1 tokens, as after `_grow`
    counter._offsets = np.zeros(size + 1, np.int64)
    counter._offsets[:n + 1] = offsets - lo
    counter._data = np.empty(max(counter._data.size, hi - lo), np.uint8)
    counter._data[:hi - lo] = data[lo:hi]
    counter._counts = np.zeros(size, np.int64)
    counter._counts[:n] = counts
    counter._slots = None  # built by the first `add`: a counter that is only read (`items`) never needs it
    counter._state[:] = (n, hi - lo)
    return counter
