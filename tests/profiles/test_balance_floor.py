"""The profile's per-step balance: the hottest id per table and step against plain Python, the floor and worst step
of a stack against the core's own per-step counts, and the frequency-order figures of a profile with balanced ids
against a profile of the same steps with the ids relabelled (random models and batches)."""

from __future__ import annotations

import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import ProfileCollector, synthetic
from profiles.counting import hottest_per_table
from profiles.stats import PartitionStats
from tests.profiles.test_counting import _core_stack_counts, _model_and_batch, configs
from tpu_embed.sparsecore import FeatureIds, layout_of


def plain_hottest(model, batch):
    out = {}
    for t in model.tables:
        c: collections.Counter = collections.Counter()
        for f in model.table_features(t.name):
            fid = batch[f.name]
            for _, i in set(zip(fid.rows.tolist(), fid.ids.tolist())):
                c[i] += 1
        out[t.name] = max(c.values(), default=0)
    return out


@settings(max_examples=60, deadline=None)
@given(configs())
def test_hottest_per_table_is_the_plain_count(cfg):
    model, batch = _model_and_batch(cfg)
    assert hottest_per_table(model, batch) == plain_hottest(model, batch)


@settings(max_examples=30, deadline=None)
@given(configs(), st.integers(1, 4))
def test_floor_and_worst_step_from_the_core_counts(cfg, steps):
    model, _ = _model_and_batch(cfg)
    fc, topo, seed, zipf = cfg
    rng = np.random.default_rng(seed)
    collector = ProfileCollector(model)
    acc = collector.create_accumulator()
    S = topo.num_sparse_cores
    layout = layout_of(model)
    want = {name: [0, 0.0, 0.0] for name in layout.stacks}
    for step in range(steps):
        batch = synthetic.global_batch(fc, topo.num_chips, rng, zipf_a=zipf)
        collector.add_step(acc, batch, step=step)
        hot = plain_hottest(model, batch)
        for name, (ids, _) in _core_stack_counts(batch, layout).items():
            total, busiest = int(ids.sum()), int(ids.sum(axis=(0, 1)).max())
            if not total:
                continue
            h = max(hot[t] for t in layout.stacks[name].tables)
            want[name][0] += max(S * h, total)
            want[name][1] = max(want[name][1], busiest * S / total)
            want[name][2] = max(want[name][2], max(S * h, total) / total)
    profile = collector.extract_output(acc)
    for name, sp in profile.stacks.items():
        st_ = sp.stats
        assert [st_.step_floor_ids, st_.worst_step_balance, st_.worst_step_floor] == want[name], name
        assert st_.step_balance_floor() <= st_.step_destination_balance() + 1e-12  # nothing beats the floor
        assert PartitionStats.from_json(st_.to_json()) == st_


def _relabel(batch, perms):
    out = {}
    for k, f in batch.items():
        ids = f.ids.copy()
        inside = ids < perms[k].size
        ids[inside] = perms[k][ids[inside]]
        out[k] = FeatureIds(f.rows, ids, f.weights)
    return out


@settings(max_examples=25, deadline=None)
@given(configs(), st.integers(0, 2**31), st.integers(1, 3))
def test_frequency_order_counts_are_a_profile_of_the_relabelled_steps(cfg, seed, steps):
    """A collector given `frequency_ids` counts every stack as a collector of the same steps with each id replaced
    by its frequency id does (OOV-like ids past the array kept), and merges as it does."""
    model, _ = _model_and_batch(cfg)
    fc, topo, _, zipf = cfg
    rng = np.random.default_rng(seed)
    freq = {}
    for t in model.tables:
        n = int(rng.integers(0, t.vocabulary_size + 1))  # a prefix of the table's ids: the tokens
        freq[t.name] = rng.permutation(n).astype(np.int64)
    balanced, plain = ProfileCollector(model, frequency_ids=freq), ProfileCollector(model)
    accs, plain_acc = [], plain.create_accumulator()
    for step in range(steps):
        batch = synthetic.global_batch(fc, topo.num_chips, rng, zipf_a=zipf)
        a = balanced.create_accumulator()
        balanced.add_step(a, batch, step=step)
        accs.append(a)
        per_feature = {f.name: freq[f.table.name] for f in model.features}
        plain.add_step(plain_acc, _relabel(batch, per_feature), step=step)
    got = balanced.extract_output(balanced.merge_accumulators(accs))
    want = plain.extract_output(plain_acc)
    keys = ("steps", "ids", "unique_ids", "step_max_ids", "step_max_unique_ids", "cell_ids", "cell_unique_ids",
            "step_max_chip_buffer", "chip_buffer", "step_max_sc_buffer", "dest_ids", "step_max_dest_ids",
            "sc_dest_ids", "step_floor_ids", "worst_step_balance", "worst_step_floor")
    for name, sp in got.stacks.items():
        a, b = sp.stats.frequency_order.to_json(), want.stacks[name].stats.to_json()
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, name
