"""`tpu-embed plan --propose` (profiles/planner/proposal.py, cost.py, placements.py): the cost model against a
small case computed by hand, the TensorCore move of a small table with a dominant token, and the configurations
written: a SparseCoreEmbeddingConfig under TensorFlow, jax-tpu-embedding FeatureSpecs stacked in its groups."""

from __future__ import annotations

import json
import runpy
import subprocess
from pathlib import Path

import numpy as np
import pytest

from profiles import ProfileStore, load_plan
from profiles.planner.cost import placement_cost
from profiles.planner.placements import tensorflow_candidates
from profiles.planner.proposal import proposal_lines, propose_placements
from profiles.planner.whatif import ReplaySteps
from profiles.whatif_steps import WhatIfCollector, write_what_if_steps
from tests.helpers import jobs
from tpu_embed.core.model import FeatureConfig, ModelConfig, TableConfig
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import FeatureIds

ROOT = Path(__file__).resolve().parents[3]


def _profile(model: ModelConfig, batches):
    collector = WhatIfCollector(model, model.topology)
    acc = collector.create_accumulator()
    for i, b in enumerate(batches):
        collector.add_step(acc, b, step=i)
    return collector.extract_output(acc)


def _ids(rows, ids):
    return FeatureIds(np.asarray(rows, np.int64), np.asarray(ids, np.int64), None)


# ---------------------------------------------------------------- the cost model by hand

def test_cost_model_equals_a_small_case_computed_by_hand():
    """1 chip x 2 SparseCores (S = 2), tables a and b of width 8 (TF stacks them as a_b, both at rotation 0),
    2 examples per chip, one step: a = {sample 0: ids 0, 2; sample 1: id 0}, b = {sample 0: 1; sample 1: 1}.

    Sample r goes to source SparseCore r, id i to destination i mod 2.  Cells (source -> destination):
    stacked: 0->0 holds a's 0, 2 (2 ids, 2 unique); 1->0 a's 0 (1, 1); 0->1 and 1->1 b's 1 (1, 1 each).
    Destination 0: 3 ids, 3 rows gathered (unique per cell); destination 1: 2 ids, 2 rows.  Mean 2.5 ids.
    Traffic (ids x 12 B + rows x 8 x 4 B): destination 0 36 + 96 = 132 B, destination 1 24 + 64 = 88 B.
    Hottest id: a's 0 and b's 1, 2 lookups each: floor max(2, 2.5) / 2.5 = 1.
    Limits: max_ids 2, max_unique 2, chip buffer 4 cells x 8 = 32 slots over 4 samples: 8 per sample (a
    multiple of 2, which 4 samples need for 8-aligned buffers).  Memory: staging 2 x 12 + 2 x 8 x 4 = 88 B,
    CSR buffer 8 x 4 x 12 / 2 = 192 B.
    Unstacked: a alone sends 3 ids / 3 rows to destination 0 (132 B; mean 1.5, hottest 2: floor 1.33); b alone
    2 ids / 2 rows to destination 1 (88 B; mean 1, floor 2).  a: limits 2 / 2, 16 slots over 2 samples: 8
    per sample (a multiple of 4); staging 88 B + buffer 8 x 2 x 12 / 2 = 96 B; b: 1 / 1: 44 + 96 B."""
    a = TableConfig("a", 8, 8, "sum", optimizer_group="sgd")
    b = TableConfig("b", 8, 8, "sum", optimizer_group="sgd")
    model = ModelConfig((FeatureConfig("fa", a, (2,)), FeatureConfig("fb", b, (2,))), Topology(1, 2))
    profile = _profile(model, [{"fa": _ids([0, 0, 1], [0, 2, 0]), "fb": _ids([0, 1], [1, 1])}])
    replay = ReplaySteps(profile.model, profile.accumulator.what_if)
    stacked, unstacked = (placement_cost(c, replay, profile) for c in tensorflow_candidates(profile.model))

    assert stacked.kernels == 1 and [s.tables for s in stacked.stacks] == [("a", "b")]
    assert (stacked.busiest_ids, stacked.busiest_rows, stacked.traffic_bytes) == (3, 3, 132)
    assert stacked.gathered_bytes == 3 * 8 * 4
    assert stacked.balance == pytest.approx(3 / 2.5) and stacked.floor == pytest.approx(1.0)
    lim = stacked.stacks[0].limits
    assert (lim.max_ids, lim.max_unique_ids, lim.chip_buffer_slots, lim.limits_from) == (2, 2, 32, "exact")
    assert stacked.max_ids_per_chip_per_sample == 8
    assert stacked.memory_bytes_per_sc == 88 + 192

    assert unstacked.kernels == 2 and [s.tables for s in unstacked.stacks] == [("a",), ("b",)]
    sa, sb = unstacked.stacks
    assert (sa.busiest_ids, sa.busiest_rows, sa.busiest_traffic, sa.balance) == (3, 3, 132, 2.0)
    assert sa.floor == pytest.approx(2 / 1.5)
    assert (sb.busiest_ids, sb.busiest_rows, sb.busiest_traffic, sb.balance, sb.floor) == (2, 2, 88, 2.0, 2.0)
    assert (unstacked.busiest_ids, unstacked.traffic_bytes) == (5, 220)
    assert unstacked.balance == pytest.approx(5 / 2.5) and unstacked.floor == pytest.approx(4 / 2.5)
    assert (sa.limits.max_ids, sa.limits.max_unique_ids, sb.limits.max_ids, sb.limits.max_unique_ids) == (2, 2, 1, 1)
    assert unstacked.max_ids_per_chip_per_sample == 8
    assert unstacked.memory_bytes_per_sc == (88 + 96) + (44 + 96)

    proposal = propose_placements(profile, profile.accumulator.what_if)
    assert proposal.tensorflow.label == "tf-default" and proposal.tensor_core == ()
    assert proposal.sampling["text"] == "exact: all 1 steps"


