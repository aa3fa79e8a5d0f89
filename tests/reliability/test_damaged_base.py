"""A damaged `--base` (the previous day of a lineage) is refused before any job runs, in one line naming the file:
its vocabulary and token-count files are checked against its manifest as training checks an artifact's
(`tpu_embed.artifact.lineage.check_base_files`, `tpu_embed.artifact.verify.check_file`)."""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import yaml

from pipelines import cli
from tests.reliability.artifacts import MODEL
from tpu_embed.artifact import lineage
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec
from tpu_embed.artifact.verify import ArtifactDamagedError


def _spec() -> dict:
    model = copy.deepcopy(MODEL)
    model["categorical"][0]["vocabulary"] = {"mode": "append", "capacity": 32, "num_oov_buckets": 1}
    return {"inputs": {"format": "csv", "patterns": ["in.csv"]}, **model, "topology": {"num_chips": 1},
            "global_batch_size": 4}


def _run(capsys, spec, out, *more):
    rc = cli.main(["run", "--spec", spec, "--output", out, "--no-transform-output", *more])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(scope="module")
def day1(tmp_path_factory):
    d = tmp_path_factory.mktemp("lineage")
    with open(d / "in.csv", "w") as fh:
        fh.write("label,x,cat,id\n" + "".join(f"{i % 2},{i * 0.5},t{i % 7}|u{i % 3},{i % 10}\n" for i in range(24)))
    spec = str(d / "spec.yaml")
    with open(spec, "w") as fh:
        yaml.safe_dump(_spec(), fh)
    out = str(d / "day1")
    assert cli.main(["run", "--spec", spec, "--output", out, "--no-transform-output"]) == 0
    return spec, out


def _remove_line(path):
    with open(path, "rb") as fh:
        lines = fh.read().splitlines(keepends=True)
    with open(path, "wb") as fh:
        fh.write(b"".join(lines[:2] + lines[3:]))


def _flip_bit(path):
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    data[len(data) // 2] ^= 0x01
    with open(path, "wb") as fh:
        fh.write(bytes(data))


DAMAGES = {
    "vocabulary line removed": ("vocab/cat.txt", _remove_line),
    "vocabulary bit flipped": ("vocab/cat.txt", _flip_bit),
    "vocabulary missing": ("vocab/cat.txt", os.remove),
    "counts bit flipped": ("vocab/cat.counts.parquet", _flip_bit),
    "counts missing": ("vocab/cat.counts.parquet", os.remove),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_base_is_refused_in_one_line_naming_the_file(day1, tmp_path, capsys, damage):
    spec, good = day1
    rel, damage_it = DAMAGES[damage]
    base = str(tmp_path / "base")
    shutil.copytree(good, base)
    assert rel in {f.path for f in read_manifest(base).files}
    damage_it(os.path.join(base, rel))
    out = str(tmp_path / "day2")
    rc, printed, err = _run(capsys, spec, out, "--base", base)
    assert rc == 1 and printed == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tpu-embed run: --base ") and os.path.join(base, rel) in lines[0], err
    assert "restore it" in lines[0] and "--debug" not in lines[0], err
    assert not os.path.exists(out)  # refused before any job (nor was the output prepared)
    # The Python API refuses it the same way, with the verifier's error as the cause.
    with pytest.raises(lineage.LineageError, match="is damaged") as e:
        lineage.open_base(base, load_spec(spec))
    assert isinstance(e.value.__cause__, ArtifactDamagedError)


def test_an_intact_base_is_continued(day1, tmp_path, capsys):
    spec, good = day1
    base = str(tmp_path / "base")
    shutil.copytree(good, base)
    out = str(tmp_path / "day2")
    rc, printed, err = _run(capsys, spec, out, "--base", base)
    assert rc == 0, err
    m = read_manifest(out)
    assert m.lineage.day == 2
    assert m.lineage.base.vocabulary_fingerprint == read_manifest(good).lineage.vocabulary_fingerprint
    def vocabulary(d):
        with open(os.path.join(d, "vocab", "cat.txt"), "rb") as fh:
            return fh.read()
    assert vocabulary(out).startswith(vocabulary(good))  # append: day 1's ids kept


def test_a_damaged_profile_of_the_base_is_refused_and_a_missing_one_is_not(day1, tmp_path):
    spec, good = day1
    base = str(tmp_path / "base")
    shutil.copytree(good, base)
    # The base's profile, where it is there, is read (merged) by the run: it is checked too; without it the run
    # goes on and its manifest says the profile was not merged.
    profiles = [f.path for f in read_manifest(base).files if f.kind == "profile"]
    assert profiles
    _flip_bit(os.path.join(base, profiles[0]))
    with pytest.raises(lineage.LineageError, match=profiles[0].replace(".", r"\.")):
        lineage.open_base(base, load_spec(spec))
    for p in profiles:
        os.remove(os.path.join(base, p))
    assert lineage.open_base(base, load_spec(spec)).directory == base
