"""OS errors inside the jobs, on real runs of `tpu-embed run`: one line naming the path, the job step and the fix,
no traceback and no --debug hint, exit code 1; what the failed step wrote is not accepted as complete.

Each failure is a real one of the shard job, after the vocabulary job has finished:

* a regular file where the shard directory goes (ENOTDIR, with the path in the error);
* a file size limit (`ulimit -f`, RLIMIT_FSIZE) below a shard run: EFBIG from a plain `write`, which names no
  path (the line then names --output);
* a full disk (a small tmpfs, where this process may mount one): ENOSPC from a plain `write`, the error Beam
  reports as `RuntimeError: OSError: [Errno 28] No space left on device [while running '...BuildStep']`.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys

import pytest

from pipelines import cli
from tests.reliability.artifacts import write_inputs
from tpu_embed.artifact.load import require_shards
from tpu_embed.artifact.manifest import ManifestError, read_manifest

ROWS = 20_000  # at --steps-per-file 100000, shard runs (one per host) far larger than the rest of the artifact
RERUN = "; then run again with --overwrite."
SHARD_STEP = r"\(in job step Shards/[\w/]+\)"  # Beam's label of the shard job's step that failed


def _run_args(out, *extra):
    # One shard file per host (large runs); --reread-input: no read spill, so the shard runs are the large writes.
    return ["run", "--spec", "spec.yaml", "--output", str(out), "--steps-per-file", "100000", "--reread-input",
            *extra]


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # no "(run with --debug for the traceback)"
    return lines[0]


def _nothing_of_the_failed_step_looks_complete(out):
    """The manifest there is the vocabulary job's (it finished): it lists no shard, profile or plan file, the
    training side refuses it, and no temporary file of the shard job is left."""
    m = read_manifest(str(out))
    assert m.shards is None and [f.kind for f in m.files if f.kind in ("shard", "profile", "plan")] == []
    with pytest.raises(ManifestError, match="has no shards"):
        require_shards(m, str(out))
    assert [n for _, ds, ns in os.walk(out) for n in ds + ns if n.startswith(".tmp-")] == []


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("os-errors")
    write_inputs(str(d), rows=ROWS)
    return d


def test_a_file_where_the_shard_directory_goes(work, monkeypatch, capsys):
    out = work / "not-a-dir"
    out.mkdir()
    (out / "shards").write_text("a file, not a directory")
    monkeypatch.chdir(work)
    assert cli.main(_run_args("not-a-dir", "--overwrite")) == 1
    line = _one_line(capsys.readouterr().err)
    assert re.fullmatch(re.escape(f"tpu-embed run: not a directory: a part of {out}/shards/host-0000") + "[01]" +
                        re.escape(" is a file ") + SHARD_STEP +
                        re.escape(". Fix: move that file away, or choose another --output" + RERUN), line), line
    _nothing_of_the_failed_step_looks_complete(out)


def _limit_file_size(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes fail with EFBIG
    return apply


def test_a_file_size_limit_below_a_shard_run(work):
    out = work / "limited"
    p = subprocess.run([sys.executable, "-m", "pipelines.cli", *_run_args(out)], cwd=work, capture_output=True,
                       text=True, timeout=600, preexec_fn=_limit_file_size(64 << 10))
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert re.fullmatch(re.escape(f"tpu-embed run: file size limit exceeded writing under --output {out} ") +
                        SHARD_STEP + re.escape(". Fix: a smaller --steps-per-file (smaller shard files), or a higher "
                                               "limit (`ulimit -f`; the file system's largest file), or choose "
                                               "another --output" + RERUN), line), line
    _nothing_of_the_failed_step_looks_complete(out)


def test_a_full_disk_in_the_shard_step(work, tmpfs, monkeypatch, capsys):
    d = tmpfs("full", "128k")  # the vocabulary job's files fit, the shard runs do not
    monkeypatch.chdir(work)
    assert cli.main(_run_args(d / "out")) == 1
    line = _one_line(capsys.readouterr().err)
    assert re.fullmatch(re.escape(f"tpu-embed run: no space left on device writing under --output {d / 'out'} ") +
                        SHARD_STEP + re.escape(". Fix: free space there, or choose another --output" + RERUN),
                        line), line
    _nothing_of_the_failed_step_looks_complete(d / "out")
