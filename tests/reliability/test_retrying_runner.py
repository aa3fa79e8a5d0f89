"""A runner that retries: a Beam worker process dies mid-job and the job still gives byte-identical outputs
(docs/reference/reliability.md, "Damaged artifacts and faults").

Beam's DaskRunner on a `distributed.LocalCluster` of 2 worker processes with nannies. A WorkerPlugin patches one
DoFn's `process` inside every worker process (also the one the nanny restarts); on its first attempt at one
element, after the same DoFn already finished another element, the worker process exits abruptly
(`os._exit(1)`: no exception, no clean-up, as an OOM kill or a lost machine). The nanny restarts the worker and
the scheduler reschedules the task that was running there (and recomputes the results that were held there).
The job must succeed, and every file must be byte-identical to a DirectRunner run of the same spec.

Two places: the read/parse DoFn (mid-pipeline, upstream of every step) and the shard-file writer (after another
shard file was already written; the retried task writes its files again).

An *exception* in a DoFn is not retried: Beam's DaskRunner submits the graph with `client.compute(graph)`,
without `retries`, so the task errs and the job fails at once (`test_an_exception_is_not_retried`). (Dask
would retry it if the graph carried a `retries` annotation, e.g. `dask.annotate(retries=1)` around the runner's
`run_pipeline`; nothing here sets one.)
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import pytest

from pipelines import runner
from pipelines.jobs import JobConfig
from tpu_embed.artifact.spec import load_spec

distributed = pytest.importorskip("distributed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(ROOT, "examples", "criteo", "spec.yaml")
# As tests/pipelines/runner/test_runners.py, with one step per shard file: several files, so one is written before
# the fault.
KW = dict(chunk_rows=50, steps_per_file=1)


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def _files(d):
    return {os.path.relpath(os.path.join(r, x), d): _read(os.path.join(r, x)) for r, _, xs in os.walk(d) for x in xs}


def _run(out, beam_args=()):
    runner.run_all(JobConfig(spec=load_spec(SPEC), output=out, **KW), list(beam_args))
    return _files(out)


# ---------------------------------------------------------------- the fault, inside the worker processes

def _split_key(split):
    return f"{split.file.index}/{split.index}"


def _file_key(kv):
    host, file_no = kv[0]
    return f"{host}/{file_no}"


KEYS = {"_ReadAndParse": _split_key, "_WriteShardFile": _file_key}


def _log(path, line):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one small O_APPEND write: whole lines, whatever the process
    finally:
        os.close(fd)


def _lines(path):
    with open(path) as fh:
        return [line.split() for line in fh]


def _claim(path):
    """True for exactly one caller, across processes (O_CREAT | O_EXCL)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


class FaultOnce(distributed.WorkerPlugin):
    """Patches `<cls>.process` (a DoFn of `pipelines.jobs`) in the worker process.

    Every call logs `start <element> <dask task> <pid>` and, once the element is done, `done ...` to
    `<work>/calls.log`. The first call that finds another element already done by this DoFn claims
    `<work>/fired` and ends its process with `mode`: "exit" (os._exit(1)) or "raise" (RuntimeError).
    """

    def __init__(self, cls: str, work: str, mode: Optional[str] = "exit"):
        self.cls, self.work, self.mode = cls, work, mode

    def setup(self, worker):
        from pipelines.jobs import build_shards, read_examples
        target = getattr({"_ReadAndParse": read_examples, "_WriteShardFile": build_shards}[self.cls], self.cls)
        orig = target.__dict__["process"]
        key_of, log = KEYS[self.cls], os.path.join(self.work, "calls.log")
        marker, mode = os.path.join(self.work, "fired"), self.mode

        @functools.wraps(orig)  # Beam reads process's signature (side inputs) through __wrapped__
        def process(dofn, element, *args, **kwargs):
            fields = [key_of(element), str(distributed.get_worker().get_current_task()).replace(" ", ""),
                      str(os.getpid())]
            _log(log, " ".join(["start", *fields]))
            done = os.path.exists(log) and any(line[0] == "done" for line in _lines(log))
            if mode is not None and done and _claim(marker):
                _log(log, " ".join(["fired", *fields]))
                if mode == "exit":
                    os._exit(1)
                raise RuntimeError("injected transient failure")
            yield from orig(dofn, element, *args, **kwargs)
            _log(log, " ".join(["done", *fields]))

        target.process = process


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    files = _run(str(tmp_path_factory.mktemp("ref")))
    assert len([p for p in files if p.startswith("shards/")]) >= 3, sorted(files)
    return files


