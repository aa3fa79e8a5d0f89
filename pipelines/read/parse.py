"""Arrow batches -> labels, dense floats and per-feature values (pure Arrow / numpy).

`parse_batch(raw, spec)` validates every row of a `RawBatch`: a row that has
an unparsable number, a blank label (without `label.fill`), a value of the
wrong type or a weight list that does not match its values goes to the dead
letters with the reason, and is counted; the other rows come out as a
`ParsedChunk`.  Blank categorical values mean "no value"; blank dense values
take the spec's `fill`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.read import value_kinds
from pipelines.read.csv_scan import csv_native
from pipelines.read.records import DeadLetter, RawBatch, one_array
from pipelines.token_index import dictionary_encode, drop_empty

if TYPE_CHECKING:
    from tpu_embed.artifact.spec import Spec


@dataclasses.dataclass
class FeatureValues:
    """One feature's values for n examples: example i has values[offsets[i]:offsets[i+1]]."""
    lengths: np.ndarray  # int64 [n]
    tokens: Optional[pa.Array] = None  # the values (strings) dictionary-encoded (token_index.DICTIONARY_TYPE), or
    ints: Optional[np.ndarray] = None  # int64 values (integer columns)
    weights: Optional[np.ndarray] = None  # float32 per value, NaN where blank/unparsable-as-NaN

    @property
    def size(self) -> int:
        return int(self.lengths.sum())

    def as_tokens(self) -> pa.Array:
        """The values as vocabulary / hashing tokens: the strings (dictionary-encoded, as parsed), or the
        integers' decimal text."""
        if self.tokens is not None:
            return self.tokens
        # Arrow's cast, not numpy's fixed-width '<U' strings (pa.array(..., large_binary) keeps only their
        # first character).
        return value_kinds.int_text(pa.array(self.ints, pa.int64()))

    def take_rows(self, keep: np.ndarray) -> "FeatureValues":
        vkeep = np.repeat(keep, self.lengths)
        return FeatureValues(
            lengths=self.lengths[keep],
            tokens=None if self.tokens is None else self.tokens.filter(pa.array(vkeep)),
            ints=None if self.ints is None else self.ints[vkeep],
            weights=None if self.weights is None else self.weights[vkeep])


@dataclasses.dataclass
class ParsedChunk:
    file_index: int
    chunk_index: int
    record_numbers: np.ndarray  # int64 [n]
    label: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, D]
    features: Dict[str, FeatureValues]
    path: str = ""  # the input file (for messages naming file and record)

    @property
    def num_rows(self) -> int:
        return int(self.record_numbers.size)


class _Problems:
    def __init__(self, raw: RawBatch):
        self.raw = raw
        self.bad = np.zeros(raw.num_rows, dtype=bool)
        self.letters: Dict[int, Tuple[str, str]] = {}

    def flag(self, rows: np.ndarray, reason: str, detail_fn):
        for r in np.flatnonzero(rows):
            if r not in self.letters:
                self.letters[int(r)] = (reason, detail_fn(int(r)))
        self.bad |= rows

    def dead_letters(self) -> List[DeadLetter]:
        return [DeadLetter(self.raw.path, int(self.raw.record_numbers[r]), reason, detail, self.raw.file_index)
                for r, (reason, detail) in sorted(self.letters.items())]


# ---------------------------------------------------------------- Arrow helpers

def _as_array(col) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = one_array(col)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return col


def list_form(col) -> Tuple[np.ndarray, pa.Array]:
    """(lengths [n], flat values) of a scalar or list column; nulls are empty."""
    col = _as_array(col)
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        values = _as_array(pc.list_flatten(col))
        if values.null_count:  # a null inside a list is no value, as a null cell is
            rows = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
            null = np.asarray(pc.is_null(values).to_numpy(zero_copy_only=False), dtype=bool)
            lengths = lengths - np.bincount(rows[null], minlength=lengths.size).astype(np.int64)
            values = values.drop_null()
        return lengths, values
    lengths = np.ones(len(col), dtype=np.int64)
    if col.null_count:
        lengths[np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)] = 0
        col = col.drop_null()
    return lengths, col


