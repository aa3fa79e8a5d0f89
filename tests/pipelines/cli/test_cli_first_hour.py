"""What a new user meets in the first hour with `tpu-embed`: --version, the command list, each command's help,
`inspect` (--host, --json --steps, what a record's line counts), one exit code per kind of error in every
command, spec and YAML errors that name the file, the line and the right key, a missing CSV column named
without every header, remap's and inspect's words, and `tpu-embed demo` twice into one directory.

Commands run in this process (`pipelines.cli.main`); the artifact is the tutorial's quickstart (200 rows)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import re

import numpy as np
import pytest

from pipelines import cli, runner
from pipelines.jobs import JobConfig
from tests.helpers import ROOT
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec

CSV = os.path.join(ROOT, "data", "criteo_sample.csv")
QUICKSTART = f"""\
name: quickstart
inputs: {{format: csv, patterns: [{CSV}]}}
label: label
dense: [I1, I2, I3]
categorical: [C1, C2, C3]           # frequency vocabularies, one table each
defaults: {{table: {{dim: 8}}}}
optimizer: {{type: adagrad, learning_rate: 0.05}}
topology: {{num_chips: 2, num_sc_per_chip: 4}}
global_batch_size: 32
"""


def _spec(tmp_path, text: str = QUICKSTART, name: str = "quickstart.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("first_hour")
    out = str(d / "quickstart")
    runner.run_all(JobConfig(spec=load_spec(_spec(d)), output=out))
    return out


def _run(capsys, argv):
    """(exit code, stdout, stderr lines) of `tpu-embed ARGV`; argparse's own errors exit through SystemExit."""
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


# ---------------------------------------------------------------- --version, the command list, --help

def test_version_prints_the_version(capsys):
    import tpu_embed
    code, out, err = _run(capsys, ["--version"])
    assert (code, out, err) == (0, f"tpu-embed {tpu_embed.__version__}\n", [])


