"""The output-directory rules (docs/reference/reliability.md) on an object store (gs://), through the CLI,
on a GCS emulator on loopback.

What tests/reliability/test_faults.py shows for local directories, here for gs:// prefixes (what Dataflow jobs
write to), with the emulator and helpers of tests/helpers/object_store.py:

* `run` into a prefix that holds an artifact, without --overwrite: refused in one line naming the URL and the
  fix; not one object in the bucket changes.
* `run --overwrite` with another spec and --steps-per-file (other profile names, other shard files) over an old
  artifact plus stale objects planted by hand (a stray shard, a `.tmp-...` leftover): afterwards the prefix holds
  exactly what the new manifest lists, byte for byte what the same command writes to a local directory.
* An --overwrite that fails mid-job (a shard writer raises after the vocabularies and one new shard file were
  written) leaves a prefix neither `load_artifact` nor `input_fn` accepts (the old manifest is gone; the one
  there is the finished vocabulary job's, with no shards); a rerun with --overwrite gives the same bytes as an
  uninterrupted one.
* A location that cannot be written (no such bucket, a name the store rejects) fails in one line naming the
  URL before the vocabulary job runs.

The local reference reads its inputs from the same bucket objects, so every byte (the spec copy, the manifest
and the dead letters record the input paths) is comparable as is.
"""

from __future__ import annotations

import os

import pytest
import yaml

from tests.helpers.object_store import (
    BUCKET,
    SPEC,
    bucket_files,
    gcs_emulator,
    local_files,
    run_cli,
    run_jobs,
    split_sample,
)
from tests.reliability.artifacts import not_accepted
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import read_manifest

FIX_REFUSED = ("pass --overwrite to replace it (files the new manifest does not list are deleted), or choose "
               "another --output.")
FIX_NOT_WRITABLE = "nothing was run. Fix: choose a writable --output (or fix its permissions / mount)."
DEBUG_HINT = "(run with --debug for the traceback)"
STALE = ("shards/host-00000/part-99999-of-99999.tfrecord",  # a shard file of some other run
         "shards/host-00001/.tmp-0123456789abcdef-part-00000-of-00003.tfrecord")  # a killed writer's leftover


def _main(*argv) -> int:
    from pipelines.cli import main
    return main([str(a) for a in argv])


def _err_lines(capsys) -> list:
    """The CLI's stderr lines. The emulator's HTTP server runs in this process and prints a block (between two
    lines of dashes) for each client that hung up early (gcsfs closing a streamed read): those are dropped."""
    lines, in_block = [], False
    for line in capsys.readouterr().err.strip().splitlines():
        if line == "-" * 40:
            in_block = not in_block
        elif not in_block:
            lines.append(line)
    return lines


def _copy_prefix(src: str, dst: str) -> None:
    for rel, data in bucket_files(src).items():
        tio.write_atomic(f"{dst}/{rel}", data)


def _raw_keys(url: str) -> set:
    """Every object key under `url` as the store lists it (gcsfs `find`, not tpu_embed.artifact.io): placeholders
    too."""
    fs, p = tio.filesystem(url)
    fs.invalidate_cache()
    return {k[len(p) + 1:] for k in fs.find(p)}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The emulator, with the MovieLens sample (two files and a bad record) in gs://BUCKET/data."""
    tmp = tmp_path_factory.mktemp("object_store_output")
    data = str(tmp / "data")
    split_sample(data)
    with gcs_emulator():
        gdata = f"gs://{BUCKET}/data"
        for name in sorted(os.listdir(data)):
            tio.write_atomic(f"{gdata}/{name}", open(os.path.join(data, name), "rb").read())
        yield {"tmp": tmp, "inputs": gdata + "/movielens_*.csv"}


@pytest.fixture(scope="module")
def old(store):
    """An artifact in gs://BUCKET/old: `run` (3 shard files per host), `plan`, `report`."""
    url = f"gs://{BUCKET}/old"
    run_jobs(url, store["inputs"])
    return url