def test_jax_groups_merge_tables_of_two_widths_where_the_traffic_drops():
    """2 chips x 4 SparseCores; a (width 8) and b (width 16), one optimizer and combiner: jax's auto_stack_tables
    keeps them apart (two widths).  Every sample looks up id 0 of each: 16 ids per step, 8 rows (one per source
    SparseCore).  Apart: a 16 x 12 + 8 x 8 x 4 = 448 B, b 16 x 12 + 8 x 16 x 4 = 704 B on one SparseCore each.
    Stacked (b rotated by 4, padded to 16): SparseCores 0 and 4 carry 704 B each, so the step's 1152 B become
    704 B with one kernel; within the activation limit only.  (Both tables have a dominant token: no table is
    small enough to move here.)"""
    a = TableConfig("a", 8, 8, "sum", optimizer_group="sgd")
    b = TableConfig("b", 8, 16, "sum", optimizer_group="sgd")
    model = ModelConfig((FeatureConfig("fa", a, (8,)), FeatureConfig("fb", b, (8,))), Topology(2, 4))
    zeros = _ids(np.arange(16), np.zeros(16))
    profile = _profile(model, [{"fa": zeros, "fb": zeros}] * 3)
    proposal = propose_placements(profile, profile.accumulator.what_if, tensor_core_max_bytes=0)
    by_label = {c.label: c for c in proposal.costs}
    auto, groups = by_label["jax-auto"], by_label["jax-groups"]
    assert auto.candidate.groups == (("a",), ("b",)) and auto.traffic_bytes == 448 + 704
    assert groups.candidate.groups == (("a", "b"),) and groups.traffic_bytes == 704 and groups.kernels == 1
    assert groups.stacks[0].padded_dim == 16 and groups.stacks[0].rotations == (0, 4)
    assert proposal.jax is groups
    # 16 samples x 16 wide x 4 B / 8 SparseCores = 128 B of activations per table: a limit of 255 B keeps them apart.
    tight = propose_placements(profile, profile.accumulator.what_if, tensor_core_max_bytes=0,
                               activation_mem_bytes_limit=255)
    assert "jax-groups" not in {c.label for c in tight.costs} and tight.jax.label == "jax-auto"


