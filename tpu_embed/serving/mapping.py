"""Raw features -> the ids, weights and dense values the shards hold, in TensorFlow ops.

    mapping = RawFeatureMapping.from_artifact("build/criteo")       # a tf.Module over the vocabulary files
    out = mapping({"C1": tf.constant(["68fd1e64", ""]), "I1": tf.constant(["1", ""]), ...})
    out = mapping.map_examples(serialized_examples)                 # the same from serialized tf.train.Examples
    out["ids"]["C1"]        # tf.RaggedTensor int64 [batch, None]: the ids the shards hold for these rows
    out["weights"]["C1"]    # float32 ragged like the ids (weighted features only)
    out["dense"]            # float32 [batch, num_dense]
    out["valid"]            # bool [batch]: False where the offline jobs would not have used the record

The rules are the offline jobs' (`pipelines.read.parse`, `pipelines.mapping.ids`), each written here once:

* a categorical column's values: strings (split at the feature's `delimiter`), integers (their decimal text)
  or floats (their Python `repr`); blank strings are no value;
* frequency vocabularies: the token's line in the vocabulary file (a `tf.lookup.StaticHashTable` over the
  file), an unknown token `V + Fingerprint64(token) % num_oov_buckets` (`tf.strings.to_hash_bucket_fast`), or
  dropped with 0 OOV buckets;
* identity: the integer (`tpu_embed.serving.numbers.parse_int64`); a value that is not an integer in
  `[0, num_buckets)` gets the vocabulary's `default_value`, or is dropped;
* hashing: `Fingerprint64(token) % num_buckets`;
* weights (`weight_column`): one per value, blank or unparsable ones are NaN and follow `policies.nan_weights`;
* sequence features keep their first `sequence_length` values, tensor-core features their first
  `tensor_core_width`;
* dense values: the first value of the column parsed as a float, blank or missing ones the spec's `fill`;
* CSV specs: a record with a string that is not UTF-8 in a column the spec reads is a dead letter (the CSV
  reader's rule; TFRecord and Parquet binary values are bytes as they are).

Records the offline jobs would not use (dead letters, or values that stop the job under an `error` policy)
are mapped anyway, so a batch keeps its rows, and flagged in `valid`; docs/how-to/serve.md says what
each one gets. The label is not read.

`map_raw(raw, plan, tables)` is the pure function under the module (no Keras, no Python per value): a
`tf.Transform` preprocessing function or any `tf.function` can call it with tables made by
`vocabulary_tables(plan)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tpu_embed.serving import numbers
from tpu_embed.serving.plan import DensePlan, FeaturePlan, MappingPlan

__all__ = ["FeaturePlan", "DensePlan", "MappingPlan", "RawFeatureMapping", "map_raw", "parse_examples",
           "vocabulary_tables"]


class _SharedNameTextFileInitializer(tf.lookup.TextFileInitializer):
    """A text file initializer whose table has the shared name given (TensorFlow derives it from the path)."""

    def __init__(self, shared_name: str, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._given_shared_name = shared_name

    @property
    def _shared_name(self) -> str:
        return self._given_shared_name


def vocabulary_tables(plan: MappingPlan, shared_names: Optional[Mapping[str, str]] = None
                      ) -> Dict[str, tf.lookup.StaticHashTable]:
    """{vocabulary key: token -> line number table (-1 if absent)} over the plan's vocabulary files (every line:
    under a capacity the file has fewer lines than the manifest's size). Made in a `tf.Module` (or a
    tf.Transform preprocessing function) the files become the SavedModel's assets. `shared_names`: {key: the
    table's shared name} (default: TensorFlow's, from the file's path)."""
    tables = {}
    for key, path in sorted(plan.vocabulary_files.items()):
        args = (path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
        init = (tf.lookup.TextFileInitializer(*args) if shared_names is None
                else _SharedNameTextFileInitializer(shared_names[key], *args))
        tables[key] = tf.lookup.StaticHashTable(init, default_value=-1, name=f"vocabulary_{key}")
    return tables


# ---------------------------------------------------------------- raw columns

@dataclasses.dataclass
class Column:
    """One raw column of a batch: its values per row, as strings, integers and / or floats ([batch, None]
    ragged tensors; a row's values are of one kind). A raw tensor gives one kind, tf.train.Examples all three."""

    strings: Optional[tf.RaggedTensor] = None
    ints: Optional[tf.RaggedTensor] = None
    floats: Optional[tf.RaggedTensor] = None  # float64
    float_texts: Optional[tf.RaggedTensor] = None  # `numbers.float_text` of `floats`, when made once for a batch

    def parts(self) -> List[tf.RaggedTensor]:
        return [p for p in (self.strings, self.ints, self.floats) if p is not None]


def as_column(x: Any, name: str = "") -> Column:
    """A raw tensor as a `Column`: [batch] (one value a row; a blank string is no value), [batch, n], ragged
    [batch, None] or sparse [batch, n]; strings, integers or floats."""
    if isinstance(x, Column):
        return x
    if isinstance(x, tf.SparseTensor):
        x = tf.RaggedTensor.from_sparse(x)
    elif not isinstance(x, tf.RaggedTensor):
        x = tf.convert_to_tensor(x)
        if x.shape.rank == 1:
            x = x[:, None]
        if x.shape.rank != 2:
            raise ValueError(f"raw column {name!r}: expected a [batch] or [batch, n] tensor, got shape {x.shape}.")
        x = tf.RaggedTensor.from_tensor(x)
    if x.shape.rank != 2:
        raise ValueError(f"raw column {name!r}: expected [batch, None] values, got rank {x.shape.rank}.")
    d = x.dtype
    if d == tf.string:
        return Column(strings=x)
    if d.is_integer and d not in (tf.uint64,):
        return Column(ints=tf.cast(x, tf.int64))
    if d.is_floating:
        return Column(floats=tf.cast(x, tf.float64))
    raise TypeError(f"raw column {name!r} has type {d.name}: expected strings, integers or floats.")


def _rows(column: Column) -> tf.Tensor:
    return column.parts()[0].nrows()


_UNEQUAL = "raw columns of unequal length: "
_UNEQUAL_FIX = ": give every column one entry per row of the batch (a blank string for no value)."


def _batch_rows(cols: Mapping[str, Column]) -> tf.Tensor:
    """The rows of the batch: every column's, checked equal. Columns of unequal length are refused in one line
    naming each column whose length is not the one most columns have, its length and that one: a `ValueError`
    where the lengths are known when the ops are made (eager), else an assert in the graph
    (`InvalidArgumentError` when it runs), which the rows returned depend on."""
    names = list(cols)
    rows = [_rows(cols[c]) for c in names]
    known = [tf.get_static_value(r) for r in rows]
    if all(k is not None for k in known):
        lengths = [int(k) for k in known]
        common = max(lengths, key=lengths.count)  # the first of the most frequent
        if any(n != common for n in lengths):
            ref = names[lengths.index(common)]
            odd = ", ".join(f"{c} has {n} rows" for c, n in zip(names, lengths, strict=True) if n != common)
            raise ValueError(f"{_UNEQUAL}{odd}, where {ref} has {common}{_UNEQUAL_FIX}")
        return rows[0]
    lengths = tf.stack([tf.cast(r, tf.int64) for r in rows])
    same = tf.cast(tf.equal(lengths[:, None], lengths[None, :]), tf.int32)
    at = tf.argmax(tf.reduce_sum(same, axis=1), output_type=tf.int32)  # the first of the most frequent
    common = lengths[at]
    odd = tf.not_equal(lengths, common)
    named = tf.constant(names)  # unquoted: the assert's message escapes quotes
    text = tf.strings.reduce_join(tf.boolean_mask(named + " has " + tf.strings.as_string(lengths) + " rows", odd),
                                  separator=", ")
    message = tf.strings.join([_UNEQUAL, text, ", where ", tf.gather(named, at), " has ",
                               tf.strings.as_string(common), _UNEQUAL_FIX])
    check = tf.debugging.Assert(~tf.reduce_any(odd), [message])
    with tf.control_dependencies([check]):
        return tf.identity(rows[0])


def _concat(parts: List[tf.RaggedTensor]) -> tf.RaggedTensor:
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)