@pytest.fixture(scope="module")
def new(store):
    """Another config: another spec (other table dims, so other stacks and profile names) and 13 steps per
    file (one shard file per host); and what it writes to a local directory, reading the same bucket objects."""
    spec = yaml.safe_load(open(SPEC))
    spec["tables"] = [dict(t, dim=8) for t in spec["tables"]]
    path = str(store["tmp"] / "other_spec.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    args = ("--spec", path, "--input", store["inputs"], "--steps-per-file", 13)
    local = str(store["tmp"] / "new_local")
    run_cli("run", "--output", local, *args)
    return {"args": args, "local": local_files(local)}


# ---------------------------------------------------------------- 1. refused without --overwrite

@pytest.mark.slow
def test_run_into_a_prefix_with_an_artifact_is_refused_and_nothing_changes(old, new, capsys):
    url = f"gs://{BUCKET}/refuse"
    _copy_prefix(old, url)
    before = bucket_files(f"gs://{BUCKET}")
    capsys.readouterr()
    assert _main("run", "--output", url, *new["args"]) == 1
    assert _err_lines(capsys) == [f"tpu-embed run: --output {url} already holds an artifact: {FIX_REFUSED}"]
    assert bucket_files(f"gs://{BUCKET}") == before  # every object, byte for byte (the write probe is gone too)


# ---------------------------------------------------------------- 2. --overwrite: exactly the new files

@pytest.mark.slow
def test_overwrite_leaves_exactly_the_new_manifests_objects(old, new):
    url = f"gs://{BUCKET}/overwrite"
    _copy_prefix(old, url)
    for rel in STALE:
        tio.write_atomic(f"{url}/{rel}", b"stale")
    before = bucket_files(url)
    assert {"plan.json", "report/index.html", "shards/host-00000/part-00002-of-00003.tfrecord"} <= set(before)

    run_cli("run", "--output", url, "--overwrite", *new["args"])

    after = bucket_files(url)
    listed = {f.path for f in read_manifest(url).files} | {"manifest.json"}
    assert set(after) == listed == _raw_keys(url)
    assert after == new["local"]  # byte for byte what the same command writes to a local directory
    assert [p for p in after if p.startswith("shards/")] == [
        "shards/host-00000/part-00000-of-00001.tfrecord", "shards/host-00001/part-00000-of-00001.tfrecord"]
    assert {p for p in before if p.startswith("profiles/")} - set(after)  # the old spec's other profiles: gone
    assert not {p for p in before if p.startswith("report/")} & set(after)  # so is the old report
    assert not set(STALE) & set(after)


# ---------------------------------------------------------------- 3. --overwrite interrupted

@pytest.mark.slow
def test_interrupted_overwrite_is_not_accepted_and_a_rerun_converges(old, new, monkeypatch, capsys):
    from pipelines.jobs import build_shards
    url = f"gs://{BUCKET}/interrupted"
    _copy_prefix(old, url)
    calls = {"n": 0}
    orig = build_shards._WriteShardFile.process

    def failing(self, kv, info):  # the first shard file is written, the second fails
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("injected failure writing a shard file")
        yield from orig(self, kv, info)
    monkeypatch.setattr(build_shards._WriteShardFile, "process", failing)
    capsys.readouterr()
    assert _main("run", "--output", url, "--overwrite", *new["args"]) == 1
    lines = _err_lines(capsys)
    assert lines[1:] == [DEBUG_HINT] and "injected failure writing a shard file" in lines[0], lines
    monkeypatch.undo()

    # The old manifest went first; the one there now is the vocabulary job's (it ran to the end): no shards.
    left = bucket_files(url)
    assert left["manifest.json"] != bucket_files(old)["manifest.json"]
    m = read_manifest(url)
    assert m.shards is None and not [f for f in m.files if f.kind in ("shard", "profile", "plan")]
    new_parts = {p for p in left if p.endswith("-of-00001.tfrecord")}
    old_parts = {p for p in left if p.endswith("-of-00003.tfrecord")}
    assert len(new_parts) == 1 and len(old_parts) == 6  # old and new files side by side, and no manifest over them
    not_accepted(url)

    run_cli("run", "--output", url, "--overwrite", *new["args"])
    assert bucket_files(url) == new["local"]


# ---------------------------------------------------------------- 4. not writable

@pytest.mark.parametrize("url, why", [
    ("gs://tpu-embed-no-such-bucket/out", "bucket gs://tpu-embed-no-such-bucket does not exist"),
    # The store rejects the name: not an OSError (the emulator: HTTP 501, gcsfs's HttpError, retried at length).
    pytest.param("gs://Not_A_Bucket!/out", "HttpError: 501", marks=pytest.mark.slow),
])
def test_unwritable_bucket_fails_in_one_line_before_the_vocabulary_job(store, monkeypatch, capsys, url, why):
    from pipelines import runner
    ran = []
    for job in ("run_all", "run_vocab"):
        monkeypatch.setattr(runner, job, lambda *a, job=job, **k: ran.append(job))
    before = bucket_files(f"gs://{BUCKET}")
    capsys.readouterr()
    assert _main("run", "--spec", SPEC, "--output", url, "--input", store["inputs"]) == 1
    lines = _err_lines(capsys)
    assert len(lines) == 1, lines
    assert lines[0] == f"tpu-embed run: --output {url} is not writable ({why}); {FIX_NOT_WRITABLE}", lines[0]
    assert "127.0.0.1" not in lines[0]  # the reason, not the store's API endpoint
    assert ran == []
    assert bucket_files(f"gs://{BUCKET}") == before


def test_an_empty_folder_placeholder_is_not_an_existing_artifact(store):
    """A "folder" made in the GCS console is a zero-byte `out/` object: the prefix is empty, not refused."""
    from pipelines import output
    url = f"gs://{BUCKET}/console-folder"
    fs, p = tio.filesystem(url)
    fs.pipe_file(p + "/", b"")
    fs.pipe_file(p + "/sub/", b"")
    assert "sub/" in _raw_keys(url)
    assert tio.glob(url + "/**") == []
    output.prepare(url, "run", overwrite=False)  # no OutputError
