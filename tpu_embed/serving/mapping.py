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
* identity: the integer (`tpu_embed.serving.number_text.parse_int64`); a value that is not an integer in
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
each one gets. The label is not read. A column the raw features leave out has no value in any row (as an
Example without that key).

The graph is compact: the columns are stacked (`tpu_embed.serving.columns`) and every rule runs once over all
the features that take it (one split per delimiter, one number parse, one mask per step), features grouped by
rule (`tpu_embed.serving.feature_layout.Layout`): the ops per feature are one lookup per frequency vocabulary
and one hash per distinct `num_buckets` (`tpu_embed.serving.token_ids`), whatever the number of columns.
`map_stacked` gives the result in that form (`Mapped`: every feature's ids in one ragged tensor), which
`tpu_embed.serving.export` looks up without splitting it per feature.

`map_raw(raw, plan, tables)` is the pure function under the module (no Keras, no Python per value): a
`tf.Transform` preprocessing function or any `tf.function` can call it with tables made by
`vocabulary_tables(plan)`.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tpu_embed.artifact import io as tio
from tpu_embed.serving import number_text
from tpu_embed.serving.columns import (
    Column,
    Stacked,
    as_column,
    batch_rows,
    block_of_rows,
    concat_rows,
    per_row,
    rows_of,
    stack,
    stack_strings,
    value_rowids,
)
from tpu_embed.serving.examples import parse_examples, parse_for_plan
from tpu_embed.serving.feature_layout import Layout, Source, runs
from tpu_embed.serving.rules import DensePlan, FeaturePlan, MappingPlan, load_for_serving
from tpu_embed.serving.token_ids import policy, token_ids

__all__ = ["Column", "FeaturePlan", "DensePlan", "Mapped", "MappingPlan", "RawFeatureMapping",
           "map_raw", "map_stacked", "parse_examples", "vocabulary_tables"]


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


@dataclasses.dataclass
class Mapped:
    """`map_stacked`'s result: every feature's ids in one ragged tensor, features in `layout.features` order
    (feature k's rows at k * nrows ... (k + 1) * nrows - 1)."""

    layout: Layout
    nrows: tf.Tensor  # int64
    ids: tf.RaggedTensor  # int64 [num_features * nrows, None]
    weights: Optional[tf.Tensor]  # float32 [ids' values]: 1.0 for features without weights; None if none has
    dense: tf.Tensor  # float32 [nrows, num_dense]
    valid: tf.Tensor  # bool [nrows]
    rowids: tf.Tensor  # int64 [ids' values]: `ids.value_rowids()`, made once

    def feature_ids(self) -> Dict[str, Any]:
        """{"ids": {feature: int64 ragged [batch, None]}, "weights": {weighted feature: float32 ragged}}: one
        split of the values and one of the rows for all the features."""
        feats = self.layout.features
        num, n = len(feats), self.nrows
        splits = self.ids.row_splits
        # Each feature's row splits: its block of the splits, shifted to start at 0.
        starts = splits[:-1:n] if num > 1 else splits[:1]
        ends = splits[n::n] if num > 1 else splits[-1:]
        rows = tf.concat([tf.reshape(splits[:-1], [num, n]), ends[:, None]], axis=1) - starts[:, None]
        sizes = ends - starts
        values = tf.split(self.ids.flat_values, sizes, num=num) if num > 1 else [self.ids.flat_values]
        weights = ([None] * num if self.weights is None
                   else tf.split(self.weights, sizes, num=num) if num > 1 else [self.weights])
        ids, out_weights = {}, {}
        for f, v, w, r in zip(feats, values, weights, tf.unstack(rows, num=num), strict=True):
            ids[f.name] = tf.RaggedTensor.from_row_splits(v, r, validate=False)
            if f.weight_column:
                out_weights[f.name] = tf.RaggedTensor.from_row_splits(w, r, validate=False)
        return {"ids": ids, "weights": out_weights}


# ---------------------------------------------------------------- steps over stacked columns

def _any_per_row(flags: tf.Tensor, rowids: tf.Tensor, blocks: int, nrows: tf.Tensor) -> tf.Tensor:
    """bool [nrows]: rows of the batch with a flag set (`flags` per value, `rowids` its row of a [blocks * nrows,
    None] ragged tensor)."""
    per_row = tf.math.unsorted_segment_max(tf.cast(flags, tf.int32), rowids, blocks * nrows) > 0
    return tf.reduce_any(tf.reshape(per_row, [blocks, nrows]), axis=0)


def _split(strings: tf.RaggedTensor, delimiter: Optional[str]) -> tf.RaggedTensor:
    """Each string value split at `delimiter` (literally, as pyarrow's split_pattern), rows kept."""
    if delimiter is None:
        return strings
    return strings.with_flat_values(tf.strings.split(strings.flat_values, sep=delimiter)).merge_dims(1, 2)


def _split_sources(strings: tf.RaggedTensor, sources: Sequence[Source], nrows: tf.Tensor, count: int
                   ) -> tf.RaggedTensor:
    """[len(sources) * nrows, None]: each source's column of `strings` ([count * nrows, None]) split at its
    delimiter; `sources` are grouped by delimiter (`Layout`), so one split per delimiter."""
    parts = []
    for start, end, delimiter in runs([d for _, d in sources]):
        parts.append(_split(rows_of(strings, [c for c, _ in sources[start:end]], nrows, count), delimiter))
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)


