"""What-if in every plan (profiles/planner/variants.py): other chip counts, SparseCores per chip and global batches
from the profile job's recorded steps, each with its sampling; equal to the plan's own figures and to the exact
candidate chip counts where every step was recorded."""

from __future__ import annotations

import pytest

import profiles
from profiles import ProfileStore, synthetic
from profiles.whatif_steps import WhatIfCollector, write_what_if_steps
from tests.helpers import jobs
from tpu_embed.core.topology import Topology


def _write(tmp_path, *, budget_ids=1 << 21, steps=12, candidates=()):
    fc = synthetic.feature_config(4, per_chip_batch=16, vocab_sizes=[40, 7, 300, 1000], dims=[8, 16], shared=1)
    collector = WhatIfCollector(fc, Topology(4, 4), candidate_chip_counts=candidates, budget_ids=budget_ids)
    acc = collector.create_accumulator()
    for i, b in enumerate(synthetic.global_batches(fc, 4, steps, seed=7)):
        collector.add_step(acc, b, step=i)
    profile = collector.extract_output(acc)
    ProfileStore(tmp_path).write(profile)
    write_what_if_steps(str(tmp_path), profile)
    return profile


def _rows(plan):
    return {r["label"]: r for r in plan.what_if["configurations"]}


def test_every_plan_has_the_what_if_and_its_exact_figures_are_the_plans(tmp_path):
    profile = _write(tmp_path, candidates=(8,))
    plan = profiles.plan(str(tmp_path), min_steps=1)
    rows = _rows(plan)
    assert list(rows) == ["as profiled", "chips x1/2", "chips x2", "chips x4", "2 SparseCores per chip",
                          "batch B/2", "batch 2B"]
    assert all(r["status"] == "evaluated" and r["sampling"]["exact"] for r in rows.values())
    assert [rows[k]["sampling"]["steps"] for k in ("as profiled", "batch B/2", "batch 2B")] == [12, 24, 6]
    own = rows["as profiled"]
    assert {n: s["max_ids_per_table"] for n, s in own["stacks"].items()} == plan.max_ids_per_table
    assert {n: s["max_unique_ids_per_table"] for n, s in own["stacks"].items()} == plan.max_unique_ids_per_table
    assert own["max_ids_per_chip_per_sample"] == plan.max_ids_per_chip_per_sample
    assert own["bytes_per_sc"] == plan.memory["planned_bytes_per_sc"]
    for name, s in own["stacks"].items():
        st = profile.accumulator.stacks[name]
        assert s["balance"] == pytest.approx(st.step_destination_balance())
    # x2 the chips: what the exact path (--candidate-chip-counts 8, plan --spec) plans from the same pass.
    exact = profiles.plan(str(tmp_path), profiles.units.rescaled(profile.model, 8), min_steps=1)
    x2 = rows["chips x2"]
    assert {n: s["max_ids_per_table"] for n, s in x2["stacks"].items()} == exact.max_ids_per_table
    assert {n: s["max_unique_ids_per_table"] for n, s in x2["stacks"].items()} == exact.max_unique_ids_per_table
    assert x2["max_ids_per_chip_per_sample"] == exact.max_ids_per_chip_per_sample
    # plan.json keeps it.
    plan.write(str(tmp_path / "plan.json"))
    assert profiles.load_plan(tmp_path / "plan.json").what_if == plan.what_if


def test_sampled_steps_say_so_beside_every_figure(tmp_path, capsys):
    _write(tmp_path, budget_ids=1, steps=12)  # only block 0 (steps 0-3) is kept
    assert jobs.cli(["plan", "--profiles", str(tmp_path), "--output", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    rows = _rows(profiles.load_plan(tmp_path / "plan.json"))
    assert rows["as profiled"]["sampling"] == {"exact": False, "steps": 4, "of": 12, "text": "sampled: 4 of 12 steps"}
    assert rows["batch B/2"]["sampling"]["text"] == "sampled: 8 of 24 steps"
    assert rows["batch 2B"]["sampling"]["text"] == "sampled: 2 of 6 steps"
    assert "what-if from the recorded steps (4 of 12 steps" in out and "sampled: 4 of 12 steps" in out
    assert "--candidate-chip-counts" in out


def test_a_profile_without_recorded_steps_plans_as_before(tmp_path, write_synthetic_profile):
    fc = synthetic.feature_config(3, per_chip_batch=8, vocab_sizes=[50, 3000, 800])
    plan = profiles.plan(str(write_synthetic_profile(fc, steps=4, seed=1, candidate_chip_counts=())), min_steps=1)
    assert plan.what_if is None and "what_if" not in plan.to_json()
