"""The inputs users pass reach the native kernel as they are, and pack as the readable reference path does.

Every input kind (dense, ragged, sparse; weighted or not) in every form (numpy int64, numpy int32 with float64
weights, non-contiguous numpy and lists, TF tensors int64 and int32) against `implementation="reference"` on
numpy int64; errors name the feature whatever the form; `layout_cache.layout_for` is `stack_tables`.
"""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conformance import cases as C
from tests.helpers import native
from tests.tpu_embed.sparsecore.test_sparsecore import F, T, _same
from tpu_embed import Topology
from tpu_embed.sparsecore import LimitExceededError, RaggedIds, SparseIds, csr, preprocess, stack_tables
from tpu_embed.sparsecore.layout_cache import layout_for

NATIVE = pytest.mark.native("csr")


def _numpy_forms(case):
    """{form: (inputs, weights)} of numpy forms other than int64 C-contiguous."""
    inputs, _, _, kwargs = C.to_ours(case, use_tf=False)
    weights = kwargs["weights"]

    def narrow(x):
        if isinstance(x, SparseIds):
            return SparseIds(x.indices.astype(np.int32), x.values.astype(np.int32), x.dense_shape)
        if isinstance(x, RaggedIds):
            return RaggedIds(x.values.astype(np.int32), x.row_splits.astype(np.int32))
        return x.astype(np.int32)

    def strided(a):  # the same values, not C-contiguous
        return np.repeat(a[..., None], 2, axis=-1)[..., 0]

    def loose(x):
        if isinstance(x, SparseIds):
            return SparseIds(np.asfortranarray(x.indices), strided(x.values), x.dense_shape)
        if isinstance(x, RaggedIds):
            return RaggedIds(x.values.tolist(), strided(x.row_splits))
        return x.tolist() if x.ndim == 1 else strided(x)

    def wide(w):
        if isinstance(w, SparseIds):
            return SparseIds(w.indices, w.values.astype(np.float64), w.dense_shape)
        if isinstance(w, RaggedIds):
            return RaggedIds(w.values.astype(np.float64), w.row_splits)
        return w.astype(np.float64)

    wide_weights = None if weights is None else {n: wide(w) for n, w in weights.items()}
    forms = {"numpy int32 ids, float64 weights": ({n: narrow(v) for n, v in inputs.items()}, wide_weights)}
    forms["numpy strided and lists"] = ({n: loose(v) for n, v in inputs.items()}, weights)
    return forms


def _run(inputs, fc, topo, kwargs, weights, impl):
    try:
        return preprocess(inputs, fc, topo, **dict(kwargs, weights=weights), implementation=impl)
    except (ValueError, LimitExceededError) as e:
        return type(e)


@settings(max_examples=60, deadline=None)
@given(case=C.cases(max_chips=4))
def test_every_input_form_packs_like_the_reference(case):
    tf = pytest.importorskip("tensorflow")
    del tf
    _, fc, topo, _ = C.to_ours(case, use_tf=False)
    if case.get("limit_mode"):
        stacks = stack_tables(fc, topo).stacks
        case["max_ids_per_table"] = {s: case["limit_mode"][1] for s in stacks}
        case["max_unique_ids_per_table"] = {s: max(1, case["limit_mode"][1] - 1) for s in stacks}
    inputs, fc, topo, kwargs = C.to_ours(case, use_tf=False)
    want = _run(inputs, fc, topo, kwargs, kwargs["weights"], "reference")
    forms = dict(_numpy_forms(case))
    forms["tf int64"] = C.tf_inputs(case)
    forms["tf int32 ids and row_splits"] = C.tf_inputs(case, int32=True)
    impls = ["numpy"] + (["native"] if native.available("csr") else [])
    for form, (x, w) in forms.items():
        for impl in impls:
            got = _run(x, fc, topo, kwargs, w, impl)
            try:
                _same(want, got)
            except AssertionError as e:
                raise AssertionError(f"{form}, {impl}: {e}") from None