def _empty(rows: tf.Tensor, dtype: tf.DType, inner: Sequence[int] = ()) -> tf.RaggedTensor:
    return tf.RaggedTensor.from_row_lengths(tf.zeros([0, *inner], dtype), tf.zeros([rows], tf.int64),
                                            validate=False)


def _tokens(st: Stacked, sources: Sequence[Source]) -> tf.RaggedTensor:
    """[len(sources) * nrows, None] token texts of the sources: strings split at the delimiter, integers' decimal
    text, floats' `repr` (row by row in that order); blank tokens still in (they count against weights)."""
    n, count = st.nrows, len(st.names)
    columns = [c for c, _ in sources]
    parts = []
    if st.strings is not None:
        parts.append(_split_sources(st.strings, sources, n, count))
    if st.ints is not None:
        x = rows_of(st.ints, columns, n, count)
        parts.append(x.with_flat_values(tf.strings.as_string(x.flat_values)))
    if st.floats is not None:
        x = rows_of(st.floats, columns, n, count)
        parts.append(x.with_flat_values(number_text.float_text(x.flat_values)))
    if not parts:
        return _empty(len(sources) * n, tf.string)
    return concat_rows(parts)


_BLANK = float("inf")  # `_numbers`' value of a blank (a number is finite)
_BAD = float("nan")  # and of a value that is not a number, or not finite


def _f64(x: float) -> tf.Tensor:
    return tf.constant(x, tf.float64)


def _numbers(st: Stacked, sources: Sequence[Source], plain: tf.Tensor) -> tf.RaggedTensor:
    """[len(sources) * nrows, None] float64: each value of the sources (strings split at the delimiter and parsed
    as `pipelines.read.parse.parse_floats`; integers; floats), +inf (`_BLANK`) where blank and NaN (`_BAD`)
    where not a number or not finite: one float per value."""
    n, count = st.nrows, len(st.names)
    columns = [c for c, _ in sources]
    parts = []
    if st.strings is not None:
        s = _split_sources(st.strings, sources, n, count)
        # split values of plain numbers are plain numbers or empty (no delimiter holds a digit, '.', ... and
        # so splits one): the check of the unsplit strings holds for them
        v, blank, bad = number_text.parse_float64(s.flat_values, plain=plain if _plain_delimiters(sources) else None)
        parts.append(s.with_flat_values(tf.where(blank, _f64(_BLANK), tf.where(bad, _f64(_BAD), v))))
    if st.ints is not None:
        x = rows_of(st.ints, columns, n, count)
        parts.append(x.with_flat_values(tf.cast(x.flat_values, tf.float64)))
    if st.floats is not None:
        x = rows_of(st.floats, columns, n, count)
        parts.append(x.with_flat_values(tf.where(tf.math.is_finite(x.flat_values), x.flat_values, _f64(_BAD))))
    if not parts:
        return _empty(len(sources) * n, tf.float64)
    return concat_rows(parts)


