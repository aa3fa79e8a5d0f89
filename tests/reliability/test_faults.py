"""Faults while the jobs run: a transient worker failure, SIGKILL at several points, --overwrite, two runs at
once, a full disk, a read-only output. Nothing half-written is ever accepted as an artifact; a rerun gives
byte-identical outputs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.reliability.artifacts import SPEC, not_accepted, run_in_process, tree, write_inputs
from tpu_embed.artifact.manifest import read_manifest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# `tpu-embed` in a subprocess whose tpu_embed.artifact.io.write_atomic and move (a shard file that one run holds whole
# is moved into place: pipelines.sharding.runs) are patched to SIGKILL the process at a point.
KILLER = textwrap.dedent("""
    import os, signal, sys
    from tpu_embed.artifact import io as tio
    orig, orig_move, point, seen = tio.write_atomic, tio.move, os.environ.get("KILL_AT", ""), []
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    def patched_move(src, dst, **kw):
        if "/shards/" in dst:
            seen.append(dst)
            if point == "after_vocab" or (point == "mid_shard" and len(seen) == 3):  # before the third file
                die()
        return orig_move(src, dst, **kw)
    tio.move = patched_move
    def patched(path, data, **kw):
        if "/shards/" in path:
            seen.append(path)
            if point == "after_vocab":
                die()
            if point == "mid_shard" and len(seen) == 3:  # half of the third shard file written, then killed
                def chunks():
                    for c in tio._chunks(data):
                        yield c[:len(c) // 2]
                        die()
                return orig(path, chunks(), **kw)
        if point == "before_plan" and path.endswith("plan.json"):
            die()
        if point == "manifest" and path.endswith("manifest.json") and seen:
            die()
        return orig(path, data, **kw)
    tio.write_atomic = patched
    from pipelines import cli
    sys.exit(cli.main(sys.argv[1:]))
""")


def tpu_embed(work, *args, kill_at="", **kw):
    env = dict(os.environ, KILL_AT=kill_at)
    return subprocess.run([sys.executable, "-c", KILLER, *args], cwd=work, capture_output=True, text=True,
                          env=env, timeout=300, **kw)


def run_cli(work, out, *extra, kill_at=""):
    return tpu_embed(work, "run", "--spec", "spec.yaml", "--output", out, "--steps-per-file", "10", *extra,
                     kill_at=kill_at)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("faults"))
    write_inputs(d)
    return d


@pytest.fixture(scope="module")
def reference(work):
    p = run_cli(work, "ref")
    assert p.returncode == 0, p.stderr
    return tree(os.path.join(work, "ref"))


# ---------------------------------------------------------------- SIGKILL

@pytest.mark.parametrize("point", ["after_vocab", "mid_shard", pytest.param("before_plan", marks=pytest.mark.slow),
                                   pytest.param("manifest", marks=pytest.mark.slow)])
def test_sigkill_leaves_nothing_accepted_and_overwrite_rerun_is_identical(work, reference, point):
    out = f"killed-{point}"
    p = run_cli(work, out, kill_at=point)
    assert p.returncode == -9, (p.returncode, p.stderr)
    full = os.path.join(work, out)
    not_accepted(full)
    if point == "mid_shard":  # the half-written shard file, or the runs not yet moved into place
        assert any(n.startswith(".tmp-") for _, ds, ns in os.walk(full) for n in ns + ds
                   if n not in (".tmp-read-spill",))
    if point == "after_vocab":  # a later run takes over what the killed run left: no --overwrite needed
        p = run_cli(work, out)
        assert p.returncode == 0, p.stderr
        assert tree(full) == reference
    p = run_cli(work, out, "--overwrite")
    assert p.returncode == 0, p.stderr
    assert tree(full) == reference  # byte-identical, no leftover (.tmp-…, stale parts)


# ---------------------------------------------------------------- --overwrite

@pytest.mark.slow
def test_overwrite_deletes_what_the_new_manifest_does_not_list(work, reference):
    out = os.path.join(work, "ow")
    assert run_cli(work, "ow", "--steps-per-file", "3").returncode == 0  # 17 parts per host
    other = dict(SPEC, defaults={"table": {"dim": 16}})  # another spec: other profile keys
    write_inputs(work, spec=other, name="other.yaml")
    p = tpu_embed(work, "run", "--spec", "other.yaml", "--output", "ow", "--overwrite")
    assert p.returncode == 0, p.stderr
    listed = {f.path for f in read_manifest(out).files} | {"manifest.json"}
    assert set(tree(out)) == listed
    assert run_cli(work, "ow", "--overwrite").returncode == 0
    assert tree(out) == reference
    p = tpu_embed(work, "shard", "--spec", "spec.yaml", "--output", "ow")
    assert p.returncode == 1 and "already has shards: pass --overwrite" in p.stderr
    p = tpu_embed(work, "shard", "--spec", "spec.yaml", "--output", "ow", "--steps-per-file", "10", "--overwrite")
    assert p.returncode == 0, p.stderr
    assert tree(out) == reference


# ---------------------------------------------------------------- two runs at once

@pytest.mark.slow
def test_two_runs_into_different_directories_at_once(work, reference):
    procs = [subprocess.Popen([sys.executable, "-c", KILLER, "run", "--spec", "spec.yaml", "--output", f"par{i}",
                               "--steps-per-file", "10"], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    for i in range(2):
        assert tree(os.path.join(work, f"par{i}")) == reference


# ---------------------------------------------------------------- transient worker failure

def test_transient_worker_failure_fails_the_job_and_rerun_is_identical(tmp_path, monkeypatch):
    """The DirectRunner (in_memory: Beam's FnApiRunner) does not retry a failed bundle: the job fails, leaves no
    accepted artifact, and a rerun gives byte-identical outputs (runners that retry bundles, e.g. Dataflow,
    re-execute the same deterministic DoFns and atomic writes)."""
    from pipelines.jobs import build_shards
    write_inputs(str(tmp_path))
    ref = str(tmp_path / "ref")
    run_in_process(str(tmp_path), ref)
    calls = {"n": 0}
    orig = build_shards._WriteShardFile.process

    def flaky(self, kv, info):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("injected transient failure (first attempt at this bundle)")
        yield from orig(self, kv, info)
    monkeypatch.setattr(build_shards._WriteShardFile, "process", flaky)
    out = str(tmp_path / "out")
    with pytest.raises(Exception, match="injected transient failure"):
        run_in_process(str(tmp_path), out)
    assert calls["n"] == 2  # no retry: the bundle was not attempted again
    not_accepted(out)
    run_in_process(str(tmp_path), out)  # the failure is gone (one attempt only)
    assert tree(out) == tree(ref)


# ---------------------------------------------------------------- full disk, read-only output

def test_full_disk_is_one_clear_line_and_no_half_artifact(work, tmpfs):
    d = tmpfs("full", "96k")  # smaller than the artifact
    p = run_cli(work, str(d / "out"))
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpu-embed run: "), p.stderr
    assert "no space left on device" in lines[0] and str(d / "out") in lines[0], lines[0]
    not_accepted(str(d / "out"))
    assert not any(n.startswith(".tmp-") for _, _, ns in os.walk(d) for n in ns)


def test_read_only_output_fails_before_the_vocabulary_job(work, tmpfs):
    d = tmpfs("ro", "1m", ro=True)
    p = run_cli(work, str(d / "out"))
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert lines[0] == (f"tpu-embed run: --output {d / 'out'} is not writable (read-only file system); nothing was "
                        "run. Fix: choose a writable --output (or fix its permissions / mount)."), p.stderr
    assert os.listdir(d) == []
