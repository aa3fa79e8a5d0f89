"""Tokens -> ids through the vocabularies, with every policy counted (pure Arrow / numpy).

* frequency vocabulary: id = line of the token in the vocabulary file; an
  out-of-vocabulary token goes to bucket `V + Fingerprint64(token) % num_oov_buckets`
  (V: the vocabulary's size in the manifest, its `capacity` when it has one, else its tokens)
  (what `tf.lookup.StaticVocabularyTable`, `tft.apply_vocabulary` and
  `categorical_column_with_vocabulary_file` compute), or with 0 OOV buckets is
  dropped; both are counted per feature.
* identity: the value itself; unparsable, negative or >= num_buckets values
  get `default_value`, or follow `policies.invalid_ids` (drop and count, or error).
* hashing: `Fingerprint64(token) % num_buckets`, as `categorical_column_with_hash_bucket`.
* sequence features keep their first `sequence_length` values, tensor-core
  features their first `tensor_core_width` (the rest is counted as truncated).
* NaN / blank weights follow `policies.nan_weights` (drop the value, zero it, or error).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.read.parse import FeatureValues, ParsedChunk
from pipelines.sharding.batches import ExampleBlock, FeatureBlock
from pipelines.token_index import TokenIndex, distinct_and_codes, spread_ids

if TYPE_CHECKING:
    from tpu_embed.artifact.spec import Spec


class PolicyError(RuntimeError):
    """A value that the spec's policies say must stop the job."""


def fingerprint64_buckets(tokens: pa.Array, num_buckets: int) -> np.ndarray:
    """Fingerprint64(token) % num_buckets, exactly as tf.strings.to_hash_bucket_fast."""
    if len(tokens) == 0:
        return np.zeros(0, np.int64)
    from tensorflow.python.framework import ops  # noqa: F401
    from tensorflow.python.ops import gen_string_ops  # imported only when hashing is needed
    arr = np.asarray(tokens.to_pylist(), dtype=object)
    return gen_string_ops.string_to_hash_bucket_fast(arr, num_buckets).numpy().astype(np.int64)


