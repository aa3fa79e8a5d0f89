"""Which topologies a job's profile covers: the spec's own by default, others when asked for (`--candidate-chip-counts`,
the spec's `profile_candidate_chip_counts`); `tpu-embed plan --spec` plans those and refuses the rest in one line."""

from __future__ import annotations

import os

import pytest
import yaml

from pipelines import cli
from profiles import ProfileStore, load_plan
from tests.helpers import ROOT

CRITEO = os.path.join(ROOT, "examples", "criteo", "spec.yaml")  # 2 chips x 4 SparseCores, global batch 32


def _spec(tmp_path, name: str, **changes) -> str:
    with open(CRITEO) as f:
        d = yaml.safe_load(f)
    d["inputs"]["patterns"] = [os.path.join(ROOT, "data", "criteo_sample.csv")]
    d.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def _covered(artifact: str):
    return ProfileStore(os.path.join(artifact, "profiles")).read().covered_chip_counts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("candidates")
    spec = _spec(tmp, "spec")
    out = {}
    for name, extra in (("default", []), ("flag", ["--candidate-chip-counts", "1,4"])):
        out[name] = str(tmp / name)
        assert cli.main(["run", "--spec", spec, "--output", out[name]] + extra) == 0
    out["key"] = str(tmp / "key")
    assert cli.main(["run", "--spec", _spec(tmp, "keyed", profile_candidate_chip_counts=[4]),
                     "--output", out["key"]]) == 0
    out["four_chips"] = _spec(tmp, "four", topology={"num_chips": 4, "num_sc_per_chip": 4, "num_hosts": 1})
    return out


def test_default_profiles_the_spec_topology_only(runs):
    assert _covered(runs["default"]) == (2,)


def test_flag_and_spec_key_add_candidates(runs):
    assert _covered(runs["flag"]) == (1, 2, 4)
    assert _covered(runs["key"]) == (2, 4)


def test_plan_for_a_covered_chip_count(runs, tmp_path, capsys):
    plan = str(tmp_path / "plan.json")
    assert cli.main(["plan", "--profiles", os.path.join(runs["key"], "profiles"), "--spec", runs["four_chips"],
                     "--output", plan, "--min-steps", "1"]) == 0
    p = load_plan(plan)
    assert p.model["topology"]["num_chips"] == 4
    assert [t["num_chips"] for t in p.topologies if t.get("is_target")] == [4]
    assert "chip counts the profile covers: 2, 4" in capsys.readouterr().out


def test_plan_refuses_an_uncovered_chip_count_in_one_line(runs, tmp_path, capsys):
    rc = cli.main(["plan", "--profiles", os.path.join(runs["default"], "profiles"), "--spec", runs["four_chips"],
                   "--output", str(tmp_path / "plan.json"), "--min-steps", "1"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "Traceback" not in err
    line, = err.splitlines()
    assert "no figures for 4 chips: it covers 2 chip(s)" in line
    assert "--candidate-chip-counts 4" in line and "profile_candidate_chip_counts: [4]" in line
    assert not os.path.exists(tmp_path / "plan.json")


@pytest.mark.parametrize("value", ["x", "0", ",", "4,-1"])
def test_bad_candidate_chip_counts_are_one_line(tmp_path, capsys, value):
    rc = cli.main(["run", "--spec", _spec(tmp_path, "spec"), "--output", str(tmp_path / "out"),
                   f"--candidate-chip-counts={value}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    line, = err.splitlines()
    assert line.startswith("tpu-embed run: --candidate-chip-counts must be positive integers")
    assert not os.path.exists(tmp_path / "out")


def test_plan_with_a_spec_needs_an_artifacts_profiles(runs, tmp_path, capsys):
    """A YAML spec's table sizes come from the artifact's vocabularies: a bare profile directory is refused."""
    bare = tmp_path / "profiles"
    ProfileStore(str(bare)).write(ProfileStore(os.path.join(runs["default"], "profiles")).read())
    rc = cli.main(["plan", "--profiles", str(bare), "--spec", runs["four_chips"], "--output",
                   str(tmp_path / "plan.json")])
    line, = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "is not an artifact's profile directory" in line