@NATIVE
@pytest.mark.parametrize("int32", [False, True])
def test_tf_tensors_reach_the_kernel_without_conversion(monkeypatch, int32):
    """Dense tf.Tensor, tf.RaggedTensor and rank-2 tf.SparseTensor inputs and weights go to the kernel as they
    are: the readable normalisation (`to_feature_ids`) is never called."""
    pytest.importorskip("tensorflow")
    case = {"tables": [{"name": "t", "vocabulary_size": 50, "dim": 8, "combiner": "mean"}],
            "features": [{"name": n, "table": "t", "output_shape": [8]} for n in ("d", "r", "s")],
            "num_chips": 2, "num_sc_per_chip": 4}
    splits = np.array([0, 2, 3, 3, 5, 5, 6, 8, 8])
    idx = np.array([[0, 0], [0, 1], [2, 0], [5, 0], [5, 1], [5, 2], [7, 0]])
    case["inputs"] = {"d": {"kind": "dense", "values": np.arange(8) * 3 % 50},
                      "r": {"kind": "ragged", "values": np.array([1, 2, 2, 7, 9, 1, 1, 3]), "row_splits": splits},
                      "s": {"kind": "sparse", "indices": idx, "values": np.array([4, 4, 5, 6, 39, 0, 2]),
                            "dense_shape": np.array([8, 3])}}
    case["weights"] = {"d": {"kind": "dense", "values": np.linspace(0.1, 2, 8).astype(np.float32)},
                       "r": {"kind": "ragged", "values": np.arange(8, dtype=np.float32), "row_splits": splits},
                       "s": {"kind": "sparse", "indices": idx, "values": np.full(7, 0.5, np.float32),
                             "dense_shape": np.array([8, 3])}}
    inputs, fc, topo, kwargs = C.to_ours(case, use_tf=False)
    want = preprocess(inputs, fc, topo, **kwargs, implementation="reference")
    x, w = C.tf_inputs(case, int32=int32)

    def no_conversion(*args, **kw):
        raise AssertionError("an input was normalised in Python")

    monkeypatch.setattr(csr, "to_feature_ids", no_conversion)
    _same(want, preprocess(x, fc, topo, **dict(kwargs, weights=w), implementation="native"))


@NATIVE
@settings(max_examples=30, deadline=None)
@given(case=C.cases(weighted=True, allow_sequence=False, limit_modes=("default",), batch_mult=(8, 64)),
       threads=st.sampled_from([2, 3, 5]))
def test_the_kernels_threads_pack_what_one_thread_packs(case, threads):
    inputs, fc, topo, kwargs = C.to_ours(case, use_tf=False)
    big = {s: 1 << 20 for s in stack_tables(fc, topo).stacks}
    kwargs.update(max_ids_per_table=big, max_unique_ids_per_table=big, max_ids_per_chip_per_sample=256)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TPU_EMBED_THREADS", "1")
        one = preprocess(inputs, fc, topo, **kwargs, implementation="native")
        mp.setenv("TPU_EMBED_THREADS", str(threads))
        mp.setattr(csr, "PARALLEL_MIN_IDS", 0)
        for _ in range(3):  # pool threads woken, then spinning
            _same(one, preprocess(inputs, fc, topo, **kwargs, implementation="native"))


# ------------------------------------------------------------------ errors, whatever the form

IMPLS = ["reference", "numpy", pytest.param("native", marks=NATIVE)]


def _tf():
    return pytest.importorskip("tensorflow")


