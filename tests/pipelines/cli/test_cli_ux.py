"""What the user sees: one-line errors with exit codes (no traceback; the --debug hint only for an unexpected
error), no TensorFlow start-up noise, refusal to overwrite, the spec fingerprint independent of the input format,
short stack names, natural feature order."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines import cli, runner
from pipelines.jobs import JobConfig
from pipelines.user_errors import UserError
from profiles.display import natural_sorted, short_stack_name
from tests.helpers import ROOT
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec, parse_spec

CRITEO = os.path.join(ROOT, "examples", "criteo", "spec.yaml")
TPU_EMBED = os.path.join(os.path.dirname(sys.executable), "tpu-embed")
NOISE = ("Traceback", "I0000", "E0000", "oneDNN", "cuInit", "cuda", "absl::InitializeLog")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ux") / "criteo")
    runner.run_all(JobConfig(spec=load_spec(CRITEO), output=out))
    return out


def _one_line_error(capsys, argv, code, *fragments):
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == code, err
    assert "Traceback" not in err
    first, *rest = err.strip().splitlines()
    assert first.startswith(f"tpu-embed {argv[0]}: ")
    assert rest == []
    for f in fragments:
        assert f in first
    return first


def test_inspect_host_out_of_range(artifact, capsys):
    _one_line_error(capsys, ["inspect", artifact, "--host", "1"], 2, "--host 1", "1 host(s)", "0..0")


def test_debug_shows_the_traceback(artifact):
    with pytest.raises(UserError):
        cli.main(["inspect", artifact, "--host", "1", "--debug"])


@pytest.mark.parametrize("command", ["plan", "report"])
def test_plan_and_report_without_profiles(tmp_path, capsys, command):
    empty = tmp_path / "nothing"
    empty.mkdir()
    _one_line_error(capsys, [command, "--profiles", str(empty), "--output", str(tmp_path / "out")], 1,
                    "no model-*.json profile index", "tpu-embed profile")


def _overflowing_spec(tmp_path) -> str:
    d = yaml.safe_load(open(CRITEO))
    d["inputs"]["patterns"] = [os.path.join(ROOT, "data", "criteo_sample.csv")]
    d["limits"] = {"max_ids_per_chip_per_sample": 64}  # pinned: 256 per partition, far below 192 rows on 1 SC
    d["global_batch_size"] = 192
    d["topology"] = {"num_chips": 1, "num_sc_per_chip": 1, "num_hosts": 1}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def test_job_failure_is_one_line(tmp_path, capsys):
    first = _one_line_error(capsys, ["run", "--spec", _overflowing_spec(tmp_path), "--output",
                                     str(tmp_path / "out")], 1, "max_ids_per_table")
    assert "limits from spec" in first


def test_missing_input_is_one_line(tmp_path, capsys):
    _one_line_error(capsys, ["run", "--spec", CRITEO, "--output", str(tmp_path / "out"), "--input",
                             str(tmp_path / "no-such-*.csv")], 1)


def test_terminal_gets_no_tensorflow_noise_and_no_traceback(tmp_path):
    """A real process: a failing job prints its one line, and nothing from TensorFlow's start-up."""
    proc = subprocess.run([TPU_EMBED, "run", "--spec", _overflowing_spec(tmp_path), "--output",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpu-embed run: "), proc.stderr
    for noise in NOISE:
        assert noise not in proc.stderr, proc.stderr


def test_demo_refuses_a_directory_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "something").write_text("x")
    _one_line_error(capsys, ["demo", "--output", str(out)], 1, "did not write", "something", "another --output")
    assert os.listdir(out) == ["something"]


def test_fingerprint_does_not_depend_on_where_or_how_the_data_is_stored():
    d = yaml.safe_load(open(CRITEO))
    base = parse_spec(d).fingerprint
    for inputs in ({"format": "parquet", "patterns": ["x/*.parquet"]},
                   {"format": "tfrecord", "patterns": ["gs://b/*.tfrecord"]},
                   {"format": "csv", "patterns": ["a.tsv"], "csv": {"delimiter": "\t"}}):
        assert parse_spec(dict(d, inputs=inputs)).fingerprint == base, inputs
    assert parse_spec(dict(d, global_batch_size=64)).fingerprint != base


def test_csv_and_parquet_artifacts_are_interchangeable(artifact, tmp_path):
    """The same rows as Parquet: same fingerprint, accepted by input_fn(expected_fingerprint=...)."""
    from tpu_embed.training.input import input_fn
    table = pacsv.read_csv(os.path.join(ROOT, "data", "criteo_sample.csv"),
                           convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
    pq.write_table(table, str(tmp_path / "criteo.parquet"))
    d = yaml.safe_load(open(CRITEO))
    d["inputs"] = {"format": "parquet", "patterns": [str(tmp_path / "criteo.parquet")]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(d))
    spec = load_spec(str(tmp_path / "spec.yaml"))
    out = str(tmp_path / "parquet")
    runner.run_all(JobConfig(spec=spec, output=out))
    csv_fp = read_manifest(artifact).spec_fingerprint
    assert read_manifest(out).spec_fingerprint == csv_fp == load_spec(CRITEO).fingerprint
    assert sum(1 for _ in input_fn(out, expected_fingerprint=csv_fp)) == read_manifest(out).counts.steps


def test_stack_names_are_shortened_without_looking_like_table_names():
    tables = sorted(f"C{i}" for i in range(1, 27))
    name = "_".join(tables)
    short = short_stack_name(name, tables)
    assert short == "C1_C10…(+24 tables)"
    assert short_stack_name("video") == "video" and short_stack_name("a_b", ["a", "b"]) == "a_b"
    assert not short.endswith("_C2")


def test_summary_shows_a_per_stack_table(artifact):
    text = cli.summary(read_manifest(artifact), artifact)
    assert "planned from this run's profile" in text
    assert "C1_C10…(+24 tables)" in text
    assert "C1_C10_C11_C12" not in text


def test_natural_sort():
    assert natural_sorted(["C10", "C2", "C1", "tags", "I13", "I2", "C26"]) == ["C1", "C2", "C10", "C26", "I2",
                                                                               "I13", "tags"]


def test_report_names_the_spec_fingerprint_and_tokens(artifact, tmp_path):
    from profiles import report
    html_path = report.write_report(os.path.join(artifact, "profiles"), None, str(tmp_path / "report"))
    page = open(html_path).read()
    m = read_manifest(artifact)
    assert f"Spec fingerprint {m.spec_fingerprint[:16]}" in page
    assert report.find_artifact(os.path.join(artifact, "profiles")) == artifact
    tokens = report.token_lookups(artifact)
    vocab = open(os.path.join(artifact, "vocab", "C1.txt")).read().splitlines()
    assert tokens["C1"].label(0) == vocab[0] and tokens["C1"].label(len(vocab)) == "OOV bucket 0"
    assert "<td>C1_C10…(+24 tables)</td>" in page  # the stack table shows short names


# ---------------------------------------------------------------- inspect: a lineage's vocabularies

@pytest.fixture(scope="module")
def two_days(tmp_path_factory):
    """The MovieLens sample split in two days by its timestamp; vocabularies of an append lineage (zip's
    capacity fills on day 2)."""
    import csv
    d = tmp_path_factory.mktemp("inspect_days")
    with open(os.path.join(ROOT, "data", "movielens_sample.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: int(r["timestamp"]))
    days = (rows[:100], rows[100:])
    for i, part in enumerate(days):
        with open(d / f"day{i + 1}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(part)

    def spec(day):
        return parse_spec({"inputs": {"format": "csv", "patterns": [f"day{day}.csv"]}, "label": "rating",
                           "categorical": [{"name": "zip", "vocabulary": {"mode": "append", "capacity": 120,
                                                                         "num_oov_buckets": 2}},
                                           {"name": "occupation", "vocabulary": {"mode": "append"}},
                                           {"name": "gender"}],
                           "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
                           "topology": {"num_chips": 1, "num_sc_per_chip": 4}, "global_batch_size": 8},
                          base_dir=str(d))
    day1, day2 = str(d / "day1-out"), str(d / "day2-out")
    runner.run_vocab(JobConfig(spec=spec(1), output=day1))
    runner.run_vocab(JobConfig(spec=spec(2), output=day2, base=day1))
    return days, day1, day2


def test_inspect_shows_a_lineage_mode_capacity_and_tokens_added_unseen_or_sent_to_oov(two_days, capsys):
    (rows1, rows2), day1, day2 = two_days
    assert cli.main(["inspect", day2]) == 0
    out = capsys.readouterr().out
    assert f"lineage {read_manifest(day1).lineage.id[:12]} day 2, base ../day1-out (day 1)" in out
    for name, cap in (("zip", 120), ("occupation", None)):
        seen1 = list(dict.fromkeys(r[name] for r in rows1))  # a first day's vocabulary: every token counted
        counts2: dict = {}
        for r in rows2:
            counts2[r[name]] = counts2.get(r[name], 0) + 1
        new = sorted((t for t in counts2 if t not in seen1), key=lambda t: (counts2[t], t.encode()), reverse=True)
        admitted = new if cap is None else new[:cap - len(seen1)]
        oov_values = sum(counts2[t] for t in new) - sum(counts2[t] for t in admitted)
        unseen = sum(t not in counts2 for t in seen1)
        tokens = len(seen1) + len(admitted)
        over = len(new) - len(admitted)
        line = next(x for x in out.splitlines() if x.startswith(f"  {name}: "))
        assert line == (f"  {name}: append, {tokens} tokens{f' of capacity {cap}' if cap else ''} "
                        f"({len(seen1)} kept, {len(admitted)} new), {over} not admitted"
                        f"{f', {over} over capacity' if over else ''}; {oov_values} values to OOV; "
                        f"{unseen} unseen for 1+ day(s)"), line
    assert "zip" in [x.split(":")[0].strip() for x in out.splitlines() if "over capacity" in x]
    assert "gender:" not in out  # rebuild: no lineage line
    # Two days back from day 2 is day 0: nothing in use was last seen then.
    assert cli.main(["inspect", day2, "--unseen-days", "2"]) == 0
    assert "; 0 unseen for 2+ day(s)" in capsys.readouterr().out
    assert cli.main(["inspect", day1]) == 0
    assert "day 1, first day" in capsys.readouterr().out


def test_inspect_refuses_unseen_days_below_one(two_days, capsys):
    _one_line_error(capsys, ["inspect", two_days[2], "--unseen-days", "0"], 2, "--unseen-days 0", "1 or more")
