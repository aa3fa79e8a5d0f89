"""`--candidate-chip-counts`: a chip count that cannot run the spec's global batch is not profiled, and the run says
so in one line naming it, why and the fix (not only a later `tpu-embed plan`); the others are profiled."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from profiles import ProfileStore
from tests.helpers import ROOT

TPU_EMBED = os.path.join(os.path.dirname(sys.executable), "tpu-embed")


def test_a_candidate_the_batch_cannot_run_is_named_in_one_line(tmp_path):
    # The tutorial's spec: a global batch of 32 on chips of 4 SparseCores. 8 chips give each SparseCore one
    # example; 16 chips half of one, and 3 chips x 4 SparseCores are not a power of two.
    data = os.path.join(ROOT, "data", "criteo_sample.csv")
    spec = {"name": "quickstart", "inputs": {"format": "csv", "patterns": [data]},
            "label": "label", "dense": ["I1"], "categorical": ["C1", "C2"], "defaults": {"table": {"dim": 8}},
            "optimizer": {"type": "adagrad", "learning_rate": 0.05},
            "topology": {"num_chips": 2, "num_sc_per_chip": 4}, "global_batch_size": 32}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    out = tmp_path / "artifact"
    r = subprocess.run([TPU_EMBED, "run", "--spec", str(tmp_path / "spec.yaml"), "--output", str(out),
                        "--candidate-chip-counts", "8,16,3", "--no-transform-output"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = (r.stdout + r.stderr).splitlines()
    said = {c: [line for line in lines if f"candidate chip count {c} " in line] for c in (3, 8, 16)}
    assert said[8] == [], said[8]
    assert len(said[16]) == 1 and len(said[3]) == 1, said
    assert ("is not profiled: feature 'C1': per-chip samples 2" in said[16][0]
            and "`tpu-embed plan` cannot plan 16 chips" in said[16][0]
            and "fix: give a global_batch_size that is a multiple of 64" in said[16][0]), said[16][0]
    assert "not a power of two" in said[3][0] and "fix: ask for a chip count" in said[3][0], said[3][0]
    # What the profile records agrees: 8 chips profiled, 16 and 3 not.
    assert ProfileStore(str(out / "profiles")).read().covered_chip_counts == (2, 8)
