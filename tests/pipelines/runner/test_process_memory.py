"""glibc's malloc tuned while a job runs in this process (`pipelines.process_memory`): freed arrays handed out again
instead of faulted in anew, glibc's defaults and the free memory given back afterwards, applied to in-process
jobs only.

The allocator's behaviour is observed in a fresh interpreter each time (`_in_fresh_process`): in the test
process the heap holds whatever earlier tests freed, and malloc serves an array from such free chunks (no fault)
whatever its thresholds say."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from pipelines import process_memory, runner
from pipelines.jobs import JobConfig
from tests.helpers import ROOT
from tpu_embed.artifact.spec import load_spec

pytestmark = pytest.mark.skipif(process_memory._libc() is None or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc only")

CRITEO = os.path.join(ROOT, "examples", "criteo", "spec.yaml")

_HELPERS = """
import json, resource
import numpy as np
from pipelines import process_memory
MB = 1 << 20
PAGE = resource.getpagesize()
PAGES = 3 * MB // PAGE  # under 4 MiB: numpy asks for no huge pages

def faults_of_two_arrays(size=3 * MB):
    # minor page faults of the second of two arrays of `size` bytes, each written whole, the first freed
    a = np.ones(size, np.uint8)
    del a
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b = np.ones(size, np.uint8)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del b
    return faults

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE
"""


def _in_fresh_process(body: str) -> dict:
    """Run `body` (after `_HELPERS`) in a new interpreter; it prints one JSON object, returned here."""
    code = _HELPERS + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_arrays_are_reused_while_a_job_runs_then_mapped_as_glibc_does():
    got = _in_fresh_process("""
        with process_memory.freed_memory_reused():
            faults_of_two_arrays()  # the heap grown once
            inside = faults_of_two_arrays()
        after = faults_of_two_arrays()
        print(json.dumps({"inside": inside, "after": after, "pages": PAGES}))
    """)
    assert got["inside"] < got["pages"] // 10, got  # the freed array's pages handed out again
    # glibc's static default again: mapped afresh, its pages faulted in (an eighth at least: where transparent huge
    # pages are always on, a 2 MiB-aligned part comes in one fault)
    assert got["after"] > got["pages"] // 8, got


def test_the_free_memory_is_given_back_when_the_job_ends():
    got = _in_fresh_process("""
        with process_memory.freed_memory_reused():
            arrays = [np.ones(MB, np.uint8) for _ in range(200)]  # 200 MB from the heap (under the mmap threshold)
            held = rss()
            del arrays
            kept = rss()  # freed, kept in the heap for the next arrays
        print(json.dumps({"held": held, "kept": kept, "after": rss(), "mb": MB}))
    """)
    mb = got["mb"]
    assert got["kept"] > got["held"] - 50 * mb, got
    assert got["after"] < got["kept"] - 150 * mb, got  # malloc_trim gave it back


def test_settings_are_set_back_after_a_failure():
    got = _in_fresh_process("""
        try:
            with process_memory.freed_memory_reused():
                raise RuntimeError("boom")
        except RuntimeError as e:
            error = str(e)
        print(json.dumps({"error": error, "after": faults_of_two_arrays(), "pages": PAGES}))
    """)
    assert got["error"] == "boom"
    assert got["after"] > got["pages"] // 8, got


def test_in_process_jobs_run_with_it(tmp_path, monkeypatch):
    entered = []
    real = process_memory.freed_memory_reused
    monkeypatch.setattr(process_memory, "freed_memory_reused", lambda: entered.append(1) or real())
    runner.run_all(JobConfig(spec=load_spec(CRITEO), output=str(tmp_path / "out"), chunk_rows=50,
                             steps_per_file=3))
    assert len(entered) == 2  # the vocabulary job and the shard job
