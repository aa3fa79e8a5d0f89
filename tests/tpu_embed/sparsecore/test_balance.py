"""tpu_embed.sparsecore.balance: the assignment of balanced ids, against the one-by-one greedy it is defined as."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_embed.sparsecore.balance import TableDemand, assign_ids, destination_capacity, destination_loads


def greedy_reference(tables, S):
    """Largest count first (ties: table order, token order), one token at a time onto the least-loaded destination
    with a free id of its table (ties: the lowest), the class's lowest free id."""
    load = destination_loads(tables, {t.name: np.zeros(0, np.int64) for t in tables}, S).tolist()
    free = []
    for t in tables:
        ids = range(t.first_id, t.first_id + t.counts.size)
        free.append({d: [i for i in ids if (i + t.rotation) % S == d] for d in range(S)})
    items = sorted((-int(c), ti, k) for ti, t in enumerate(tables) for k, c in enumerate(t.counts))
    out = {t.name: np.zeros(t.counts.size, np.int64) for t in tables}
    for neg, ti, k in items:
        d = min((d for d in range(S) if free[ti][d]), key=lambda d: (load[d], d))
        out[tables[ti].name][k] = free[ti][d].pop(0)
        load[d] += -neg
    return out


@st.composite
def stacks(draw):
    S = draw(st.sampled_from([1, 2, 4, 8, 16]))
    tables = []
    for i in range(draw(st.integers(1, 5))):
        n = draw(st.integers(0, 40))
        # Zipf-like counts with ties: a few hot tokens and a tail of small equal counts.
        counts = draw(st.lists(st.one_of(st.integers(0, 3), st.integers(0, 500)), min_size=n, max_size=n))
        first = draw(st.integers(0, 12))
        oov = draw(st.integers(0, 3))
        fixed_ids = list(range(first)) + [first + n + b for b in range(oov)]
        fixed_counts = draw(st.lists(st.integers(0, 300), min_size=len(fixed_ids), max_size=len(fixed_ids)))
        tables.append(TableDemand(f"t{i}", draw(st.integers(0, S - 1)), counts, first, fixed_ids, fixed_counts))
    return S, tables


@settings(max_examples=150, deadline=None)
@given(stacks())
def test_assign_ids_is_the_greedy_one_token_at_a_time(case):
    S, tables = case
    ids = assign_ids(tables, S)
    ref = greedy_reference(tables, S)
    for t in tables:
        got = ids[t.name]
        # A bijection onto the table's free range; fixed ids (a base's, OOV buckets) are never handed out.
        assert sorted(got.tolist()) == list(range(t.first_id, t.first_id + t.counts.size))
        assert not set(got.tolist()) & set(t.fixed_ids.tolist())
        # The same destinations get the same counts as one token at a time (equal counts may swap places).
        for d in range(S):
            mine = sorted(t.counts[(got + t.rotation) % S == d].tolist())
            theirs = sorted(t.counts[(ref[t.name] + t.rotation) % S == d].tolist())
            assert mine == theirs, (t.name, d)
        # Within a destination, a larger count never has a larger id.
        for d in range(S):
            sel = (got + t.rotation) % S == d
            by_id = t.counts[sel][np.argsort(got[sel])]
            assert (np.diff(by_id) <= 0).all()
    np.testing.assert_array_equal(destination_loads(tables, ids, S), destination_loads(tables, ref, S))
    again = assign_ids(tables, S)
    assert all(np.array_equal(again[t.name], ids[t.name]) for t in tables)  # deterministic


def test_capacity_is_each_destinations_share_of_the_range():
    for first, n, r, S in [(0, 10, 0, 4), (3, 10, 1, 4), (5, 3, 7, 8), (0, 0, 0, 2), (2, 17, 3, 16)]:
        cap = destination_capacity(first, n, r, S)
        want = np.bincount((np.arange(first, first + n) + r) % S, minlength=S)
        np.testing.assert_array_equal(cap, want)


def test_frequency_order_on_consecutive_destinations_is_evened_out():
    """Zipf-skewed tables of one stack: frequency order puts every table's top ids on consecutive SparseCores;
    the assignment brings the busiest destination to the mean (here the hottest token is far below it)."""
    rng = np.random.default_rng(0)
    S, tables = 16, []
    for i in range(6):
        counts = np.sort(np.bincount(rng.zipf(1.2, 200_000) % 5000))[::-1]
        counts = counts[counts > 0]
        tables.append(TableDemand(f"t{i}", (4 * i) % S, counts))
    ids = assign_ids(tables, S)
    freq = {t.name: np.arange(t.counts.size) for t in tables}
    before, after = destination_loads(tables, freq, S), destination_loads(tables, ids, S)
    assert before.max() / before.mean() > 1.3
    assert after.max() / after.mean() < 1.001


def test_a_hot_token_sets_the_floor_and_the_rest_fill_around_it():
    S = 4
    small = TableDemand("flag", 0, [100, 900])  # two tokens: one id on destination 0, one on 1
    big = TableDemand("big", 1, [300, 300, 300, 100, 100, 100, 0, 0])  # two ids on every destination
    ids = assign_ids([small, big], S)
    load = destination_loads([small, big], ids, S)
    assert load.tolist() == [900, 500, 400, 400]  # the hot token alone where it is: only big's zeros join it
    assert ids["flag"].tolist() == [1, 0]
    # Every destination holds two of big's ids, whatever the order: with equal counts nothing can move.
    flat = TableDemand("flat", 1, [50] * 8)
    load = destination_loads([small, flat], assign_ids([small, flat], S), S)
    assert sorted(load.tolist()) == [100, 100, 200, 1000]


def test_bad_input():
    with pytest.raises(ValueError, match="twice"):
        assign_ids([TableDemand("a", 0, [1]), TableDemand("a", 0, [2])], 2)
    with pytest.raises(ValueError, match=">= 0"):
        TableDemand("a", 0, [-1])
    with pytest.raises(ValueError, match="length"):
        TableDemand("a", 0, [1], 0, [3], [])
