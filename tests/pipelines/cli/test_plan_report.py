"""`plan` and `report` commands, as the top-level CLI adds them."""

import argparse
import json

import pytest

import profiles
from pipelines.cli.plan_report import add_commands
from profiles import ProfileCollector, ProfileStore, synthetic
from tpu_embed.core.topology import Topology


def _parser(spec_loader=None):
    parser = argparse.ArgumentParser(prog="tpu-embed")
    add_commands(parser.add_subparsers(dest="command", required=True), spec_loader=spec_loader)
    return parser


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    """A profile of 12 synthetic global batches on 2 chips x 4 SparseCores."""
    fc = synthetic.feature_config(3, per_chip_batch=8, vocab_sizes=[50, 3000, 800])
    topology = Topology(2, 4)
    col = ProfileCollector(fc, topology, candidate_chip_counts=(1,))
    acc = col.create_accumulator()
    for i, b in enumerate(synthetic.global_batches(fc, topology.num_chips, 12, seed=4)):
        col.add_step(acc, b, step=i)
    d = tmp_path_factory.mktemp("profiles")
    ProfileStore(d).write(col.extract_output(acc))
    return d


@pytest.mark.parametrize("command", ["plan", "report"])
def test_help_explains(command, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--profiles" in out and "--output" in out
    if command == "plan":
        assert "max_ids_per_chip_per_sample" in out and "--quantile" in out and "--headroom" in out
        assert "allow_id_dropping" in out and "--spec" in out
    else:
        assert "index.html" in out and "--plan" in out


def test_plan_and_report_commands(tmp_path, profile_dir, capsys):
    parser = _parser()
    args = parser.parse_args(["plan", "--profiles", str(profile_dir), "--output", str(tmp_path / "plan.json"),
                              "--quantile", "p99.9", "--headroom", "1.1"])
    assert args.func(args) == 0
    out, err = capsys.readouterr()
    assert "wrote" in out and "InsufficientDataWarning" in err
    plan = profiles.load_plan(tmp_path / "plan.json")
    assert plan.policy["quantile"] == "p99.9" and plan.policy["headroom"] == 1.1
    args = parser.parse_args(["report", "--profiles", str(profile_dir), "--plan", str(tmp_path / "plan.json"),
                              "--output", str(tmp_path / "rep")])
    assert args.func(args) == 0
    assert (tmp_path / "rep" / "index.html").exists()


def test_spec_loader_hook(tmp_path, profile_dir):
    """The top-level CLI passes its YAML loader; plan calls it for --spec."""
    seen = []

    def loader(path, profiles):
        seen.append((path, profiles))
        return ProfileStore(profile_dir).read().model
    parser = _parser(spec_loader=loader)
    args = parser.parse_args(["plan", "--profiles", str(profile_dir), "--spec", "model.yaml",
                              "--output", str(tmp_path / "plan.json")])
    assert args.func(args) == 0
    assert seen == [("model.yaml", str(profile_dir))]
    assert json.loads((tmp_path / "plan.json").read_text())["kind"] == "plan"