def _plain_delimiters(sources: Sequence[Source]) -> bool:
    """Whether the sources' delimiters split plain numbers (digits, signs, '.', 'e', ASCII whitespace) into
    plain numbers or empty strings only: no delimiter, or one without those characters."""
    return all(d is None or not set(d) & set("0123456789+-.eE \t\n\x0b\x0c\r") for _, d in sources)


def _not_utf8(tokens: tf.RaggedTensor, rowids: tf.Tensor, known: Optional[tf.Tensor],
              number_strings: Optional[tf.RaggedTensor], plain: tf.Tensor, nfeat: int, nrows: tf.Tensor) -> tf.Tensor:
    """bool [nrows]: rows with a token or number string that is not UTF-8 (CSV specs: the reader's dead letter).
    Known tokens (lines of a UTF-8 vocabulary) and plain numbers are UTF-8; where every token is known and every
    number plain, nothing more is done. Else the other strings are checked: ASCII ones are UTF-8, and
    transcoding replaces exactly the bytes that are not UTF-8 (as Python's strict decode rejects them), so text
    that comes back changed was not UTF-8 (a row's strings are transcoded joined by a newline, which ends any
    byte sequence a string leaves unfinished)."""
    zeros = tf.zeros([nrows], tf.bool)

    def check():
        at = None if known is None else tf.where(~known)[:, 0]
        flat = tokens.flat_values if at is None else tf.gather(tokens.flat_values, at)
        rid = rowids if at is None else tf.gather(rowids, at)
        strings, rows = [flat], [rid - nrows * tf.gather(block_of_rows(nfeat, nrows), rid)]  # rows of the batch
        if number_strings is not None:
            nid = value_rowids(number_strings)
            blocks = number_strings.nrows() // tf.maximum(nrows, 1)
            strings.append(number_strings.flat_values)
            rows.append(nid - nrows * tf.gather(block_of_rows(blocks, nrows), nid))
        flat, rows = tf.concat(strings, axis=0), tf.concat(rows, axis=0)

        def transcode():
            joined = tf.strings.unsorted_segment_join(flat, rows, nrows, separator="\n")
            return tf.not_equal(tf.strings.unicode_transcode(joined, "UTF-8", "UTF-8", errors="replace",
                                                             replacement_char=0xFFFD), joined)
        return tf.cond(number_text.all_ascii(flat), lambda: zeros, transcode)

    if known is None:
        return check()
    return tf.cond(plain & tf.reduce_all(known), lambda: zeros, check)


def _dense(plan: MappingPlan, layout: Layout, numbers_: Optional[tf.RaggedTensor], nrows: tf.Tensor
           ) -> Tuple[tf.Tensor, tf.Tensor]:
    """(float32 [nrows, num_dense], rows the offline jobs would not use): each dense column's first value, the
    fill where it is blank or missing; a record with an unparsable first value or more than one value is a dead
    letter offline (here: the fill, and flagged). `numbers_`: `_numbers` of `layout.number_sources`."""
    num = len(plan.dense)
    if not num or numbers_ is None:
        return tf.zeros([nrows, 0], tf.float32), tf.zeros([nrows], tf.bool)
    x = rows_of(numbers_, layout.dense_sources, nrows, len(layout.number_sources))
    lengths = x.row_lengths()
    padded = tf.concat([x.flat_values, tf.constant([_BLANK], tf.float64)], axis=0)  # no value: as blank
    first = tf.gather(padded, tf.where(lengths > 0, x.row_splits[:-1], tf.shape(x.flat_values, tf.int64)[0]))
    fills = per_row([d.fill for d in plan.dense], tf.float64, nrows)
    bad = tf.math.is_nan(first)
    value = tf.cast(tf.where(tf.math.is_finite(first), first, fills), tf.float32)
    flagged = tf.reduce_any(tf.reshape(bad | (lengths > 1), [num, nrows]), axis=0)
    if num == 1:
        return value[:, None], flagged
    # [num, nrows] -> [nrows, num] by a gather of the values in row order
    order = tf.reshape(tf.range(num, dtype=tf.int64)[None, :] * nrows + tf.range(nrows)[:, None], [-1])
    return tf.reshape(tf.gather(value, order), [nrows, num]), flagged