def _split(strings: tf.RaggedTensor, delimiter: Optional[str]) -> tf.RaggedTensor:
    """Each string value split at `delimiter` (literally, as pyarrow's split_pattern), rows kept."""
    if delimiter is None:
        return strings
    return strings.with_flat_values(tf.strings.split(strings.flat_values, sep=delimiter)).merge_dims(1, 2)


def _float64(column: Column, delimiter: Optional[str]) -> Tuple[tf.RaggedTensor, tf.RaggedTensor, tf.RaggedTensor]:
    """(values, blank, bad) of a column of numbers, ragged; strings split at `delimiter`."""
    parts = []
    if column.strings is not None:
        s = _split(column.strings, delimiter)
        v, blank, bad = numbers.parse_float64(s.flat_values)
        parts.append((s.with_flat_values(v), s.with_flat_values(blank), s.with_flat_values(bad)))
    if column.ints is not None:
        x = column.ints
        parts.append((tf.cast(x, tf.float64), tf.zeros_like(x, tf.bool), tf.zeros_like(x, tf.bool)))
    if column.floats is not None:
        x = column.floats
        ok = tf.math.is_finite(x.flat_values)
        parts.append((x.with_flat_values(tf.where(ok, x.flat_values, tf.zeros_like(x.flat_values))),
                      tf.zeros_like(x, tf.bool), x.with_flat_values(~ok)))
    return tuple(_concat([p[i] for p in parts]) for i in range(3))


