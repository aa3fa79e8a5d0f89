"""A small real artifact (2 chips, 2 hosts, 50 steps, 5 shard files per host) for the damage and fault tests."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
import yaml

from tpu_embed.artifact.load import load_artifact, require_shards
from tpu_embed.artifact.manifest import ManifestError
from tpu_embed.training.input import input_fn

ROWS = 400
# The features, tables and optimizer of every small spec in the reliability suite (inputs.make_spec too).
MODEL = {
    "label": {"column": "label"},
    "dense": [{"name": "x", "fill": 0.0}],
    "categorical": [
        {"name": "cat", "delimiter": "|", "vocabulary": {"num_oov_buckets": 1}},
        {"name": "id", "vocabulary": {"type": "identity", "num_buckets": 10}},
    ],
    "defaults": {"table": {"dim": 8}},
    "optimizer": {"type": "sgd", "learning_rate": 0.1},
}
SPEC = {
    "inputs": {"format": "csv", "patterns": ["in.csv"]},
    **MODEL,
    "topology": {"num_chips": 2, "num_hosts": 2},
    "global_batch_size": 8,
}


def write_inputs(d, rows: int = ROWS, spec: dict = None, name: str = "spec.yaml") -> str:
    """in.csv and a spec file in directory `d`; returns the spec path."""
    os.makedirs(d, exist_ok=True)
    lines = ["label,x,cat,id"] + [f"{i % 2},{i * 0.5},t{i % 13}|u{i % 5},{i % 10}" for i in range(rows)]
    with open(os.path.join(d, "in.csv"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    path = os.path.join(d, name)
    with open(path, "w") as fh:
        yaml.safe_dump(spec or SPEC, fh)
    return path


def run_in_process(d, out, spec_path=None, steps_per_file=10):
    from pipelines import runner
    from pipelines.jobs import JobConfig
    from tpu_embed.artifact.spec import load_spec
    spec = load_spec(spec_path or os.path.join(d, "spec.yaml"))
    return runner.run_all(JobConfig(spec=spec, output=out, steps_per_file=steps_per_file))


def tree(d) -> dict:
    """{relative path: sha256} of every file under d (hidden ones too)."""
    out = {}
    for root, _, names in os.walk(d):
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def artifact_bytes(out) -> dict:
    """{relative path: bytes} of every file under out's vocab/ and shards/: what two runs of the same data must
    write alike, whatever the input format."""
    got = {}
    for sub in ("vocab", "shards"):
        for root, _, names in os.walk(os.path.join(out, sub)):
            for n in names:
                p = os.path.join(root, n)
                with open(p, "rb") as fh:
                    got[os.path.relpath(p, out)] = fh.read()
    return got


def copy(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def not_accepted(out):
    """Neither input_fn nor the training side accepts `out` as a complete artifact."""
    with pytest.raises((ManifestError, FileNotFoundError)):
        input_fn(out)
    with pytest.raises((ManifestError, FileNotFoundError)):
        require_shards(load_artifact(out).manifest, out)
