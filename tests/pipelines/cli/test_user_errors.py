"""The one line the CLI prints for an error (`pipelines.user_errors`), from each form in which Beam hands a worker's
error back: in process (a RuntimeError naming the step, the original as its context), from worker processes (the
worker's traceback as text), and from Dask (the worker's own exception, noted with the job by the runner).

The errors are real: a one-element pipeline whose step writes to /dev/full (ENOSPC from a plain write, no path),
opens a file under a regular file (ENOTDIR, with the path), or writes through `tpu_embed.artifact.io.write_atomic`
from a source that fails with ENOSPC (its DiskFullError names the path); permission and read-only errors, which a
root process cannot provoke on a path, are raised as Python raises them, inside the step.
"""

from __future__ import annotations

import errno
import os

import apache_beam as beam
import pytest

from pipelines import cli, runner
from pipelines.read.records import DataError
from pipelines.user_errors import DEBUG_HINT, UserError, describe, exit_code, job_note
from tests.helpers import ROOT
from tpu_embed.artifact import io as tio

NO_RECORDS = "the 1 input file(s) hold no records (an empty data set): nothing to count or write."
OUT = "/data/out"  # the --output the lines name when the error has no path
STEP = "FailingWrite"
RERUN = ", or choose another --output; then run again with --overwrite."
MODES = {"in_process": [], "worker_processes": ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]}


def _full_device_write():
    with open("/dev/full", "wb") as fh:
        fh.write(b"x")  # buffered: the flush at close fails


class _Fail(beam.DoFn):
    def __init__(self, kind: str, where: str):
        self.kind, self.where = kind, where

    def process(self, x):
        if self.kind == "enospc":
            _full_device_write()
        elif self.kind == "enotdir":
            open(os.path.join(self.where, "a-file", "shards"), "wb")
        elif self.kind == "disk_full":
            def chunks():
                yield b"abc"
                _full_device_write()
            tio.write_atomic(os.path.join(self.where, "manifest.json"), chunks())
        elif self.kind == "eacces":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.path.join(self.where, "vocab"))
        elif self.kind == "erofs":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(self.where, "spec.yaml"))
        elif self.kind == "data_error":
            raise DataError(NO_RECORDS)
        yield x


def _failure(kind: str, where: str, beam_args, job: str = "shard") -> BaseException:
    with pytest.raises(Exception) as info:
        runner._run(lambda p: p | beam.Create([1]) | STEP >> beam.ParDo(_Fail(kind, where)), beam_args, job)
    return info.value


def _expected(kind: str, where: str, at: str) -> str:
    what, fix = {
        "enospc": (f"no space left on device writing under --output {where}", "free space there"),
        "enotdir": (f"not a directory: a part of {where}/a-file/shards is a file", "move that file away"),
        "disk_full": (f"no space left on device writing {where}/manifest.json", "free space there"),
        "eacces": (f"permission denied on {where}/vocab", "give the user running the job access to it"),
        "erofs": (f"read-only file system: cannot write {where}/spec.yaml", "remount it read-write"),
    }[kind]
    return f"{what} ({at}). Fix: {fix}{RERUN}"


@pytest.fixture
def where(tmp_path):
    (tmp_path / "a-file").write_text("a regular file")
    return str(tmp_path)


KINDS = ["enospc", "enotdir", "disk_full", "eacces", "erofs"]


# Worker processes are slow to start: the full disk (the issue's case) always, the rest with the slow tests.
@pytest.mark.parametrize("mode, kind", [("in_process", k) for k in KINDS] + [("worker_processes", "enospc")] + [
    pytest.param("worker_processes", k, marks=pytest.mark.slow) for k in KINDS[1:]])
def test_os_errors_name_the_path_the_step_and_the_fix(where, kind, mode):
    e = _failure(kind, where, MODES[mode])
    if mode == "in_process":
        assert isinstance(e.__context__, OSError)
    else:  # only the worker's traceback, as text
        assert e.__context__ is None and "Traceback (most recent call last)" in str(e)
    said = describe(e, output=where)
    assert said.expected and said.line == _expected(kind, where, f"in job step {STEP}")


