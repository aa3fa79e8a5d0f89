"""A feature's ids (dense, sparse or ragged; TF or numpy) as the packers take them.

TF's `ConvertToListOfSparseCoreCooTensors` takes three input kinds:
dense (one id per sample, row = position), SparseTensor (row = first index
column, indices sorted) and RaggedTensor (row from row_splits).

* `native_entries`: the buffers of each kind as they are, for the C kernel,
  which reads numpy arrays and TF tensors in place and checks them itself;
* `to_feature_ids`: the readable path, which turns any of them into (row, id,
  weight) numpy arrays and validates what TF does not (ids out of range, NaN
  weights), naming the feature.  It is the numpy and reference packers'
  input, and the kernel's fallback for what it does not read as it is.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import numpy as np

from tpu_embed.core.nest import leaf_type


@leaf_type
class SparseIds(NamedTuple):
    """numpy twin of tf.SparseTensor: indices [n, rank], values [n], dense_shape [rank]."""

    indices: np.ndarray
    values: np.ndarray
    dense_shape: np.ndarray


@leaf_type
class RaggedIds(NamedTuple):
    """numpy twin of a ragged_rank-1 tf.RaggedTensor: values [n], row_splits [samples + 1]."""

    values: np.ndarray
    row_splits: np.ndarray


class FeatureIds(NamedTuple):
    rows: np.ndarray  # int64, non-decreasing, in [0, sample_count)
    ids: np.ndarray  # int64 in [0, vocabulary_size)
    weights: Optional[np.ndarray]  # float32, or None meaning all ones


def id_out_of_range(path: str, bad: int, vocabulary_size: int, position=None) -> ValueError:
    where = "" if position is None else f" (position {position})"
    return ValueError(
        f"Feature {path!r}: id {bad}{where} is outside its table's vocabulary [0, {vocabulary_size}). "
        + ("Negative ids usually mean padding or a failed lookup: drop them (tf.sparse.retain) or "
           "map them to an OOV bucket." if bad < 0 else
           "Raise the table's vocabulary_size or map out-of-vocabulary ids to an OOV bucket."))


def weight_not_finite(path: str, value, position: int) -> ValueError:
    return ValueError(f"Feature {path!r}: weight {value} at position {position} is not finite. "
                      "Clean NaN/inf weights upstream (e.g. replace with 0 or drop the id).")


def dense_count_mismatch(path: str, n: int, sample_count: int) -> ValueError:
    return ValueError(
        f"Feature {path!r}: a dense input has {n} ids but the feature has {sample_count} "
        "samples per chip (prod(output_shape)). Dense inputs carry exactly one id per sample; "
        "use a SparseTensor or RaggedTensor for multivalent features.")


def bad_row_splits(path: str, n: int) -> ValueError:
    return ValueError(f"Feature {path!r}: RaggedTensor row_splits must start at 0, be non-decreasing "
                      f"and end at the number of values ({n}).")


def _np(x) -> np.ndarray:
    # np.asarray reads a TF eager tensor without copying it (`.numpy()` copies); the view is read-only.
    return x if isinstance(x, np.ndarray) else np.asarray(x)


# The input kind of a type, learnt from its first value: one dict look-up per feature instead of
# attribute probes.  Only for types whose attributes do not vary between values (ours and TF's).
_KIND_OF_TYPE = {np.ndarray: "dense", SparseIds: "sparse", RaggedIds: "ragged"}


def kind_of(value) -> str:
    kind = _KIND_OF_TYPE.get(type(value))
    if kind is not None:
        return kind
    if hasattr(value, "indices") and hasattr(value, "dense_shape"):
        kind = "sparse"
    elif hasattr(value, "row_splits"):
        kind = "ragged"
    else:
        kind = "dense"
    if type(value).__module__.startswith("tensorflow."):
        _KIND_OF_TYPE[type(value)] = kind
    return kind


_RANGES: dict = {}


def _rows_for_dense(n: int) -> np.ndarray:
    # Dense rows are always 0..n-1; share one read-only array per size.
    r = _RANGES.get(n)
    if r is None:
        r = np.arange(n, dtype=np.int64)
        r.setflags(write=False)
        if len(_RANGES) < 1024:
            _RANGES[n] = r
    return r


def to_feature_ids(value, weight, *, path: str, sample_count: int, vocabulary_size: int,
                   check_ids: bool = True) -> FeatureIds:
    """Normalise one feature.  `check_ids=False` leaves the id range check to the caller
    (the native packer checks every id in its single pass anyway)."""
    if isinstance(value, np.ndarray):
        kind = "dense"
    else:
        kind = kind_of(value)
    if kind == "dense":
        ids = _np(value).reshape(-1)
        if ids.size not in (0, sample_count):
            raise dense_count_mismatch(path, ids.size, sample_count)
        rows = _rows_for_dense(ids.size)
        w = None if weight is None else _weights(weight, "dense", ids.size, path)
    elif kind == "sparse":
        indices = _np(value.indices).astype(np.int64, copy=False)
        ids = _np(value.values).reshape(-1)
        if indices.ndim != 2 or indices.shape[0] != ids.size:
            raise ValueError(f"Feature {path!r}: SparseTensor indices must be [num_ids, rank]; got shape "
                             f"{indices.shape} for {ids.size} values.")
        if indices.shape[1] < 2:
            raise ValueError(f"Feature {path!r}: a SparseTensor input needs rank >= 2 ([samples, ids]); "
                             f"got rank {indices.shape[1]}.")
        if indices.shape[1] == 2:
            rows = indices[:, 0].copy()
        else:
            # Rank > 2 (e.g. [batch, sequence, ids]): the leading dims address one sample,
            # row-major, like TF's later kernels do with shape strides.
            shape = _np(value.dense_shape).astype(np.int64)
            rows = np.zeros(ids.size, dtype=np.int64)
            for d in range(indices.shape[1] - 1):
                rows = rows * shape[d] + indices[:, d]
        if rows.size > 1 and (np.any(rows[1:] < rows[:-1])):
            bad = int(np.flatnonzero(rows[1:] < rows[:-1])[0]) + 1
            raise ValueError(
                f"Feature {path!r}: SparseTensor indices are not sorted (entry {bad} has row "
                f"{int(rows[bad])} after row {int(rows[bad - 1])}). Call tf.sparse.reorder on the input "
                "first; SparseCore requires row-major sorted indices.")
        if rows.size and (rows[0] < 0 or rows[-1] >= sample_count):
            raise ValueError(
                f"Feature {path!r}: SparseTensor row {int(rows[-1] if rows[-1] >= sample_count else rows[0])} "
                f"is outside [0, {sample_count}) samples per chip; the feature's output_shape does not match "
                "the batch.")
        w = None if weight is None else _weights(weight, "sparse", ids.size, path)
    else:
        if hasattr(value, "ragged_rank") and value.ragged_rank != 1:
            raise ValueError(f"Feature {path!r}: only ragged_rank 1 RaggedTensors are supported "
                             f"(got ragged_rank {value.ragged_rank}); flatten the inner dimensions first.")
        ids = _np(value.values).reshape(-1)
        splits = _np(value.row_splits).astype(np.int64, copy=False)
        if splits.size != sample_count + 1:
            raise ValueError(
                f"Feature {path!r}: a RaggedTensor with {splits.size - 1} rows was given but the feature has "
                f"{sample_count} samples per chip (prod(output_shape)).")
        lengths = np.diff(splits)
        if splits[0] != 0 or splits[-1] != ids.size or (lengths.size and lengths.min() < 0):
            raise bad_row_splits(path, ids.size)
        rows = np.repeat(_rows_for_dense(sample_count), lengths)
        w = None if weight is None else _weights(weight, "ragged", ids.size, path)

    if ids.dtype != np.int64:
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            if np.issubdtype(ids.dtype, np.floating) and np.all(np.isfinite(ids)) and np.all(ids == np.round(ids)):
                ids = ids.astype(np.int64)
            else:
                raise TypeError(f"Feature {path!r}: ids must be integers, got dtype {ids.dtype}. "
                                "Map strings to ids with the feature's vocabulary first.")
        ids = ids.astype(np.int64)
    if check_ids and ids.size:
        lo, hi = ids.min(), ids.max()
        if lo < 0 or hi >= vocabulary_size:
            raise id_out_of_range(path, int(lo) if lo < 0 else int(hi), vocabulary_size)
    return FeatureIds(rows=rows, ids=ids, weights=w)


def _weights(weight, kind: str, n: int, path: str) -> np.ndarray:
    if kind == "sparse" and hasattr(weight, "values") and hasattr(weight, "indices"):
        w = _np(weight.values)
    elif kind == "ragged" and hasattr(weight, "row_splits"):
        w = _np(weight.values)
    else:
        w = _np(weight)
    w = w.reshape(-1).astype(np.float32)
    if w.size != n:
        raise ValueError(f"Feature {path!r}: {w.size} weights for {n} ids; weights must have the same "
                         "structure as the ids (same SparseTensor indices / ragged row_splits / dense shape).")
    if n and not np.all(np.isfinite(w)):
        bad = int(np.flatnonzero(~np.isfinite(w))[0])
        raise weight_not_finite(path, w[bad], bad)
    return w


def _host_view_of_type(t: type):
    """How the kernel gets a buffer of type `t` cheapest: None (as it is), or a function returning a numpy view.

    A TF eager tensor's own buffer protocol builds a numpy array and then takes its buffer; its
    `_numpy_internal` (what `np.asarray` and `.numpy()` build on) returns that view directly, at about
    half the cost (0.3 against 0.8 us a buffer, 60 buffers per headline batch).  It shares the
    tensor's memory (nothing copied) and keeps the tensor alive."""
    view = getattr(t, "_numpy_internal", None) if t.__module__.startswith("tensorflow.") else None
    return view if callable(view) else None


