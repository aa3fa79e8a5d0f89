"""`ProfileCollector.add_steps`: steps added in groups give the accumulator of adding them one by one (random
models, topologies, batches and groupings; balanced ids, candidate chip counts, explicit and implicit step
numbers, the what-if collector's kept steps), and `hottest_per_table_steps` the hottest ids of each step."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import ProfileCollector, synthetic
from profiles.collector import StepInput
from profiles.counting import hottest_per_table_steps
from profiles.whatif_steps import WhatIfCollector
from tests.profiles.test_balance_floor import plain_hottest
from tests.profiles.test_counting import _model_and_batch, configs
from tpu_embed.core.topology import Topology


def _groups(draw, n: int):
    """`n` steps cut into consecutive groups of random sizes."""
    out, start = [], 0
    while start < n:
        size = draw(st.integers(1, n - start))
        out.append(range(start, start + size))
        start += size
    return out


def _what_if(acc) -> dict:
    kept = acc.what_if
    return {"stride": kept.stride, "seen": kept.steps_seen, "ids": kept.ids_kept,
            "steps": {s: {n: (r.tolist(), i.tolist()) for n, (r, i) in v.items()} for s, v in kept.steps.items()}}


@settings(max_examples=40, deadline=None)
@given(configs(), st.integers(1, 9), st.booleans(), st.booleans(), st.booleans(), st.data())
def test_steps_added_in_groups_equal_steps_added_one_by_one(cfg, n_steps, balanced, numbered, candidates, data):
    model, _ = _model_and_batch(cfg)
    fc, topo, seed, zipf = cfg
    rng = np.random.default_rng(seed)
    freq = None
    if balanced:
        freq = {t.name: rng.permutation(int(rng.integers(0, t.vocabulary_size + 1))).astype(np.int64)
                for t in model.tables}
    chips = (1, 2 * topo.num_chips) if candidates else ()
    # A small budget: the kept steps are sampled, so which steps a group keeps must follow the same rule.
    collector = WhatIfCollector(model, frequency_ids=freq, candidate_chip_counts=chips,
                                budget_ids=data.draw(st.sampled_from([1, 50, 1 << 21])))
    batches = [synthetic.global_batch(fc, topo.num_chips, rng, zipf_a=zipf) for _ in range(n_steps)]
    oov = [{model.features[0].name: int(rng.integers(0, 5))} if rng.random() < 0.7 else None
           for _ in range(n_steps)]
    start = 3 * int(numbered)

    def step_of(i):
        return start + i if numbered else None

    one = collector.create_accumulator()
    for i, b in enumerate(batches):
        collector.add_step(one, b, oov[i], step=step_of(i))
    grouped = collector.create_accumulator()
    for group in _groups(data.draw, n_steps):
        collector.add_steps(grouped, [StepInput(batches[i], oov[i], step_of(i)) for i in group])
    assert grouped == one
    assert _what_if(grouped) == _what_if(one)
    assert collector.extract_output(grouped) == collector.extract_output(one)


@settings(max_examples=40, deadline=None)
@given(configs(), st.integers(1, 6))
def test_hottest_ids_of_several_steps_are_each_steps(cfg, n_steps):
    model, _ = _model_and_batch(cfg)
    fc, topo, seed, zipf = cfg
    rng = np.random.default_rng(seed)
    batches = [synthetic.global_batch(fc, topo.num_chips, rng, zipf_a=zipf) for _ in range(n_steps)]
    assert hottest_per_table_steps(model, batches) == [plain_hottest(model, b) for b in batches]


def test_an_empty_group_adds_nothing():
    collector = ProfileCollector(synthetic.feature_config(2, per_chip_batch=8, vocab_sizes=[10, 20]), Topology(2, 4))
    acc = collector.create_accumulator()
    assert collector.add_steps(acc, []) is acc and acc.steps == 0


def test_hottest_ids_of_steps_whose_ids_span_more_than_32_bits():
    # Three steps of a 2^31-row table: the keys of the one sort do not fit 32 bits (the int64 sort).
    fc = synthetic.feature_config(2, per_chip_batch=8, vocab_sizes=[2**31, 50])
    topo = Topology(2, 4)
    model = ProfileCollector(fc, topo).model
    rng = np.random.default_rng(5)
    batches = [synthetic.global_batch(fc, topo.num_chips, rng, zipf_a=1.3) for _ in range(3)]
    assert hottest_per_table_steps(model, batches) == [plain_hottest(model, b) for b in batches]


@settings(max_examples=15, deadline=None)
@given(configs(), st.integers(1, 4))
def test_a_consumed_accumulator_gives_the_same_profile_and_a_copied_one_stays_apart(cfg, n_steps):
    """`extract_output(acc, consume=True)` (the job's merged partials, never used again) is the profile of a
    copy; without it the profile does not alias the accumulator: steps added afterwards leave it as it was."""
    model, _ = _model_and_batch(cfg)
    fc, topo, seed, zipf = cfg
    rng = np.random.default_rng(seed)
    collector = WhatIfCollector(model)
    batches = [synthetic.global_batch(fc, topo.num_chips, rng, zipf_a=zipf) for _ in range(n_steps + 1)]
    acc = collector.create_accumulator()
    collector.add_steps(acc, [StepInput(b, None, i) for i, b in enumerate(batches[:n_steps])])
    copied = collector.extract_output(acc)
    again = collector.extract_output(acc)
    collector.add_step(acc, batches[-1], step=n_steps)  # the accumulator goes on: the copies do not move
    assert copied == again and copied.accumulator.steps == n_steps
    want = collector.extract_output(acc)
    consumed = collector.extract_output(acc, consume=True)
    assert consumed == want and consumed.accumulator is acc and consumed.accumulator.steps == n_steps + 1
    assert consumed != copied