def _tokens(column: Column, delimiter: Optional[str]) -> tf.RaggedTensor:
    """A categorical column's values as tokens: strings split at the delimiter, integers' decimal text,
    floats' `repr`; blank tokens still in (they count against the weights first)."""
    parts = []
    if column.strings is not None:
        parts.append(_split(column.strings, delimiter))
    if column.ints is not None:
        parts.append(column.ints.with_flat_values(tf.strings.as_string(column.ints.flat_values)))
    if column.float_texts is not None:
        parts.append(column.float_texts)
    elif column.floats is not None:
        parts.append(column.floats.with_flat_values(numbers.float_text(column.floats.flat_values)))
    return _concat(parts)


# ---------------------------------------------------------------- the mapping

def _any_per_row(flags: tf.RaggedTensor) -> tf.Tensor:
    return tf.reduce_any(flags, axis=1)


def _not_utf8(column: Column) -> Optional[tf.Tensor]:
    """bool [batch]: rows with a string value that is not UTF-8 (None: the column has no strings). Transcoding
    replaces exactly the bytes that are not UTF-8 (as Python's strict decode rejects them), so text that
    comes back changed was not UTF-8."""
    if column.strings is None:
        return None
    flat = column.strings.flat_values
    same = tf.equal(tf.strings.unicode_transcode(flat, "UTF-8", "UTF-8", errors="replace",
                                                 replacement_char=0xFFFD), flat)
    return _any_per_row(column.strings.with_flat_values(~same))


