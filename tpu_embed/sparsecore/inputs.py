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

import operator
from itertools import repeat
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from tpu_embed.core.nest import leaf_type
from tpu_embed.sparsecore.eager_tensors import forget as forget_eager_tensors
from tpu_embed.sparsecore.eager_tensors import read_in_place


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
        rows, ids = _sparse_rows_and_ids(value, path, sample_count)
        w = None if weight is None else _weights(weight, "sparse", ids.size, path)
    else:
        rows, ids = _ragged_rows_and_ids(value, path, sample_count)
        w = None if weight is None else _weights(weight, "ragged", ids.size, path)

    if ids.dtype != np.int64:
        ids = _int64_ids(ids, path)
    if check_ids and ids.size:
        lo, hi = ids.min(), ids.max()
        if lo < 0 or hi >= vocabulary_size:
            raise id_out_of_range(path, int(lo) if lo < 0 else int(hi), vocabulary_size)
    return FeatureIds(rows=rows, ids=ids, weights=w)


def _sparse_rows_and_ids(value, path: str, sample_count: int) -> Tuple[np.ndarray, np.ndarray]:
    """(row of each id, ids) of a SparseTensor-like input, its indices checked sorted and within the samples."""
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
    return rows, ids


def _ragged_rows_and_ids(value, path: str, sample_count: int) -> Tuple[np.ndarray, np.ndarray]:
    """(row of each id, ids) of a RaggedTensor-like input of ragged rank 1, its row splits checked."""
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
    return rows, ids


def _int64_ids(ids: np.ndarray, path: str) -> np.ndarray:
    """Ids of another dtype as int64: integers, or floats that hold integers; else TypeError."""
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        if np.issubdtype(ids.dtype, np.floating) and np.all(np.isfinite(ids)) and np.all(ids == np.round(ids)):
            return ids.astype(np.int64)
        raise TypeError(f"Feature {path!r}: ids must be integers, got dtype {ids.dtype}. "
                        "Map strings to ids with the feature's vocabulary first.")
    return ids.astype(np.int64)


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

    A TF eager tensor is read in place by the kernel through TF's C API where that can be registered
    (`eager_tensors.read_in_place`).  Otherwise its `_numpy_internal` (what `np.asarray` and `.numpy()`
    build on) gives a numpy view, at about half the cost of its own buffer protocol, which builds that
    array and then takes its buffer (0.3 against 0.8 us a buffer, 60 buffers per headline batch).  Either
    way the tensor's memory is shared (nothing copied) and the tensor kept alive."""
    if not t.__module__.startswith("tensorflow."):
        return None
    if read_in_place(t):
        return None
    view = getattr(t, "_numpy_internal", None)
    return view if callable(view) else None


class _ViewOfType(dict):
    """{type: `_host_view_of_type(type)`}, learnt from a type's first value."""

    def __missing__(self, t: type):
        view = self[t] = _host_view_of_type(t)
        return view


_VIEW_OF_TYPE = _ViewOfType({np.ndarray: None})


def forget_learnt_types() -> None:
    """Forget what was learnt of input types (views, hand-overs, plans) and TF's C API registration: the
    next batch learns them again (e.g. after `TPU_EMBED_TF_C_API` changed)."""
    forget_eager_tensors()
    _VIEW_OF_TYPE.clear()
    _VIEW_OF_TYPE[np.ndarray] = None
    _HANDOVER_OF_TYPE.clear()
    _PLANS.clear()


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
    """For the features at `positions` of the flattened `inputs` and `weights` (None: no weights), what the
    native packer takes: (rows | None, ids, weights | None, row_splits | None), nothing copied.

    The buffers go to the kernel as the caller passed them (numpy arrays, TF
    eager tensors themselves where the kernel reads them through TF's C API,
    else numpy views of their memory: anything with the buffer protocol);
    the kernel reads int32/int64 ids, rows and row_splits and
    float32 weights, and checks every id, weight, row and length.  What it
    cannot read as it is, or rejects, is then normalised by `to_feature_ids`,
    which converts it or raises the error naming the feature.  An entry is
    None where that must happen at once: a `SparseIds` whose indices are not
    [n, 2].

    Unweighted features of the types `_HANDOVER_OF_TYPE` knows are handed over
    type by type in C loops (`_unweighted_entries`); the others feature by
    feature.
    """
    if weights is None or all(map(operator.is_, map(weights.__getitem__, positions), repeat(None))):
        try:
            entries = _unweighted_entries(inputs, positions)
        except Exception:  # e.g. a buffer of another type than the view learnt: feature by feature, below
            entries = None
        if entries is not None:
            return entries
        if weights is None:
            weights = [None] * len(inputs)
    return _entries_one_by_one(inputs, weights, positions)


def _entries_one_by_one(inputs, weights, positions) -> List[Optional[tuple]]:
    kinds, views, buf = _KIND_OF_TYPE, _VIEW_OF_TYPE, _buffer
    out: List[Optional[tuple]] = []
    for i in positions:
        value, weight = inputs[i], weights[i]
        kind = kinds.get(type(value)) or kind_of(value)
        if kind == "ragged":
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
            shape = getattr(rows, "shape", None)  # a view's: a tuple (a TF tensor's TensorShape is slower to read)
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


# ------------------------------------------------------------------ unweighted features, type by type

# A hand-over: the unweighted features of one type -> their entries, in C loops (`map`, `zip`).
Handover = Callable[[Sequence[Any]], List[Optional[tuple]]]


