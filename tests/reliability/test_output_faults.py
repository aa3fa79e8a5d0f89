"""The output directory of `tpu-embed run` under faults: runs killed (SIGKILL) at points, the transform output's
writing included; two runs into one output at once; a failed run; a user's files; a killed writer's `.tmp-…`
leftovers; the object-store rules of the run marker.

Real `tpu-embed run` processes (`.venv/bin/tpu-embed`, incremental runs with `--base` over a small CSV), killed
when a file of a stage appears under the output; then what every reader does with the directory:
`load_artifact(verify="sha256")`, `input_fn` and `tpu-embed inspect` refuse it until a run finishes, and the
re-run needs no --overwrite and writes the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from pipelines import cli, output, runner
from tests.reliability.artifacts import SPEC, tree
from tpu_embed.artifact import io as tio
from tpu_embed.artifact import verify
from tpu_embed.artifact.load import load_artifact
from tpu_embed.artifact.manifest import ManifestError, manifest_bytes, read_manifest
from tpu_embed.training.input import input_fn

TPU_EMBED = os.path.join(os.path.dirname(sys.executable), "tpu-embed")
SPEC_APPEND = dict(SPEC, inputs={"format": "csv", "patterns": ["day1.csv"]}, categorical=[
    dict(SPEC["categorical"][0], vocabulary={"mode": "append", "capacity": 40, "num_oov_buckets": 1}),
    SPEC["categorical"][1]])
RUN = ("run", "--spec", "spec.yaml", "--input", "day2.csv", "--base", "day1", "--steps-per-file", "5")
BUSY = "is being written by another run, `tpu-embed run` (pid "


def _csv(path, lo, hi, mod):
    lines = ["label,x,cat,id"] + [f"{i % 2},{i * 0.5},t{i % mod}|u{i % 5},{i % 10}" for i in range(lo, hi)]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """day1.csv, day2.csv (new tokens), spec.yaml (an append vocabulary) and day 1's artifact `day1`."""
    d = str(tmp_path_factory.mktemp("output_faults"))
    _csv(os.path.join(d, "day1.csv"), 0, 200, 13)
    _csv(os.path.join(d, "day2.csv"), 200, 400, 17)
    with open(os.path.join(d, "spec.yaml"), "w") as fh:
        yaml.safe_dump(SPEC_APPEND, fh)
    p = _tpu_embed(d, "run", "--spec", "spec.yaml", "--output", "day1", "--steps-per-file", "5")
    assert p.returncode == 0, p.stderr
    return d


def _tpu_embed(work, *args):
    return subprocess.run([TPU_EMBED, *args], cwd=work, capture_output=True, text=True, timeout=300)


def _start(work, out, *extra, nice=0):
    return subprocess.Popen([TPU_EMBED, *RUN, "--output", out, *extra], cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=(lambda: os.nice(nice)) if nice else None)


@pytest.fixture(scope="module")
def reference(work):
    """Day 2, uninterrupted: {path: sha256}."""
    p = _tpu_embed(work, *RUN, "--output", "ref")
    assert p.returncode == 0, p.stderr
    return tree(os.path.join(work, "ref"))


def _files(work, out, pattern) -> set:
    found = set()
    for p in glob.glob(os.path.join(work, out, pattern), recursive=True):
        try:
            found.add((p, os.stat(p).st_ino))
        except FileNotFoundError:
            pass
    return found


def _kill_when(work, out, pattern, *extra, nice=0):
    """Start day 2's run into `out` and SIGKILL it (its process group) as soon as a file matching `pattern` (a
    glob under `out`) is written (a new one: not there before, or replaced). `nice`: the run's niceness, so that
    this process, polling every millisecond, sees the file before the run goes much further. Returns the run's
    exit status: -SIGKILL, or 0 if it finished first."""
    before = _files(work, out, pattern)
    p = _start(work, out, *extra, nice=nice)
    deadline = time.time() + 240
    try:
        while p.poll() is None and time.time() < deadline:
            if _files(work, out, pattern) - before:
                os.killpg(p.pid, signal.SIGKILL)
                break
            time.sleep(0.001)
    finally:
        rc = p.wait(timeout=60)
    assert rc in (0, -signal.SIGKILL), (pattern, rc, p.stderr.read())
    return rc


