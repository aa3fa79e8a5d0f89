"""The SparseCore core without the oracle: implementations agree, inputs of every kind, errors."""

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conformance import cases as C
from tests.helpers import native
from tpu_embed import Topology
from tpu_embed.core.nest import flatten_with_paths
from tpu_embed.sparsecore import (
    LimitExceededError,
    RaggedIds,
    SparseIds,
    feature_ids_for,
    partition_counts,
    preprocess,
    preprocess_with_layout,
    split_global_batch,
    stack_tables,
)

IMPLS = ["reference", "numpy", pytest.param("native", marks=pytest.mark.native("csr"))]


def impls():
    """The implementations to compare in one test: the native one too, unless the fallback was asked for."""
    return ["reference", "numpy"] + (["native"] if native.available("csr") else [])


def T(name, vocab, dim=8, combiner="sum", optimizer="sgd"):
    return types.SimpleNamespace(name=name, vocabulary_size=vocab, dim=dim, combiner=combiner,
                                 optimizer=optimizer)


def F(table, shape):
    return types.SimpleNamespace(table=table, output_shape=list(shape))


def _run(case, impl):
    inputs, fc, topo, kwargs = C.to_ours(case, use_tf=False)
    try:
        return preprocess(inputs, fc, topo, implementation=impl, **kwargs)
    except (ValueError, LimitExceededError) as e:
        return type(e)


def _same(a, b):
    if isinstance(a, type) or isinstance(b, type):
        assert a == b
        return
    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        for field in ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "ids_per_partition",
                      "unique_ids_per_partition"):
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field), err_msg=f"{name}.{field}")
        np.testing.assert_array_equal(x.sorted_gains.view(np.uint32), y.sorted_gains.view(np.uint32))
        for field in ("sample_count", "row_pointers_unpadded_size", "ids_unpadded_size", "dropped_ids",
                      "row_pointers_buffer_size", "ids_buffer_size", "num_minibatches_per_physical_sparse_core"):
            assert getattr(x, field) == getattr(y, field), field


def _with_limits(case):
    mode = case.get("limit_mode")
    if mode:
        _, fc, topo, _ = C.to_ours(case, use_tf=False)
        stacks = stack_tables(fc, topo).stacks
        case["max_ids_per_table"] = {s: mode[1] for s in stacks}
        case["max_unique_ids_per_table"] = {s: max(1, mode[1] - 1) for s in stacks}
    return case


@settings(max_examples=200)
@given(case=C.cases())
def test_reference_numpy_and_native_agree(case):
    case = _with_limits(case)
    compared = impls()
    results = {impl: _run(case, impl) for impl in compared}
    for impl in compared[1:]:
        _same(results["reference"], results[impl])


@settings(max_examples=30)
@given(case=C.cases(weighted=True, allow_sequence=False, limit_modes=("default",)))
def test_numpy_and_native_agree_on_large_weighted_batches(case):
    # Larger batches than the reference can afford: many features, long rows, heavy duplicates.
    rng = np.random.default_rng(len(case["features"]))
    for f in case["features"]:
        spec = case["inputs"][f["name"]]
        if spec["kind"] == "ragged":
            k = rng.integers(0, 40, size=spec["row_splits"].size - 1)
            spec["row_splits"] = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
            spec["values"] = rng.integers(0, 3, size=int(k.sum())) % f_vocab(case, f)
            case["weights"][f["name"]] = {"kind": "ragged", "row_splits": spec["row_splits"],
                                          "values": rng.normal(size=int(k.sum())).astype(np.float32)}
    case["max_ids_per_chip_per_sample"] = 512
    big = {s: 1 << 20 for s in stack_tables(C.to_ours(case, use_tf=False)[1],
                                            Topology(case["num_chips"], case["num_sc_per_chip"])).stacks}
    case["max_ids_per_table"] = case["max_unique_ids_per_table"] = big
    results = [_run(case, impl) for impl in impls() if impl != "reference"]
    for r in results[1:]:
        _same(results[0], r)


def f_vocab(case, f):
    return next(t["vocabulary_size"] for t in case["tables"] if t["name"] == f["table"])


# ------------------------------------------------------------------ inputs