def _as_is(xs):
    return xs


def _handover_of_type(t: type, value: Any) -> Optional[Handover]:
    """The hand-over of type `t`, learnt from `value`, one of its values; None for a type handed over
    feature by feature (`SparseIds`, whose indices' shape decides their entry; a TF type whose buffers
    `value` has no view of, e.g. symbolic tensors).

    A kind's buffers are read with the getters TF's own properties use (`RaggedTensor.values` returns
    `_values`, `.row_splits` its row partition's `_row_splits`; `SparseTensor.indices` and `.values`
    return `_indices` and `_values`), checked on `value` to give the very objects the public properties
    return, else the public properties.  Each buffer is viewed with the view of its type in `value`
    (`_host_view_of_type`); in a later batch, a buffer of another type makes the view raise, and that
    batch is handed over feature by feature."""
    if t is SparseIds:
        return None
    kind = kind_of(value)
    if kind == "dense":
        view = _VIEW_OF_TYPE[t]
        if view is None:
            return lambda xs: list(zip(repeat(None), xs, repeat(None), repeat(None)))
        return lambda xs: list(zip(repeat(None), map(view, xs), repeat(None), repeat(None)))
    buffers = []
    for private, public in ((("_values", "values"), ("_row_partition._row_splits", "row_splits")) if kind == "ragged"
                            else (("_indices", "indices"), ("_values", "values"))):
        try:
            same = operator.attrgetter(private)(value) is getattr(value, public)
        except AttributeError:
            same = False
        get = operator.attrgetter(private if same else public)
        buffer_type = type(get(value))
        view = _VIEW_OF_TYPE[buffer_type]
        if (view is None and t.__module__.startswith("tensorflow.") and buffer_type is not np.ndarray
                and not read_in_place(buffer_type)):
            return None
        buffers.append(_buffers_of(get, view))
    a, b = buffers
    if kind == "ragged":
        return lambda xs: list(zip(repeat(None), a(xs), repeat(None), b(xs)))
    return lambda xs: list(zip(a(xs), b(xs), repeat(None), repeat(None)))


def _buffers_of(get: Callable[[Any], Any], view: Optional[Callable[[Any], Any]]) -> Callable[[Sequence[Any]], Any]:
    """The buffers `get` takes from each of a sequence of values, viewed with `view` (None: as they are)."""
    if view is None:
        return lambda xs: map(get, xs)
    return lambda xs: map(view, map(get, xs))


_HANDOVER_OF_TYPE: Dict[type, Optional[Handover]] = {}
_UNKNOWN: Any = object()


class _Plan(NamedTuple):
    """How the features of one sequence of input types are handed over: per type, a function taking its
    features out of the batch, and its hand-over; `order` puts the groups' entries, concatenated, back in
    the features' order (None: one group, already in order)."""

    groups: Tuple[Tuple[Callable[[List[Any]], Sequence[Any]], Handover], ...]
    order: Optional[Callable[[List[Optional[tuple]]], tuple]]


_PLANS: Dict[Tuple[type, ...], Optional[_Plan]] = {}
_PLANS_KEPT = 256


def _taker(j: int) -> Callable[[List[Any]], Sequence[Any]]:
    return lambda xs: (xs[j],)


def _plan_of(values: List[Any], signature: Tuple[type, ...]) -> Optional[_Plan]:
    """The plan of `signature` (the types of `values`), remembered; None where a type has no hand-over."""
    where: Dict[type, List[int]] = {}
    for j, t in enumerate(signature):
        where.setdefault(t, []).append(j)
    groups: List[Tuple[Callable[[List[Any]], Sequence[Any]], Handover]] = []
    for t, at in where.items():
        handover = _HANDOVER_OF_TYPE.get(t, _UNKNOWN)
        if handover is _UNKNOWN:
            handover = _handover_of_type(t, values[at[0]])
            if handover is None and t.__module__.startswith("tensorflow."):
                return None  # not remembered: learnt again from the next batch's values
            _HANDOVER_OF_TYPE[t] = handover
        if handover is None:
            break
        take: Callable[[List[Any]], Sequence[Any]] = (
            _as_is if len(where) == 1 else operator.itemgetter(*at) if len(at) > 1 else _taker(at[0]))
        groups.append((take, handover))
    plan = None
    if len(groups) == len(where):
        concatenated = [j for at in where.values() for j in at]
        order = operator.itemgetter(*sorted(range(len(concatenated)), key=concatenated.__getitem__))
        plan = _Plan(tuple(groups), order if len(where) > 1 else None)
    if len(_PLANS) >= _PLANS_KEPT:
        _PLANS.clear()
    _PLANS[signature] = plan
    return plan


def _unweighted_entries(inputs, positions) -> Optional[List[Optional[tuple]]]:
    """`native_entries` of unweighted features in C loops, None where the batch is handed over feature by
    feature: the features grouped by type (the grouping remembered per sequence of types, `_plan_of`),
    each group's buffers got and viewed by its type's hand-over (`_handover_of_type`)."""
    values = list(map(inputs.__getitem__, positions))
    signature = tuple(map(type, values))
    plan = _PLANS.get(signature, _UNKNOWN)
    if plan is _UNKNOWN:
        plan = _plan_of(values, signature)
    if plan is None:
        return None
    if plan.order is None:
        return plan.groups[0][1](values)
    entries: List[Optional[tuple]] = []
    for take, handover in plan.groups:
        entries += handover(take(values))
    return list(plan.order(entries))
