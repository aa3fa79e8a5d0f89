"""TF eager tensors read by the C kernel through TF's C API (`tpu_embed.sparsecore.eager_tensors`): the bytes it
reads are numpy's, and what it packs is what it packs from numpy views of the same tensors and what the reference
packs."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings

from tests.conformance import cases as C
from tests.tpu_embed.sparsecore.test_sparsecore import F, T, _same
from tpu_embed import Topology
from tpu_embed.sparsecore import LimitExceededError, RaggedIds, eager_tensors, preprocess
from tpu_embed.sparsecore import inputs as feature_inputs

pytestmark = pytest.mark.native("csr")

tf = pytest.importorskip("tensorflow")


def _kernel():
    return eager_tensors._kernel()


@pytest.fixture
def numpy_views(monkeypatch):
    """TF's C API not used: eager tensors go to the kernel as numpy views (TPU_EMBED_TF_C_API=0)."""
    monkeypatch.setenv("TPU_EMBED_TF_C_API", "0")
    feature_inputs.forget_learnt_types()
    yield
    monkeypatch.delenv("TPU_EMBED_TF_C_API")
    feature_inputs.forget_learnt_types()


def _registered() -> bool:
    return eager_tensors.read_in_place(type(tf.constant(0)))


@pytest.mark.parametrize("value", [
    np.array([3, -1, 1 << 40, -(1 << 62)], np.int64), np.arange(12, dtype=np.int32).reshape(3, 4),
    np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5), np.arange(24, dtype=np.int64).reshape(2, 3, 4),
    np.zeros((0, 2), np.int64), np.zeros(0, np.float32), np.array(7, np.int32)])
def test_the_kernel_reads_a_tensor_as_numpy_does(value):
    assert _registered()
    tensor = tf.constant(value)
    dtype, shape, data = _kernel().eager_tensor_bytes(tensor)
    assert (np.dtype(dtype), shape, data) == (value.dtype, value.shape, value.tobytes())


@pytest.mark.parametrize("value", [np.array([1.5], np.float64), np.array([1, 2], np.uint8),
                                   np.array([1, 2], np.int16), np.array([True]), np.array([b"a"])])
def test_a_dtype_the_kernel_does_not_take_is_not_read(value):
    assert _registered()
    assert _kernel().eager_tensor_bytes(tf.constant(value)) is None


def test_registered_the_tensors_themselves_go_to_the_kernel():
    assert _registered()
    splits = tf.constant([0, 2, 6], tf.int64)
    ragged = tf.RaggedTensor.from_row_splits(tf.constant(np.arange(6), tf.int64), splits)
    dense = tf.constant([3, 4], tf.int32)
    (_, ids, _, row_splits), (_, dense_ids, _, _) = feature_inputs.native_entries([ragged, dense], None, [0, 1])
    assert ids is ragged.values and row_splits is ragged.row_splits and dense_ids is dense


@settings(max_examples=25, deadline=None)
@given(case=C.cases(max_chips=4, weighted=True, max_features=4))
def test_tf_inputs_pack_alike_read_in_place_and_as_numpy_views(case):
    """Over random configurations and inputs (dense, sparse, ragged; int32 and int64; weighted), the kernel
    packs from TF's C API what it packs from numpy views of the same tensors and what the reference packs,
    and raises the same errors."""
    inputs, fc, topo, kwargs = C.to_ours(case, use_tf=False)

    def run(x, w, impl):
        try:
            return preprocess(x, fc, topo, **dict(kwargs, weights=w), implementation=impl)
        except (ValueError, LimitExceededError) as e:
            return type(e)

    want = run(inputs, kwargs["weights"], "reference")
    for int32 in (False, True):
        x, w = C.tf_inputs(case, int32=int32)
        assert _registered()
        in_place = run(x, w, "native")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TPU_EMBED_TF_C_API", "0")
            feature_inputs.forget_learnt_types()
            views = run(x, w, "native")
            mp.delenv("TPU_EMBED_TF_C_API")
        feature_inputs.forget_learnt_types()
        _same(want, in_place)
        _same(want, views)


