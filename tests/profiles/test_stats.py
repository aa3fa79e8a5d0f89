"""Statistics: exact histograms, exact id counts, and merges that are associative, commutative and
equal to one accumulation over all the data."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import profiles
from profiles import Histogram, ProfileCollector, merge_profiles, synthetic
from profiles.histogram import parse_quantile, quantile_label
from profiles.idcounts import IdCounts
from profiles.step_series import StepSeries
from tpu_embed.core.topology import Topology

small_ints = st.lists(st.integers(0, 60), max_size=80)


def _hist(values):
    h = Histogram()
    h.add_array(np.array(values, np.int64))
    return h


# ---------------------------------------------------------------- Histogram

@given(small_ints, st.sampled_from(["p50", "p90", "p99", "p99.9", "max", 0.25, 0.999]))
def test_histogram_quantile_is_numpy_inverted_cdf(values, q):
    h = _hist(values)
    if not values:
        assert h.quantile(q) == 0
        return
    want = np.quantile(np.array(values), float(parse_quantile(q)), method="inverted_cdf")
    assert h.quantile(q) == int(want)
    assert h.max == max(values) and h.total == len(values) and h.sum == sum(values)


@given(small_ints, small_ints, small_ints)
def test_histogram_merge_is_associative_commutative_and_exact(a, b, c):
    A, B, C = _hist(a), _hist(b), _hist(c)
    ab_c = Histogram.merged([Histogram.merged([A, B]), C])
    a_bc = Histogram.merged([A, Histogram.merged([B, C])])
    assert ab_c == a_bc
    assert Histogram.merged([A, B]) == Histogram.merged([B, A])
    assert ab_c == _hist(a + b + c)
    for q in ("p50", "p99.9", "max"):
        assert ab_c.quantile(q) == _hist(a + b + c).quantile(q)


def test_histogram_large_values_and_json_round_trip():
    h = _hist([0, 5, 10**9, 10**9])
    assert h.counts == {0: 1, 5: 1, 10**9: 2}
    assert Histogram.from_json(h.to_json()) == h
    assert h.excess_over(5) == 2 * (10**9 - 5) and h.count_over(5) == 2


def test_quantile_parsing():
    assert quantile_label("p99.9") == "p99.9" and quantile_label(0.999) == "p99.9"
    assert quantile_label("max") == "max" and parse_quantile("p50") == parse_quantile(0.5)
    with pytest.raises(ValueError, match="quantile"):
        parse_quantile("p101")
    with pytest.raises(ValueError, match="quantile"):
        parse_quantile("median")


# ---------------------------------------------------------------- IdCounts

@given(st.lists(st.lists(st.integers(0, 50), max_size=40), max_size=6))
def test_id_counts_exact_and_mergeable(batches):
    parts = []
    for b in batches:
        c = IdCounts()
        c.add(np.array(b, np.int64))
        parts.append(c)
    merged = IdCounts()
    for p in parts:
        merged.merge_from(p)
    flat = [x for b in batches for x in b]
    want = {}
    for x in flat:
        want[x] = want.get(x, 0) + 1
    ids, counts = merged.arrays()
    assert dict(zip(ids.tolist(), counts.tolist())) == want
    top = merged.top_k(3)
    assert top == sorted(want.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    assert IdCounts.from_json(merged.to_json()) == merged
    assert pickle.loads(pickle.dumps(merged)) == merged


@given(st.lists(st.tuples(st.booleans(), st.lists(st.one_of(st.integers(0, 300), st.integers(0, 2 ** 40)),
                                                  max_size=60)), max_size=8))
def test_id_counts_dense_and_sorted_folds_agree(ops):
    """The bincount fold (ids in a dense range) and the sort fold (sparse or huge ids) give the same
    counts, whatever the mix of adds, merges and compactions."""
    import collections
    c, want = IdCounts(), collections.Counter()
    for merge, ids in ops:
        arr = np.array(ids, np.int64)
        if merge:
            other = IdCounts()
            other.add(arr)
            c.merge_from(other)
        else:
            c.add(arr)
            c._compact()
        want.update(ids)
    ids, counts = c.arrays()
    assert ids.dtype == np.int64 and counts.dtype == np.int64
    assert list(ids) == sorted(want) and dict(zip(ids.tolist(), counts.tolist())) == dict(want)


def test_id_counts_compacts_many_steps():
    c = IdCounts()
    rng = np.random.default_rng(0)
    for _ in range(50):
        c.add(rng.integers(0, 1000, size=5000))
    assert c.total == 250_000 and c.distinct == 1000


# ---------------------------------------------------------------- StepSeries

@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 9)), max_size=30), st.integers(1, 12))
def test_step_series_merge_is_order_free(entries, limit):
    def series(part):
        s = StepSeries(limit)
        for step, v in part:
            s.record(step, v, v // 2, v * 8)
        return s
    thirds = [entries[i::3] for i in range(3)]
    a, b, c = (series(p) for p in thirds)

    def merged(x, y):
        out = StepSeries(limit)
        out.merge_from(x)
        out.merge_from(y)
        return out
    assert merged(merged(a, b), c) == merged(a, merged(b, c))
    assert merged(a, b) == merged(b, a)
    assert merged(merged(a, b), c) == series(entries)
    assert StepSeries.from_json(series(entries).to_json()) == series(entries)


# ---------------------------------------------------------------- collector accumulators

FC = synthetic.feature_config(3, per_chip_batch=8, vocab_sizes=[40, 500, 7], shared=1, sequence={1: 2})
TOPO = Topology(2, 4)
COLLECTOR = ProfileCollector(FC, TOPO, candidate_chip_counts=(1, 4, 8))
BATCHES = list(synthetic.global_batches(FC, 2, 9, seed=7))


def _acc(indices):
    acc = COLLECTOR.create_accumulator()
    for i in indices:
        COLLECTOR.add_step(acc, BATCHES[i], step=i, oov_counts={"feature_00": i % 3})
    return acc


@settings(max_examples=25)
@given(st.lists(st.integers(0, 2), min_size=9, max_size=9))
def test_accumulator_merge_properties(assignment):
    """Steps dealt to three workers: merging is associative, commutative, and equals one pass."""
    a, b, c = (_acc([i for i, w in enumerate(assignment) if w == k]) for k in range(3))
    m = COLLECTOR.merge_accumulators
    assert m([m([a, b]), c]) == m([a, m([b, c])])
    assert m([a, b]) == m([b, a])
    assert m([a, b, c]) == _acc(range(9))
    # merging leaves its inputs alone
    assert a == _acc([i for i, w in enumerate(assignment) if w == 0])
    # the same at the level of profiles (several runs or hosts)
    pa, pb, pc = (COLLECTOR.extract_output(x) for x in (a, b, c))
    assert profiles.merge(pa, profiles.merge(pb, pc)) == profiles.merge(profiles.merge(pa, pb), pc)
    assert profiles.merge(pa, pb) == profiles.merge(pb, pa)


def test_profile_merge_and_pickle():
    whole = COLLECTOR.extract_output(_acc(range(9)))
    parts = [COLLECTOR.extract_output(_acc(range(k, 9, 3))) for k in range(3)]
    assert merge_profiles(parts) == whole
    assert parts[0].merge(parts[1]).merge(parts[2]) == parts[2].merge(parts[0].merge(parts[1]))
    acc = _acc(range(3))
    assert pickle.loads(pickle.dumps(acc)) == acc
    assert pickle.loads(pickle.dumps(COLLECTOR)).model == COLLECTOR.model


def test_collected_figures_are_right():
    """Direct checks of a few figures against a hand computation from the batches."""
    profile = COLLECTOR.extract_output(_acc(range(9)))
    t0 = profile.tables["table_00"].stats
    f0 = t0.features["feature_00"]
    assert f0.examples == 9 * 16
    assert f0.ids == sum(BATCHES[i]["feature_00"].ids.size for i in range(9))
    assert f0.ids_per_example.total == 9 * 16
    assert f0.ids_per_example.sum == f0.ids
    assert f0.oov_ids == sum(i % 3 for i in range(9))
    every = np.concatenate([BATCHES[i][p].ids for i in range(9) for p in ("feature_00", "shared_00")])
    u, c = np.unique(every, return_counts=True)
    assert t0.id_counts.top_k(1)[0] == (int(u[np.argmax(c)]), int(c.max()))
    load = t0.shard_load[8]
    assert load.mod.tolist() == np.bincount(every % 8, minlength=8).tolist()
    assert load.div.tolist() == np.bincount(every // 5, minlength=8).tolist()  # ceil(40 / 8) = 5
    # The sequence feature counts ids per example over its positions.
    f1 = profile.tables["table_01"].stats.features["feature_01"]
    assert f1.examples == 9 * 16 and f1.ids_per_example.sum == f1.ids
    # Candidates: 8 chips get 16 / 8 = 2 examples each, not a multiple of 4 SCs: skipped, with the reason.
    assert profile.candidates[8].status == "skipped" and "not divisible by 4" in profile.candidates[8].reason
    assert profile.candidates[1].status == "profiled" and profile.candidates[2].status == "main"
    # Total ids after dedup are the same whatever the chip count (dedup is per sample).
    for tp in profile.tables.values():
        assert tp.stats.candidates[1].ids == tp.stats.partitions.ids


def test_collector_validates_batches():
    acc = COLLECTOR.create_accumulator()
    bad = dict(BATCHES[0])
    bad.pop("feature_00")
    with pytest.raises(ValueError, match="missing features"):
        COLLECTOR.add_step(acc, bad)
    bad = dict(BATCHES[0])
    f = bad["feature_02"]
    bad["feature_02"] = f._replace(ids=f.ids + 7)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        COLLECTOR.add_step(acc, bad)
    with pytest.raises(ValueError, match="unknown features"):
        COLLECTOR.add_step(acc, BATCHES[0], oov_counts={"nope": 1})


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 8), max_size=9, unique=True), min_size=1, max_size=3))
def test_profile_shard_loads_equal_every_step_added(partials):
    """The profile's shard loads (derived from the id counts when it is extracted) equal `ShardLoad.add` of
    every step's lookups, per table and per S (main topology and candidates), however the steps were split
    into partial accumulators."""
    from profiles.stats import ShardLoad
    profile = COLLECTOR.extract_output(COLLECTOR.merge_accumulators([_acc(p) for p in partials]))
    model = COLLECTOR.model
    for t in model.tables:
        loads = profile.tables[t.name].stats.shard_load
        assert sorted(loads) == [4, 8, 16]  # S of candidate 1 chip, the main topology (2 chips), candidate 4
        for S, got in loads.items():
            want = ShardLoad.empty(S)
            for i in (i for p in partials for i in p):
                want.add(np.concatenate([BATCHES[i][f.name].ids for f in model.table_features(t.name)]),
                         t.vocabulary_size)
            assert got == want, (t.name, S)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 8, 16]), st.lists(st.integers(0, 1000), max_size=60), st.integers(1, 300))
def test_shard_load_of_id_counts_equals_adding_every_lookup(S, ids, vocab):
    """`ShardLoad.of_id_counts` over distinct ids and counts against `add` of every lookup (ids past the
    vocabulary included)."""
    from profiles.stats import ShardLoad
    ids = np.array(ids, np.int64)
    counts = IdCounts()
    counts.add(ids)
    want = ShardLoad.empty(S)
    want.add(ids, vocab)
    assert ShardLoad.of_id_counts(*counts.arrays(), S, vocab) == want


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 8, 16]), st.lists(st.tuples(st.integers(1, 300), st.lists(st.integers(0, 400),
                                                                                        max_size=40)),
                                                 min_size=1, max_size=5))
def test_shard_loads_of_tables_equal_the_rule(S, tables):
    """`ShardLoad.add` against the per-table rule written with bincounts, ids past a vocabulary included
    (no shard's under 'div')."""
    from profiles.stats import ShardLoad
    one, many = [ShardLoad.empty(S) for _ in tables], [ShardLoad.empty(S) for _ in tables]
    ids = [np.array(x, np.int64) for _, x in tables]
    vocab = [v for v, _ in tables]
    for load, i, v in zip(one, ids, vocab):
        load.mod += np.bincount(i & (S - 1), minlength=S)
        load.div += np.bincount(i // -(-v // S), minlength=S)[:S]
    for load, i, v in zip(many, ids, vocab):
        load.add(i, v)
    for a, b in zip(one, many):
        assert np.array_equal(a.mod, b.mod) and np.array_equal(a.div, b.div)


def _reference_add_step(ps, c, step):
    """PartitionStats.add_step of one statistic, written cell by cell (the rule `add_step_many` vectorises)."""
    from tpu_embed.sparsecore.padding import XLA_PAD, round_up
    nsc, S, chips = ps.num_sc_per_chip, ps.num_sparse_cores, ps.num_chips
    ps.steps += 1
    ps.ids += int(c.ids.sum())
    ps.unique_ids += int(c.unique.sum())
    mx_ids, mx_uniq = int(c.ids.max(initial=0)), int(c.unique.max(initial=0))
    ps.step_max_ids.add(mx_ids)
    ps.step_max_unique_ids.add(mx_uniq)
    for v, u in zip(c.ids.tolist(), c.unique.tolist()):
        ps.cell_ids.add(v)
        ps.cell_unique_ids.add(u)
    ps.cell_ids.add(0, c.num_cells - c.cells.size)
    ps.cell_unique_ids.add(0, c.num_cells - c.cells.size)
    sc_need = [0] * (chips * nsc)
    dest = np.zeros(S, np.int64)
    heat = np.zeros((nsc, S), np.int64)
    part_ids, part_uniq = np.zeros((chips, S), np.int64), np.zeros((chips, S), np.int64)
    for cell, v, u in zip(c.cells.tolist(), c.ids.tolist(), c.unique.tolist()):
        sc, d = divmod(cell, S)
        sc_need[sc] += int(round_up(np.int64(v), XLA_PAD))
        dest[d] += v
        heat[sc % nsc, d] += v
        part_ids[sc // nsc, d] = max(part_ids[sc // nsc, d], v)
        part_uniq[sc // nsc, d] = max(part_uniq[sc // nsc, d], u)
    chip_need = [sum(sc_need[ch * nsc:(ch + 1) * nsc]) for ch in range(chips)]
    for x in chip_need:
        ps.chip_buffer.add(x)
    ps.step_max_sc_buffer.add(max(sc_need))
    ps.step_max_chip_buffer.add(max(chip_need))
    ps.dest_ids = ps.dest_ids + dest
    ps.step_max_dest_ids += int(dest.max())
    if ps.sc_dest_ids is not None:
        ps.sc_dest_ids = ps.sc_dest_ids + heat
    if ps.series is not None:
        ps.series.record(step, mx_ids, mx_uniq, max(chip_need))
    if ps.partition_max_ids is not None:
        ps.partition_max_ids = np.maximum(ps.partition_max_ids, part_ids)
        ps.partition_max_unique_ids = np.maximum(ps.partition_max_unique_ids, part_uniq)
        ps.sc_max_buffer = np.maximum(ps.sc_max_buffer, np.array(sc_need, np.int64).reshape(chips, nsc))


@st.composite
def _cell_counts(draw, chips, nsc):
    from profiles.counting import CellCounts
    S = chips * nsc
    cells = np.array(sorted(draw(st.sets(st.integers(0, chips * nsc * S - 1), max_size=12))), np.int64)
    ids = np.array(draw(st.lists(st.integers(1, 40), min_size=cells.size, max_size=cells.size)), np.int64)
    uniq = np.array([draw(st.integers(1, int(v))) for v in ids], np.int64)
    return CellCounts(chips, nsc, S, cells, ids, uniq)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([(1, 1), (1, 4), (2, 2), (4, 4)]), st.integers(1, 5), st.integers(1, 3))
def test_partition_stats_of_many_at_once_equal_one_by_one(data, topo, k, steps):
    """`PartitionStats.add_step_many` (every table and stack of a step at once, as the collector adds them)
    against the per-cell rule; with and without heat maps and series, empty counts included."""
    from profiles.stats import PartitionStats
    chips, nsc = topo

    def fresh():
        return [PartitionStats.empty(chips, nsc, heat_map=i % 2 == 0, series_steps=10 if i % 3 == 0 else None,
                                     per_partition=i % 4 < 2)
                for i in range(k)]

    many, ref = fresh(), fresh()
    for step in range(steps):
        counts = [data.draw(_cell_counts(chips, nsc)) for _ in range(k)]
        PartitionStats.add_step_many(many, counts, step)
        for ps, c in zip(ref, counts):
            _reference_add_step(ps, c, step)
    for a, b in zip(many, ref):
        assert a == b


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([(1, 1), (1, 4), (2, 2), (4, 4)]), st.integers(1, 5), st.integers(1, 4),
       st.booleans())
def test_partition_stats_of_dense_counts_equal_those_of_cell_counts(data, topo, k, steps, floors):
    """`PartitionStats.add_steps_dense` (the collector's: dense cells of every table and stack) against
    `add_steps_many` of the same cells as `CellCounts`; heat maps, series, per-partition maxima and step balance
    with its floor, empty counts included."""
    from profiles.stats import PartitionStats
    chips, nsc = topo

    def fresh():
        return [PartitionStats.empty(chips, nsc, heat_map=i % 2 == 0, series_steps=10 if i % 3 == 0 else None,
                                     per_partition=i % 4 < 2, step_balance=i % 2 == 1)
                for i in range(k)]

    sparse, dense = fresh(), fresh()
    counts = [[data.draw(_cell_counts(chips, nsc)) for _ in range(k)] for _ in range(steps)]
    hottest = np.array([[data.draw(st.integers(1, 40)) for _ in range(k)] for _ in range(steps)], np.int64)
    numbers = list(range(3, 3 + steps))
    PartitionStats.add_steps_many(sparse, counts, numbers, hottest.tolist() if floors else None)
    ids = np.stack([np.stack([c.dense()[0].reshape(-1) for c in step]) for step in counts])
    unique = np.stack([np.stack([c.dense()[1].reshape(-1) for c in step]) for step in counts])
    PartitionStats.add_steps_dense(dense, ids, unique, numbers, hottest if floors else None)
    for a, b in zip(dense, sparse):
        assert a == b


def test_partition_stats_refuse_another_topology():
    from profiles.counting import CellCounts
    from profiles.stats import PartitionStats
    z = np.zeros(0, np.int64)
    with pytest.raises(ValueError, match="another topology"):
        PartitionStats.add_step_many([PartitionStats.empty(2, 4), PartitionStats.empty(1, 4)],
                                     [CellCounts(2, 4, 8, z, z, z), CellCounts(1, 4, 4, z, z, z)], 0)
