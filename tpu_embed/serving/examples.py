"""Serialized tf.train.Examples -> raw `Column`s: typed where the training data held one value kind per key,
any kind elsewhere.

* `parse_typed(serialized, kinds)`: `tf.io.parse_example`'s kernel (ParseExampleV2, ragged features) with each
  column's one kind (`bytes_list` -> strings, `int64_list` -> integers, `float_list` -> floats); a key missing
  from an Example, or a Feature with no kind, is no value. An Example holding one of these keys as another kind
  fails the call with TensorFlow's one line naming the key, the Example's index and both kinds (`Key: C1, Index:
  3.  Data types don't match. Expected type: string, Actual type: int64`): never a wrong id.
* `parse_examples(serialized, columns)`: any value kind per key, also one that changes from Example to Example,
  as the offline TFRecord reader takes them (`tf.io.decode_proto` of the Example, its entries and their value
  lists): several times the ops and the time of the typed parse.
* `parse_for_plan(serialized, plan, value_kinds)`: the typed parse for every column of one recorded kind (or
  none: the training data held no value; read as bytes), `parse_examples` for the columns of several kinds,
  every column as any kind where nothing was recorded (`value_kinds=None`).

The kinds are the manifest's `value_kinds` ({column: the kinds its values had in the records the jobs read};
`tpu_embed.artifact.manifest.Manifest.value_kinds`): CSV cells are text (`bytes_list`), Parquet columns the kind
of their Arrow type, TFRecord keys the kinds their Features held.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tpu_embed.serving import number_text
from tpu_embed.serving.columns import Column
from tpu_embed.serving.rules import MappingPlan

__all__ = ["KINDS", "parse_examples", "parse_for_plan", "parse_typed", "typed_kinds"]

KINDS = ("bytes_list", "float_list", "int64_list")  # tf.train.Feature's kinds, as its oneof names them
_DTYPES = {"bytes_list": tf.string, "float_list": tf.float32, "int64_list": tf.int64}


def typed_kinds(columns: Sequence[str], value_kinds: Optional[Mapping[str, Sequence[str]]]) -> Dict[str, str]:
    """{column: the one kind it is parsed as}: columns recorded with one kind, and as `bytes_list` those the
    record does not list (the training data held no value of them); columns of several kinds are parsed as any
    kind, and every column where nothing was recorded (`value_kinds` None)."""
    if value_kinds is None:
        return {}
    out = {}
    for c in columns:
        kinds = value_kinds.get(c, ())
        if len(kinds) <= 1:
            out[c] = kinds[0] if kinds else "bytes_list"
    return out


def parse_typed(serialized: tf.Tensor, kinds: Mapping[str, str]) -> Dict[str, Column]:
    """{column: Column} of [batch] serialized tf.train.Examples, each column parsed as its kind (module
    docstring). One kernel for every column."""
    names = list(kinds)
    out = tf.raw_ops.ParseExampleV2(
        serialized=serialized, names=tf.constant([], tf.string), sparse_keys=tf.constant([], tf.string),
        dense_keys=tf.constant([], tf.string), ragged_keys=tf.constant(names, tf.string), dense_defaults=[],
        num_sparse=0, sparse_types=[], ragged_value_types=[_DTYPES[kinds[c]] for c in names],
        ragged_split_types=[tf.int64] * len(names), dense_shapes=[], name="parse_examples_as_trained_kinds")
    columns = {}
    for c, values, splits in zip(names, out.ragged_values, out.ragged_row_splits, strict=True):
        kind = kinds[c]
        rt = tf.RaggedTensor.from_row_splits(values, splits, validate=False)
        columns[c] = Column(**{{"bytes_list": "strings", "int64_list": "ints", "float_list": "floats"}[kind]: rt})
    return columns


def parse_for_plan(serialized: tf.Tensor, plan: MappingPlan, value_kinds: Optional[Mapping[str, Sequence[str]]]
                   ) -> Tuple[Dict[str, Column], tf.Tensor]:
    """({column: Column} of every column the plan reads, the batch's rows) of serialized tf.train.Examples: the
    typed parse where `typed_kinds` gives a kind, any kind for the other columns (module docstring)."""
    serialized = tf.reshape(tf.convert_to_tensor(serialized, tf.string), [-1])
    nrows = tf.size(serialized, out_type=tf.int64)
    typed = typed_kinds(plan.columns, value_kinds)
    columns: Dict[str, Column] = parse_typed(serialized, typed) if typed else {}
    rest = [c for c in plan.columns if c not in typed]
    if rest:
        columns.update(parse_examples(serialized, rest, [c for c in plan.text_columns if c in rest]))
    return columns, nrows


# ---------------------------------------------------------------- any kind per key

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
    Parsed with `tf.io.decode_proto` (plain TensorFlow); a record that is not an Example fails the call. An
    Example whose `features` field occurs twice on the wire is read with the last occurrence only (protobuf,
    and the typed parse, merge them).

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
            sub["ints"].flat_values)), sub["floats"].with_flat_values(
                number_text.float_text(sub["floats"].flat_values))],
            axis=1)
        t_keys, t_row = tf.boolean_mask(keys, is_text), tf.boolean_mask(row, is_text)
        for c, kv in _by_column({"strings": token_texts}, t_keys, t_row, batch, texts).items():
            out[c] = Column(**kv)
    if others:
        for c, kv in _by_column(kinds, keys, row, batch, others).items():
            out[c] = Column(**kv)
    return {c: out[c] for c in columns}
