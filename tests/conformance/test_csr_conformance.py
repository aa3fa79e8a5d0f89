"""Our SparseCore preprocessing against TensorFlow's own kernels (tensorflow-tpu 2.20 on CPU)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conformance import cases as C
from tpu_embed.sparsecore import LimitExceededError, preprocess, stack_tables

pytestmark = pytest.mark.conformance


def _apply_limits(case, layout):
    mode = case.get("limit_mode")
    if mode:
        _, lim = mode
        case["max_ids_per_table"] = {s: lim for s in layout.stacks}
        case["max_unique_ids_per_table"] = {s: max(1, lim - 1) for s in layout.stacks}


def _compare(case, oracle, tf_inputs=None, implementations=("auto",)):
    """`tf_inputs`: None, our side gets numpy inputs; "int64" / "int32", the TF tensors a user has.
    `implementations`: those of `preprocess` compared, each against the one answer of TF."""
    inputs, fc, topo, kwargs = C.to_ours(case)
    layout = stack_tables(fc, topo)
    _apply_limits(case, layout)
    inputs, fc, topo, kwargs = C.to_ours(case)
    if tf_inputs is not None:
        inputs, kwargs["weights"] = C.tf_inputs(case, int32=tf_inputs == "int32")
    tf_out = oracle(C.request(case, "preprocess"))
    for implementation in implementations:
        if "error" in tf_out:
            with pytest.raises((LimitExceededError, ValueError)):
                preprocess(inputs, fc, topo, implementation=implementation, **kwargs)
            continue
        _same_as_tf(preprocess(inputs, fc, topo, implementation=implementation, **kwargs), tf_out, implementation)
    return "error" if "error" in tf_out else "ok"


def _same_as_tf(ours, tf_out, implementation):
    assert list(ours) == list(tf_out)
    for name, t in tf_out.items():
        b = ours[name]
        p = b.prefixes()
        assert b.row_pointers_unpadded_size == t["row_pointers_unpadded_size"], (name, implementation)
        assert b.ids_unpadded_size == t["ids_unpadded_size"], name
        assert b.sample_count == t["sample_count"]
        assert b.num_minibatches_per_physical_sparse_core == t["num_minibatches"]
        assert b.row_pointers_buffer_size == t["row_pointers_size"] and b.ids_buffer_size == t["ids_size"]
        np.testing.assert_array_equal(p["row_pointers"], t["row_pointers"], err_msg=name)
        np.testing.assert_array_equal(p["sorted_token_ids"], t["sorted_token_ids"], err_msg=name)
        np.testing.assert_array_equal(p["sorted_sample_ids"], t["sorted_sample_ids"], err_msg=name)
        # Bit for bit: float32 gains compared as raw bits.
        np.testing.assert_array_equal(p["sorted_gains"].view(np.uint32), t["sorted_gains"].view(np.uint32),
                                      err_msg=f"{name} ({implementation})")


@settings(max_examples=150)
@given(case=C.cases())
def test_preprocess_matches_tensorflow(case, oracle):
    _compare(case, oracle)


@settings(max_examples=60)
@given(case=C.cases(), tf_inputs=st.sampled_from(["int64", "int32"]))
def test_tf_tensor_inputs_match_tensorflow(case, tf_inputs, oracle):
    """tf.Tensor / tf.SparseTensor / tf.RaggedTensor inputs (int64, or int32 ids and row_splits) go to our kernel
    as they are and give TF's bytes."""
    _compare(case, oracle, tf_inputs)


@settings(max_examples=40)
@given(case=C.cases(weighted=True, allow_sequence=False))
def test_weighted_combiners_match_tensorflow(case, oracle):
    case.pop("limit_mode", None)
    case.pop("max_ids_per_chip_per_sample", None)
    _compare(case, oracle)


def test_overflow_and_dropping_cases_really_occur(oracle):
    """The generators above must actually reach the error and dropping paths."""
    seen = {"ok": 0, "error": 0, "dropped": 0}

    @settings(max_examples=60, database=None, derandomize=True)
    @given(case=C.cases(max_chips=4, limit_modes=("tight", "buffer", "buffer")))
    def run(case):
        res = _compare(case, oracle)
        seen[res] += 1
        if res == "ok" and case.get("allow_id_dropping"):
            inputs, fc, topo, kwargs = C.to_ours(case)
            if any(b.dropped_ids for b in preprocess(inputs, fc, topo, **kwargs).values()):
                seen["dropped"] += 1

    run()
    assert seen["ok"] > 5 and seen["error"] > 5 and seen["dropped"] > 0, seen


def test_dropping_truncates_like_tensorflow_and_counts(oracle):
    case = {"tables": [{"name": "t", "vocabulary_size": 100, "dim": 8, "combiner": "sum"}],
            "features": [{"name": "f00", "table": "t", "output_shape": [4]}], "num_chips": 4,
            "num_sc_per_chip": 4, "weights": None, "max_ids_per_chip_per_sample": 8,
            "allow_id_dropping": True,
            "inputs": {"f00": {"kind": "ragged", "values": np.arange(40) % 97,
                               "row_splits": np.array([0, 10, 20, 30, 40])}}}
    assert _compare(case, oracle) == "ok"
    inputs, fc, topo, kwargs = C.to_ours(case)
    batch = preprocess(inputs, fc, topo, **kwargs)["t"]
    # 40 distinct (sample, id) pairs, 4 fit in the 32-slot buffer (one per 8-aligned segment).
    assert batch.dropped_ids == 36
    case["allow_id_dropping"] = False
    assert _compare(case, oracle) == "error"
    inputs, fc, topo, kwargs = C.to_ours(case)
    with pytest.raises(LimitExceededError, match="max_ids_per_chip_per_sample"):
        preprocess(inputs, fc, topo, **kwargs)


