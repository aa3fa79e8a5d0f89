"""The planner: limits that never overflow on the profiled data, stated drop budgets, warnings, the
plan file and SparseCoreEmbeddingConfig, planning for other configurations, and speed at scale."""

import json
import time
import warnings

import numpy as np
import pytest

import profiles
from profiles import (
    ConfigurationMismatchWarning,
    ConservativeBoundWarning,
    InsufficientDataWarning,
    LimitOverflowWarning,
    MissingProfileError,
    ProfileCollector,
    ProfileStore,
    synthetic,
)
from profiles.units import rescaled, stack_units
from tpu_embed.core.model import from_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import LimitExceededError, layout_of, preprocess_with_layout, split_global_batch

FC = synthetic.feature_config(5, per_chip_batch=16, vocab_sizes=[30, 2000, 500, 70000, 9], shared=1,
                              sequence={2: 3})
TOPO = Topology(4, 4)
STEPS = 120
BATCHES = list(synthetic.global_batches(FC, 4, STEPS, seed=11, zipf_a=1.1))


@pytest.fixture(scope="module")
def profile():
    col = ProfileCollector(FC, TOPO, candidate_chip_counts=(1, 2, 8, 32))
    acc = col.create_accumulator()
    for i, b in enumerate(BATCHES):
        col.add_step(acc, b, step=i)
    return col.extract_output(acc)


def _preprocess_all(plan, model, batches):
    """Preprocess every chip of every step with the plan's limits; returns ids dropped per (step, chip)."""
    layout = layout_of(model)
    dropped = []
    for b in batches:
        for chip in split_global_batch(b, layout):
            out = preprocess_with_layout(chip, layout, **plan.preprocess_kwargs())
            dropped.append({name: csr.dropped_ids for name, csr in out.items()})
    return dropped


def test_exact_plan_never_overflows_and_is_tight(profile):
    plan = profiles.plan(profile, min_steps=100)
    assert not plan.allow_id_dropping
    drops = _preprocess_all(plan, profile.model, BATCHES)
    assert all(d == 0 for step in drops for d in step.values())
    # Tight: one less on any stack's limit overflows somewhere (the maxima are real, not padded).
    for name in plan.stacks:
        tighter = dict(plan.max_ids_per_table)
        tighter[name] -= 1
        if tighter[name] < 1:
            continue
        kw = dict(plan.preprocess_kwargs(), max_ids_per_table=tighter)
        layout = layout_of(profile.model)
        with pytest.raises(LimitExceededError):
            for b in BATCHES:
                for chip in split_global_batch(b, layout):
                    preprocess_with_layout(chip, layout, **kw)
    # The buffer setting is the smallest multiple that holds every stack.
    for s in plan.stacks.values():
        assert plan.max_ids_per_chip_per_sample * s.sample_count % 8 == 0
        assert plan.max_ids_per_chip_per_sample * s.sample_count >= s.observed["chip_buffer_slots"]["max"]
    assert plan.stacks[next(iter(plan.stacks))].drops["drop_rate_at_most"] == 0.0


def test_quantile_plan_drops_within_its_stated_budget(profile):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsufficientDataWarning)
        plan = profiles.plan(profile, quantile="p50")
    assert plan.allow_id_dropping
    assert plan.max_ids_per_table == profiles.plan(profile).max_ids_per_table  # partitions stay at max
    drops = _preprocess_all(plan, profile.model, BATCHES)  # never raises: only the buffer drops
    chips = TOPO.num_chips
    for name, s in plan.stacks.items():
        per_pair = [d[name] for d in drops]
        dropped = sum(per_pair)
        # Exactly the (chip, step) pairs the profile predicted drop ids...
        assert np.mean([x > 0 for x in per_pair]) == pytest.approx(s.drops["chip_steps_over_buffer"])
        # ...and the ids dropped stay within the stated bound.
        assert dropped <= s.drops["ids_dropped_at_most"]
        if s.drops["ids_dropped_at_most"]:
            assert dropped > 0
    assert any(s.drops["ids_dropped_at_most"] for s in plan.stacks.values())
    assert len(drops) == STEPS * chips