# ---------------------------------------------------------------- TensorCore moves and the written configs

def _dominant_token_model(per_chip_batch=16):
    """4 chips x 4 SparseCores: `big` and `big2` (2000 rows, spread ids), `flag` (2 rows, id 0 in 15 of 16
    examples), `hot_big` (5000 x 16: too big to move, also dominated by one id), `other` (adagrad: a stack of its
    own).  flag, big and big2 share a stack (sgd, width 8); the flag's id 0 sets that stack's floor."""
    big = TableConfig("big", 2000, 8, "sum", optimizer_group="sgd")
    big2 = TableConfig("big2", 2000, 8, "sum", optimizer_group="sgd")
    flag = TableConfig("flag", 2, 8, "sum", optimizer_group="sgd")
    hot_big = TableConfig("hot_big", 5000, 16, "mean", optimizer_group="sgd")
    other = TableConfig("other", 300, 8, "sum", optimizer_group="adagrad")
    feats = tuple(FeatureConfig(f"f_{t.name}", t, (per_chip_batch,)) for t in (big, big2, flag, hot_big, other))
    return ModelConfig(feats, Topology(4, 4))


def _dominant_batches(model, steps, seed=0):
    rng = np.random.default_rng(seed)
    n = model.per_chip_batch * model.topology.num_chips
    rows = np.arange(n)
    for _ in range(steps):
        yield {"f_big": _ids(rows, rng.integers(0, 2000, n)), "f_big2": _ids(rows, rng.integers(0, 2000, n)),
               "f_flag": _ids(rows, (rng.random(n) < 1 / 16).astype(np.int64)),
               "f_hot_big": _ids(rows, np.where(rng.random(n) < 0.9, 0, rng.integers(0, 5000, n))),
               "f_other": _ids(rows, rng.integers(0, 300, n))}


@pytest.fixture(scope="module")
def dominant_dir(tmp_path_factory):
    model = _dominant_token_model()
    profile = _profile(model, list(_dominant_batches(model, 8)))
    d = tmp_path_factory.mktemp("dominant")
    ProfileStore(d).write(profile)
    write_what_if_steps(str(d), profile)
    return d


def _plan(directory: Path, output: Path, *extra: str) -> str:
    assert jobs.cli(["plan", "--profiles", str(directory), "--output", str(output), "--min-steps", "1", "--propose",
                     *extra]) == 0
    return str(output.with_name(output.stem + "_proposal.py"))


def test_a_small_table_with_a_dominant_token_goes_to_the_tensor_core(dominant_dir, tmp_path, capsys):
    snippet = _plan(dominant_dir, tmp_path / "plan.json")
    out = capsys.readouterr().out
    proposal = load_plan(tmp_path / "plan.json").proposal
    assert proposal["tensor_core"] == ["flag"]  # hot_big is dominated as much, but 320 KB > 64 KiB
    by_label = {c["label"]: c for c in proposal["candidates"]}
    before, after = by_label["tf-default"], by_label["tf-default + TensorCore: flag"]
    stack = next(s for s in before["stacks"].values() if "flag" in s["tables"])
    assert stack["floor"] > 3  # flag's id 0: ~15/16 of a batch against a mean of 3/16 per SparseCore
    moved = next(s for s in after["stacks"].values() if "big" in s["tables"])
    assert moved["tables"] == ["big", "big2"] and moved["floor"] < 1.1
    assert after["traffic_bytes_per_step"] < before["traffic_bytes_per_step"]
    assert proposal["chosen"]["tensorflow"] == "tf-default + TensorCore: flag"
    tf = proposal["tensorflow"]
    assert tf["tensor_core_features"] == {"f_flag": 1}
    assert set(tf["sparse_core_config"]["max_ids_per_table"]) == {"big_big2", "hot_big", "other"}
    assert proposal["sampling"] == {"exact": True, "steps": 8, "steps_seen": 8, "stride": 1, "limits_exact": True,
                                    "text": "exact: all 8 steps"}
    assert "placements compared" in out and "<- chosen" in out and "tensor_core_width: 1" in out
    assert proposal_lines(proposal)[0] in out
    # A bound on the table size keeps it on the SparseCores.
    _plan(dominant_dir, tmp_path / "small.json", "--tensor-core-max-bytes", "32")
    assert load_plan(tmp_path / "small.json").proposal["tensor_core"] == []
    assert Path(snippet).exists()