def _ragged(tf, values, splits, dtype=None):
    return tf.RaggedTensor.from_row_splits(tf.constant(values, dtype), tf.constant(splits, tf.int64))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("make,match", [
    (lambda tf: _ragged(tf, [1, 2, 10, 3], [0, 1, 2, 4, 4]), r"'f'.*id 10 .*outside.*\[0, 10\).*vocabulary_size"),
    (lambda tf: tf.constant([1, -1, 2, 3], tf.int32), r"'f'.*id -1 .*outside.*\[0, 10\).*Negative ids"),
    (lambda tf: tf.SparseTensor([[1, 0], [0, 0]], tf.constant([1, 2], tf.int64), [4, 1]),
     r"'f'.*not sorted.*tf.sparse.reorder"),
    (lambda tf: tf.SparseTensor([[0, 0], [4, 0]], tf.constant([1, 2], tf.int64), [5, 1]), r"'f'.*outside \[0, 4\)"),
    (lambda tf: tf.constant(np.zeros((4, 2), np.int64)), r"'f'.*dense input has 8 ids.*4 samples"),
    (lambda tf: _ragged(tf, [1, 2], [0, 1, 2, 2]), r"'f'.*3 rows.*4 samples"),
    (lambda tf: tf.RaggedTensor.from_row_splits(_ragged(tf, [1, 2], [0, 1, 2]), [0, 1, 1, 2, 2]),
     r"'f'.*ragged_rank 1"),
    (lambda tf: tf.constant([1.5, 2.0, 3.0, 4.0]), r"'f'.*ids must be integers"),
    (lambda tf: tf.constant(["a", "b", "c", "d"]), r"'f'.*ids must be integers"),
])
def test_tf_input_errors_name_the_feature(impl, make, match):
    tf = _tf()
    with pytest.raises((ValueError, TypeError), match=match):
        preprocess({"f": make(tf)}, {"f": F(T("t", 10), [4])}, Topology(1), implementation=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_row_splits_name_the_feature(impl):
    with pytest.raises(ValueError, match=r"'f'.*row_splits must start at 0, be non-decreasing"):
        preprocess({"f": RaggedIds(np.array([1, 2, 3]), np.array([0, 2, 1, 3, 3]))}, {"f": F(T("t", 10), [4])},
                   Topology(1), implementation=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("weight,match", [
    (lambda tf: _ragged(tf, [1.0, np.nan, 1.0, 1.0], [0, 1, 2, 4, 4], tf.float32), r"'f': weight nan .* not finite"),
    (lambda tf: _ragged(tf, [1.0, 1.0, 1.0], [0, 1, 2, 3, 3], tf.float32), r"'f'.*3 weights for 4 ids"),
    (lambda tf: tf.constant([1.0, 1.0], tf.float64), r"'f'.*2 weights for 4 ids"),
])
def test_tf_weight_errors_name_the_feature(impl, weight, match):
    tf = _tf()
    with pytest.raises(ValueError, match=match):
        preprocess({"f": _ragged(tf, [1, 2, 3, 3], [0, 1, 2, 4, 4])}, {"f": F(T("t", 10, combiner="mean"), [4])},
                   Topology(1), weights={"f": weight(tf)}, implementation=impl)


# ------------------------------------------------------------------ the layout of a feature configuration

@settings(max_examples=60, deadline=None)
@given(case=C.cases(max_features=6, max_tables=6), use_tf=st.booleans())
def test_layout_for_is_stack_tables(case, use_tf):
    if use_tf:
        pytest.importorskip("tensorflow")
    _, fc, topo, _ = C.to_ours(case, use_tf=use_tf)
    assert layout_for(fc, topo).to_dict() == stack_tables(fc, topo).to_dict()
    assert layout_for(fc, topo).to_dict() == stack_tables(fc, topo).to_dict()  # remembered


def _tf_config(tf, n=4, shared_optimizer=False):
    E = tf.tpu.experimental.embedding
    shared = E.SGD(learning_rate=0.1)
    tables = [E.TableConfig(vocabulary_size=100 + 10 * i, dim=8, name=f"t{i}", combiner="mean",
                            optimizer=shared if shared_optimizer else E.SGD(learning_rate=0.1)) for i in range(n)]
    return {f"f{i}": E.FeatureConfig(table=t, output_shape=[16], name=f"f{i}") for i, t in enumerate(tables)}


@pytest.mark.parametrize("change", [
    "vocabulary_size", "dim", "combiner", "learning_rate", "clip_weight_min", "output_shape", "output_shape_list",
    "share_a_table", "add_feature", "drop_feature", "rename_table", "topology"])
def test_a_feature_config_changed_in_place_is_stacked_again(change):
    tf = _tf()
    E = tf.tpu.experimental.embedding
    fc = _tf_config(tf)
    topo = Topology(2)
    first = layout_for(fc, topo)
    assert layout_for(fc, topo) is first  # unchanged: remembered
    before = copy.deepcopy(first.to_dict())
    if change == "vocabulary_size":
        fc["f1"].table.vocabulary_size = 5000
    elif change == "dim":
        fc["f2"].table.dim = 16
    elif change == "combiner":
        fc["f0"].table.combiner = "sum"
    elif change == "learning_rate":
        fc["f3"].table.optimizer.learning_rate = 0.5  # another optimizer group: another stack
    elif change == "clip_weight_min":
        fc["f3"].table.optimizer.clip_weight_min = -1.0
    elif change == "output_shape":
        fc["f2"].output_shape = tf.TensorShape([32])
    elif change == "output_shape_list":
        fc["f2"].output_shape = [32]
    elif change == "share_a_table":
        fc["f3"].table = fc["f0"].table
    elif change == "add_feature":
        fc["f9"] = E.FeatureConfig(table=fc["f0"].table, output_shape=[16], name="f9")
    elif change == "drop_feature":
        del fc["f2"]
    elif change == "rename_table":
        fc["f1"].table.name = "z1"
    elif change == "topology":
        topo = Topology(4)
    after = layout_for(fc, topo)
    assert after.to_dict() == stack_tables(fc, topo).to_dict()
    assert after.to_dict() != before
    if change == "output_shape_list":  # a mutable shape: checked every call, still right after a change
        fc["f2"].output_shape.append(2)
        assert layout_for(fc, topo).to_dict() == stack_tables(fc, topo).to_dict()


def test_configs_used_in_turn_are_each_remembered():
    tf = _tf()
    a, b = _tf_config(tf, 3, shared_optimizer=True), _tf_config(tf, 5)
    topo = Topology(2)
    la, lb = layout_for(a, topo), layout_for(b, topo)
    assert layout_for(a, topo) is la and layout_for(b, topo) is lb
    assert la.to_dict() == stack_tables(a, topo).to_dict() and lb.to_dict() == stack_tables(b, topo).to_dict()


def test_an_optimizer_attribute_replaced_by_an_equal_value_keeps_the_stacking():
    """The remembered config's optimizers are compared by the identity of their attributes first; a new but
    equal value falls back to the optimizer's key, which finds the same stacking."""
    tf = _tf()
    fc = _tf_config(tf)
    topo = Topology(2)
    first = layout_for(fc, topo)
    optimizer = fc["f3"].table.optimizer
    optimizer.learning_rate = float(str(optimizer.learning_rate))  # equal, another object
    assert layout_for(fc, topo) is first
    optimizer.learning_rate = 0.5
    assert layout_for(fc, topo).to_dict() == stack_tables(fc, topo).to_dict() != first.to_dict()


def test_unweighted_features_are_handed_over_type_by_type_as_one_by_one():
    """`native_entries` of unweighted features (grouped by type, in C loops) gives, feature by feature, the
    entries of the one-by-one hand-over: the same kinds of buffer, viewing the same memory, in feature order;
    a SparseIds batch and a weighted one go one by one."""
    tf = pytest.importorskip("tensorflow")
    from tpu_embed.sparsecore import inputs as feature_inputs
    splits = np.array([0, 2, 6], np.int64)
    values = [tf.RaggedTensor.from_row_splits(tf.constant(np.arange(6), tf.int64), splits),
              tf.constant([3, 4], tf.int32), np.array([5, 6]), RaggedIds(np.arange(6), splits),
              tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([7, 8, 9], tf.int64), [2, 2]),
              tf.RaggedTensor.from_row_splits(tf.constant(np.arange(3), tf.int32), [0, 1, 3]),
              tf.constant([1, 2], tf.int64)]
    sparse_ids = SparseIds(np.array([[0, 0], [1, 0]]), np.array([1, 2]), np.array([2, 1]))

    def same(got, want):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            for a, b in zip(g or (), w or ()):
                assert (a is None) == (b is None) and type(a) is type(b)
                if a is not None:
                    assert np.shares_memory(a, b) and np.array_equal(a, b)

    for positions in ([0, 1, 2, 3, 4, 5, 6], [6, 4, 0], [5], [2, 3], [0, 5]):
        for _ in range(2):  # learnt, then remembered
            same(feature_inputs.native_entries(values, None, positions),
                 feature_inputs._entries_one_by_one(values, [None] * len(values), positions))
    with_sparse_ids = values + [sparse_ids]
    same(feature_inputs.native_entries(with_sparse_ids, None, [0, 7]),
         feature_inputs._entries_one_by_one(with_sparse_ids, [None] * 8, [0, 7]))
    weights = [None] * 7
    weights[1] = np.array([0.5, 2.0])
    entries = feature_inputs.native_entries(values, weights, [0, 1])
    assert entries[1][2].dtype == np.float32 and np.array_equal(entries[1][2], [0.5, 2.0])


@NATIVE
def test_a_hand_over_learnt_from_one_value_takes_buffers_of_other_types():
    """A type's hand-over is learnt from its first value (which view its buffers get); a later value whose
    buffers are of another type (RaggedIds of numpy arrays, then of TF tensors, then of lists) packs as the
    reference does: the view refuses them and the batch is handed over feature by feature, or the kernel
    reads them as they are, or converts them."""
    tf = _tf()
    from tpu_embed.sparsecore import inputs as feature_inputs
    splits = np.array([0, 1, 3, 3, 5, 8, 8, 8, 8])
    ids = np.array([1, 2, 2, 7, 9, 1, 1, 3])
    fc = {f"f{i}": F(T(f"t{i}", 10), [8]) for i in range(3)}
    want = preprocess({n: RaggedIds(ids, splits) for n in fc}, fc, Topology(1), implementation="reference")
    for first, then in (("numpy", "tf"), ("tf", "numpy"), ("tf", "list")):
        feature_inputs._HANDOVER_OF_TYPE.pop(RaggedIds, None)
        feature_inputs._PLANS.clear()
        for form in (first, then, first):
            make = {"numpy": np.asarray, "tf": tf.constant, "list": list}[form]
            _same(want, preprocess({n: RaggedIds(make(ids), make(splits)) for n in fc}, fc, Topology(1),
                                   implementation="native"))
