"""`tpu-embed run` at a real batch size: limits planned from the same pass, recorded, never overflowing.

The Criteo sample repeated to two global batches of 4096 needs max_ids_per_table ~2,500 on its one
stack (2 chips x 4 SCs); TF's default is 256, so packing with the defaults fails at step 0.
"""

from __future__ import annotations

import os

import pytest
import yaml

from pipelines import runner
from pipelines.jobs import JobConfig
from pipelines.sharding.planned_limits import PLAN_FILE, PLANNED_SOURCE
from profiles import load_plan
from tests.helpers import ROOT
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec
from tpu_embed.sparsecore import LimitExceededError


def _spec(tmp_path, limits=None) -> str:
    with open(os.path.join(ROOT, "data", "criteo_sample.csv")) as f:
        header, *rows = f.read().splitlines()
    data = tmp_path / "criteo_x42.csv"
    data.write_text("\n".join([header] + rows * 42) + "\n")  # 8,400 rows: 2 steps of 4096
    with open(os.path.join(ROOT, "examples", "criteo", "spec.yaml")) as f:
        d = yaml.safe_load(f)
    d["inputs"]["patterns"] = [str(data)]
    d["global_batch_size"] = 4096
    if limits is not None:
        d["limits"] = limits
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planned")
    out = str(tmp / "out")
    runner.run_all(JobConfig(spec=load_spec(_spec(tmp)), output=out))
    return out


def test_run_plans_and_records_the_limits(planned):
    m = read_manifest(planned)
    plan = load_plan(os.path.join(planned, PLAN_FILE))
    assert m.counts.steps == 2
    assert m.limits.source == PLANNED_SOURCE
    assert m.limits.max_ids_per_table == plan.max_ids_per_table
    assert m.limits.max_unique_ids_per_table == plan.max_unique_ids_per_table
    assert m.limits.max_ids_per_chip_per_sample == plan.max_ids_per_chip_per_sample
    assert not m.limits.allow_id_dropping
    (stack, need), = plan.max_ids_per_table.items()
    assert need > 256  # TF's default would have failed
    assert m.counts.ids_dropped_by_limits == {}
    assert m.jobs["shard"].limits.max_ids_per_table == plan.max_ids_per_table
    kinds = {f.path: f.kind for f in m.files}
    assert kinds[PLAN_FILE] == "plan"
    # the shard format's buffers are the planned ones
    sample_count = m.stacks[stack].sample_count
    (fmt_stack,) = m.shards.format.stacks
    assert fmt_stack.ids_buffer == plan.max_ids_per_chip_per_sample * sample_count


def test_input_fn_pads_to_the_planned_buffers(planned):
    import tensorflow as tf

    from tpu_embed.training.input import input_fn
    m = read_manifest(planned)
    (fmt_stack,) = m.shards.format.stacks
    n = 0
    for step in input_fn(planned):
        for chip in step["sparse_core"]:
            d = chip[fmt_stack.name]
            assert d["sorted_token_ids"].shape == (fmt_stack.ids_buffer,)
            assert d["row_pointers"].shape == (fmt_stack.row_pointers_buffer,)
            assert int(d["ids_unpadded_size"]) <= fmt_stack.ids_buffer
            assert int(d["dropped_ids"]) == 0
            assert int(tf.reduce_max(d["row_pointers"])) <= fmt_stack.ids_buffer
        n += 1
    assert n == 2


def test_planned_limits_hold_when_pinned(planned, tmp_path):
    """Re-sharding with the recorded plan pinned (--plan) gives the same shard bytes: nothing overflows."""
    out = str(tmp_path / "pinned")
    spec = load_spec(os.path.join(planned, "spec.yaml")).with_inputs(
        [i.path for i in read_manifest(planned).jobs["shard"].inputs])
    runner.run_all(JobConfig(spec=spec, output=out, plan=os.path.join(planned, PLAN_FILE), write_profile=False))
    a, b = read_manifest(planned), read_manifest(out)
    assert b.limits.source.startswith("plan:")
    assert a.shards.format == b.shards.format
    sha = lambda m: {f.path: f.sha256 for f in m.files if f.kind == "shard"}  # noqa: E731
    assert sha(a) == sha(b)


def test_pinned_limits_still_fail_with_the_overflow_error(tmp_path):
    cfg = JobConfig(spec=load_spec(_spec(tmp_path, limits={})), output=str(tmp_path / "out"))  # TF's 256/256/64
    with pytest.raises(Exception) as e:
        runner.run_all(cfg)
    text = f"{type(e.value).__name__}: {e.value}"
    assert "LimitExceededError" in text or isinstance(e.value, LimitExceededError)
    assert "max_ids_per_table" in text and "limits from spec" in text
