"""Raw columns of a batch, and the same columns stacked: the form `tpu_embed.serving.mapping` maps in one pass.

A `Column` is one raw column: its values per row as strings, integers and / or floats ([batch, None] ragged
tensors; a row's values are of one kind). `stack(columns, names, nrows)` puts many columns one after the other,
per kind: a [len(names) * batch, None] ragged tensor whose rows i * batch ... (i + 1) * batch - 1 are column i's
(empty rows where a column has no value of the kind). Every later step (splitting at delimiters, parsing
numbers, looking up vocabularies, masks, combiners) then runs once over all the columns that take it, so the
graph's ops do not grow with the number of columns: only the vocabulary lookups and the tables' gathers are per
vocabulary or table.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

__all__ = ["Column", "Stacked", "as_column", "batch_rows", "block_of_rows", "concat_rows", "per_row", "rows_of",
           "stack", "value_rowids"]


@dataclasses.dataclass
class Column:
    """One raw column of a batch: its values per row, as strings, integers and / or floats ([batch, None] ragged
    tensors; a row's values are of one kind). A raw tensor gives one kind, tf.train.Examples up to all three."""

    strings: Optional[tf.RaggedTensor] = None
    ints: Optional[tf.RaggedTensor] = None  # int64
    floats: Optional[tf.RaggedTensor] = None  # float64 (or float32: an Example's FloatList)

    def parts(self) -> List[tf.RaggedTensor]:
        return [p for p in (self.strings, self.ints, self.floats) if p is not None]


def _int64_splits(x: tf.RaggedTensor) -> tf.RaggedTensor:
    return x if x.row_splits.dtype == tf.int64 else x.with_row_splits_dtype(tf.int64)


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
    x = _int64_splits(x)
    d = x.dtype
    if d == tf.string:
        return Column(strings=x)
    if d.is_integer and d not in (tf.uint64,):
        return Column(ints=tf.cast(x, tf.int64))
    if d.is_floating:
        return Column(floats=tf.cast(x, tf.float64))
    raise TypeError(f"raw column {name!r} has type {d.name}: expected strings, integers or floats.")


# ---------------------------------------------------------------- the batch's rows

_UNEQUAL = "raw columns of unequal length: "
_UNEQUAL_FIX = ": give every column one entry per row of the batch (a blank string for no value)."


def batch_rows(lengths: Mapping[str, tf.Tensor]) -> tf.Tensor:
    """The rows of the batch from {column: its rows}, checked equal. Columns of unequal length are refused in one
    line naming each column whose length is not the one most columns have, its length and that one: a
    `ValueError` where the lengths are known when the ops are made (eager), else an assert in the graph
    (`InvalidArgumentError` when it runs), which the rows returned depend on."""
    names = list(lengths)
    rows = [lengths[c] for c in names]
    if len(rows) == 1:
        return tf.cast(rows[0], tf.int64)
    known = [tf.get_static_value(r) for r in rows]
    if all(k is not None for k in known):
        counts = [int(k) for k in known]
        common = max(counts, key=counts.count)  # the first of the most frequent
        if any(n != common for n in counts):
            ref = names[counts.index(common)]
            odd = ", ".join(f"{c} has {n} rows" for c, n in zip(names, counts, strict=True) if n != common)
            raise ValueError(f"{_UNEQUAL}{odd}, where {ref} has {common}{_UNEQUAL_FIX}")
        return tf.cast(rows[0], tf.int64)
    all_rows = tf.cast(tf.stack(rows), tf.int64)
    same = tf.cast(tf.equal(all_rows[:, None], all_rows[None, :]), tf.int32)
    at = tf.argmax(tf.reduce_sum(same, axis=1), output_type=tf.int32)  # the first of the most frequent
    common = all_rows[at]
    odd = tf.not_equal(all_rows, common)
    named = tf.constant(names)  # unquoted: the assert's message escapes quotes
    text = tf.strings.reduce_join(tf.boolean_mask(named + " has " + tf.strings.as_string(all_rows) + " rows", odd),
                                  separator=", ")
    message = tf.strings.join([_UNEQUAL, text, ", where ", tf.gather(named, at), " has ",
                               tf.strings.as_string(common), _UNEQUAL_FIX])
    check = tf.debugging.Assert(~tf.reduce_any(odd), [message])
    with tf.control_dependencies([check]):
        return tf.identity(common)


# ---------------------------------------------------------------- columns stacked per kind

@dataclasses.dataclass
class Stacked:
    """Columns `names` of a batch of `nrows` rows, stacked per kind: [len(names) * nrows, None] ragged tensors,
    column-major (column i's rows at i * nrows ... (i + 1) * nrows - 1); None where no column has the kind."""

    names: List[str]
    nrows: tf.Tensor  # int64 scalar
    strings: Optional[tf.RaggedTensor] = None
    ints: Optional[tf.RaggedTensor] = None
    floats: Optional[tf.RaggedTensor] = None  # float64
    # {column: its string values} where `strings` is these one after the other and no column has another kind:
    # a rule over one column's values can take them as they were given, without slicing the stack
    string_columns: Optional[Dict[str, tf.Tensor]] = None

    def kinds(self) -> Dict[str, tf.RaggedTensor]:
        return {k: v for k, v in (("strings", self.strings), ("ints", self.ints), ("floats", self.floats))
                if v is not None}


def _stack_kind(parts: Sequence[Optional[tf.RaggedTensor]], nrows: tf.Tensor) -> Optional[tf.RaggedTensor]:
    """[len(parts) * nrows, None] of [nrows, None] parts, a None part's rows empty; None if every part is."""
    present = [i for i, p in enumerate(parts) if p is not None]
    if not present:
        return None
    ps = [_int64_splits(parts[i]) for i in present]
    flats = [p.flat_values for p in ps]
    complete = len(present) == len(parts)
    if len({v.dtype for v in flats}) > 1:  # floats: float32 (an Example's) and float64 columns
        flats = [tf.cast(v, tf.float64) for v in flats]
    values = flats[0] if len(flats) == 1 else tf.concat(flats, axis=0)
    if values.dtype == tf.float32:
        values = tf.cast(values, tf.float64)
    # Every part's splits in one [P, nrows + 1] tensor: the stack's rows in a few ops, whatever P.
    splits = ps[0].row_splits[None, :] if len(ps) == 1 else tf.stack([p.row_splits for p in ps])
    if complete:  # each part's splits shifted by the values of the parts before it
        shifted = splits[:, 1:] + tf.cumsum(splits[:, -1], exclusive=True)[:, None]
        return tf.RaggedTensor.from_row_splits(
            values, tf.concat([tf.zeros([1], tf.int64), tf.reshape(shifted, [-1])], axis=0), validate=False)
    lengths = splits[:, 1:] - splits[:, :-1]
    if len(present) < len(parts):  # the rows of columns without this kind: empty
        where = {i: k for k, i in enumerate(present)}
        lengths = tf.gather(tf.concat([lengths, tf.zeros([1, nrows], tf.int64)], axis=0),
                            [where.get(i, len(present)) for i in range(len(parts))])
    return tf.RaggedTensor.from_row_lengths(values, tf.reshape(lengths, [-1]), validate=False)


def stack(columns: Mapping[str, Column], names: Sequence[str], nrows: tf.Tensor) -> Stacked:
    """`names`' columns stacked per kind (`Stacked`); every column has `nrows` rows (`batch_rows`)."""
    out = Stacked(list(names), nrows)
    for kind in ("strings", "ints", "floats"):
        setattr(out, kind, _stack_kind([getattr(columns[c], kind) for c in names], nrows))
    if out.ints is None and out.floats is None and all(columns[c].strings is not None for c in names):
        out.string_columns = {c: columns[c].strings.flat_values for c in names}  # type: ignore[union-attr]
    return out


def stack_strings(cells: Mapping[str, tf.Tensor], names: Sequence[str], nrows: tf.Tensor) -> Stacked:
    """Columns given as [batch] string tensors (one value a row, as CSV cells), stacked (`Stacked`); a column of
    `names` that `cells` leaves out has no value in any row."""
    given = [c for c in names if c in cells]
    if not given:
        return Stacked(list(names), nrows)
    flat = tf.reshape(tf.stack([cells[c] for c in given]), [-1]) if len(given) > 1 else cells[given[0]]
    if len(given) == len(names):
        strings = tf.RaggedTensor.from_row_splits(flat, tf.range(len(names) * nrows + 1), validate=False)
        return Stacked(list(names), nrows, strings=strings, string_columns={c: cells[c] for c in names})
    lengths = per_row([int(c in cells) for c in names], tf.int64, nrows)
    return Stacked(list(names), nrows, strings=tf.RaggedTensor.from_row_lengths(flat, lengths, validate=False))


def rows_of(x: tf.RaggedTensor, blocks: Sequence[int], nrows: tf.Tensor, count: int) -> tf.RaggedTensor:
    """The blocks `blocks` (block i: rows i * nrows ... (i + 1) * nrows - 1) of `x` ([count * nrows, None]), in
    that order: `x` itself, a slice, or a gather of rows."""
    blocks = list(blocks)
    if blocks == list(range(count)):
        return x
    if blocks and blocks == list(range(blocks[0], blocks[0] + len(blocks))):
        return x[blocks[0] * nrows:(blocks[-1] + 1) * nrows]
    index = tf.reshape(tf.constant(blocks, tf.int64)[:, None] * nrows + tf.range(nrows)[None, :], [-1])
    return tf.gather(x, index)


def concat_rows(parts: Sequence[tf.RaggedTensor]) -> tf.RaggedTensor:
    """Ragged tensors of the same rows joined row by row (row r: part 0's values of row r, then part 1's, ...)."""
    if len(parts) == 1:
        return parts[0]
    return tf.concat(list(parts), axis=1)


def value_rowids(x: tf.RaggedTensor) -> tf.Tensor:
    """`x.value_rowids()` ([values] int64: each value's row) by a segment sum of the rows' starts and a cumsum
    (TensorFlow's repeats every row's index through a boolean mask: several times slower)."""
    splits = x.row_splits
    n = tf.shape(x.flat_values, out_type=splits.dtype)[0]
    inner = splits[1:-1]
    return tf.cumsum(tf.math.unsorted_segment_sum(tf.ones_like(inner), inner, n + 1)[:n])


def block_of_rows(blocks: int, nrows: tf.Tensor) -> tf.Tensor:
    """[blocks * nrows] int64: the block of each row of `blocks` blocks of `nrows` rows (a gather by a value's row
    gives its block without an integer division, which TensorFlow does slowly)."""
    return tf.reshape(tf.tile(tf.range(blocks, dtype=tf.int64)[:, None], tf.stack([1, nrows])), [-1])


def per_row(values: Sequence[Any], dtype: tf.DType, nrows: tf.Tensor) -> tf.Tensor:
    """[len(values) * nrows]: value i for each row of block i (a constant tiled: fewer ops than `tf.repeat`)."""
    return tf.reshape(tf.tile(tf.constant(list(values), dtype)[:, None], tf.stack([1, nrows])), [-1])
