"""glibc's malloc tuned while a job runs in this process (`pipelines.process_memory`): freed arrays handed out again
instead of faulted in anew, glibc's defaults and the free memory given back afterwards, applied to in-process
jobs only."""

from __future__ import annotations

import os
import platform
import resource

import numpy as np
import pytest

from pipelines import process_memory, runner
from pipelines.jobs import JobConfig
from tests.helpers import ROOT
from tpu_embed.artifact.spec import load_spec

pytestmark = pytest.mark.skipif(process_memory._libc() is None or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc only")

CRITEO = os.path.join(ROOT, "examples", "criteo", "spec.yaml")
MB = 1 << 20
PAGE = resource.getpagesize()


def _faults_of_two_arrays(size: int) -> int:
    """Minor page faults of the second of two arrays of `size` bytes, each written whole, the first freed."""
    a = np.ones(size, np.uint8)
    del a
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b = np.ones(size, np.uint8)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del b
    return faults


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def test_freed_arrays_are_reused_while_a_job_runs_then_mapped_as_glibc_does():
    pages = 3 * MB // PAGE  # under 4 MiB: numpy asks for no huge pages
    with process_memory.freed_memory_reused():
        _faults_of_two_arrays(3 * MB)  # the heap grown once
        inside = _faults_of_two_arrays(3 * MB)
    after = _faults_of_two_arrays(3 * MB)
    assert inside < pages // 10  # the freed array's pages handed out again
    # glibc's static default again: mapped afresh, its pages faulted in (an eighth at least: where transparent huge
    # pages are always on, a 2 MiB-aligned part comes in one fault)
    assert after > pages // 8


def test_the_free_memory_is_given_back_when_the_job_ends():
    with process_memory.freed_memory_reused():
        arrays = [np.ones(MB, np.uint8) for _ in range(200)]  # 200 MB from the heap (under the mmap threshold)
        held = _rss()
        del arrays
        kept = _rss()  # freed, kept in the heap for the next arrays
        assert kept > held - 50 * MB
    assert _rss() < kept - 150 * MB  # malloc_trim gave it back


def test_settings_are_set_back_after_a_failure():
    with pytest.raises(RuntimeError, match="boom"):
        with process_memory.freed_memory_reused():
            raise RuntimeError("boom")
    assert _faults_of_two_arrays(3 * MB) > (3 * MB // PAGE) // 8


def test_in_process_jobs_run_with_it(tmp_path, monkeypatch):
    entered = []
    real = process_memory.freed_memory_reused
    monkeypatch.setattr(process_memory, "freed_memory_reused", lambda: entered.append(1) or real())
    runner.run_all(JobConfig(spec=load_spec(CRITEO), output=str(tmp_path / "out"), chunk_rows=50,
                             steps_per_file=3))
    assert len(entered) == 2  # the vocabulary job and the shard job