def test_tensors_of_other_dtypes_are_converted_and_pack_as_the_reference():
    """int16 ids and float64 weights (not read in place) go through the checked conversion: the same bytes."""
    assert _registered()
    ids = np.array([1, 2, 2, 7, 9, 1, 1, 3])
    splits = np.array([0, 1, 3, 3, 5, 8, 8, 8, 8])
    weights = np.linspace(0.25, 2, 8)
    fc = {"a": F(T("t", 10), [8]), "b": F(T("u", 10), [8])}
    want = preprocess({"a": ids, "b": RaggedIds(ids, splits)}, fc, Topology(1),
                      weights={"a": weights.astype(np.float32), "b": RaggedIds(weights.astype(np.float32), splits)},
                      implementation="reference")
    got = preprocess({"a": tf.constant(ids.astype(np.int16)),
                      "b": tf.RaggedTensor.from_row_splits(tf.constant(ids.astype(np.int16)), splits)},
                     fc, Topology(1), weights={"a": tf.constant(weights),
                                               "b": tf.RaggedTensor.from_row_splits(tf.constant(weights), splits)},
                     implementation="native")
    _same(want, got)


def test_without_the_c_api_tensors_go_as_numpy_views_of_their_memory(numpy_views):
    """TPU_EMBED_TF_C_API=0: `native_entries` hands the kernel numpy views of the tensors' host memory, never
    copies; the kernel does not read tensors itself."""
    assert not _registered()
    assert _kernel().eager_tensor_bytes(tf.constant([1])) is None
    splits = tf.constant([0, 2, 6], tf.int64)
    ragged = tf.RaggedTensor.from_row_splits(tf.constant(np.arange(6), tf.int64), splits)
    weights = tf.RaggedTensor.from_row_splits(tf.constant(np.linspace(0.5, 3, 6), tf.float32), splits)
    sparse = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([7, 8, 9], tf.int32), [2, 2])
    dense = tf.constant([3, 4], tf.int32)
    for weighted in (True, False):  # feature by feature, and type by type
        (_, r_ids, r_w, r_splits), (s_rows, s_ids, _, _), (_, d_ids, _, _) = feature_inputs.native_entries(
            [ragged, sparse, dense], [weights, None, None] if weighted else None, [0, 1, 2])
        views = [(r_ids, ragged.values), (r_splits, ragged.row_splits), (s_rows, sparse.indices),
                 (s_ids, sparse.values), (d_ids, dense)] + ([(r_w, weights.values)] if weighted else [])
        for view, tensor in views:
            assert type(view) is np.ndarray and view.dtype == tensor.dtype.as_numpy_dtype
            assert np.shares_memory(view, np.asarray(tensor)) and np.array_equal(view, tensor.numpy())


def test_where_tf_s_functions_are_not_found_tensors_go_as_numpy_views(monkeypatch):
    """A TensorFlow whose libraries lack one of the functions (another wheel layout) is not registered; its
    tensors still pack as the reference does."""
    monkeypatch.setattr(eager_tensors, "_FUNCTIONS", eager_tensors._FUNCTIONS + ("TF_NoSuchFunction",))
    feature_inputs.forget_learnt_types()
    try:
        assert not _registered()
        fc = {"a": F(T("t", 10), [8]), "b": F(T("u", 10), [8])}
        ids = np.array([1, 2, 2, 7, 9, 1, 1, 3])
        splits = np.array([0, 1, 3, 3, 5, 8, 8, 8, 8])
        x = {"a": tf.constant(ids), "b": tf.RaggedTensor.from_row_splits(tf.constant(ids), splits)}
        want = preprocess({"a": ids, "b": RaggedIds(ids, splits)}, fc, Topology(1), implementation="reference")
        _same(want, preprocess(x, fc, Topology(1), implementation="native"))
    finally:
        monkeypatch.undo()
        feature_inputs.forget_learnt_types()


def test_threads_packing_tf_tensors_at_once_pack_what_one_packs():
    """The kernel reads TF tensors with one TF_Status while holding the GIL: threads calling `preprocess`
    together get what each gets alone."""
    rng = np.random.default_rng(0)
    fc = {f"f{i}": F(T(f"t{i}", 1000), [64]) for i in range(6)}
    batches = []
    for _ in range(8):
        lengths = rng.integers(0, 4, 64)
        splits = np.concatenate([[0], np.cumsum(lengths)])
        batches.append({n: tf.RaggedTensor.from_row_splits(tf.constant(rng.integers(0, 1000, splits[-1])),
                                                           tf.constant(splits)) for n in fc})
    topo = Topology(2)
    want = [preprocess(b, fc, topo, implementation="reference") for b in batches]
    errors = []

    def work():
        try:
            for _ in range(20):
                for b, w in zip(batches, want):
                    _same(w, preprocess(b, fc, topo, implementation="native"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
