"""Local paths are made absolute in the driver before a pipeline is built (`pipelines.paths.for_workers`), and a
runner whose workers cannot see this machine's files is told so in one line. The run on Dask workers in another
directory: tests/pipelines/runner/test_runners.py."""

from __future__ import annotations

import os

import pytest
import yaml

from pipelines import cli, paths
from pipelines.jobs import JobConfig
from pipelines.user_errors import UserError
from tests.reliability.artifacts import SPEC, write_inputs
from tpu_embed.artifact.spec import load_spec, parse_spec


def test_every_local_path_is_absolute_and_urls_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = parse_spec(dict(SPEC, inputs={"format": "csv", "patterns": ["data/*.csv"]}))  # base directory "."
    assert spec.input_patterns() == ["data/*.csv"]
    cfg = paths.for_workers(JobConfig(spec=spec, output="out", vocab_dir="../vocab", plan="plans/plan.json",
                                      profile_dir="stats"))
    assert (cfg.output, cfg.vocab_dir, cfg.plan) == (f"{tmp_path}/out", f"{tmp_path.parent}/vocab",
                                                     f"{tmp_path}/plans/plan.json")
    assert cfg.profile_dir == f"{tmp_path}/out/stats"  # --profile-dir is relative to --output
    assert cfg.spec.input_patterns() == [f"{tmp_path}/data/*.csv"]
    assert cfg.spec.fingerprint == spec.fingerprint and cfg.spec.to_dict() == spec.to_dict()
    assert paths.for_workers(cfg) == cfg
    remote = paths.for_workers(JobConfig(spec=spec, output="gs://bucket/out", vocab_dir="s3://b/v"))
    assert (remote.output, remote.vocab_dir, remote.profile_dir) == ("gs://bucket/out", "s3://b/v",
                                                                     "gs://bucket/out/profiles")
    assert paths.absolute("file://out") == f"{tmp_path}/out"


def test_remote_runner_given_local_paths_is_refused(tmp_path):
    spec = load_spec(write_inputs(str(tmp_path)))
    with pytest.raises(UserError, match=f"--output {tmp_path}/out is a local path, but --runner=DataflowRunner"):
        paths.for_workers(JobConfig(spec=spec, output=str(tmp_path / "out")), "DataflowRunner")
    with pytest.raises(UserError, match=f"the input pattern {tmp_path}/in.csv is a local path"):
        paths.for_workers(JobConfig(spec=spec, output="gs://bucket/out"), "dataflow")
    on_gcs = spec.with_inputs(["gs://bucket/in.csv"])
    cfg = paths.for_workers(JobConfig(spec=on_gcs, output="gs://bucket/out"), "DataflowRunner")  # accepted
    for runner in ("DirectRunner", "apache_beam.runners.dask.dask_runner.DaskRunner", "PortableRunner"):
        paths.for_workers(JobConfig(spec=spec, output="out"), runner)  # workers on this machine may see them
    assert cfg.output == "gs://bucket/out"


def test_cli_refuses_dataflow_with_a_local_output_in_one_line_before_touching_it(tmp_path, capsys, monkeypatch):
    write_inputs(str(tmp_path))
    with open(tmp_path / "spec.yaml") as fh:
        d = yaml.safe_load(fh)
    d["inputs"]["patterns"] = ["gs://bucket/in.csv"]
    (tmp_path / "gcs.yaml").write_text(yaml.safe_dump(d))
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["run", "--spec", "gcs.yaml", "--output", "out", "--runner=DataflowRunner", "--project=p",
                   "--region=r", "--temp_location=gs://bucket/tmp"])
    assert rc == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tpu-embed run: --output {tmp_path}/out is a local path, but --runner=DataflowRunner runs the jobs on "
        "workers that cannot see this machine's files. Fix: give object-store paths (gs://...) for --output, the "
        "inputs (--input / inputs.patterns), --vocab and --profile-dir, or run with a local runner."]
    assert not os.path.exists(tmp_path / "out")