def _refused_by_every_reader(work, out, capsys):
    full = os.path.join(work, out)
    for read in (lambda: load_artifact(full, verify="sha256"), lambda: load_artifact(full),
                 lambda: input_fn(full), lambda: input_fn(full, host_index=1)):
        with pytest.raises(ManifestError):  # ArtifactUnfinishedError, or no manifest / no shards yet
            read()
    capsys.readouterr()
    assert cli.main(["inspect", full]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is an unfinished artifact" in err, err


def _accepted(full, reference):
    """Finished, every listed file as listed (sha256), the same bytes as the uninterrupted run, every step read."""
    assert tree(full) == reference  # no marker, no `.tmp-…`, nothing stale
    a = load_artifact(full, verify="sha256")
    assert verify.UNFINISHED_KEY not in a.manifest
    steps = a.manifest.shards.steps
    for h in (0, 1):
        assert sum(1 for _ in input_fn(full, host_index=h, verify="sha256")) == steps


# ---------------------------------------------------------------- killed at points; re-runs take over

def test_killed_runs_leave_nothing_accepted_and_the_rerun_needs_no_overwrite(work, reference, capsys):
    out, full = "killed", os.path.join(work, "killed")
    # After the vocabulary job's manifest: readers and inspect see an unfinished artifact.
    assert _kill_when(work, out, "manifest.json") == -signal.SIGKILL
    _refused_by_every_reader(work, out, capsys)
    assert os.path.exists(os.path.join(full, verify.RUN_MARKER))
    with pytest.raises(verify.ArtifactUnfinishedError, match=r"unfinished artifact: `tpu-embed run` \(pid \d+"):
        load_artifact(full)
    # The re-run takes the directory over (no --overwrite) and is killed when it moves its first shard file in.
    assert _kill_when(work, out, "shards/host-*/part-*") == -signal.SIGKILL
    _refused_by_every_reader(work, out, capsys)
    # Killed while it writes the transform output (after the shards and plan.json). Its few small files take
    # milliseconds: a run that finished before the kill is tried again (with --overwrite: it is an artifact now).
    for attempt in range(3):
        if _kill_when(work, out, "transform_output/**/*", *(["--overwrite"] if attempt else []), nice=19) != 0:
            break
    else:
        pytest.fail("three runs finished before the transform output's first file was seen")
    m = read_manifest(full)
    assert m.shards is not None and m.files_of("plan") and os.path.isdir(os.path.join(full, "transform_output"))
    _refused_by_every_reader(work, out, capsys)
    p = _tpu_embed(work, *RUN, "--output", out)  # no --overwrite
    assert p.returncode == 0, p.stderr
    _accepted(full, reference)
    capsys.readouterr()
    assert cli.main(["inspect", full, "--steps", "1"]) == 0
    assert "host 0 step 0" in capsys.readouterr().out


# ---------------------------------------------------------------- two runs at once

@pytest.mark.parametrize("trial", [1, 2])
def test_two_runs_into_one_output_at_once_one_is_refused_the_other_is_complete(work, reference, trial):
    out = f"race{trial}"
    procs = [_start(work, out) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 1], results
    (_, refusal), = [(rc, err) for rc, err in results if rc == 1]
    line, = refusal.strip().splitlines()
    assert line.startswith(f"tpu-embed run: --output {out} {BUSY}") and "Wait for it to finish" in line, line
    winner = procs[[rc for rc, _ in results].index(0)].pid
    assert f"(pid {winner}, " in line
    _accepted(os.path.join(work, out), reference)


def test_a_second_claim_is_refused_while_the_first_holds_the_directory(tmp_path):
    out = str(tmp_path / "out")
    with output.claim(out, "run", False):
        with pytest.raises(output.OutputError, match=rf"\(pid {os.getpid()}, host .*{re.escape(verify.RUN_MARKER)}"):
            output.claim(out, "run", False).__enter__()
    assert os.listdir(out) == [verify.RUN_MARKER]  # a claim not finished leaves its marker
    with output.claim(out, "run", False):  # taken over
        pass


def test_a_run_refused_while_the_holder_has_not_yet_written_its_marker_names_the_holder(tmp_path):
    # The holder locks the marker, checks the directory, then writes its fields: a run refused in between
    # waits for them rather than naming "a tpu-embed job" (or the killed run before the holder).
    import fcntl
    import threading
    out = tmp_path / "out"
    out.mkdir()
    marker = out / verify.RUN_MARKER
    marker.write_text(json.dumps({"command": "tpu-embed run", "pid": 2 ** 22 + 7, "host": socket.gethostname()}))
    fd = os.open(marker, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    holder = {"command": "tpu-embed shard", "pid": 4242, "host": "elsewhere", "state": "running"}
    later = threading.Timer(0.3, lambda: os.pwrite(fd, json.dumps(holder).encode() + b" " * 64, 0))
    later.start()
    try:
        with pytest.raises(output.OutputError, match=r"another run, `tpu-embed shard` \(pid 4242, host elsewhere\)"):
            output.claim(str(out), "run", False).__enter__()
    finally:
        later.join()
        os.close(fd)


def test_another_runs_write_probe_under_its_temporary_name_is_no_file_of_the_directory(tmp_path):
    # Two runs started at once: one checks the directory while the other's write probe is a `.tmp-` file.
    out = tmp_path / "out"
    out.mkdir()
    (out / f".tmp-{'ab' * 16}-{output.WRITE_CHECK_PREFIX}{'cd' * 16}").write_bytes(b"ok")
    with output.claim(str(out), "run", False):
        pass


def test_a_file_url_output_is_locked_as_its_local_path(work, reference, monkeypatch, capsys):
    out = os.path.join(work, "as_url")
    monkeypatch.chdir(work)
    with output.claim(out, "run", False):  # the same directory, named as a path, is busy
        assert cli.main([*RUN, "--output", f"file://{out}"]) == 1
        assert BUSY in capsys.readouterr().err
    assert cli.main([*RUN, "--output", f"file://{out}"]) == 0, capsys.readouterr().err
    assert not os.path.exists(os.path.join(out, verify.RUN_MARKER))
    _accepted(out, reference)


# ---------------------------------------------------------------- `tpu-embed transform-output` into an artifact

def _copy_of_ref(work, name):
    full = os.path.join(work, name)
    shutil.rmtree(full, ignore_errors=True)
    shutil.copytree(os.path.join(work, "ref"), full)
    return full


def test_transform_output_takes_the_artifacts_claim(work, reference, capsys, monkeypatch):
    monkeypatch.chdir(work)
    full = _copy_of_ref(work, "to_busy")
    with output.claim(full, "profile", False):  # a job writing the artifact: transform-output is refused
        assert cli.main(["transform-output", full]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is being written by another run, `tpu-embed profile` (pid " in err, err
    assert {k: v for k, v in tree(full).items() if k != verify.RUN_MARKER} == reference  # untouched (the holder,
    # not finished, left its marker)
    with output.claim(full, "transform-output", False):  # and it holds the claim while it writes
        assert cli.main([*RUN, "--output", full, "--overwrite"]) == 1
        err = capsys.readouterr().err
        assert "is being written by another run, `tpu-embed transform-output` (pid " in err, err
    assert cli.main(["transform-output", full]) == 0
    _accepted(full, reference)


def test_a_failed_transform_output_leaves_an_unfinished_artifact_that_the_rerun_finishes(work, reference, capsys):
    from pipelines import tft_output_writer
    full = _copy_of_ref(work, "to_failed")
    with pytest.raises(RuntimeError, match="killed"):
        with output.claim(full, "transform-output", False):
            tft_output_writer.write_files(full, {"transform_fn/saved_model.pb": b"half"})
            raise RuntimeError("killed while it wrote")
    with pytest.raises(verify.ArtifactUnfinishedError, match="`tpu-embed transform-output`"):
        load_artifact(full)
    assert cli.main(["inspect", full]) == 1
    capsys.readouterr()
    assert cli.main(["transform-output", full]) == 0  # takes it over, no --overwrite needed
    _accepted(full, reference)


def test_transform_output_refuses_an_artifact_another_command_left_unfinished(work, capsys):
    from pipelines.jobs import manifest_writer
    full = _copy_of_ref(work, "to_unfinished")
    with pytest.raises(RuntimeError):
        with output.claim(full, "profile", False):
            manifest_writer.replace_files(full, "plan", read_manifest(full).to_json()["files"][:0])
            raise RuntimeError("killed")
    before = tree(full)
    assert cli.main(["transform-output", full]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is an unfinished artifact: `tpu-embed profile` (pid" in err, err
    assert tree(full) == before


# ---------------------------------------------------------------- a user's files, a failed run, leftovers

def test_user_files_kept_failed_run_rerun_without_overwrite_and_leftovers_swept(work, reference, monkeypatch,
                                                                                capsys):
    out = os.path.join(work, "mine")
    os.makedirs(out)
    with open(os.path.join(out, "notes.txt"), "w") as fh:
        fh.write("mine\n")
    monkeypatch.chdir(work)
    args = [*RUN, "--output", "mine"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "already holds 1 file(s) that are no artifact (notes.txt)" in err and err.count("\n") == 1, err
    # A spec naming a column the CSV does not have: the run fails (with --overwrite, on a directory that never held
    # an artifact) and deletes nothing of the user's.
    bad = dict(SPEC_APPEND, categorical=SPEC_APPEND["categorical"] + [{"name": "nope"}])
    with open(os.path.join(work, "bad.yaml"), "w") as fh:
        yaml.safe_dump(bad, fh)
    assert cli.main(["run", "--spec", "bad.yaml", "--input", "day2.csv", "--output", "mine", "--overwrite"]) == 1
    capsys.readouterr()
    assert open(os.path.join(out, "notes.txt")).read() == "mine\n"
    assert verify.read_run_marker(out)["state"].startswith("failed: ")
    with pytest.raises(ManifestError):
        load_artifact(out)
    # The fixed re-run needs no --overwrite. A killed writer's temporary files (as one left them in a Dask
    # worker) are in the finished directory before `finish`: it deletes them.
    stray = [os.path.join(out, ".tmp-0123456789abcdef0123456789abcdef-spec.yaml"),
             os.path.join(out, "shards", "host-00000", ".tmp-00112233445566778899aabbccddeeff-part-00000-of-00004"),
             os.path.join(out, "transform_output", "metadata", ".tmp-fedcba9876543210fedcba9876543210-schema.pbtxt")]
    run_all = runner.run_all

    def leaves_temporary_files(*a, **k):
        m = run_all(*a, **k)
        for p in stray:
            with open(p, "wb") as fh:
                fh.write(b"half")
        return m

    monkeypatch.setattr(runner, "run_all", leaves_temporary_files)
    assert cli.main(args) == 0, capsys.readouterr().err
    assert not any(os.path.exists(p) for p in stray)
    assert open(os.path.join(out, "notes.txt")).read() == "mine\n"
    os.unlink(os.path.join(out, "notes.txt"))
    _accepted(out, reference)


def _unfinished_copy(src, dst):
    """A copy of a finished artifact as a killed run of ours would leave it: its marker, the manifest unfinished."""
    shutil.copytree(src, dst)
    m = read_manifest(dst).to_json()
    m[verify.UNFINISHED_KEY] = {"command": "tpu-embed run", "pid": 1, "host": "elsewhere"}
    tio.write_atomic(os.path.join(dst, "manifest.json"), manifest_bytes(m))
    with open(os.path.join(dst, verify.RUN_MARKER), "w") as fh:
        fh.write('{"command": "tpu-embed run", "pid": 1, "host": "elsewhere", "state": "running"}')
    return m


def test_finish_refuses_an_artifact_missing_a_listed_file(work, reference, tmp_path):
    """The last step checks every listed file: a run whose listed file is gone (another process deleted it) fails,
    and leaves the manifest unfinished."""
    dst = str(tmp_path / "a")
    m = _unfinished_copy(os.path.join(work, "ref"), dst)
    with pytest.raises(verify.ArtifactDamagedError, match="saved_model.pb: the manifest lists this transform_output"):
        with output.claim(dst, "run", False) as claimed:  # taken over: the manifest is invalidated
            tio.write_atomic(os.path.join(dst, "manifest.json"), manifest_bytes(m))  # as the jobs write it again
            os.unlink(os.path.join(dst, "transform_output", "transform_fn", "saved_model.pb"))
            claimed.finish()
    with pytest.raises(verify.ArtifactUnfinishedError):
        load_artifact(dst, verify="none")
    assert verify.read_run_marker(dst)["state"].startswith("failed: ")


# ---------------------------------------------------------------- what the readers check

@pytest.mark.parametrize("rel", ["transform_output/transform_fn/saved_model.pb",
                                 "transform_output/metadata/schema.pbtxt", "profiles", "plan.json"])
def test_every_listed_file_is_checked_by_load_artifact_sha256_and_inspect(work, reference, tmp_path, capsys, rel):
    """verify="sha256" checks every listed file, not only those training reads; `inspect` reports a missing one."""
    art = str(tmp_path / "a")
    shutil.copytree(os.path.join(work, "ref"), art)
    path = os.path.join(art, rel)
    if os.path.isdir(path):
        path = sorted(glob.glob(os.path.join(path, "*")))[0]
    data = open(path, "rb").read()
    with open(path, "wb") as fh:
        fh.write(data[:-1] + bytes([data[-1] ^ 1]))  # the same size
    with pytest.raises(verify.ArtifactDamagedError, match="sha256"):
        load_artifact(art, verify="sha256")
    os.unlink(path)
    with pytest.raises(verify.ArtifactDamagedError, match="the manifest lists this .* but it is missing"):
        load_artifact(art, verify="sha256")
    capsys.readouterr()
    assert cli.main(["inspect", art]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: the manifest lists this " in err and "is missing" in err, err


# ---------------------------------------------------------------- object stores: no lock, the marker's rules

def test_object_store_marker_rules(tmp_path):
    url = f"memory://tpu-embed-output-faults-{os.getpid()}/out"
    marker = tio.join(url, verify.RUN_MARKER)
    dead = subprocess.Popen(["true"])
    dead.wait()
    here = socket.gethostname()
    cases = [({"pid": os.getpid(), "host": here, "state": "running"}, False, "is being written by another run"),
             ({"pid": os.getpid(), "host": here, "state": "running"}, True, "is being written by another run"),
             ({"pid": 4242, "host": "elsewhere", "state": "running"}, False,
              "may still be writing it: .* pass --overwrite to take the output over"),
             ({"pid": dead.pid, "host": here, "state": "running"}, False, None),  # its process is gone: taken over
             ({"pid": 4242, "host": "elsewhere", "state": "failed: DataError"}, False, None),
             ({"pid": 4242, "host": "elsewhere", "state": "running"}, True, None)]  # --overwrite: taken over
    try:
        for info, overwrite, refused in cases:
            tio.write_atomic(marker, json.dumps(info).encode())
            tio.write_atomic(tio.join(url, "vocab/cat.txt"), b"a\n")  # what a run of ours left
            if refused:
                with pytest.raises(output.OutputError, match=refused):
                    output.claim(url, "run", overwrite).__enter__()
                assert verify.read_run_marker(url) == info  # untouched
                continue
            with output.claim(url, "run", overwrite) as claimed:
                assert verify.read_run_marker(url)["token"] == claimed.info["token"]
            assert verify.read_run_marker(url)["pid"] == os.getpid()  # not finished: the marker stays
    finally:
        tio.delete_tree(url)


# ---------------------------------------------------------------- a Dask worker killed while it writes

KILL_ONCE = '''
import os, signal
flag = os.environ.get("TPU_EMBED_TEST_KILL_ONCE")
if flag:
    from tpu_embed.artifact import io as _tio
    _orig = _tio.write_atomic

    def write_atomic(path, data, **kw):
        if str(path).endswith("/spec.yaml"):
            try:
                fd = os.open(flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return _orig(path, data, **kw)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)

            def half_then_killed():
                for c in _tio._chunks(data):
                    yield bytes(c)[:len(c) // 2]
                    os.kill(os.getpid(), signal.SIGKILL)
            return _orig(path, half_then_killed(), **kw)
        return _orig(path, data, **kw)
    _tio.write_atomic = write_atomic
'''


@pytest.mark.slow
def test_a_dask_worker_killed_while_it_writes_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    """The first worker that writes spec.yaml (the vocabulary job's manifest step) is SIGKILLed half-way, leaving
    `.tmp-…-spec.yaml`; Dask runs the task again on another worker and the job completes: the finished artifact
    holds no `.tmp-…` file, and every listed file is as listed."""
    distributed = pytest.importorskip("distributed")
    from tests.reliability.artifacts import write_inputs
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_ONCE)  # imported at start by the (spawned) worker processes
    flag = tmp_path / "killed-worker-pid"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("TPU_EMBED_TEST_KILL_ONCE", str(flag))
    write_inputs(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                  env={"TPU_EMBED_THREADS": "1"}) as cluster:
        rc = cli.main(["run", "--spec", "spec.yaml", "--output", "out", "--steps-per-file", "10", "--runner=dask",
                       f"--dask_client_address={cluster.scheduler_address}"])
    assert rc == 0, capsys.readouterr().err
    killed = int(flag.read_text())  # the hook ran in a worker, which is gone
    with pytest.raises(ProcessLookupError):
        os.kill(killed, 0)
    out = str(tmp_path / "out")
    left = [os.path.join(r, n) for r, ds, ns in os.walk(out) for n in ns + ds if n.startswith(".tmp-")]
    assert left == []
    assert not os.path.exists(os.path.join(out, verify.RUN_MARKER))
    load_artifact(out, verify="sha256")