def parse_ints(tokens: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    """(int64 values, ok mask) for byte-string integers: Python's `int(token)` within int64."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    try:
        s = tokens.cast(pa.large_string()) if not pa.types.is_large_string(tokens.type) else tokens
    except pa.ArrowInvalid:  # bytes that are not UTF-8 (TFRecord, Parquet binary): those are not integers
        s = pa.array([v.decode("utf-8", "replace") for v in tokens.cast(pa.large_binary()).to_pylist()],
                     pa.large_string())
    try:
        # Arrow's cast takes "0x10" as 16 where int() refuses it: hex text goes the general way (int()'s rule,
        # which serving's parse_int64 follows), so a token's id never depends on the other tokens of its batch.
        if pc.any(pc.match_substring(s, "x", ignore_case=True)).as_py():
            raise pa.ArrowInvalid("hexadecimal text")
        return pc.cast(s, pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64), np.ones(n, bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        out = np.zeros(n, np.int64)
        ok = np.zeros(n, bool)
        for i, v in enumerate(s.to_pylist()):
            try:
                x = int(v)
            except (TypeError, ValueError):
                continue
            if -(1 << 63) <= x < (1 << 63):  # beyond int64: invalid (it is >= num_buckets anyway)
                out[i] = x
                ok[i] = True
        return out, ok


def _truncate(lengths: np.ndarray, limit: int) -> Tuple[np.ndarray, np.ndarray]:
    """(keep mask over values, new lengths) keeping the first `limit` values of each example."""
    starts = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    ex = np.repeat(np.arange(lengths.size), lengths)
    pos = np.arange(int(starts[-1]), dtype=np.int64) - starts[ex]
    keep = pos < limit
    return keep, np.minimum(lengths, limit)


def _per_row(lengths: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """int64 [n]: how many of each example's values are flagged (`flags`: one bool per value, in order)."""
    at = np.flatnonzero(flags)
    if not at.size:
        return np.zeros(lengths.size, np.int64)
    return np.bincount(np.searchsorted(np.cumsum(lengths), at, side="right"), minlength=lengths.size).astype(np.int64)


def _row_of(lengths: np.ndarray, value: int) -> int:
    """The example that value `value` belongs to."""
    return int(np.searchsorted(np.cumsum(lengths), value, side="right"))


def _value_text(fv: FeatureValues, i: int) -> str:
    if fv.ints is not None:
        return str(int(fv.ints[i]))
    v = fv.tokens[i].as_py()  # type: ignore[index]  # tokens where there are no ints
    return repr(v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v)


def _record_where(records: Optional[np.ndarray], path: str, example: int) -> str:
    if records is None:
        return f" example {example}"
    return f" {path or 'input'} record {int(records[example])}"


def map_feature(f, fv: FeatureValues, spec: Spec, vocab: Optional["pa.Array | TokenIndex"],
                counts: collections.Counter, where: str = "", records: Optional[np.ndarray] = None, path: str = "",
                oov_base: Optional[int] = None) -> FeatureBlock:
    """`records`/`path`: the record numbers of the examples and their file, for error messages. `oov_base`: the
    first OOV id, the vocabulary's size in the manifest (its capacity under one); None: the tokens in `vocab`."""
    n = fv.lengths.size
    v = f.vocabulary
    key = f"feature/{f.name}/"
    counts[key + "values"] += int(fv.lengths.sum())
    limit = f.sequence_length if f.sequence_length > 0 else (f.tensor_core_width or 0)
    truncated = bool(limit and n and int(fv.lengths.max()) > limit)
    chunk_ids = _chunk_ids(v, fv, vocab, oov_base) if v.type == "frequency" else None
    if chunk_ids is not None and v.num_oov_buckets and fv.weights is None and not truncated:
        # Every value kept: the block's lengths are the chunk's (neither is ever changed in place).
        block = _frequency_block(chunk_ids, counts, key, fv.lengths.astype(np.int64, copy=False))
        if block is not None:
            return block
    lengths = fv.lengths.copy()

    def at(value: int) -> str:  # where value `value` is, for an error message
        return _record_where(records, path, _row_of(lengths, value))

    oov_per_value = None
    keep = None  # values kept, over fv's values
    if chunk_ids is not None:
        ids, oov_per_value, keep = _frequency_ids(v, chunk_ids, counts, key)
    elif v.type == "hashing":
        distinct, codes = distinct_and_codes(fv.as_tokens())
        ids = fingerprint64_buckets(distinct, int(v.num_buckets))
        if codes is not None:
            ids = np.take(ids, codes)
    else:  # identity
        ids, keep = _identity_ids(f, fv, spec, counts, key, f"feature {f.name!r}{where}:", at)
    weights, keep = _weights(fv.weights, keep, spec, counts, key, f"feature {f.name!r}{where}:", at)

    if keep is not None and not keep.all():
        lengths = lengths - _per_row(lengths, ~keep)
        ids = ids[keep]
        weights = None if weights is None else weights[keep]
        oov_per_value = None if oov_per_value is None else oov_per_value[keep]
    if limit and lengths.size and int(lengths.max()) > limit:
        tkeep, lengths = _truncate(lengths, limit)
        counts[key + ("truncated_sequence" if f.sequence_length else "truncated_tensor_core")] += int((~tkeep).sum())
        ids = ids[tkeep]
        weights = None if weights is None else weights[tkeep]
        oov_per_value = None if oov_per_value is None else oov_per_value[tkeep]
    oov = (_per_row(lengths, oov_per_value).astype(np.int32) if oov_per_value is not None
           else np.zeros(n, np.int32))
    counts[key + "ids"] += int(ids.size)
    return FeatureBlock(lengths.astype(np.int64, copy=False), ids.astype(np.int64, copy=False),
                        None if weights is None else weights.astype(np.float32, copy=False), oov)


def _distinct_ids(v, distinct: pa.Array, index: TokenIndex, oov_base: Optional[int]) -> Tuple[np.ndarray, np.ndarray]:
    """(a frequency vocabulary's id of each of a chunk's distinct tokens: its position in the vocabulary, else its
    OOV bucket `V + Fingerprint64(token) % num_oov_buckets`, else (no OOV buckets) -1; whether it is in the
    vocabulary). OOV ids are -1 or >= V, V >= the vocabulary's tokens."""
    ids = index.lookup(distinct)
    found = ids >= 0
    if v.num_oov_buckets and not found.all():
        V = len(index) if oov_base is None else oov_base
        if v.num_oov_buckets == 1:
            ids[~found] = V
        else:
            ids[~found] = V + fingerprint64_buckets(distinct.filter(pa.array(~found)), v.num_oov_buckets)
    return ids, found


class _ChunkIds(NamedTuple):
    """A frequency feature's chunk, mapped per distinct token (`_chunk_ids`)."""

    ids: np.ndarray  # each distinct token's id (`_distinct_ids`)
    found: np.ndarray  # whether it is in the vocabulary
    codes: Optional[np.ndarray]  # each value's distinct token (None: the values are the distinct tokens)
    found_limit: int  # the vocabulary's tokens: ids in [0, found_limit) are found, the others OOV


def _chunk_ids(v, fv: FeatureValues, vocab: Optional["pa.Array | TokenIndex"], oov_base: Optional[int]) -> _ChunkIds:
    """The ids of the distinct tokens of `fv`'s values (the parser dictionary-encoded them), and the codes that
    spread them over the values: computed once per chunk, for the native spread or the numpy rule."""
    distinct, codes = distinct_and_codes(fv.as_tokens())
    index = vocab if isinstance(vocab, TokenIndex) else TokenIndex(vocab)
    ids, found = _distinct_ids(v, distinct, index, oov_base)
    return _ChunkIds(ids, found, codes, len(index))


def _frequency_ids(v, chunk: _ChunkIds, counts: collections.Counter, key: str
                   ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """A frequency vocabulary's ids of a chunk's values, which of them are out of the vocabulary, and the values
    kept (None: all; without OOV buckets an OOV value is dropped)."""
    ids, found = chunk.ids, chunk.found
    if chunk.codes is not None:
        ids = np.take(ids, chunk.codes)
        # Found per value without a second gather: OOV ids are -1 or >= V, real ones in [0, V).
        found = (ids >= 0) & (ids < chunk.found_limit)
    oov_per_value = ~found
    n_oov = int(oov_per_value.sum())
    counts[key + "oov"] += n_oov
    keep = None
    if n_oov and v.num_oov_buckets == 0:
        keep = found
        counts[key + "oov_dropped"] += n_oov
    return ids, oov_per_value, keep


def _frequency_block(chunk: _ChunkIds, counts: collections.Counter, key: str, lengths: np.ndarray
                     ) -> Optional[FeatureBlock]:
    """`map_feature`'s block of a frequency feature that keeps every value as it is (OOV buckets, no weights, no
    truncation): the distinct tokens' ids spread over the values and the OOV values counted per example in one
    native pass (`token_index.spread_ids`); None without the native module or where it does not take the codes
    (`_frequency_ids` and `_per_row` then do it, from the same `chunk`)."""
    spread = spread_ids(chunk.ids, chunk.codes, lengths, chunk.found_limit)
    if spread is None:
        return None
    values, oov, n_oov = spread
    counts[key + "oov"] += n_oov
    counts[key + "ids"] += int(values.size)
    return FeatureBlock(lengths, values, None, oov)


def _identity_ids(f, fv: FeatureValues, spec: Spec, counts: collections.Counter, key: str, what: str,
                  at: Callable[[int], str]) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """An identity vocabulary's ids of `fv`'s values, invalid ones defaulted or dropped (then the values kept;
    None: all) or raised as `policies.invalid_ids` says."""
    v = f.vocabulary
    if fv.ints is not None:
        ids, ok = fv.ints.astype(np.int64), np.ones(fv.ints.size, bool)
    else:
        distinct, codes = distinct_and_codes(fv.tokens)
        ids, ok = parse_ints(distinct)
        if codes is not None:
            ids, ok = np.take(ids, codes), np.take(ok, codes)
    ok &= (ids >= 0) & (ids < int(v.num_buckets))
    bad = int((~ok).sum())
    if not bad:
        return ids, None
    if v.default_value is not None:
        counts[key + "invalid_ids_defaulted"] += bad
        return np.where(ok, ids, int(v.default_value)), None
    if spec.policies.invalid_ids == "error":
        first = int(np.flatnonzero(~ok)[0])
        raise PolicyError(f"{what}{at(first)}: value "
                          f"{_value_text(fv, first)} is not an integer id in [0, {v.num_buckets}) "
                          f"({bad} such value(s) in this chunk; policies.invalid_ids: error). Fix the data, "
                          "set policies.invalid_ids: drop (counted as invalid_ids_dropped), or give the "
                          "vocabulary a default_value.")
    counts[key + "invalid_ids_dropped"] += bad
    return ids, ok


def _weights(weights: Optional[np.ndarray], keep: Optional[np.ndarray], spec: Spec, counts: collections.Counter,
             key: str, what: str, at: Callable[[int], str]) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """The weights with `policies.nan_weights` applied to the NaN or blank ones among the values kept, and the
    values kept after it."""
    if weights is None:
        return weights, keep
    nan = ~np.isfinite(weights)
    if keep is not None:
        nan &= keep
    n_nan = int(nan.sum())
    if not n_nan:
        return weights, keep
    pol = spec.policies.nan_weights
    if pol == "error":
        first = int(np.flatnonzero(nan)[0])
        raise PolicyError(f"{what}{at(first)}: "
                          "weight is NaN or blank "
                          "(policies.nan_weights: error). Fix the data or set policies.nan_weights: "
                          "drop | zero.")
    if pol == "zero":
        counts[key + "nan_weights_zeroed"] += n_nan
        return np.where(nan, np.float32(0), weights).astype(np.float32), keep
    counts[key + "nan_weights_dropped"] += n_nan
    return weights, ~nan if keep is None else (keep & ~nan)


def map_chunk(chunk: ParsedChunk, spec: Spec, vocabs: Mapping[str, "pa.Array | TokenIndex"],
              counts: collections.Counter, sizes: Optional[Mapping[str, int]] = None) -> ExampleBlock:
    """`vocabs`: {vocabulary key: its tokens, or their TokenIndex (built once: pass it for many chunks)};
    `sizes`: {vocabulary key: size}, the first OOV id of each (None: the tokens of each)."""
    feats = {}
    where = f" (input file #{chunk.file_index})"
    for f in spec.categorical:
        key = spec.vocabulary_key(f)
        vocab = vocabs.get(key) if f.vocabulary.type == "frequency" else None
        feats[f.name] = map_feature(f, chunk.features[f.name], spec, vocab, counts, where,
                                    chunk.record_numbers, chunk.path, None if sizes is None else sizes.get(key))
    n = chunk.num_rows
    return ExampleBlock(chunk.label, chunk.dense, np.ones(n, np.float32), feats)