@pytest.mark.slow
def test_dask_hands_back_the_workers_own_error_and_the_runner_names_the_job(where):
    pytest.importorskip("distributed")
    e = _failure("enospc", where, ["--runner=dask", "--dask_workers=1"])
    assert type(e) is OSError and e.errno == errno.ENOSPC and e.__notes__ == [job_note("shard")]
    said = describe(e, output=where)
    assert said.expected and said.line == _expected("enospc", where, "in the shard job")


def test_the_issue_text_of_a_full_disk():
    """The line a full disk printed before: `RuntimeError: OSError: [Errno 28] No space left on device [while
    running 'Shards/Build0/BuildStep']`, as text only."""
    e = RuntimeError("OSError: [Errno 28] No space left on device [while running 'Shards/Build0/BuildStep']")
    assert describe(e, OUT).line == ("no space left on device writing under --output /data/out (in job step "
                                     f"Shards/Build0/BuildStep). Fix: free space there{RERUN}")


def test_in_a_traceback_text_the_error_raised_last_counts():
    """A worker's text holds every error of a chain ("During handling of the above exception, ..."): the last one
    ended the job."""
    chained = ("Traceback (most recent call last):\nFileNotFoundError: [Errno 2] No such file or directory: "
               "'/data/out/.tmp-shard-runs'\n\nDuring handling of the above exception, another exception occurred:"
               "\n\nTraceback (most recent call last):\nRuntimeError: PermissionError: [Errno 13] Permission "
               "denied: '/data/out/vocab' [while running 'Vocabulary/Write']\n")
    assert describe(RuntimeError(chained), OUT).line == (
        "permission denied on /data/out/vocab (in job step Vocabulary/Write). Fix: give the user running the job "
        f"access to it{RERUN}")
    reversed_ = chained.replace("FileNotFoundError: [Errno 2] No such file or directory: '/data/out/.tmp-shard-"
                                "runs'", "PermissionError: [Errno 13] Permission denied: '/data/out/x'").replace(
        "RuntimeError: PermissionError: [Errno 13] Permission denied: '/data/out/vocab'",
        "RuntimeError: pipelines.read.records.DataError: no valid record")
    assert describe(RuntimeError(reversed_), OUT).line == "no valid record"


def test_a_path_outside_the_output_gets_no_output_advice():
    e = PermissionError(errno.EACCES, "Permission denied", "/srv/data/in.csv")
    assert describe(e, OUT).line == ("permission denied on /srv/data/in.csv. Fix: give the user running the job "
                                     "access to it.")


@pytest.mark.parametrize("mode", list(MODES))
def test_user_errors_are_their_message_alone(where, mode):
    """No type name, no Beam step, no hint: the same line in process and from a worker's traceback."""
    said = describe(_failure("data_error", where, MODES[mode]), output=where)
    assert said.expected and said.line == NO_RECORDS


def test_unexpected_errors_keep_the_debug_hint(monkeypatch, tmp_path, capsys):
    def broken(*a, **k):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(runner, "run_all", broken)
    spec = os.path.join(ROOT, "examples", "criteo",
                        "spec.yaml")
    assert cli.main(["run", "--spec", spec, "--output", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.splitlines() == ["tpu-embed run: ZeroDivisionError: division by zero",
                                                    DEBUG_HINT]
    worker = RuntimeError("Traceback (most recent call last):\n  File \"x\", line 1\n"
                          "RuntimeError: KeyError: 'C1' [while running 'Ids/Map']\n")
    said = describe(worker, OUT)
    assert not said.expected and said.line == "RuntimeError: KeyError: 'C1' [while running 'Ids/Map']"


def test_exit_codes():
    assert exit_code(UserError("--host 3")) == 2
    assert exit_code(OSError(errno.ENOSPC, "full")) == 1
    assert exit_code(ZeroDivisionError()) == 1
