"""The native step counts (`profiles/native/_step_counts.c`) equal the numpy reference: every table's cells,
the frequency-order stacks, the hottest ids, the valency histograms and the id counts, on random models,
topologies and batches (multivalent and sequence features, balanced ids); and the collector's accumulator is
the same with either."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import ProfileCollector, step_counts, synthetic
from profiles.collector import StepInput
from profiles.counting import one_chip_model
from profiles.idcounts import IdCounts
from tests.helpers import native
from tests.profiles.test_counting import _model_and_batch, configs
from tpu_embed.core.model import from_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import FeatureIds


@pytest.fixture(autouse=True)
def _native_built():
    native.require("step_counts")


def _plain(s: step_counts.StepCounts) -> dict:
    """A `StepCounts` as lists (its arrays compared by value; a histogram without its trailing zeros)."""
    def hist(h):
        h = np.trim_zeros(np.asarray(h), "b")
        return h.tolist()

    def arr(a):
        return None if a is None else a.tolist()
    return {"tables": (arr(s.table_ids), arr(s.table_unique)), "stacks": (arr(s.stack_ids), arr(s.stack_unique)),
            "frequency": (arr(s.frequency_stack_ids), arr(s.frequency_stack_unique)), "hottest": arr(s.hottest),
            "valency": {f: hist(h) for f, h in s.valency.items()}, "lookups": s.lookups}


def _both(model, batches, freq):
    one_chip = one_chip_model(model)
    counts = [{t.name: IdCounts() for t in model.tables} for _ in range(2)]
    got = step_counts.count_steps(model, one_chip, batches, freq, counts[0])
    want = step_counts.count_steps_reference(model, one_chip, batches, freq, counts[1])
    return got, want, counts


def _frequency_ids(model, rng):
    return {t.name: rng.permutation(int(rng.integers(0, t.vocabulary_size + 1))).astype(np.int64)
            for t in model.tables if rng.random() < 0.7}


def _drawn(cfg, n_steps: int, balanced: bool):
    """The model of a drawn config, `n_steps` of its batches and, if `balanced`, frequency ids of some tables."""
    model, _ = _model_and_batch(cfg)
    fc, topo, seed, zipf = cfg
    rng = np.random.default_rng(seed)
    batches = [synthetic.global_batch(fc, topo.num_chips, rng, zipf_a=zipf) for _ in range(n_steps)]
    return model, batches, _frequency_ids(model, rng) if balanced else {}


@settings(max_examples=60, deadline=None)
@given(configs(), st.integers(1, 4), st.booleans())
def test_native_step_counts_equal_the_reference(cfg, n_steps, balanced):
    model, batches, freq = _drawn(cfg, n_steps, balanced)
    got, want, counts = _both(model, batches, freq)
    assert [_plain(s) for s in got] == [_plain(s) for s in want]
    assert counts[0] == counts[1]


def _one_feature(rows, ids, vocab=50, batch=8, nsc=2, chips=2):
    fc = synthetic.feature_config(1, per_chip_batch=batch, vocab_sizes=[vocab])
    model = from_tf_feature_config(fc, Topology(chips, nsc))
    name = model.features[0].name
    return model, {name: FeatureIds(np.asarray(rows, np.int64), np.asarray(ids, np.int64), None)}


def test_an_example_with_more_ids_than_the_kernels_histogram_is_counted_by_numpy():
    n = step_counts.HISTOGRAM_SIZE + 5
    rows = [0] * n + [3, 3, 9]
    ids = list(range(n)) + [1, 1, 2]
    model, step = _one_feature(rows, ids, vocab=200)
    got, want, counts = _both(model, [step], {})
    assert _plain(got[0]) == _plain(want[0])
    assert got[0].valency[model.features[0].name][n] == 1
    assert counts[0] == counts[1]


def test_equal_pairs_are_merged_and_distinct_ids_counted_once_per_sparse_core():
    # 2 chips x 2 SparseCores, 16 samples: 4 per SparseCore; S = 4 destinations (id mod 4).
    rows = [0, 0, 0, 1, 5, 6, 6, 15]
    ids = [7, 7, 3, 7, 7, 7, 11, 7]
    model, step = _one_feature(rows, ids)
    got, want, _ = _both(model, [step], {})
    assert _plain(got[0]) == _plain(want[0])
    ids_cells, uniq_cells = got[0].table_ids[0].reshape(2, 2, 4), got[0].table_unique[0].reshape(2, 2, 4)
    # SparseCore 0 (chip 0, SC 0): samples 0 and 1 look up 7 (merged within sample 0) and 3.
    assert ids_cells[0, 0].tolist() == [0, 0, 0, 3] and uniq_cells[0, 0].tolist() == [0, 0, 0, 2]
    # SparseCore 1: samples 5 and 6 look up 7 twice and 11 once: 3 ids, 2 distinct, all in destination 3.
    assert ids_cells[0, 1].tolist() == [0, 0, 0, 3] and uniq_cells[0, 1].tolist() == [0, 0, 0, 2]
    assert got[0].hottest.tolist() == [5]  # id 7: samples 0, 1, 5, 6, 15


@pytest.mark.parametrize("rows, ids, message", [
    ([3, 1], [0, 1], "out of order"),
    ([0, 16], [0, 1], "outside its SparseCores' samples"),
    ([0, -1], [0, 1], "outside its SparseCores' samples"),
    ([0, 1], [0, 50], "outside"),
    ([0, 1], [-2, 1], "outside"),
])
def test_the_kernel_refuses_what_would_corrupt_its_counts(rows, ids, message):
    model, step = _one_feature(rows, ids)
    with pytest.raises(ValueError, match=message):
        step_counts.count_steps(model, one_chip_model(model), [step], {}, {model.tables[0].name: IdCounts()})


def test_stamps_that_would_wrap_clear_the_scratch_first():
    fc = synthetic.feature_config(2, per_chip_batch=8, vocab_sizes=[30, 70])
    model = from_tf_feature_config(fc, Topology(2, 2))
    rng = np.random.default_rng(5)
    batches = [synthetic.global_batch(fc, 2, rng) for _ in range(3)]
    want, _, _ = _both(model, batches, {})
    scratch = step_counts._scratch_for(70)
    scratch[:2] = np.array([0xFFFFFFF0, 0], np.uint32)  # the counter (slot 0), about to wrap
    got, _, _ = _both(model, batches, {})
    assert [_plain(s) for s in got] == [_plain(s) for s in want]
    assert int(scratch.view(np.uint64)[0]) < 1 << 16  # restarted from zero


@settings(max_examples=25, deadline=None)
@given(configs(), st.integers(1, 5), st.booleans())
def test_the_collectors_accumulator_is_the_same_native_or_not(cfg, n_steps, balanced):
    model, batches, freq = _drawn(cfg, n_steps, balanced)
    collector = ProfileCollector(model, frequency_ids=freq or None)
    accs = []
    for use_native in (True, False):
        acc = collector.create_accumulator()
        saved = step_counts._native
        step_counts._native = saved if use_native else None
        try:
            collector.add_steps(acc, [StepInput(b, None, i) for i, b in enumerate(batches)])
        finally:
            step_counts._native = saved
        accs.append(acc)
    assert accs[0] == accs[1]
    assert collector.extract_output(accs[0]) == collector.extract_output(accs[1])


@pytest.mark.parametrize("limit", ["NATIVE_MAX_TABLE_ROWS", "NATIVE_MAX_MODEL_ROWS"])
def test_a_model_past_the_kernels_memory_limits_is_counted_by_numpy(monkeypatch, limit):
    fc = synthetic.feature_config(2, per_chip_batch=8, vocab_sizes=[30, 70])
    model = from_tf_feature_config(fc, Topology(2, 2))
    batches = [synthetic.global_batch(fc, 2, np.random.default_rng(4)) for _ in range(2)]
    want, _, _ = _both(model, batches, {})
    monkeypatch.setattr(step_counts, limit, 50)
    assert not step_counts.native_counts(model)

    class Refused:
        def count_step(self, *args):
            raise AssertionError("the kernel was called")

    monkeypatch.setattr(step_counts, "_native", Refused())
    counts = {t.name: IdCounts() for t in model.tables}
    got = step_counts.count_steps(model, one_chip_model(model), batches, {}, counts)
    assert [_plain(s) for s in got] == [_plain(s) for s in want]
    assert all(c._dense is None for c in counts.values())  # no dense count of the vocabulary