def _categorical(f: FeaturePlan, raw: Mapping[str, Column], tables: Mapping[str, Any], nrows: tf.Tensor
                 ) -> Tuple[tf.RaggedTensor, Optional[tf.RaggedTensor], tf.Tensor]:
    """(ids, weights or None, rows the offline jobs would not use) of one feature."""
    col = raw[f.column]
    invalid = tf.zeros([nrows], tf.bool)
    typed_ints = f.kind == "identity" and col.strings is None and col.floats is None and col.ints is not None
    values: Any = col.ints if typed_ints else _tokens(col, f.delimiter)
    weights: Any = None
    if f.weight_column is not None:
        w, blank, bad = _float64(raw[f.weight_column], f.delimiter)
        w = w.with_flat_values(tf.where(blank.flat_values | bad.flat_values,
                                        tf.constant(float("nan"), tf.float64), w.flat_values))
        mismatch = tf.not_equal(w.row_lengths(), values.row_lengths())  # a dead letter: the row gets no values
        invalid |= mismatch
        values = tf.ragged.boolean_mask(values, values.with_flat_values(tf.repeat(~mismatch, values.row_lengths())))
        weights = tf.ragged.boolean_mask(w, w.with_flat_values(tf.repeat(~mismatch, w.row_lengths())))
        weights = weights.with_flat_values(tf.cast(weights.flat_values, tf.float32))
    if not typed_ints:  # blank values are no value
        nonblank = values.with_flat_values(tf.not_equal(values.flat_values, ""))
        values = tf.ragged.boolean_mask(values, nonblank)
        weights = None if weights is None else tf.ragged.boolean_mask(weights, nonblank)
    flat = values.flat_values
    keep = None
    if f.kind == "frequency":
        table = tables[str(f.vocabulary_key)]
        ids = table.lookup(flat)
        found = ids >= 0
        size = table.size() if f.vocabulary_size is None else tf.constant(int(f.vocabulary_size), tf.int64)
        if f.num_oov_buckets == 0:
            keep = found
        elif f.num_oov_buckets == 1:
            ids = tf.where(found, ids, size)
        else:
            ids = tf.where(found, ids, size + tf.strings.to_hash_bucket_fast(flat, f.num_oov_buckets))
    elif f.kind == "hashing":
        ids = tf.strings.to_hash_bucket_fast(flat, int(f.num_buckets))  # type: ignore[arg-type]
    else:
        ids, ok = (flat, tf.ones_like(flat, tf.bool)) if typed_ints else numbers.parse_int64(flat)
        ok &= (ids >= 0) & (ids < int(f.num_buckets))  # type: ignore[arg-type]
        if f.default_value is not None:
            ids = tf.where(ok, ids, tf.constant(int(f.default_value), tf.int64))
        else:
            keep = ok
            if f.invalid_ids == "error":
                invalid |= _any_per_row(values.with_flat_values(~ok))
    if weights is not None:
        w = weights.flat_values
        nan = ~tf.math.is_finite(w)
        if keep is not None:
            nan &= keep
        if f.nan_weights == "zero":
            w = tf.where(nan, tf.zeros_like(w), w)
        else:
            keep = ~nan if keep is None else keep & ~nan
            if f.nan_weights == "error":
                invalid |= _any_per_row(values.with_flat_values(nan))
        weights = weights.with_flat_values(w)
    ids = values.with_flat_values(ids)
    if keep is not None:
        kept = values.with_flat_values(keep)
        ids = tf.ragged.boolean_mask(ids, kept)
        weights = None if weights is None else tf.ragged.boolean_mask(weights, kept)
    if f.truncate:
        ids = ids[:, :f.truncate]
        weights = None if weights is None else weights[:, :f.truncate]
    return ids, weights, invalid