class _ViewOfType(dict):
    """{type: `_host_view_of_type(type)`}, learnt from a type's first value."""

    def __missing__(self, t: type):
        view = self[t] = _host_view_of_type(t)
        return view


_VIEW_OF_TYPE = _ViewOfType({np.ndarray: None})


def _buffer(x):
    """`x`, or the numpy view of it the kernel reads faster (`_host_view_of_type`); `x` where there is none."""
    view = _VIEW_OF_TYPE[type(x)]
    if view is None:
        return x
    try:
        return view(x)
    except Exception:  # e.g. a tensor of a dtype numpy has no view of: the kernel, then `to_feature_ids`, decide
        return x


def native_entries(inputs, weights, positions) -> List[Optional[tuple]]:
    """For the features at `positions` of the flattened `inputs` and `weights`, what the native packer takes:
    (rows | None, ids, weights | None, row_splits | None), nothing copied.

    The buffers go to the kernel as the caller passed them (numpy arrays, TF
    eager tensors as numpy views of their memory: anything with the buffer
    protocol); the kernel reads int32/int64 ids, rows and row_splits and
    float32 weights, and checks every id, weight, row and length.  What it
    cannot read as it is, or rejects, is then normalised by `to_feature_ids`,
    which converts it or raises the error naming the feature.  An entry is
    None where that must happen at once: a SparseTensor of rank > 2, whose
    rows need its dense shape.
    """
    kinds, views, buf = _KIND_OF_TYPE, _VIEW_OF_TYPE, _buffer
    out: List[Optional[tuple]] = []
    for i in positions:
        value, weight = inputs[i], weights[i]
        kind = kinds.get(type(value)) or kind_of(value)
        if kind == "ragged":  # the common case, inlined: two buffers per feature, every batch
            rows, ids, splits = None, value.values, value.row_splits
            view = views[type(ids)]
            if view is not None and view is views[type(splits)]:
                try:
                    ids, splits = view(ids), view(splits)
                except Exception:
                    ids, splits = buf(ids), buf(splits)
            else:
                ids, splits = buf(ids), buf(splits)
        elif kind == "dense":
            rows, ids, splits = None, buf(value), None
        else:
            rows, ids, splits = buf(value.indices), buf(value.values), None
            shape = getattr(rows, "shape", None)  # a view's: a tuple (a TF tensor's TensorShape costs ~1 us)
            if shape is None or len(shape) != 2 or shape[1] != 2:
                out.append(None)
                continue
        if weight is not None:
            if kind != "dense" and (kinds.get(type(weight)) or kind_of(weight)) == kind:
                weight = weight.values
            if type(weight) is np.ndarray and weight.dtype != np.float32:
                weight = weight.astype(np.float32)
            weight = buf(weight)
        out.append((rows, ids, weight, splits))
    return out