@settings(max_examples=80)
@given(case=C.cases(max_features=6, max_tables=6))
def test_stacking_matches_tensorflow(case, oracle):
    _, fc, topo, _ = C.to_ours(case)
    tf_stack = oracle(C.request(case, "stack"))
    # TF 2.20 sizes the activation-memory check from the first feature only; reproduce that here
    # and check separately that our default (all features) only differs when that bug matters.
    ours = stack_tables(fc, topo, tf_first_feature_only=True)
    assert {k: list(v.tables) for k, v in ours.stacks.items()} == tf_stack["stacks"]
    assert list(ours.stacks) == list(tf_stack["stacks"])
    for name, (stack, col_offset, rot) in tf_stack["table_to_stacked_table_offset"].items():
        t = ours.tables[name]
        assert (t.stack, t.col_offset, t.rotation) == (stack, col_offset, rot), name
    assert {f.path: f.sample_offset for f in ours.features} == tf_stack["feature_to_sample_offset"]
    assert {k: v.sample_count for k, v in ours.stacks.items()} == tf_stack["table_to_sample_count"]


@settings(max_examples=60)
@given(case=C.cases(max_features=4))
def test_stats_match_compute_sparse_core_stats(case, oracle):
    case.pop("limit_mode", None)
    case.pop("max_ids_per_chip_per_sample", None)
    case.pop("allow_id_dropping", None)
    case["weights"] = None  # TF's stats function takes no weights
    # TF's compute_sparse_core_stats lists a table once per feature; keep one feature per table.
    seen, feats = set(), []
    for f in case["features"]:
        if f["table"] not in seen:
            seen.add(f["table"])
            feats.append(f)
    case["features"] = feats
    case["inputs"] = {f["name"]: case["inputs"][f["name"]] for f in feats}
    tf_stats = oracle(C.request(case, "stats"))
    assert "error" not in tf_stats, tf_stats
    inputs, fc, topo, kwargs = C.to_ours(case)
    big = {s: 1 << 30 for s in stack_tables(fc, topo).stacks}
    ours = preprocess(inputs, fc, topo, max_ids_per_table=big, max_unique_ids_per_table=big,
                      max_ids_per_chip_per_sample=1024)
    assert {k: b.max_ids_per_partition for k, b in ours.items()} == tf_stats["max_ids"]
    assert {k: b.max_unique_ids_per_partition for k, b in ours.items()} == tf_stats["max_unique_ids"]


@settings(max_examples=30)
@given(case=C.cases(max_features=4, limit_modes=("default",)))
def test_limits_exactly_at_and_one_past_the_maximum(case, oracle):
    """A limit equal to the observed maximum fits (in TF and here); one less overflows in both."""
    inputs, fc, topo, kwargs = C.to_ours(case)
    big = {s: 1 << 20 for s in stack_tables(fc, topo).stacks}
    kwargs.update(max_ids_per_table=big, max_unique_ids_per_table=big, max_ids_per_chip_per_sample=256,
                  allow_id_dropping=False)
    base = preprocess(inputs, fc, topo, **kwargs)
    at_ids = {s: max(1, b.max_ids_per_partition) for s, b in base.items()}
    at_uniq = {s: max(1, b.max_unique_ids_per_partition) for s, b in base.items()}
    case.update(max_ids_per_chip_per_sample=256, allow_id_dropping=False)
    case["max_ids_per_table"], case["max_unique_ids_per_table"] = at_ids, at_uniq
    assert _compare(case, oracle) == "ok"
    over = [s for s, b in base.items() if b.max_ids_per_partition > 1]
    if over:
        case["max_ids_per_table"] = dict(at_ids, **{over[0]: at_ids[over[0]] - 1})
        assert _compare(case, oracle) == "error"
    case["max_ids_per_table"] = at_ids
    over = [s for s, b in base.items() if b.max_unique_ids_per_partition > 1]
    if over:
        case["max_unique_ids_per_table"] = dict(at_uniq, **{over[0]: at_uniq[over[0]] - 1})
        assert _compare(case, oracle) == "error"


@settings(max_examples=25)
@given(case=C.cases(batch_mult=(16, 300), limit_modes=("default", "buffer"), max_features=6, max_tables=5))
def test_large_batches_match_tensorflow(case, oracle):
    """Per-chip batches up to 1200 samples: multi-pass radix sorts, long rows, many duplicates."""
    _, fc, topo, _ = C.to_ours(case)
    big = {s: 1 << 20 for s in stack_tables(fc, topo).stacks}
    case["max_ids_per_table"] = case["max_unique_ids_per_table"] = big
    _compare(case, oracle)