def test_tensorflow_inputs_match_numpy_inputs():
    tf = pytest.importorskip("tensorflow")
    a, b = T("a", 50, combiner="mean"), T("b", 40, combiner="sqrtn")
    fc = {"dense": F(a, [8]), "ragged": F(a, [8]), "sparse": F(b, [8])}
    topo = Topology(2)
    dense = np.arange(8) * 3 % 50
    rag_vals, rag_splits = np.array([1, 2, 2, 7, 9, 1, 1, 3]), np.array([0, 2, 3, 3, 5, 5, 6, 8, 8])
    sp_idx = np.array([[0, 0], [0, 1], [2, 0], [5, 0], [5, 1], [5, 2], [7, 0]])
    sp_vals = np.array([4, 4, 5, 6, 39, 0, 2])
    np_in = {"dense": dense, "ragged": RaggedIds(rag_vals, rag_splits), "sparse": SparseIds(sp_idx, sp_vals, [8, 3])}
    tf_in = {"dense": tf.constant(dense), "ragged": tf.RaggedTensor.from_row_splits(rag_vals, rag_splits),
             "sparse": tf.SparseTensor(sp_idx, sp_vals, [8, 3])}
    w_np = {"dense": np.linspace(0.1, 2, 8).astype(np.float32),
            "ragged": RaggedIds(np.arange(8, dtype=np.float32), rag_splits),
            "sparse": SparseIds(sp_idx, np.ones(7, np.float32) * 0.5, [8, 3])}
    w_tf = {"dense": tf.constant(w_np["dense"]),
            "ragged": tf.RaggedTensor.from_row_splits(w_np["ragged"].values, rag_splits),
            "sparse": tf.SparseTensor(sp_idx, w_np["sparse"].values, [8, 3])}
    _same(preprocess(np_in, fc, topo, weights=w_np), preprocess(tf_in, fc, topo, weights=w_tf))


def test_nested_structures_flatten_like_tf_nest():
    pytest.importorskip("tensorflow")
    from tensorflow.python.util import nest
    t = T("t", 10)
    fc = {"z": F(t, [4]), "a": [F(t, [4]), {"y": F(t, [4]), "b": F(t, [4])}], "m": (F(t, [4]),)}
    ours = [p for p, _ in flatten_with_paths(fc)]
    theirs = [p for p, _ in nest.flatten_with_joined_string_paths(fc)]
    assert ours == theirs
    layout = stack_tables(fc, Topology(1))
    assert [f.path for f in layout.features] == theirs
    # A batch with the same nesting is accepted; a batch missing a feature is named in the error.
    batch = {"z": np.zeros(4, int), "a": [np.ones(4, int), {"y": np.zeros(4, int), "b": np.ones(4, int)}],
             "m": (np.zeros(4, int),)}
    assert preprocess(batch, fc, Topology(1))
    del batch["a"][1]["y"]
    with pytest.raises(ValueError, match=r"missing features \['a/1/y'\]"):
        preprocess(batch, fc, Topology(1))


def test_sequence_feature_dense_and_rank3_sparse_agree():
    t = T("t", 30, combiner="mean")
    fc = {"seq": F(t, [4, 3])}
    dense = np.arange(12).reshape(4, 3) % 30
    idx = np.array([[b, s, 0] for b in range(4) for s in range(3)])
    a = preprocess({"seq": dense}, fc, Topology(1))
    b = preprocess({"seq": SparseIds(idx, dense.reshape(-1), np.array([4, 3, 1]))}, fc, Topology(1))
    _same(a, b)


# ------------------------------------------------------------------ errors

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad,match", [(-1, r"'f'.*id -1 .*outside.*\[0, 10\).*Negative ids"),
                                       (10, r"'f'.*id 10 .*outside.*\[0, 10\).*vocabulary_size")])