def test_the_written_tensorflow_config_constructs_a_sparse_core_config(dominant_dir, tmp_path):
    snippet = runpy.run_path(_plan(dominant_dir, tmp_path / "plan.json"))
    config = snippet["sparse_core_config"]()
    want = load_plan(tmp_path / "plan.json").proposal["tensorflow"]["sparse_core_config"]
    assert type(config).__name__ == "SparseCoreEmbeddingConfig"
    assert config.max_ids_per_table == want["max_ids_per_table"]
    assert config.max_unique_ids_per_table == want["max_unique_ids_per_table"]
    assert config.max_ids_per_chip_per_sample == want["max_ids_per_chip_per_sample"]
    assert config.disable_table_stacking is False and config.allow_id_dropping is False


@pytest.mark.conformance
def test_the_written_jax_groups_stack_feature_specs_in_jax(dominant_dir, tmp_path):
    """In the JAX venv: FeatureSpecs of the SparseCore tables, stacked by the written stack_feature_specs, carry
    the proposed groups (jax's own rotations and row offsets, the ones the cost model evaluated) and limits."""
    from tests.conformance.jax_oracle import jax_env, jax_python
    snippet = _plan(dominant_dir, tmp_path / "plan.json")
    proposal = load_plan(tmp_path / "plan.json").proposal
    jx = proposal["jax"]
    model = _dominant_token_model()
    moved = set(proposal["tensor_core"])
    optimizers = {"sgd": ("sgd", 0.1), "adagrad": ("adagrad", 0.1)}
    tables = [{"name": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.dim, "combiner": t.combiner,
               "optimizer": optimizers[t.optimizer_group]} for t in model.tables if t.name not in moved]
    features = [{"name": f.name, "table": f.table.name, "global_samples": f.samples * model.topology.num_chips}
                for f in model.features if f.table.name not in moved]
    request = json.dumps({"tables": tables, "features": features, "snippet": snippet})
    done = subprocess.run([jax_python(), str(Path(__file__).with_name("jax_proposal_helper.py"))], input=request,
                          capture_output=True, text=True, env=jax_env(), timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["limits"] == jx["limits"]
    stacks = {}
    for f in got["stacking"].values():
        stacks.setdefault(f["stack"], {})[f["table"]] = f["shard_rotation"]
    assert {s: sorted(t) for s, t in stacks.items()} == {s: sorted(g) for s, g in jx["stack_groups"].items()}
    by_label = {c["label"]: c for c in proposal["candidates"]}
    evaluated = by_label[jx["placement"]]["stacks"]
    for name, group in jx["stack_groups"].items():
        assert evaluated[name]["tables"] == group
        assert [stacks[name][t] for t in group] == evaluated[name]["rotations"]
    assert any(len(g) > 1 for g in jx["stack_groups"].values())


def test_the_report_shows_the_what_if_and_the_comparison(dominant_dir, tmp_path):
    pytest.importorskip("matplotlib")
    from profiles.report import write_report
    _plan(dominant_dir, tmp_path / "plan.json")
    page = Path(write_report(str(dominant_dir), str(tmp_path / "plan.json"), tmp_path / "report")).read_text()
    assert "What-if: other chips" in page and "Placements compared" in page
    assert "tf-default + TensorCore: flag" in page and "exact: all 8 steps" in page