def _dense(d: DensePlan, column: Column, nrows: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """(float32 [batch] values, rows the offline jobs would not use): the first value, the fill where it is
    blank or missing; a record with an unparsable first value or more than one value is a dead letter offline
    (here: the fill, and flagged)."""
    v, blank, bad = _float64(column, None)
    n = v.row_lengths()
    shape = tf.stack([nrows, tf.constant(1, tf.int64)])
    first_v = v[:, :1].to_tensor(0.0, shape=shape)[:, 0]
    first_blank = blank[:, :1].to_tensor(True, shape=shape)[:, 0]  # no value: as blank, the fill
    first_bad = bad[:, :1].to_tensor(False, shape=shape)[:, 0]
    value = tf.where(first_blank | first_bad, tf.constant(d.fill, tf.float64), first_v)
    return tf.cast(value, tf.float32), first_bad | (n > 1)


def map_raw(raw: Mapping[str, Any], plan: MappingPlan, tables: Mapping[str, Any]) -> Dict[str, Any]:
    """The pure mapping: `raw` {column: tensor or `Column`} -> {"ids": {feature: int64 ragged [batch, None]},
    "weights": {feature: float32 ragged} (weighted features), "dense": float32 [batch, num_dense],
    "valid": bool [batch]}. Every column of `plan.columns` is needed (the label is not), each with the batch's rows
    (columns of unequal length are refused in one line naming them and their lengths: `_batch_rows`)."""
    missing = [c for c in plan.columns if c not in raw]
    if missing:
        raise KeyError(f"raw features lack columns {missing}; the spec reads {plan.columns}.")
    cols = {c: as_column(raw[c], c) for c in plan.columns}
    nrows = _batch_rows(cols)
    valid = tf.ones([nrows], tf.bool)
    if plan.utf8_text:
        for c in plan.columns:
            bad = _not_utf8(cols[c])
            if bad is not None:
                valid &= ~bad
    ids: Dict[str, tf.RaggedTensor] = {}
    weights: Dict[str, tf.RaggedTensor] = {}
    for f in plan.features:
        i, w, bad = _categorical(f, cols, tables, nrows)
        ids[f.name] = i
        if w is not None:
            weights[f.name] = w
        valid &= ~bad
    dense_values = []
    for d in plan.dense:
        x, bad = _dense(d, cols[d.column], nrows)
        dense_values.append(x)
        valid &= ~bad
    dense = tf.stack(dense_values, axis=1) if dense_values else tf.zeros([nrows, 0], tf.float32)
    return {"ids": ids, "weights": weights, "dense": dense, "valid": valid}


# ---------------------------------------------------------------- tf.train.Example

def _decode(data: tf.Tensor, message: str, fields: List[str], types: List[tf.DType]):
    """`tf.io.decode_proto` of [n] serialized messages, n >= 0. decode_proto refuses n = 0 ("Bufs argument must
    contain at least one value": an empty batch, or Examples none of which has a feature, give no entries to
    decode); then one empty message is decoded and its row dropped, so every output has n rows. n > 0 decodes
    `data` as it is (the slices take every row: no copy)."""
    n = tf.size(data)
    data = tf.cond(n > 0, lambda: data, lambda: tf.constant([b""]))
    sizes, values = tf.io.decode_proto(data, message, fields, types)
    return sizes[:n], [v[:n] for v in values]


def _ragged(values: tf.Tensor, sizes: tf.Tensor) -> tf.RaggedTensor:
    return tf.RaggedTensor.from_tensor(values, lengths=sizes)


def _column_index(keys: tf.Tensor, columns: Sequence[str]) -> Tuple[tf.Tensor, tf.Tensor]:
    """(whether each key is one of `columns`, its index there): keys and columns compared by a 64-bit hash (int
    compares, not entries x columns string compares), then each key with the column its hash found, exactly."""
    hashes = tf.strings.to_hash_bucket_fast(keys, (1 << 63) - 1)
    with tf.init_scope():  # the columns' hashes as constants, checked distinct (so a hash names one column)
        column_hashes = tf.strings.to_hash_bucket_fast(tf.constant(list(columns)), (1 << 63) - 1).numpy()
    if len(set(column_hashes.tolist())) != len(columns):
        raise ValueError(f"columns {list(columns)} have equal 63-bit hashes: rename one of them.")
    match = tf.equal(hashes[:, None], tf.constant(column_hashes)[None, :])
    index = tf.argmax(tf.cast(match, tf.int32), axis=1, output_type=tf.int64)
    known = tf.reduce_any(match, axis=1) & tf.equal(keys, tf.gather(tf.constant(list(columns)), index))
    return known, index


def _by_column(values: Dict[str, tf.RaggedTensor], keys: tf.Tensor, row: tf.Tensor, batch: tf.Tensor,
               columns: Sequence[str]) -> Dict[str, Dict[str, tf.RaggedTensor]]:
    """{column: {kind: [batch, None] values}} from per-entry values (one entry: one key of one example): each
    example's entry of each column (the last one when a key is given twice, as a protobuf map reads it).

    Every entry gets its (example, column) slot at once; the chosen entries are put in slot order and each
    column's rows gathered from them, so the work does not grow with columns x entries."""
    n_cols = len(columns)
    known, index = _column_index(keys, columns)
    slot = row * n_cols + index
    slots = batch * n_cols
    position = tf.range(tf.size(keys, out_type=tf.int64))
    last = tf.math.unsorted_segment_max(tf.where(known, position, -1), tf.where(known, slot, slots), slots + 1)
    chosen = known & tf.equal(position, tf.gather(last, slot))
    chosen_at = tf.boolean_mask(position, chosen)
    chosen_slot = tf.boolean_mask(slot, chosen)
    order = tf.gather(chosen_at, tf.argsort(chosen_slot, stable=True))  # entries in slot order
    present = tf.scatter_nd(tf.sort(chosen_slot)[:, None], tf.ones_like(chosen_slot), [slots]) > 0
    per_kind = {}
    for name, r in values.items():
        picked = tf.gather(r, order)
        lengths = tf.scatter_nd(tf.boolean_mask(tf.range(slots), present)[:, None], picked.row_lengths(), [slots])
        per_kind[name] = tf.RaggedTensor.from_row_lengths(picked.flat_values, lengths, validate=False)
    rows = tf.range(batch) * n_cols
    return {c: {name: tf.gather(r, rows + j) for name, r in per_kind.items()} for j, c in enumerate(columns)}


def parse_examples(serialized: tf.Tensor, columns: Sequence[str], text_columns: Sequence[str] = ()
                   ) -> Dict[str, Column]:
    """{column: Column} of serialized `tf.train.Example`s ([batch] strings), any value kind per key (bytes,
    int64 or float lists, as the offline TFRecord reader takes them); a key missing from an example is no value.
    Parsed with `tf.io.decode_proto` (plain TensorFlow); a record that is not an Example fails the call.

    `text_columns` (a subset of `columns`) come as one string `Column` of every value's token text (bytes as
    they are, integers' decimal text, floats' repr): right for a categorical column whose delimiter no number's
    text contains (`MappingPlan.text_columns`), and fewer ops than three kinds."""
    serialized = tf.reshape(tf.convert_to_tensor(serialized, tf.string), [-1])
    batch = tf.size(serialized, out_type=tf.int64)
    _, (features,) = _decode(serialized, "tensorflow.Example", ["features"], [tf.string])
    sizes, (entries,) = _decode(features[:, 0], "tensorflow.Features", ["feature"], [tf.string])
    entries = _ragged(entries, sizes[:, 0])
    row = entries.value_rowids()
    _, (keys, values) = _decode(entries.flat_values, "tensorflow.Features.FeatureEntry", ["key", "value"],
                                [tf.string, tf.string])
    keys, values = keys[:, 0], values[:, 0]
    _, lists = _decode(values, "tensorflow.Feature", ["bytes_list", "float_list", "int64_list"],
                       [tf.string, tf.string, tf.string])
    kinds = {}
    for (name, message, dtype), lst in zip((("strings", "tensorflow.BytesList", tf.string),
                                            ("floats", "tensorflow.FloatList", tf.float32),
                                            ("ints", "tensorflow.Int64List", tf.int64)), lists, strict=True):
        s, (v,) = _decode(lst[:, 0], message, ["value"], [dtype])
        kinds[name] = _ragged(tf.cast(v, tf.float64) if name == "floats" else v, s[:, 0])
    texts = [c for c in columns if c in set(text_columns)]
    others = [c for c in columns if c not in set(texts)]
    out = {}
    if texts:
        # The entries of text columns only, each as its values' token texts (one entry has one kind).
        is_text, _ = _column_index(keys, texts)
        sub = {k: tf.ragged.boolean_mask(v, is_text) for k, v in kinds.items()}
        token_texts = tf.concat([sub["strings"], sub["ints"].with_flat_values(tf.strings.as_string(
            sub["ints"].flat_values)), sub["floats"].with_flat_values(numbers.float_text(sub["floats"].flat_values))],
            axis=1)
        t_keys, t_row = tf.boolean_mask(keys, is_text), tf.boolean_mask(row, is_text)
        for c, kv in _by_column({"strings": token_texts}, t_keys, t_row, batch, texts).items():
            out[c] = Column(**kv)
    if others:
        for c, kv in _by_column(kinds, keys, row, batch, others).items():
            out[c] = Column(**kv)
    return {c: out[c] for c in columns}


# ---------------------------------------------------------------- the module

class RawFeatureMapping(tf.Module):
    """The raw -> id mapping of an artifact as a `tf.Module`: vocabulary tables over its vocabulary files
    (assets when saved), `__call__(raw)` on a dict of raw tensors, `map_examples(serialized)` on serialized
    `tf.train.Example`s; both return what `map_raw` returns."""

    def __init__(self, plan: MappingPlan, name: str = "raw_feature_mapping"):
        super().__init__(name=name)
        self._plan = plan
        self.tables = vocabulary_tables(plan)

    @classmethod
    def from_artifact(cls, artifact_dir: str, **kwargs: Any) -> "RawFeatureMapping":
        return cls(MappingPlan.from_artifact(artifact_dir), **kwargs)

    @property
    def plan(self) -> MappingPlan:
        return self._plan

    @property
    def columns(self) -> List[str]:
        return self._plan.columns

    def __call__(self, raw: Mapping[str, Any]) -> Dict[str, Any]:
        return map_raw(raw, self._plan, self.tables)

    def map_examples(self, serialized: tf.Tensor) -> Dict[str, Any]:
        return map_raw(parse_examples(serialized, self.columns, self._plan.text_columns), self._plan, self.tables)