@pytest.fixture
def cluster():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                  env={"TPU_EMBED_THREADS": "1"}) as c:
        yield c


def _inject(cluster, plugin):
    with distributed.Client(cluster) as client:
        client.register_plugin(plugin)  # kept by the scheduler: also set up on restarted workers


def _dask_args(cluster):
    return ["--runner=dask", f"--dask_client_address={cluster.scheduler_address}"]


# ---------------------------------------------------------------- tests

@pytest.mark.slow
@pytest.mark.parametrize("cls", ["_ReadAndParse", "_WriteShardFile"])
def test_worker_death_is_retried_and_outputs_are_identical(reference, cluster, tmp_path, cls):
    work = str(tmp_path / "work")
    os.makedirs(work)
    _inject(cluster, FaultOnce(cls, work))
    out = str(tmp_path / "out")

    got = _run(out, _dask_args(cluster))

    # The fault fired once, in a worker process (not here), which then died mid-task.
    assert os.path.exists(os.path.join(work, "fired"))
    calls = _lines(os.path.join(work, "calls.log"))
    fired = [c for c in calls if c[0] == "fired"]
    assert len(fired) == 1, calls
    _, elem, task, pid = fired[0]
    assert int(pid) != os.getpid()
    assert ["done", elem, task, pid] not in calls
    # The same Dask task ran again, in another process, and finished that element.
    after = calls[calls.index(fired[0]) + 1:]
    assert [c for c in after if c[0] == "done" and c[1:3] == [elem, task] and c[3] != pid], calls
    # The scheduler saw the worker die unexpectedly while running that task; the nanny replaced it.
    with distributed.Client(cluster) as client:
        removed = [e for _, e in client.get_events("all")
                   if e.get("action") == "remove-worker" and not e.get("expected")]
        # Which key it lists depends on Dask's graph fusion (the DoFn may run inside a fused "finalize"
        # task, whose key is not the one get_current_task() gave): a task was running there, and was lost.
        assert any(e["processing-tasks"] for e in removed), removed
        client.wait_for_workers(2, timeout=60)

    # Byte-identical to the DirectRunner, and nothing half-written left behind.
    assert [p for p in got if ".tmp-" in os.path.basename(p)] == []
    assert sorted(got) == sorted(reference)
    assert [p for p in sorted(reference) if got[p] != reference[p]] == []


@pytest.mark.slow
def test_each_split_is_read_once(reference, cluster, tmp_path):
    """Side inputs are dependencies of the one Dask graph: each split is read by one task, once.

    (Beam's own translation computes a side input's bag again inside every task that reads it: the
    manifest writer's three side inputs re-read every input; `pipelines.dask_compat`, bug 4.)
    """
    work = str(tmp_path / "work")
    os.makedirs(work)
    _inject(cluster, FaultOnce("_ReadAndParse", work, mode=None))

    got = _run(str(tmp_path / "out"), _dask_args(cluster))

    calls = _lines(os.path.join(work, "calls.log"))
    assert sorted(c[1] for c in calls if c[0] == "start") == sorted(c[1] for c in calls if c[0] == "done")
    # Two jobs read: the vocabulary job reads the input and spills it, the shard job replays the spill.
    starts = sorted(c[1] for c in calls if c[0] == "start")
    assert starts == sorted(set(starts)) * 2, calls
    assert len({c[2] for c in calls if c[0] == "start"}) == len(starts), calls
    assert [p for p in sorted(reference) if got.get(p) != reference[p]] == []


@pytest.mark.slow
def test_an_exception_is_not_retried(cluster, tmp_path):
    """Beam's DaskRunner submits without `retries`: a DoFn that raises once fails the job (no retry)."""
    work = str(tmp_path / "work")
    os.makedirs(work)
    _inject(cluster, FaultOnce("_WriteShardFile", work, mode="raise"))
    with pytest.raises(RuntimeError, match="injected transient failure"):
        _run(str(tmp_path / "out"), _dask_args(cluster))
    calls = _lines(os.path.join(work, "calls.log"))
    fired = [c for c in calls if c[0] == "fired"]
    assert len(fired) == 1
    # That task was never attempted again.
    assert [c for c in calls if c[0] == "start" and c[1:3] == fired[0][1:3]] == [["start", *fired[0][1:]]]