def _subcommands() -> dict:
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_has_one_line_in_the_list_in_one_style(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = cli.build_parser().format_help()
    listing = text[text.index("  COMMAND\n") + len("  COMMAND\n"):text.index("\noptions:")].rstrip("\n").splitlines()
    commands = _subcommands()
    assert [line.split()[0] for line in listing] == list(commands)  # one line each, nothing wrapped
    for line in listing:
        name, help_text = line.split(maxsplit=1)
        assert len(line) <= 80 and help_text[0].islower() and not help_text.endswith("."), line
    for name, sp in commands.items():  # and each command's own --help says what it does, as a sentence
        assert sp.description and sp.description[0].isupper(), name


def test_every_flag_of_every_command_has_help():
    for name, sp in _subcommands().items():
        for action in sp._actions:
            assert action.help, (name, action.option_strings or action.dest)


def test_run_help_shows_run_examples_only(capsys):
    code, out, _ = _run(capsys, ["run", "--help"])
    examples = out[out.index("\nexamples:\n"):]
    commands = re.findall(r"^  tpu-embed (\S+)", examples, re.M)
    assert code == 0 and commands and set(commands) == {"run"}, examples  # not vocab, shard, plan, remap, ...


# ---------------------------------------------------------------- inspect

def _records(artifact, n):
    m = read_manifest(artifact)
    path = shard_records.shard_files(artifact, 0, m)[0]
    return m, [shard_records.decode_record(r, m.shard_format) for r in tfrecord.read_records(path)[:n]]


def test_inspect_json_honours_steps(artifact, capsys):
    code, out, _ = _run(capsys, ["inspect", artifact, "--json", "--steps", "2"])
    got = json.loads(out)
    m, records = _records(artifact, 2)
    assert code == 0 and got["manifest"] == json.load(open(os.path.join(artifact, "manifest.json")))
    assert [(r["host"], r["step"]) for r in got["records"]] == [(0, 0), (0, 1)]
    chip = got["records"][1]["sparse_core"][1]["C1_C2_C3"]
    want = records[1]["sparse_core"][1]["C1_C2_C3"]
    np.testing.assert_array_equal(chip["sorted_token_ids"], want["sorted_token_ids"])
    np.testing.assert_array_equal(got["records"][0]["label"], records[0]["label"])
    # --json alone: the manifest as written, as before
    code, out, _ = _run(capsys, ["inspect", artifact, "--json"])
    assert code == 0 and out.encode() == open(os.path.join(artifact, "manifest.json"), "rb").read()


def test_inspect_counts_ids_slots_and_the_buffer_as_the_tutorial_says(artifact, capsys):
    code, out, _ = _run(capsys, ["inspect", artifact, "--steps", "1"])
    m, (record,) = _records(artifact, 1)
    lines = [x for x in out.splitlines() if x.startswith("  chip ")]
    assert code == 0 and len(lines) == 2
    for c, line in enumerate(lines):
        d = record["sparse_core"][c]["C1_C2_C3"]
        real = int(np.count_nonzero(d["sorted_token_ids"] != 2**31 - 1))
        assert line == (f"  chip {c} C1_C2_C3: {real} ids in {d['ids_unpadded_size']} slots of a 240-id buffer, "
                        f"{d['row_pointers_unpadded_size']} row pointers, 0 dropped")
    assert lines[0].startswith("  chip 0 C1_C2_C3: 47 ids in 184 slots")  # one blank C3 cell in chip 0's rows
    tutorial = open(os.path.join(ROOT, "docs", "tutorial.md"), encoding="utf-8").read()
    assert lines[0] in tutorial and lines[1] in tutorial  # the tutorial shows this output and explains its words
    # input_fn pads each chip's ids to that buffer
    import tpu_embed
    step = next(iter(tpu_embed.input_fn(artifact, host_index=0)))
    assert step["sparse_core"][0]["C1_C2_C3"]["sorted_token_ids"].shape == (240,)


# ---------------------------------------------------------------- exit codes: one per kind of error

def _usage(capsys, argv, *fragments):
    code, _, err = _run(capsys, argv)
    assert code == 2, (argv, err)
    assert all(f in err[-1] for f in fragments), err
    return err


def _failed(capsys, argv, *fragments):
    code, _, err = _run(capsys, argv)
    assert code == 1 and len(err) == 1 and err[0].startswith(f"tpu-embed {argv[0]}: "), (argv, err)
    assert all(f in err[0] for f in fragments), err
    return err


def test_a_mistyped_flag_is_2_in_every_command(artifact, tmp_path, capsys):
    spec = _spec(tmp_path)
    _usage(capsys, ["run", "--spec", spec, "--output", str(tmp_path / "o"), "--stirct"], "--strict")
    _usage(capsys, ["inspect", artifact, "--stpes", "1"], "--stpes")
    _usage(capsys, ["remap", "--from", artifact, "--to", artifact, "--checkpoint", "c", "--output", "o", "--sed", "1"],
           "--sed")
    _usage(capsys, ["plan", "--profiles", artifact, "--output", "p.json", "--quantiel", "max"], "--quantiel")


def test_a_bad_flag_value_is_2_in_every_command(artifact, tmp_path, capsys):
    _usage(capsys, ["inspect", artifact, "--host", "3"], "--host 3")
    _usage(capsys, ["remap", "--from", artifact, "--to", artifact, "--checkpoint", "c", "--output",
                    str(tmp_path / "c2"), "--chunk-rows", "0"], "--chunk-rows")
    _usage(capsys, ["run", "--spec", _spec(tmp_path), "--output", str(tmp_path / "o"), "--split-bytes", "0"],
           "--split-bytes")


def test_a_bad_spec_is_2_in_every_command_that_reads_one(artifact, tmp_path, capsys):
    spec = _spec(tmp_path, QUICKSTART.replace("global_batch_size", "global_batch_sise"), "typo.yaml")
    for argv in (["run", "--spec", spec, "--output", str(tmp_path / "o1")],
                 ["vocab", "--spec", spec, "--output", str(tmp_path / "o2")],
                 ["plan", "--profiles", os.path.join(artifact, "profiles"), "--spec", spec, "--output",
                  str(tmp_path / "plan.json")]):
        err = _usage(capsys, argv, "global_batch_sise")
        assert len(err) == 1 and err[0].startswith(f"tpu-embed {argv[0]}: "), err


def _without_column(tmp_path, column: str) -> str:
    """The quickstart spec over a copy of its CSV without `column`."""
    rows = list(csv.reader(open(CSV, newline="")))
    drop = rows[0].index(column)
    data = tmp_path / f"no_{column}.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([r[:drop] + r[drop + 1:] for r in rows])
    return _spec(tmp_path, QUICKSTART.replace(CSV, str(data)), f"no_{column}.yaml")


def test_bad_data_and_missing_artifacts_are_1_in_every_command(artifact, tmp_path, capsys):
    spec = _without_column(tmp_path, "C2")
    for command in ("run", "vocab"):
        _failed(capsys, [command, "--spec", spec, "--output", str(tmp_path / command), "--strict"], "no_C2.csv")
    nowhere = str(tmp_path / "nowhere")
    _failed(capsys, ["inspect", nowhere], nowhere)
    _failed(capsys, ["transform-output", nowhere], nowhere)
    _failed(capsys, ["plan", "--profiles", nowhere, "--output", str(tmp_path / "p.json")])
    # remap: a checkpoint that is not there is the same kind of error (it was 2, "how it was called")
    _failed(capsys, ["remap", "--from", artifact, "--to", artifact, "--checkpoint", nowhere, "--output",
                     str(tmp_path / "c" / "ckpt-0")], "is not a checkpoint")


def test_an_output_that_holds_an_artifact_is_1(artifact, capsys):
    _failed(capsys, ["run", "--spec", os.path.join(artifact, "spec.yaml"), "--output", artifact], "--overwrite")


def test_the_exit_codes_are_documented():
    text = open(os.path.join(ROOT, "docs", "reference", "cli.md"), encoding="utf-8").read()
    table = text[text.index("| code | meaning |"):]
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 130 |"):
        assert code in table


# ---------------------------------------------------------------- spec, YAML and CSV messages

def test_a_misspelled_spec_key_is_named_with_the_right_one_and_the_file(tmp_path, capsys):
    spec = _spec(tmp_path, QUICKSTART.replace("global_batch_size", "global_batch_sise"), "typo.yaml")
    (line,) = _usage(capsys, ["run", "--spec", spec, "--output", str(tmp_path / "o")])
    assert line == (f"tpu-embed run: {spec}, line 9: spec key 'global_batch_sise': unknown key; did you mean "
                    "'global_batch_size'? Fix: rename it to global_batch_size (the allowed keys are in "
                    "docs/reference/spec.md).")
    # deeper, and in a section's defaults: the line of the key
    spec = _spec(tmp_path, QUICKSTART.replace("{dim: 8}", "{dimm: 8}"), "typo2.yaml")
    (line,) = _usage(capsys, ["run", "--spec", spec, "--output", str(tmp_path / "o")])
    assert f"{spec}, line 6: spec key 'defaults.table.dimm': unknown key; did you mean 'dim'?" in line


def test_a_yaml_error_names_the_file_line_and_column(tmp_path, capsys):
    spec = _spec(tmp_path, QUICKSTART.replace("dense: [I1, I2, I3]", "dense: [I1, I2, I3"), "broken.yaml")
    (line,) = _usage(capsys, ["run", "--spec", spec, "--output", str(tmp_path / "o")])
    assert line.startswith(f"tpu-embed run: {spec}, line 5, column 12: not valid YAML: expected ',' or ']', "
                           "but got ':' (while parsing a flow sequence at line 4, column 8)."), line
    assert "<unicode string>" not in line


def test_a_missing_csv_column_is_named_without_every_header(tmp_path, capsys):
    spec = _without_column(tmp_path, "C2")
    (line,) = _failed(capsys, ["run", "--spec", spec, "--output", str(tmp_path / "o"), "--strict"],
                      "column 'C2' is missing (the file has 39 columns; 'C2': did you mean ")
    named = re.findall(r"'(\w+)'", line[line.index("missing_columns"):])
    assert len(line) < 300 and "C2" in named and len(named) <= 5 and "I13" not in named, line  # not 39 headers


# ---------------------------------------------------------------- remap's and inspect's words

def test_remap_and_inspect_do_not_mean_different_things_by_new():
    """inspect's `new` is the tokens a lineage's day added; remap's count of B rows that start from the
    initializer (tokens not in A, and reserved rows) is `initialized`."""
    from tpu_embed.training.remap import RemapReport, TableReport
    t = TableReport("zip", "frequency", rows_a=99, rows_b=150, kept_tokens=43, new=106, dropped=55, oov_buckets=1,
                    slots=(), copied=False)
    header = RemapReport("a", "b", "host_embedding", "embedding", {"zip": t}, (), 0).summary().splitlines()[1]
    assert header.split() == ["table", "kind", "rows", "A", "rows", "B", "kept", "initialized", "dropped", "oov",
                              "slots"]


# ---------------------------------------------------------------- `make demo` twice

@pytest.mark.slow  # two small demos, each running the jobs, training and exporting
def test_the_demo_runs_twice_into_one_directory(tmp_path, capsys):
    """`make demo` twice: the second demo replaces what the first wrote, keeps the user's file, and runs
    to the end; a second demo while one holds the directory is refused in one line."""
    from pipelines import demo
    out = str(tmp_path / "demo")
    argv = ["demo", "--output", out, "--examples", "4096", "--no-serving"]
    assert cli.main(argv) == 0
    first = json.load(open(os.path.join(out, demo.MARKER)))
    (tmp_path / "demo" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert f"(replacing the earlier demo in {out})" in printed and "[5/5] profile report" in printed
    second = json.load(open(os.path.join(out, demo.MARKER)))
    assert first["status"] == second["status"] == "done" and second["artifact"] == first["artifact"]
    assert read_manifest(second["artifact"]).counts.steps == 2
    assert open(os.path.join(out, "notes.txt")).read() == "mine"
    assert sorted(os.listdir(out)) == ["artifact", "data", "demo.json", "notes.txt", "report", "spec.yaml"]
    with demo.holding(out):
        _failed(capsys, argv, "is being written by another demo", f"pid {os.getpid()}")
    assert sorted(os.listdir(out)) == ["artifact", "data", "demo.json", "notes.txt", "report", "spec.yaml"]


def test_shard_without_a_vocabulary_names_the_vocab_flag(tmp_path, capsys):
    _failed(capsys, ["shard", "--spec", _spec(tmp_path), "--output", str(tmp_path / "shards")], "pass --vocab DIR")


def test_the_demo_suggests_the_command_as_the_user_can_type_it(monkeypatch, tmp_path):
    from pipelines import demo
    script = tmp_path / ".venv" / "bin" / "tpu-embed"
    script.parent.mkdir(parents=True)
    script.write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", [".venv/bin/tpu-embed", "demo"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # make demo's .venv/bin is not on PATH
    assert demo.command_as_typed() == ".venv/bin/tpu-embed"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    script.chmod(0o755)
    assert demo.command_as_typed() == "tpu-embed"