def test_headroom_and_partition_quantile(profile):
    exact = profiles.plan(profile)
    roomy = profiles.plan(profile, headroom=1.5)
    for name in exact.stacks:
        assert roomy.max_ids_per_table[name] == int(np.ceil(exact.max_ids_per_table[name] * 1.5 - 1e-9))
    assert roomy.max_ids_per_chip_per_sample >= exact.max_ids_per_chip_per_sample
    with pytest.warns(LimitOverflowWarning, match="TF raises on those steps"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InsufficientDataWarning)
            low = profiles.plan(profile, partition_quantile="p50")
    assert any(low.max_ids_per_table[n] < exact.max_ids_per_table[n] for n in exact.stacks)
    assert any("LimitOverflowWarning" in w for w in low.warnings)
    with pytest.raises(ValueError, match="headroom"):
        profiles.plan(profile, headroom=0.9)


def test_few_steps_warn(profile):
    col = ProfileCollector(FC, TOPO, candidate_chip_counts=())
    acc = col.create_accumulator()
    for i, b in enumerate(BATCHES[:5]):
        col.add_step(acc, b, step=i)
    with pytest.warns(InsufficientDataWarning, match="only 5 steps"):
        plan = profiles.plan(col.extract_output(acc))
    assert any("InsufficientDataWarning" in w for w in plan.warnings)
    with pytest.warns(InsufficientDataWarning, match="profile at least 10000 steps"):
        profiles.plan(profile, quantile="p99.9")


def test_plan_file_and_sparse_core_config(tmp_path, profile):
    plan = profiles.plan(profile)
    path = plan.write(tmp_path / "plan.json")
    loaded = profiles.load_plan(path)
    assert loaded.max_ids_per_table == plan.max_ids_per_table
    assert loaded.max_unique_ids_per_table == plan.max_unique_ids_per_table
    assert loaded.max_ids_per_chip_per_sample == plan.max_ids_per_chip_per_sample
    assert loaded.allow_id_dropping is False
    d = json.loads(open(path).read())
    assert d["schema_version"] == 1 and d["kind"] == "plan"
    assert set(d["stacks"]) == set(profile.stacks)
    cfg = loaded.to_sparse_core_config()
    from tensorflow.python.tpu.tpu_embedding_v3 import SparseCoreEmbeddingConfig
    assert isinstance(cfg, SparseCoreEmbeddingConfig)
    assert cfg.max_ids_per_table == plan.max_ids_per_table
    assert cfg.max_ids_per_chip_per_sample == plan.max_ids_per_chip_per_sample
    d["schema_version"] = 2
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(profiles.SchemaVersionError, match="plan schema_version 2"):
        profiles.load_plan(tmp_path / "bad.json")


def test_plan_reports_memory_balance_stacking_and_topologies(profile):
    plan = profiles.plan(profile)
    m = plan.memory
    assert m["tf_default_bytes_per_sc"] > m["planned_bytes_per_sc"] > 0
    # Frequency-ordered Zipf ids: 'div' piles hot ids onto shard 0, 'mod' spreads them.
    t = plan.tables["table_03"]
    assert t["div_balance"] > t["mod_balance"] and t["div_shard0_share"] > 0.5 and t["better"] == "mod"
    assert plan.stacking["unstacked"]["stacks"] == 5
    assert set(plan.stacking["stacks"]) == set(profile.stacks)
    by_chips = {t["num_chips"]: t for t in plan.topologies}
    assert by_chips[4]["is_target"] and by_chips[4]["status"] == "main"
    assert by_chips[1]["status"] == "profiled" and by_chips[1]["per_chip_batch"] == 64
    assert by_chips[8]["status"] == "profiled" and by_chips[8]["per_chip_batch"] == 8
    assert by_chips[32]["status"] == "skipped" and "not divisible by 4" in by_chips[32]["reason"]
    # The target row agrees with the plan's own exact limits.
    assert by_chips[4]["max_ids_per_table"] == plan.max_ids_per_table


def test_plan_for_another_chip_count_uses_candidate_figures(tmp_path, profile):
    ProfileStore(tmp_path).write(profile)
    target = rescaled(profile.model, 2)
    with pytest.warns(ConfigurationMismatchWarning, match="another chip count"):
        plan = profiles.plan(tmp_path, target, min_steps=1)
    assert all(s.origin == "candidate:2" for s in plan.stacks.values())
    # Exactly what profiling on 2 chips directly gives.
    col = ProfileCollector(target, candidate_chip_counts=())
    acc = col.create_accumulator()
    for i, b in enumerate(BATCHES):
        col.add_step(acc, b, step=i)
    direct = profiles.plan(col.extract_output(acc), min_steps=1)
    assert plan.max_ids_per_table == direct.max_ids_per_table
    assert plan.max_unique_ids_per_table == direct.max_unique_ids_per_table
    assert plan.max_ids_per_chip_per_sample == direct.max_ids_per_chip_per_sample
    # And never overflows on the data at 2 chips.
    assert all(d == 0 for step in _preprocess_all(plan, target, BATCHES) for d in step.values())
    # A chip count the profile did not cover is refused, naming what to do.
    with pytest.raises(MissingProfileError, match=r"no figures for 16 chips: it covers 1, 2, 4, 8 chip\(s\).*"
                                                  r"--candidate-chip-counts 16"):
        profiles.plan(tmp_path, rescaled(profile.model, 16), min_steps=1)