def test_ids_out_of_range_name_the_feature(impl, bad, match):
    fc = {"f": F(T("t", 10), [4])}
    with pytest.raises(ValueError, match=match):
        preprocess({"f": np.array([1, 2, bad, 3])}, fc, Topology(1), implementation=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("w", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_name_the_feature(impl, w):
    fc = {"f": F(T("t", 10, combiner="mean"), [4])}
    with pytest.raises(ValueError, match=r"'f': weight .* not finite"):
        preprocess({"f": np.array([1, 2, 3, 4])}, fc, Topology(1), implementation=impl,
                   weights={"f": np.array([1, 1, w, 1], np.float32)})


def test_unsorted_sparse_indices():
    fc = {"f": F(T("t", 10), [4])}
    sp = SparseIds(np.array([[1, 0], [0, 0]]), np.array([1, 2]), np.array([4, 1]))
    with pytest.raises(ValueError, match=r"'f'.*not sorted.*tf.sparse.reorder"):
        preprocess({"f": sp}, fc, Topology(1))


def test_sparse_rows_beyond_batch():
    fc = {"f": F(T("t", 10), [4])}
    sp = SparseIds(np.array([[0, 0], [4, 0]]), np.array([1, 2]), np.array([5, 1]))
    with pytest.raises(ValueError, match=r"'f'.*outside \[0, 4\)"):
        preprocess({"f": sp}, fc, Topology(1))


def test_dense_with_wrong_number_of_ids():
    fc = {"f": F(T("t", 10), [4])}
    with pytest.raises(ValueError, match=r"'f'.*dense input has 8 ids.*4 samples"):
        preprocess({"f": np.zeros((4, 2), int)}, fc, Topology(1))


def test_ragged_with_wrong_number_of_rows():
    fc = {"f": F(T("t", 10), [4])}
    with pytest.raises(ValueError, match=r"'f'.*3 rows.*4 samples"):
        preprocess({"f": RaggedIds(np.array([1, 2]), np.array([0, 1, 2, 2]))}, fc, Topology(1))


def test_topology_must_be_power_of_two():
    with pytest.raises(ValueError, match="not a power of two"):
        Topology(3)
    with pytest.raises(ValueError, match="not divisible by num_hosts"):
        Topology(4, num_hosts=3)


def test_batch_not_divisible_by_sparse_cores():
    with pytest.raises(ValueError, match=r"'f'.*6 samples per chip.*not divisible by 4"):
        stack_tables({"f": F(T("t", 10), [6])}, Topology(1))


def test_missing_output_shape():
    with pytest.raises(ValueError, match=r"'f' has no output_shape"):
        stack_tables({"f": types.SimpleNamespace(table=T("t", 10), output_shape=None)}, Topology(1))


@pytest.mark.parametrize("impl", IMPLS)
def test_limit_overflow_names_stack_and_fix(impl):
    fc = {"f": F(T("t", 100), [8])}
    ids = RaggedIds(np.arange(40) * 8 % 100, np.arange(0, 41, 5))  # many ids to one SparseCore
    with pytest.raises(LimitExceededError, match=r"Stack 't'.*max_ids_per_table\['t'\] = 3.*at least"):
        preprocess({"f": ids}, fc, Topology(1), max_ids_per_table={"t": 3}, implementation=impl)
    with pytest.raises(LimitExceededError, match=r"unique ids.*max_unique_ids_per_table\['t'\] = 2"):
        preprocess({"f": ids}, fc, Topology(1), max_unique_ids_per_table={"t": 2}, implementation=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_buffer_overflow_errors_or_drops_and_counts(impl):
    fc = {"f": F(T("t", 1000), [8])}
    ids = RaggedIds(np.arange(64), np.arange(0, 65, 8))
    with pytest.raises(LimitExceededError, match=r"id buffer of 64 entries.*allow_id_dropping"):
        preprocess({"f": ids}, fc, Topology(1), max_ids_per_chip_per_sample=8, implementation=impl)
    out = preprocess({"f": ids}, fc, Topology(1), max_ids_per_chip_per_sample=8, allow_id_dropping=True,
                     implementation=impl)["t"]
    kept = int(np.sum(out.sorted_token_ids != 2**31 - 1))
    assert out.dropped_ids == 64 - kept and out.dropped_ids > 0
    assert out.ids_unpadded_size <= out.ids_buffer_size == 64


@pytest.mark.parametrize("impl", IMPLS)
def test_limits_changed_between_calls_are_read_again(impl):
    """`preprocess` remembers the last limits it checked; a dict changed in place, another value or another
    layout is read (and checked) again."""
    fc = {"f": F(T("t", 100), [8])}
    ids = RaggedIds(np.arange(40) * 8 % 100, np.arange(0, 41, 5))
    most = preprocess({"f": ids}, fc, Topology(1), implementation=impl)["t"].max_ids_per_partition
    limits = {"t": most}
    preprocess({"f": ids}, fc, Topology(1), max_ids_per_table=limits, implementation=impl)
    limits["t"] = most - 1
    with pytest.raises(LimitExceededError, match=rf"max_ids_per_table\['t'\] = {most - 1}"):
        preprocess({"f": ids}, fc, Topology(1), max_ids_per_table=limits, implementation=impl)
    limits["t"] = 0
    with pytest.raises(ValueError, match=r"max_ids_per_table\['t'\] must be > 0"):
        preprocess({"f": ids}, fc, Topology(1), max_ids_per_table=limits, implementation=impl)
    limits["t"] = most
    preprocess({"f": ids}, fc, Topology(1), max_ids_per_table=limits, implementation=impl)
    with pytest.raises(LimitExceededError, match=r"id buffer of 8 entries"):
        preprocess({"f": ids}, fc, Topology(1), max_ids_per_table=limits, max_ids_per_chip_per_sample=1,
                   implementation=impl)
    with pytest.raises(ValueError, match=r"entries \['t'\] that are not stacked tables"):
        preprocess({"f": ids}, {"f": F(T("u", 100), [8])}, Topology(1), max_ids_per_table=limits, implementation=impl)


def test_unknown_limit_keys_are_rejected():
    fc = {"f": F(T("t", 10), [4])}
    with pytest.raises(ValueError, match=r"max_ids_per_table has entries \['x'\].*stacks are \['t'\]"):
        preprocess({"f": np.arange(4)}, fc, Topology(1), max_ids_per_table={"x": 3})


def test_buffer_not_multiple_of_eight():
    fc = {"f": F(T("t", 10), [4])}
    with pytest.raises(ValueError, match="not a multiple of 8"):
        preprocess({"f": np.arange(4)}, fc, Topology(1), max_ids_per_chip_per_sample=1)


def test_missing_feature_value():
    fc = {"f": F(T("t", 10), [4]), "g": F(T("t", 10), [4])}
    with pytest.raises(ValueError, match=r"'g' is missing"):
        preprocess({"f": np.arange(4), "g": None}, fc, Topology(1))


# ------------------------------------------------------------------ layout

def test_activation_limit_counts_every_feature_unlike_tf():
    # 8 features of 2048 samples on 8 tables of width 64: 4 B * 64 * 512 = 128 KiB each per SC.
    # With every feature counted, stacks stay under 2 MiB; TF 2.20 counts only the first feature.
    tables = [T(f"t{i}", 1000, dim=64) for i in range(20)]
    fc = {f"f{i:02d}": F(t, [2048]) for i, t in enumerate(tables)}
    ours = stack_tables(fc, Topology(1))
    tf_like = stack_tables(fc, Topology(1), tf_first_feature_only=True)
    assert len(tf_like.stacks) == 1
    assert len(ours.stacks) == 2
    for s in ours.stacks.values():
        per_sc = sum(ours.feature(p).sample_count for p in s.features) // 4
        assert 4 * s.padded_dim * per_sc < 2 * 1024 * 1024


def test_stacking_groups_by_width_and_optimizer():
    fc = {"a": F(T("a", 100, dim=8), [4]), "b": F(T("b", 100, dim=6), [4]),
          "c": F(T("c", 100, dim=16), [4]), "d": F(T("d", 100, dim=8, optimizer="adagrad"), [4])}
    layout = stack_tables(fc, Topology(2))
    assert {k: v.tables for k, v in layout.stacks.items()} == {"a_b": ("a", "b"), "c": ("c",), "d": ("d",)}
    assert layout.tables["b"].rotation == 4 and layout.tables["b"].shard_row_offset == 128 // 8
    assert stack_tables(fc, Topology(2), disable_table_stacking=True).stacks.keys() == {"a", "b", "c", "d"}


# ------------------------------------------------------------------ batching

@settings(max_examples=40)
@given(case=C.cases(max_chips=4, limit_modes=("default",)), chips=st.sampled_from([1, 2, 4]))
def test_split_global_batch_matches_per_chip_preprocess(case, chips):
    # Build a global batch of `chips` per-chip batches; splitting it must give each chip's batch back.
    _, fc, topo, _ = C.to_ours(case, use_tf=False)
    topo = Topology(chips, case["num_sc_per_chip"])
    layout = stack_tables(fc, topo)
    inputs, _, _, _ = C.to_ours(case, use_tf=False)
    per_chip = feature_ids_for(inputs, layout)
    global_ids = {}
    for f in layout.features:
        p = per_chip[f.path]
        n = f.sample_count
        global_ids[f.path] = type(p)(
            rows=np.concatenate([p.rows + c * n for c in range(chips)]),
            ids=np.concatenate([p.ids] * chips), weights=None)
    chips_ids = split_global_batch(global_ids, layout)
    assert len(chips_ids) == chips
    big = {s: 1 << 20 for s in layout.stacks}
    ref = preprocess_with_layout(inputs, layout, max_ids_per_table=big, max_unique_ids_per_table=big,
                                 max_ids_per_chip_per_sample=256)
    for c in range(chips):
        counts = partition_counts(chips_ids[c], layout)
        for s, b in ref.items():
            np.testing.assert_array_equal(counts[s][0], b.ids_per_partition)
            np.testing.assert_array_equal(counts[s][1], b.unique_ids_per_partition)


@pytest.mark.native("csr")
def test_native_packer_works_in_a_forked_child():
    # The native kernel keeps a thread pool; a fork (multiprocessing's default on Linux) must not
    # inherit a pool whose threads do not exist in the child.
    import multiprocessing
    fc = {"f": F(T("t", 100, combiner="mean"), [16])}
    batch = {"f": RaggedIds(np.arange(40) % 100, np.linspace(0, 40, 17).astype(np.int64))}
    want = preprocess(batch, fc, Topology(2), implementation="native")  # starts the pool here
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_pack_in_child, (batch, fc)).get(timeout=60)
    _same(want, got)


def _pack_in_child(batch, fc):
    return preprocess(batch, fc, Topology(2), implementation="native")
