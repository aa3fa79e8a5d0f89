"""Same input + spec -> byte-identical vocabularies, shards, profiles, transform output and manifest, 1 worker vs 2
processes."""

from __future__ import annotations

import os

import pytest

from pipelines import runner
from pipelines.jobs import JobConfig
from tests.helpers import ROOT
from tpu_embed.artifact.spec import load_spec


def _files(d):
    return {os.path.relpath(os.path.join(r, x), d): open(os.path.join(r, x), "rb").read()
            for r, _, xs in os.walk(d) for x in xs}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tensorflow", "both"])  # both: jax-tpu-embedding's arrays in the records too
def test_one_worker_and_two_processes_give_identical_bytes(tmp_path, layout):
    spec = load_spec(os.path.join(ROOT, "examples", "movielens", "spec.yaml"))
    spec = spec.model_copy(update={"shards": spec.shards.model_copy(update={"layout": layout})})
    assert spec.shards.layouts == (("tensorflow",) if layout == "tensorflow" else ("tensorflow", "jax"))
    a, b = str(tmp_path / "one"), str(tmp_path / "two")
    # Small chunks: several chunks and step pieces per file, so ordering really is exercised.
    runner.run_all(JobConfig(spec=spec, output=a, chunk_rows=37, steps_per_file=5, transform_output=True))
    runner.run_all(JobConfig(spec=spec, output=b, chunk_rows=37, steps_per_file=5, transform_output=True),
                   ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb)
    assert any(p.startswith("shards/") for p in fa) and any(p.startswith("profiles/") for p in fa)
    assert "transform_output/transform_fn/saved_model.pb" in fa
    assert len([p for p in fa if p.startswith("shards/host-00000/")]) == 3  # 13 steps, 5 per file
    for p in fa:
        assert fa[p] == fb[p], p
