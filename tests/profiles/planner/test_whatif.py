"""What-if figures (profiles/planner/whatif.py) from the kept steps (profiles/whatif_steps.py), against the
profile's own counts of the same steps: the core's counter for the main topology, the exact candidates for other
chip counts, and profiles of the same examples collected at other SparseCores per chip and global batches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiles import ProfileCollector, synthetic
from profiles.planner.whatif import ReplaySteps, evaluate, tf_placement, variant
from profiles.whatif_steps import BLOCK_STEPS, WhatIfCollector, WhatIfSteps, read_what_if_steps, write_what_if_steps
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import FeatureIds


def _fc(per_chip_batch=16):
    # Shared table (two features), a sequence feature, stacked tables of several widths.
    return synthetic.feature_config(5, per_chip_batch=per_chip_batch, vocab_sizes=[40, 7, 300, 3, 1000],
                                    dims=[8, 16, 8], shared=1, sequence={2: 3})


def _batches(fc, chips, steps, seed=0):
    return list(synthetic.global_batches(fc, chips, steps, seed=seed))


def _collect(collector, batches):
    acc = collector.create_accumulator()
    for i, b in enumerate(batches):
        collector.add_step(acc, b, step=i)
    return collector.extract_output(acc)


def _same(load, ps, steps):
    assert load.steps == ps.steps == steps
    assert load.ids == ps.ids and load.unique_ids == ps.unique_ids
    assert load.max_ids == ps.step_max_ids.max
    assert load.max_unique_ids == ps.step_max_unique_ids.max
    assert load.max_chip_buffer == ps.step_max_chip_buffer.max
    assert load.busiest_ids == ps.step_max_dest_ids
    assert load.mean_ids == pytest.approx(int(ps.dest_ids.sum()) / ps.num_sparse_cores)


def test_main_topology_and_candidate_chip_counts_equal_the_profile():
    fc = _fc()
    batches = _batches(fc, 4, 9)
    collector = WhatIfCollector(fc, Topology(4, 4), candidate_chip_counts=(1, 2, 8))
    profile = _collect(collector, batches)
    replay = ReplaySteps(profile.model, profile.accumulator.what_if)
    assert replay.sampling == "all 9 steps"
    loads = evaluate(tf_placement(profile.model), replay, per_partition=True)
    for name, ps in profile.accumulator.stacks.items():
        _same(loads[name], ps, 9)
        np.testing.assert_array_equal(loads[name].partition_max_ids, ps.partition_max_ids)
        np.testing.assert_array_equal(loads[name].partition_max_unique_ids, ps.partition_max_unique_ids)
        np.testing.assert_array_equal(loads[name].sc_max_buffer, ps.sc_max_buffer)
    unstacked = evaluate(tf_placement(profile.model, disable_table_stacking=True), replay)
    for name, tp in profile.accumulator.tables.items():
        _same(unstacked[name], tp.partitions, 9)
    for c in (1, 2, 8):
        cm = variant(profile.model, c, 4, 64)
        loads = evaluate(tf_placement(cm), replay)
        for name, ps in profile.accumulator.candidate_stacks[c].items():
            _same(loads[name], ps, 9)


def _split(batch, fc_old, k):
    """A global batch of B examples as k global batches of B / k consecutive examples."""
    out = [dict() for _ in range(k)]
    for path, fid in batch.items():
        spe = fc_old[path].output_shape[1] if len(fc_old[path].output_shape) > 1 else 1
        examples = fid.rows // spe
        per = int(np.prod(fc_old[path].output_shape)) * 4 // spe // k  # examples per new batch (4 chips)
        for j in range(k):
            m = (examples >= j * per) & (examples < (j + 1) * per)
            out[j][path] = FeatureIds(fid.rows[m] - j * per * spe, fid.ids[m], None)
    return out


def _join(batches, fc_old):
    out = {}
    for path in batches[0]:
        spe = fc_old[path].output_shape[1] if len(fc_old[path].output_shape) > 1 else 1
        samples = fc_old[path].output_shape[0] * 4 * spe
        out[path] = FeatureIds(np.concatenate([b[path].rows + i * samples for i, b in enumerate(batches)]),
                               np.concatenate([b[path].ids for b in batches]), None)
    return out


@pytest.mark.parametrize("nsc, factor", [(2, 1), (4, 2), (4, 0.5), (2, 4), (4, 0.25)])
def test_other_sparse_cores_per_chip_and_global_batches_equal_a_profile_of_them(nsc, factor):
    fc = _fc()
    batches = _batches(fc, 4, 8, seed=3)
    collector = WhatIfCollector(fc, Topology(4, 4))
    profile = _collect(collector, batches)
    replay = ReplaySteps(profile.model, profile.accumulator.what_if)
    B = 64
    new_batch = int(B * factor)
    if factor < 1:
        k = int(1 / factor)
        steps = [s for b in batches for s in _split(b, fc, k)]
    else:
        m = int(factor)
        steps = [_join(batches[i:i + m], fc) for i in range(0, len(batches), m)]
    target = variant(profile.model, 4, nsc, new_batch)
    expected = _collect(ProfileCollector(target), steps)
    loads = evaluate(tf_placement(target), replay)
    assert set(loads) == set(expected.accumulator.stacks)
    for name, ps in expected.accumulator.stacks.items():
        _same(loads[name], ps, len(steps))


def test_kept_steps_survive_the_file_and_budget_samples_whole_blocks(tmp_path):
    fc = _fc()
    batches = _batches(fc, 4, 12)
    ids = [sum(f.ids.size for f in b.values()) for b in batches]
    budget = sum(ids[:4]) + sum(ids[8:])  # blocks 0 and 2 fit, the three blocks do not
    collector = WhatIfCollector(fc, Topology(4, 4), budget_ids=budget)
    profile = _collect(collector, batches)
    steps = profile.accumulator.what_if
    assert not steps.exact and steps.stride == 2 and sorted(steps.steps) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert steps.sampling() == "8 of 12 steps (every 2th block of 4 consecutive steps)"
    write_what_if_steps(str(tmp_path), profile)
    back = read_what_if_steps(str(tmp_path), profile.model)
    assert (back.stride, back.steps_seen, sorted(back.steps)) == (2, 12, sorted(steps.steps))
    for s, feats in steps.steps.items():
        for name, (rows, ids) in feats.items():
            np.testing.assert_array_equal(back.steps[s][name][0], rows)
            np.testing.assert_array_equal(back.steps[s][name][1], ids)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=30), budget=st.integers(1, 400),
       cut=st.integers(0, 30), seed=st.integers(0, 10))
def test_merging_keeps_the_same_steps_however_the_work_is_split(sizes, budget, cut, seed):
    rng = np.random.default_rng(seed)
    steps = [{"f": FeatureIds(np.arange(n, dtype=np.int64), rng.integers(0, 9, n), None)} for n in sizes]
    order = rng.permutation(len(steps))
    cut = min(cut, len(steps))

    def kept(indices):
        w = WhatIfSteps(budget)
        for i in indices:
            w.add(int(i), steps[i])
        return w

    whole = kept(range(len(steps)))
    a, b = kept(order[:cut]), kept(order[cut:])
    for x, y in ((a, b), (b, a)):
        m = dataclasses.replace(x, steps=dict(x.steps))
        m.merge_from(y)
        assert (m.stride, sorted(m.steps), m.steps_seen, m.ids_kept) == \
            (whole.stride, sorted(whole.steps), whole.steps_seen, whole.ids_kept)
    assert whole.ids_kept <= budget or all(s < BLOCK_STEPS * whole.stride for s in whole.steps)

