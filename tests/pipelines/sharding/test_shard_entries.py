"""`pipelines.sharding.step_records.build_step` packs each chip from slices of the step's values (`chip_entries`)
and hands its ids to the profile as `batches.GlobalIds` (rows made when read): the same CSR, records and ids as the
per-id rows of `global_feature_ids` split by `split_global_batch`, on random specs and steps (multivalent,
weighted, sequence and tensor-core features; several chips and hosts; combiners; empty examples)."""

import pickle
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.sharding import batches as batching
from pipelines.sharding import packing_limits as shard_limits
from pipelines.sharding import step_records
from pipelines.sharding.batches import ExampleBlock, FeatureBlock
from tests.helpers import native as helpers_native
from tpu_embed.artifact.spec import parse_spec
from tpu_embed.sparsecore import csr, preprocess_with_layout, split_global_batch

VOCAB = {"a": 7, "b": 50, "c": 3, "d": 20, "e": 9, "t": 5}


def _spec(kinds, chips, hosts, per_chip, combiner, weighted_ids):
    cat = []
    for name, kind in kinds.items():
        d = {"name": name, "vocabulary": {"type": "identity", "num_buckets": VOCAB[name]}}
        if kind in ("multi", "weighted"):
            d["delimiter"] = "|"
        if kind == "weighted":
            d["weight_column"] = name + "_w"
        if kind == "sequence":
            d.update(delimiter="|", sequence_length=3)
        if kind == "tensor_core":
            d.update(delimiter="|", embedding_lookup_device="tpu_tensor_core", tensor_core_width=4)
        cat.append(d)
    cat.append({"name": "t", "vocabulary": {"type": "identity", "num_buckets": VOCAB["t"]}})
    return parse_spec({
        "name": "entries", "inputs": {"format": "csv", "patterns": ["x.csv"]}, "label": {"column": "label"},
        "dense": ["x"], "categorical": cat, "defaults": {"table": {"dim": 4, "combiner": combiner}},
        "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": chips, "num_sc_per_chip": 2, "num_hosts": hosts},
        "global_batch_size": chips * per_chip,
        "limits": {"max_ids_per_chip_per_sample": 64, "allow_id_dropping": weighted_ids},
    }, base_dir="/tmp")


@st.composite
def steps(draw):
    kinds = {n: draw(st.sampled_from(["one", "multi", "weighted", "sequence", "tensor_core"]))
             for n in draw(st.lists(st.sampled_from("abcde"), min_size=1, max_size=4, unique=True))}
    chips, hosts = draw(st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 1), (4, 2)]))
    per_chip = 2 * draw(st.integers(1, 3))  # a multiple of the SparseCores per chip
    spec = _spec(kinds, chips, hosts, per_chip, draw(st.sampled_from(["sum", "mean", "sqrtn"])),
                 draw(st.booleans()))
    n = spec.global_batch_size
    features = {}
    for f in spec.categorical:
        most = 1 if f.name == "t" or kinds.get(f.name) == "one" else 3 if f.sequence_length else 4
        lengths = np.array(draw(st.lists(st.integers(0, most), min_size=n, max_size=n)), np.int64)
        total = int(lengths.sum())
        ids = np.array(draw(st.lists(st.integers(0, VOCAB[f.name] - 1), min_size=total, max_size=total)), np.int64)
        weights = None
        if f.weight_column:
            weights = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5, -1.0]), min_size=total,
                                             max_size=total)), np.float32)
        features[f.name] = FeatureBlock(lengths, ids, weights, np.zeros(n, np.int32))
    block = ExampleBlock(np.ones(n, np.float32), np.zeros((n, 1), np.float32), np.ones(n, np.float32), features)
    layout = spec.layout({k: VOCAB[k] for k in VOCAB})
    return spec, layout, block


def _same_batches(a, b):
    assert a.keys() == b.keys()
    for k in a:
        for field in ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains",
                      "ids_per_partition", "unique_ids_per_partition"):
            np.testing.assert_array_equal(getattr(a[k], field), getattr(b[k], field), err_msg=f"{k} {field}")
        assert (a[k].ids_unpadded_size, a[k].dropped_ids) == (b[k].ids_unpadded_size, b[k].dropped_ids)


@pytest.mark.native("csr")
@settings(max_examples=150, deadline=None)
@given(steps())
def test_chip_entries_pack_as_the_split_global_ids(case):
    spec, layout, block = case
    limits = shard_limits.resolve_limits(spec, layout)
    kw = dict(max_ids_per_chip_per_sample=limits.max_ids_per_chip_per_sample,
              max_ids_per_table=dict(limits.max_ids_per_table),
              max_unique_ids_per_table=dict(limits.max_unique_ids_per_table),
              allow_id_dropping=limits.allow_id_dropping)
    per_stack = step_records.stack_limits_of(layout, kw["max_ids_per_table"], kw["max_unique_ids_per_table"],
                                       kw["max_ids_per_chip_per_sample"], kw["allow_id_dropping"])
    chips = list(range(layout.topology.num_chips))
    entries = step_records.chip_entries(block, spec, layout, chips)
    split = split_global_batch(step_records.global_ids_of(block, spec), layout, chips)
    for chip, by_rows in zip(entries, split):
        got = {name: csr.preprocess_stack_native(stack, layout, chip, per_stack[name])
               for name, stack in layout.stacks.items()}
        _same_batches(got, preprocess_with_layout(by_rows, layout, implementation="numpy", **kw))


@settings(max_examples=100, deadline=None)
@given(steps())
def test_build_step_records_are_those_of_the_split_global_ids(case):
    """The records, ids and counts of `build_step` with the native packer on `chip_entries` and without it
    (numpy on `split_global_batch`) are the same bytes."""
    spec, layout, block = case
    limits = shard_limits.resolve_limits(spec, layout)
    want = None
    for native in ([True, False] if helpers_native.available("csr") else [False]):
        with mock.patch.object(csr, "native_available", lambda native=native: native):
            records, gids, oov, counts = step_records.build_step(3, block, spec, layout, limits)
        if want is None:
            want = (records, oov, counts)
        else:
            assert (records, oov, counts) == want
    for f in spec.sparse_core_features:
        expect = batching.global_feature_ids(block, f.name, f.sequence_length)
        for got in (gids[f.name], pickle.loads(pickle.dumps(gids))[f.name]):
            np.testing.assert_array_equal(got.rows, expect.rows)
            np.testing.assert_array_equal(got.ids, expect.ids)
            assert (got.weights is None) == (expect.weights is None)
            if got.weights is not None:
                np.testing.assert_array_equal(got.weights, expect.weights)
    assert sorted(gids) == sorted(f.name for f in spec.sparse_core_features) and len(gids) == len(list(gids))


def test_a_step_of_the_wrong_size_is_refused():
    spec = _spec({"a": "multi"}, 2, 1, 2, "sum", False)
    layout = spec.layout(VOCAB)
    n = spec.global_batch_size + 1
    block = ExampleBlock(np.ones(n, np.float32), np.zeros((n, 1), np.float32), np.ones(n, np.float32),
                         {k: FeatureBlock(np.ones(n, np.int64), np.zeros(n, np.int64), None, np.zeros(n, np.int32))
                          for k in ("a", "t")})
    with pytest.raises(ValueError, match="the step has 5 samples, not the 4 of its global batch"):
        step_records.chip_entries(block, spec, layout, [0, 1])
