"""pipelines.child_process and the profile statistics in a child (pipelines.profile_worker): real child
processes, the same accumulator as in a thread, errors raised in the parent with their type and message."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from pipelines import child_process, profile_worker
from profiles import ProfileCollector, synthetic
from tpu_embed.core.topology import Topology

# ---------------------------------------------------------------- functions the child runs (by module path)

def echo_sum(receive, send, scale):
    total = 0
    while True:
        msg = receive()
        if msg is None or isinstance(msg, str):
            return total
        total += scale * int(np.sum(msg))
        send(("partial", total, os.getpid()))


def fail(receive, send, message):
    raise KeyError(message)


def unpicklable_error(receive, send):
    class Local(Exception):
        pass
    raise Local("made in the child")


def die(receive, send):
    os.kill(os.getpid(), signal.SIGKILL)


HERE = __name__  # the child imports the functions by this module name


# ---------------------------------------------------------------- Child

@pytest.fixture
def child():
    child = child_process.Child()
    yield child
    child.close()


def test_child_runs_functions_in_another_process_one_after_another(child):
    child.start(f"{HERE}:echo_sum", 2)
    child.send(np.arange(4))
    _, total, pid = child.receive()
    assert total == 12 and pid != os.getpid()
    child.send([5])
    assert child.receive()[:2] == ("partial", 22)
    child.send("stop")
    assert child.receive() == ("return", 22)
    child.start(f"{HERE}:echo_sum", 1)  # the same child, a second function
    child.send("stop")
    assert child.receive() == ("return", 0)


def test_an_error_in_the_child_is_raised_in_the_parent_with_its_type_and_traceback(child):
    child.start(f"{HERE}:fail", "no such key")
    with pytest.raises(KeyError, match="no such key") as e:
        child.receive()
    assert isinstance(e.value.__cause__, child_process.RemoteTraceback)
    assert "in fail" in str(e.value.__cause__)
    with pytest.raises(ChildProcessError, match="exited"):  # the child ends after an error
        child.receive()


def test_an_error_that_cannot_be_pickled_keeps_its_type_name_and_message(child):
    child.start(f"{HERE}:unpicklable_error")
    with pytest.raises(RuntimeError, match="Local: made in the child"):
        child.receive()


def test_a_child_that_dies_is_reported_with_its_status(child):
    child.start(f"{HERE}:die")
    with pytest.raises(ChildProcessError, match="status -9"):
        child.receive()
    with pytest.raises(ChildProcessError):
        child.send("anything")


def test_wanted_follows_the_environment(monkeypatch):
    monkeypatch.setenv(child_process.ENV, "0")
    assert not child_process.wanted()
    monkeypatch.setenv(child_process.ENV, "1")
    assert child_process.wanted()
    monkeypatch.delenv(child_process.ENV)
    monkeypatch.setenv("TPU_EMBED_THREADS", "1")  # as under multi-process runners
    assert not child_process.wanted()
    monkeypatch.setenv("TPU_EMBED_THREADS", "2")
    assert child_process.wanted()


def test_the_profile_uses_a_child_where_its_counting_holds_the_gil(monkeypatch):
    from pipelines import profile_worker
    from profiles import step_counts
    from tpu_embed.core.model import from_tf_feature_config
    model = from_tf_feature_config(FC, TOPO)
    monkeypatch.delenv(child_process.ENV, raising=False)
    monkeypatch.setenv("TPU_EMBED_THREADS", "2")
    monkeypatch.setattr(step_counts, "_native", None)  # the numpy counting
    assert profile_worker.use_child(model)
    monkeypatch.setenv("TPU_EMBED_THREADS", "1")
    assert not profile_worker.use_child(model)
    monkeypatch.setenv("TPU_EMBED_THREADS", "2")
    monkeypatch.setattr(step_counts, "_native", object())  # the native counting: a thread
    assert not profile_worker.use_child(model)
    monkeypatch.setattr(step_counts, "NATIVE_MAX_TABLE_ROWS", 100)  # a table of 500 rows: past the kernel's limit
    assert profile_worker.use_child(model)
    monkeypatch.setenv(child_process.ENV, "1")
    assert profile_worker.use_child(model)
    monkeypatch.setenv(child_process.ENV, "0")
    monkeypatch.setattr(step_counts, "_native", None)
    assert not profile_worker.use_child(model)


# ---------------------------------------------------------------- the profile in a child

FC = synthetic.feature_config(3, per_chip_batch=8, vocab_sizes=[40, 500, 7], shared=1, sequence={1: 2})
TOPO = Topology(2, 4)
BATCHES = list(synthetic.global_batches(FC, 2, 12, seed=3))


def _profile(kind):
    collector = ProfileCollector(FC, TOPO, candidate_chip_counts=(1, 4))
    worker = kind(collector, 2)
    for i, b in enumerate(BATCHES):
        worker.add_step(b, {"feature_00": i % 2}, i, validate=True)
    return collector, worker.close()


def test_the_profile_in_a_child_equals_the_profile_in_a_thread():
    collector, in_child = _profile(profile_worker.ProfileProcess)
    _, in_thread = _profile(profile_worker.ProfileThread)
    assert in_child.steps == len(BATCHES)
    assert in_child == in_thread
    assert collector.extract_output(in_child) == collector.extract_output(in_thread)


def test_one_child_serves_bundle_after_bundle(child):
    """As `_BuildStep` uses it: one child per DoFn instance, a partial profile per bundle."""
    collector = ProfileCollector(FC, TOPO)
    assert isinstance(profile_worker.start(collector, 2), profile_worker.ProfileThread)
    partials = []
    for bundle in (BATCHES[:5], BATCHES[5:]):
        worker = profile_worker.start(collector, 2, child)
        assert isinstance(worker, profile_worker.ProfileProcess)
        for i, b in enumerate(bundle):
            worker.add_step(b, None, i, validate=True)
        partials.append(worker.close())
    assert [p.steps for p in partials] == [5, len(BATCHES) - 5]
    assert child._proc.poll() is None  # still there for the next bundle
    whole = profile_worker.ProfileThread(collector, 2)
    for i, b in enumerate(BATCHES):
        whole.add_step(b, None, i if i < 5 else i - 5, validate=True)
    assert collector.merge_accumulators(partials) == whole.close()


def test_a_bad_step_fails_the_profile_in_the_parent_naming_the_feature():
    collector = ProfileCollector(FC, TOPO)
    worker = profile_worker.ProfileProcess(collector, 2)
    bad = dict(BATCHES[0])
    name = sorted(bad)[0]
    bad[name] = bad[name]._replace(ids=bad[name].ids + 10_000)
    worker.add_step(BATCHES[1], None, 0, validate=True)
    worker.add_step(bad, None, 1, validate=True)
    with pytest.raises(ValueError, match=f"feature {name!r}: id .* is outside the vocabulary"):
        for i in range(2, 12):  # the child has ended: a later send or the close raises its error
            worker.add_step(BATCHES[i], None, i, validate=True)
        worker.close()


def test_a_child_whose_parent_closes_mid_function_exits_quietly():
    """As when the worker's job fails: the function sees the end of its input and the child exits 0,
    without answering (no broken-pipe traceback on the terminal: tests/pipelines/cli/test_cli_ux.py)."""
    child = child_process.Child()
    child.start(f"{HERE}:echo_sum", 1)
    child.send([1])
    child._proc.stdin.close()
    assert child._proc.wait(timeout=30) == 0
    child.close()