def cell_form(col) -> Tuple[np.ndarray, pa.Array, Optional[np.ndarray]]:
    """(lengths [n], flat values, blank mask over the values or None) of a categorical or weight column, its
    nulls read as a CSV reader reads an empty field: a null inside a list is one blank value (as the empty
    field of 'a||b'), a null cell of a scalar column one blank value (an empty cell); a null list (a
    TFRecord's missing key, a Parquet null list) has no values. Blank values stay in place (null in `values`)
    so that values and weights pair up by position before blanks are dropped, as they do in a CSV cell."""
    col = _as_array(col)
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        values = _as_array(pc.list_flatten(col))
    else:
        lengths, values = np.ones(len(col), dtype=np.int64), col
    blank = None
    if values.null_count:
        blank = np.asarray(pc.is_null(values).to_numpy(zero_copy_only=False), dtype=bool)
    return lengths, values, blank


def _is_stringlike(t) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


def _large_string(values: pa.Array) -> pa.Array:
    """String or binary values as large_string; bytes that are not UTF-8 (TFRecord, Parquet binary values) with
    U+FFFD in their place, as `parse_floats` reads them (then not a number)."""
    if pa.types.is_large_string(values.type):
        return values
    try:
        return values.cast(pa.large_string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()],
                        pa.large_string())


def _value_rows(lengths: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)


def parse_floats(values: pa.Array) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 values, blank mask, bad mask) for a flat Arrow array of strings or numbers."""
    n = len(values)
    t = values.type
    if n == 0:
        return np.zeros(0), np.zeros(0, bool), np.zeros(0, bool)
    if _is_stringlike(t):
        plain = _plain_decimals(values)
        if plain is not None:
            return plain[0], plain[1], np.zeros(n, bool)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            try:
                values = values.cast(pa.large_string())
            except pa.ArrowInvalid:
                strs = [None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()]
                values = pa.array(strs, pa.large_string())
        trimmed = pc.utf8_trim_whitespace(values)
        blank = np.asarray(pc.equal(pc.utf8_length(trimmed), 0).to_numpy(zero_copy_only=False), dtype=bool)
        filled = pc.if_else(pa.array(blank), pa.scalar("0", pa.large_string()), trimmed)
        try:
            out = pc.cast(filled, pa.float64()).to_numpy(zero_copy_only=False)
            bad = ~np.isfinite(out)
        except pa.ArrowInvalid:
            py = filled.to_pylist()
            out = np.empty(n, dtype=np.float64)
            bad = np.zeros(n, dtype=bool)
            for i, s in enumerate(py):
                try:
                    out[i] = float(s)
                    bad[i] = not math.isfinite(out[i])
                except (TypeError, ValueError):
                    out[i] = 0.0
                    bad[i] = True
        out = np.where(blank | bad, 0.0, out)
        return out, blank, bad
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t):
        # Unsafe: an integer beyond 2**53 rounds to the nearest float64, as its decimal text parses (a safe cast
        # raises ArrowInvalid on it).
        out = pc.cast(values, pa.float64(), safe=False).to_numpy(zero_copy_only=False).astype(np.float64)
        bad = ~np.isfinite(out)
        return np.where(bad, 0.0, out), np.zeros(n, bool), bad
    return np.zeros(n), np.zeros(n, bool), np.ones(n, bool)


def _plain_decimals(values: pa.Array) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(float64 values, blank mask) when every value is "" or a decimal integer of at most 15 digits (exact as a
    double, so what the general way gives), by the native parser in one pass; else None (also without it)."""
    native = csv_native()
    if native is None or not pa.types.is_large_string(values.type) or values.null_count:
        return None
    _, offsets, data = values.buffers()
    got = native.plain_decimals(offsets, b"" if data is None else data, values.offset, len(values))
    if got is None:
        return None
    return np.frombuffer(got[0], np.float64), np.frombuffer(got[1], np.bool_)


# ---------------------------------------------------------------- numbers