def _weights(layout: Layout, tokens: tf.RaggedTensor, rowids: tf.Tensor, numbers_: tf.RaggedTensor,
             nrows: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """(float64 weight of every token, False where its row is a weight mismatch) of the features' tokens: a
    weighted feature's value gets its weight (NaN where blank or unparsable), others 1.0. A weighted feature's
    row whose values and weights differ in number is a `weight_mismatch` dead letter: it keeps no value."""
    nfeat = len(layout.features)
    w = rows_of(numbers_, list(layout.weight_sources), nrows, len(layout.number_sources))
    w_values = tf.where(tf.math.is_finite(w.flat_values), w.flat_values, _f64(_BAD))  # blank or bad: NaN
    where = {k: j for j, k in enumerate(layout.weighted)}
    block = per_row([where.get(k, -1) for k in range(nfeat)], tf.int64, nrows)  # per row
    weighted = block >= 0
    # Per row of the features: its row of `w` (rows without weights: an appended empty row).
    w_lengths = tf.concat([w.row_lengths(), tf.zeros([1], tf.int64)], axis=0)
    w_starts = tf.concat([w.row_splits[:-1], tf.zeros([1], tf.int64)], axis=0)
    row_in_block = tf.range(nfeat * nrows, dtype=tf.int64) - block_of_rows(nfeat, nrows) * nrows
    w_row = tf.where(weighted, block * nrows + row_in_block,
                     tf.size(w_lengths, out_type=tf.int64) - 1)
    n_w = tf.size(w_values, out_type=tf.int64)
    mismatch = weighted & tf.not_equal(tf.gather(w_lengths, w_row), tokens.row_lengths())
    # Each token's weight: its row's weights from the same position.
    token_row = rowids
    position = tf.range(tf.size(tokens.flat_values, out_type=tf.int64)) - tf.gather(tokens.row_splits, token_row)
    has = tf.gather(weighted & ~mismatch, token_row)
    index = tf.where(has, tf.gather(w_starts, tf.gather(w_row, token_row)) + position, n_w)
    value = tf.gather(tf.concat([w_values, tf.ones([1], tf.float64)], axis=0), index)
    return value, mismatch


def map_stacked(plan: MappingPlan, layout: Layout, tokens_of: Stacked, numbers_of: Stacked,
                tables: Mapping[str, Any], utf8_vocabularies: AbstractSet[str] = frozenset()) -> Mapped:
    """The mapping of a batch whose columns are stacked: `tokens_of` holds `layout.token_columns`, `numbers_of`
    `layout.number_columns`, both of `nrows` rows. `utf8_vocabularies`: vocabulary keys whose files are UTF-8
    text (`utf8_vocabulary_keys`): for the UTF-8 rule of CSV specs, a token found in one is UTF-8.

    Every token is mapped (a blank one, or one of a mismatched row, too: its id is computed and dropped), and
    what the offline jobs drop (blanks, weight mismatches, unknown tokens without OOV buckets, identity values
    that are no id, NaN weights under `drop` / `error`, values beyond a sequence's length) is dropped by one mask
    at the end, so the strings are not copied to be filtered."""
    nrows = tokens_of.nrows
    feats = layout.features
    valid = tf.ones([nrows], tf.bool)
    number_strings = numbers_of.strings
    # Whether the number strings are all plain numbers or empty (so ASCII), for their parse and the UTF-8 check
    plain = number_text.plain_or_empty(number_strings.flat_values) if number_strings is not None else tf.constant(True)
    nums = _numbers(numbers_of, layout.number_sources, plain) if layout.number_sources else None
    dense, flagged = _dense(plan, layout, nums, nrows)
    valid &= ~flagged
    if not feats:
        if plan.utf8_text:
            valid &= ~_not_utf8(_empty(0, tf.string), tf.zeros([0], tf.int64), None, number_strings, plain, 0, nrows)
        return Mapped(layout, nrows, _empty(0, tf.int64), None, dense, valid, tf.zeros([0], tf.int64))
    tokens = rows_of(_tokens(tokens_of, layout.token_sources), list(layout.feature_token_source), nrows,
                     len(layout.token_sources))
    rowids = value_rowids(tokens)  # per token: its feature's position * nrows + its row
    keep = tf.not_equal(tokens.flat_values, "")  # blank values are no value
    weights = None
    if layout.weighted:
        weights, mismatch = _weights(layout, tokens, rowids, nums, nrows)
        valid &= ~tf.reduce_any(tf.reshape(mismatch, [len(feats), nrows]), axis=0)
        keep &= ~tf.gather(mismatch, rowids)
    ids, kept, flags, known = token_ids(feats, tokens, rowids, tables, nrows, tokens_of.string_columns,
                                        utf8_vocabularies)
    if plan.utf8_text:
        valid &= ~_not_utf8(tokens, rowids, known, number_strings, plain, len(feats), nrows)
    if flags is not None:
        valid &= ~_any_per_row(flags & keep, rowids, len(feats), nrows)
    if kept is not None:
        keep &= kept
    if weights is not None:
        weights, keep, valid = _nan_weights(feats, layout.weighted, weights, keep, valid, rowids, nrows)
    if any(f.truncate for f in feats):
        keep &= _within_length(feats, tokens, rowids, keep, nrows)
    out, out_rowids, out_weights = _kept(tokens, ids, rowids, keep, weights)
    return Mapped(layout, nrows, out, None if weights is None else out_weights, dense, valid, out_rowids)


def _nan_weights(feats: Sequence[FeaturePlan], weighted: Sequence[int], weights: tf.Tensor, keep: tf.Tensor,
                 valid: tf.Tensor, rowids: tf.Tensor, nrows: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(weights, keep, valid) after `policies.nan_weights` on the kept values' NaN weights: `zero` makes them 0,
    `drop` drops the value, `error` drops it and flags its row."""
    nan = ~tf.math.is_finite(weights) & keep
    nan_policy = policy([feats[k] for k in weighted], "nan_weights")
    if nan_policy == "zero":
        weights = tf.where(nan, tf.zeros_like(weights), weights)
    else:
        keep &= ~nan
        if nan_policy == "error":
            valid &= ~_any_per_row(nan, rowids, len(feats), nrows)
    return weights, keep, valid


def _within_length(feats: Sequence[FeaturePlan], tokens: tf.RaggedTensor, rowids: tf.Tensor, keep: tf.Tensor,
                   nrows: tf.Tensor) -> tf.Tensor:
    """bool per token: among the first `truncate` kept tokens of its row (features without `truncate`: all)."""
    # A token's place among its row's kept tokens: the first `truncate` are kept.
    count = tf.cast(keep, tf.int64)
    before = tf.cumsum(count, exclusive=True)
    at_start = tf.gather(tf.concat([before, [tf.reduce_sum(count)]], axis=0), tokens.row_splits[:-1])
    place = before - tf.gather(at_start, rowids)
    limit = tf.gather(per_row([f.truncate or -1 for f in feats], tf.int64, nrows), rowids)
    return (limit < 0) | (place < limit)


def _kept(tokens: tf.RaggedTensor, ids: tf.Tensor, rowids: tf.Tensor, keep: tf.Tensor, weights: Optional[tf.Tensor]
          ) -> Tuple[tf.RaggedTensor, tf.Tensor, tf.Tensor]:
    """(ids ragged like `tokens` with the kept values only, their rowids, their float32 weights (empty without
    weights)): one mask, where it drops a value (a batch whose every value is kept skips the gathers)."""
    def masked():
        out, at = _mask(tokens.with_flat_values(ids), rowids, keep)
        return (out.flat_values, out.row_splits, tf.gather(rowids, at),
                tf.zeros([0]) if weights is None else tf.cast(tf.gather(weights, at), tf.float32))

    def as_they_are():
        return (ids, tokens.row_splits, rowids, tf.zeros([0]) if weights is None else tf.cast(weights, tf.float32))

    values, splits, out_rowids, out_weights = tf.cond(tf.reduce_all(keep), as_they_are, masked)
    return tf.RaggedTensor.from_row_splits(values, splits, validate=False), out_rowids, out_weights

def _mask(x: tf.RaggedTensor, rowids: tf.Tensor, keep: tf.Tensor) -> Tuple[tf.RaggedTensor, tf.Tensor]:
    """(`x` ([rows, None]) with the values where `keep` only, rows kept; the positions of those values): the
    rows' lengths by a segment sum of `keep` over `rowids` (`x.value_rowids()`)."""
    lengths = tf.math.unsorted_segment_sum(tf.cast(keep, tf.int64), rowids, x.nrows())
    at = tf.where(keep)[:, 0]
    return tf.RaggedTensor.from_row_lengths(tf.gather(x.flat_values, at), lengths, validate=False), at


def map_columns(plan: MappingPlan, columns: Mapping[str, Column], nrows: tf.Tensor, tables: Mapping[str, Any],
                layout: Optional[Layout] = None, utf8_vocabularies: AbstractSet[str] = frozenset()) -> Mapped:
    """`map_stacked` of {column: `Column`} of `nrows` rows (a column missing from `columns` has no values)."""
    layout = layout or Layout.of(plan)
    filled = {c: columns.get(c, Column()) for c in plan.columns}
    return map_stacked(plan, layout, stack(filled, layout.token_columns, nrows),
                       stack(filled, layout.number_columns, nrows), tables, utf8_vocabularies)


def _is_cells(x: Any) -> bool:
    """A [batch] string tensor: one CSV cell a row (the `raw` signature's columns)."""
    return isinstance(x, tf.Tensor) and x.dtype == tf.string and x.shape.rank == 1


def map_raw_stacked(raw: Mapping[str, Any], plan: MappingPlan, tables: Mapping[str, Any],
                    layout: Optional[Layout] = None, utf8_vocabularies: AbstractSet[str] = frozenset()) -> Mapped:
    """`map_raw`'s mapping as `Mapped`. When every column given is a [batch] string tensor (CSV cells: the `raw`
    signature's), they are stacked in one op."""
    layout = layout or Layout.of(plan)
    given = [c for c in plan.columns if c in raw]
    if not given:
        raise KeyError(f"raw features have none of the columns the spec reads, {plan.columns}: give at least one "
                       "(a column left out has no value in any row).")
    values = {c: raw[c] if isinstance(raw[c], (tf.RaggedTensor, tf.SparseTensor, Column))
              else tf.convert_to_tensor(raw[c]) for c in given}
    if all(_is_cells(values[c]) for c in given):
        nrows = batch_rows({c: tf.shape(values[c], out_type=tf.int64)[0] for c in given})
        with tf.control_dependencies([nrows]):  # stacking unequal columns would fail first, without the names
            return map_stacked(plan, layout, stack_strings(values, layout.token_columns, nrows),
                               stack_strings(values, layout.number_columns, nrows), tables, utf8_vocabularies)
    cols = {c: as_column(values[c], c) for c in given}
    nrows = batch_rows({c: cols[c].parts()[0].nrows() for c in given})
    with tf.control_dependencies([nrows]):
        return map_columns(plan, cols, nrows, tables, layout, utf8_vocabularies)


def _as_output(mapped: Mapped) -> Dict[str, Any]:
    return {**mapped.feature_ids(), "dense": mapped.dense, "valid": mapped.valid}


def map_raw(raw: Mapping[str, Any], plan: MappingPlan, tables: Mapping[str, Any]) -> Dict[str, Any]:
    """The pure mapping: `raw` {column: tensor or `Column`} -> {"ids": {feature: int64 ragged [batch, None]},
    "weights": {feature: float32 ragged} (weighted features), "dense": float32 [batch, num_dense],
    "valid": bool [batch]}. A column of `plan.columns` that `raw` leaves out has no value in any row (as an
    Example without that key); the label is not read. The columns given must have the batch's rows (columns of
    unequal length are refused in one line naming them and their lengths: `columns.batch_rows`)."""
    return _as_output(map_raw_stacked(raw, plan, tables))


def utf8_vocabulary_keys(plan: MappingPlan) -> AbstractSet[str]:
    """The vocabulary keys whose files are UTF-8 text, so every token of their tables is (a CSV spec's are: the
    CSV reader dead-letters records that are not; a vocabulary taken from elsewhere may not be). Read once when
    a mapping is made."""
    keys = set()
    for key, path in plan.vocabulary_files.items():
        try:
            tio.read_bytes(path).decode("utf-8")
        except UnicodeDecodeError:
            continue
        keys.add(key)
    return frozenset(keys)


# ---------------------------------------------------------------- the module

class RawFeatureMapping(tf.Module):
    """The raw -> id mapping of an artifact as a `tf.Module`: vocabulary tables over its vocabulary files
    (assets when saved), `__call__(raw)` on a dict of raw tensors, `map_examples(serialized)` on serialized
    `tf.train.Example`s; both return what `map_raw` returns.

    `value_kinds`: {column: the tf.train.Feature kinds its values had in the training data} (the manifest's
    `value_kinds`): `map_examples` parses a column of one kind as that kind (`tf.io.parse_example`'s kernel),
    and a column of several kinds as any kind (`tpu_embed.serving.examples`). None (an artifact without the
    record): every column as any kind."""

    def __init__(self, plan: MappingPlan, name: str = "raw_feature_mapping",
                 value_kinds: Optional[Mapping[str, Sequence[str]]] = None):
        super().__init__(name=name)
        self._plan = plan
        self._layout = Layout.of(plan)
        self._value_kinds = None if value_kinds is None else {c: tuple(k) for c, k in value_kinds.items()}
        self._utf8 = utf8_vocabulary_keys(plan) if plan.utf8_text else frozenset()
        self.tables = vocabulary_tables(plan)

    @classmethod
    def from_artifact(cls, artifact_dir: str, **kwargs: Any) -> "RawFeatureMapping":
        """The mapping of an artifact, its vocabulary files checked (`rules.load_for_serving`), its Examples parsed
        as the manifest's `value_kinds` say (unless `value_kinds=` is given)."""
        artifact, plan = load_for_serving(artifact_dir)
        kwargs.setdefault("value_kinds", artifact.manifest.value_kinds)
        return cls(plan, **kwargs)

    @property
    def plan(self) -> MappingPlan:
        return self._plan

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def value_kinds(self) -> Optional[Dict[str, Tuple[str, ...]]]:
        return self._value_kinds

    @property
    def columns(self) -> List[str]:
        return self._plan.columns

    def __call__(self, raw: Mapping[str, Any]) -> Dict[str, Any]:
        return _as_output(self.map_raw_stacked(raw))

    def map_raw_stacked(self, raw: Mapping[str, Any]) -> Mapped:
        return map_raw_stacked(raw, self._plan, self.tables, self._layout, self._utf8)

    def map_examples(self, serialized: tf.Tensor, any_kind: bool = False) -> Dict[str, Any]:
        """`__call__`'s result from serialized tf.train.Examples; `any_kind`: every column parsed as any kind."""
        return _as_output(self.map_examples_stacked(serialized, any_kind))

    def map_examples_stacked(self, serialized: tf.Tensor, any_kind: bool = False) -> Mapped:
        columns, nrows = parse_for_plan(serialized, self._plan, None if any_kind else self._value_kinds)
        return map_columns(self._plan, columns, nrows, self.tables, self._layout, self._utf8)