def test_plan_for_another_stacking_bounds_from_tables(tmp_path, profile):
    """A model that stacks the same tables differently: stacks never profiled, tables were."""
    ProfileStore(tmp_path).write(profile)
    fc = synthetic.feature_config(5, per_chip_batch=16, vocab_sizes=[30, 2000, 500, 70000, 9], shared=1,
                                  sequence={2: 3}, optimizer=[f"o{i}" for i in range(5)])
    target = from_tf_feature_config(fc, TOPO)
    assert len(stack_units(target)) == 5 != len(profile.stacks)
    with pytest.warns(ConservativeBoundWarning):
        plan = profiles.plan(tmp_path, target, min_steps=1)
    assert {s.origin for s in plan.stacks.values()} <= {"bound-from-tables", "profiled"}
    assert all(d == 0 for step in _preprocess_all(plan, target, BATCHES) for d in step.values())


def test_plan_from_spec_files(tmp_path, profile):
    ProfileStore(tmp_path).write(profile)
    model_file = next(p for p in tmp_path.iterdir() if p.name.startswith("model-"))
    a = profiles.plan(tmp_path, str(model_file), min_steps=1)
    spec = {"topology": {"num_chips": 4, "num_sc_per_chip": 4},
            "tables": [{"name": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.dim,
                        "combiner": t.combiner, "optimizer": "sgd"} for t in profile.model.tables],
            "features": [{"name": f.name, "table": f.table.name, "output_shape": list(f.output_shape)}
                         for f in profile.model.features]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    b = profiles.plan(tmp_path, str(tmp_path / "spec.json"), min_steps=1)
    (tmp_path / "layout.json").write_text(json.dumps(layout_of(profile.model).to_dict()))
    c = profiles.plan(tmp_path, str(tmp_path / "layout.json"), min_steps=1)
    assert a.max_ids_per_table == b.max_ids_per_table == c.max_ids_per_table
    assert a.max_ids_per_chip_per_sample == b.max_ids_per_chip_per_sample == c.max_ids_per_chip_per_sample


def test_planning_26_tables_from_10k_steps_is_fast():
    """26 tables, statistics of 10^4 steps (drawn directly), TF stacking and one stack per table."""
    for optimizer in ("sgd", [f"o{i}" for i in range(26)]):
        fc = synthetic.feature_config(26, per_chip_batch=256, vocab_sizes=[10**6, 5 * 10**4, 300, 2 * 10**5],
                                      dims=[16, 32, 64], optimizer=optimizer)
        profile = synthetic.synthetic_profile(fc, Topology(8, 4), 10_000, candidate_chip_counts=(1, 4, 16, 64))
        assert profile.steps == 10_000 and len(profile.tables) == 26
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InsufficientDataWarning)
            start = time.perf_counter()
            plan = profiles.plan(profile, quantile="p99.9", headroom=1.1)
            elapsed = time.perf_counter() - start
        assert len(plan.tables) == 26
        # The real figure is in benchmarks/plan.py; this generous bound only catches regressions
        # by an order of magnitude on a slow, shared test machine.
        assert elapsed < 5.0, elapsed


def test_plan_for_other_hosts_uses_the_profile_with_a_warning(tmp_path, profile):
    """Hosts do not change any statistic: the same figures, but the plan says where they came from."""
    ProfileStore(tmp_path).write(profile)
    target = profile.model.with_topology(Topology(TOPO.num_chips, TOPO.num_sc_per_chip, 2))
    with pytest.warns(ConfigurationMismatchWarning, match="hosts differ"):
        plan = profiles.plan(tmp_path, target, min_steps=1)
    assert {s.origin for s in plan.stacks.values()} == {"equivalent"}
    assert plan.max_ids_per_table == profiles.plan(profile, min_steps=1).max_ids_per_table