def _scalar_float(raw: RawBatch, column: str, fill: Optional[float], what: str, probs: _Problems) -> np.ndarray:
    n = raw.num_rows
    lengths, values = list_form(raw.columns[column])
    t = values.type
    if not (_is_stringlike(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
            or pa.types.is_boolean(t) or pa.types.is_decimal(t)):
        probs.flag(np.ones(n, bool), "wrong_type", lambda r: f"{what} column {column!r} has type {t}, "
                   "expected numbers or strings of numbers")
        return np.zeros(n, np.float32)
    multi = lengths > 1
    if multi.any():
        probs.flag(multi, "wrong_type",
                   lambda r: f"{what} column {column!r} has {int(lengths[r])} values, expected one")
    parsed, blank, bad = parse_floats(values)
    if len(values) == n and not multi.any():  # one value per row (a CSV column): each row's value is its own
        out, present, bad_rows = parsed, ~blank, bad  # parse_floats gives 0.0 where blank or bad
    else:
        rows = _value_rows(lengths)
        out = np.zeros(n, np.float64)
        present = np.zeros(n, bool)
        first = np.ones(rows.size, bool)
        if rows.size > 1:
            first[1:] = rows[1:] != rows[:-1]
        use = first & ~blank
        out[rows[use]] = parsed[use]
        present[rows[use]] = True
        bad_rows = np.zeros(n, bool)
        bad_rows[rows[first & bad]] = True
    if bad_rows.any():
        py = values.to_pylist() if _is_stringlike(t) else None
        starts = np.concatenate([[0], np.cumsum(lengths)])

        def detail(r, py=py, starts=starts):
            v = py[starts[r]] if py is not None else "non-finite"
            return f"{what} column {column!r}: cannot parse {v!r} as a finite number"
        probs.flag(bad_rows, "unparsable_number", detail)
    missing = ~present & ~bad_rows & ~multi
    if fill is None:
        if missing.any():
            probs.flag(missing, "missing_value", lambda r: f"{what} column {column!r} is blank and has no fill")
    elif missing.any():
        out = np.where(missing, fill, out)
    return out.astype(np.float32)


# ---------------------------------------------------------------- categorical

def encodable_columns(spec) -> Dict[str, Optional[str]]:
    """{column: token delimiter or None} of the columns whose values only unweighted categorical features
    read, all with the same delimiter: the CSV reader may give them dictionary-encoded
    (`pipelines.read.splits.read_split`'s `encode`), which `_categorical` takes as they are."""
    other = {c for c in ([spec.label.column] if spec.label is not None else []) + [d.column for d in spec.dense]}
    other |= {f.weight_column for f in spec.categorical if f.weight_column}
    delimiters: Dict[str, set] = {}
    for f in spec.categorical:
        delimiters.setdefault(f.column, set()).add(f.delimiter)
        if f.weight_column:
            other.add(f.column)
    return {c: next(iter(d)) for c, d in delimiters.items() if len(d) == 1 and c not in other}


def _categorical(raw: RawBatch, f, probs: _Problems) -> FeatureValues:
    n = raw.num_rows
    pre = raw.encoded.get(f.column)
    if pre is not None and pre[0] == f.delimiter and not f.weight_column:  # the reader's encoding (same values)
        return FeatureValues(lengths=pre[1], tokens=pre[2])
    lengths, values, nulls = cell_form(raw.columns[f.column])
    t = values.type
    ints = None
    tokens = None
    if pa.types.is_uint64(t) and len(values) and (pc.max(values).as_py() or 0) >= 1 << 63:
        values, t = values.cast(pa.large_string()), pa.large_string()  # beyond int64: the decimal text
    if _is_stringlike(t):
        if nulls is not None:  # a blank is an empty token (dropped below, with its weight)
            values = values.fill_null(pa.scalar(b"" if pa.types.is_binary(t) or pa.types.is_large_binary(t)
                                                else "", t))
        tokens = values.cast(pa.large_binary()) if not pa.types.is_large_binary(t) else values
        if f.delimiter is not None and len(tokens):
            split = pc.split_pattern(tokens, f.delimiter)
            per_value = pc.list_value_length(split).to_numpy(zero_copy_only=False).astype(np.int64)
            rows = _value_rows(lengths)
            lengths = np.bincount(rows, weights=per_value, minlength=n).astype(np.int64)
            tokens = _as_array(pc.list_flatten(split))
    elif pa.types.is_integer(t):
        # Every integer type as int64 (a uint64 beyond int64 is text, above); a blank (null) is dropped below.
        ints = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    elif pa.types.is_floating(t):
        # Float values are categorical values in their text form (repr: 3.0 -> "3.0"), exactly as the same
        # number written in a CSV cell: the same token for a frequency vocabulary or a hash, and an invalid
        # id for an identity vocabulary (policies.invalid_ids), whichever the input format.
        tokens = value_kinds.float_text(values).fill_null(b"")
    else:
        probs.flag(np.ones(n, bool), "wrong_type",
                   lambda r: f"categorical column {f.column!r} has type {t}, expected strings or integers")
        return FeatureValues(lengths=np.zeros(n, np.int64), tokens=dictionary_encode(pa.array([], pa.large_binary())))

    weights = None
    if f.weight_column:
        w, wl = _weight_values(raw, f, n)
        mismatch = wl != lengths
        if mismatch.any():
            probs.flag(mismatch, "weight_mismatch",
                       lambda r: f"feature {f.name!r}: {int(lengths[r])} values in {f.column!r} but "
                                 f"{int(wl[r])} weights in {f.weight_column!r}")
            # keep arrays aligned for the other rows: give bad rows zero values
            vkeep = np.repeat(~mismatch, lengths)
            wkeep = np.repeat(~mismatch, wl)
            lengths = np.where(mismatch, 0, lengths)
            if tokens is not None:
                tokens = tokens.filter(pa.array(vkeep))
            else:
                ints = ints[vkeep]  # type: ignore[index]  # ints where there are no tokens
                nulls = None if nulls is None else nulls[vkeep]
            w = w[wkeep]
        weights = w

    return _without_blanks(n, lengths, tokens, ints, nulls, weights)


def _weight_values(raw: RawBatch, f, n: int) -> Tuple[np.ndarray, np.ndarray]:
    """(float32 weights, one per value with NaN for a blank or unparsable one; weights per row) of the feature's
    weight column, split by its delimiter as the values are."""
    wl, wv, wblank = cell_form(raw.columns[f.weight_column])
    if wblank is not None and _is_stringlike(wv.type):  # a blank weight is an empty string: NaN below
        wv = _large_string(wv).fill_null("")
    if _is_stringlike(wv.type) and f.delimiter is not None and len(wv):
        split = pc.split_pattern(_large_string(wv), f.delimiter)
        per_value = pc.list_value_length(split).to_numpy(zero_copy_only=False).astype(np.int64)
        wl = np.bincount(_value_rows(wl), weights=per_value, minlength=n).astype(np.int64)
        wv = _as_array(pc.list_flatten(split))
    parsed, blank, bad = parse_floats(wv)
    w = parsed.astype(np.float32)
    w[blank | bad] = np.nan
    if wblank is not None and not _is_stringlike(wv.type):  # a null number: a blank weight
        w[wblank] = np.nan
    return w, wl


def _without_blanks(n: int, lengths: np.ndarray, tokens, ints: Optional[np.ndarray], nulls: Optional[np.ndarray],
                    weights: Optional[np.ndarray]) -> FeatureValues:
    """The values with the blank ones (null integers, empty tokens) dropped, with their weights."""
    if ints is not None and nulls is not None and nulls.any():
        # Blank integers are no value, as blank tokens are below: dropped with their weights.
        lengths = lengths - np.bincount(_value_rows(lengths)[nulls], minlength=n).astype(np.int64)
        ints = ints[~nulls]
        if weights is not None:
            weights = weights[~nulls]

    if tokens is not None:
        # Blank values mean "no value" (Criteo's empty cells, 'a||b').
        tokens, nonempty = drop_empty(dictionary_encode(tokens))
        if nonempty is not None:
            rows = _value_rows(lengths)
            lengths = lengths - np.bincount(rows[~nonempty], minlength=n).astype(np.int64)
            if weights is not None:
                weights = weights[nonempty]
    return FeatureValues(lengths=lengths, tokens=tokens, ints=ints, weights=weights)


def parse_batch(raw: RawBatch, spec: Spec, chunk_index: Optional[int] = None
                ) -> Tuple[ParsedChunk, List[DeadLetter]]:
    probs = _Problems(raw)
    n = raw.num_rows
    if spec.label is not None:
        label = _scalar_float(raw, spec.label.column, spec.label.fill, "label", probs)
    else:
        label = np.zeros(n, np.float32)
    dense = np.zeros((n, len(spec.dense)), np.float32)
    for j, d in enumerate(spec.dense):
        dense[:, j] = _scalar_float(raw, d.column, d.fill, "dense", probs)
    feats = {f.name: _categorical(raw, f, probs) for f in spec.categorical}
    keep = ~probs.bad
    if not keep.all():
        label, dense = label[keep], dense[keep]
        feats = {k: v.take_rows(keep) for k, v in feats.items()}
    chunk = ParsedChunk(raw.file_index, raw.batch_index if chunk_index is None else chunk_index,
                        raw.record_numbers[keep], label, dense, feats, raw.path)
    return chunk, probs.dead_letters()
