"""A tpu-embed process ends with its own exit status: no native worker thread outlives the work.

A run could print its summary and then abort with exit 134 ("terminate called without an active exception"):
a worker of one of Arrow's thread pools was still alive when the process exited, and the C++ runtime tore the
pool down under it. Arrow starts those pools behind the caller's back: `pq.read_table` scans through its
dataset layer (read-ahead tasks on its pools, even with `use_threads=False`), and `pq.ParquetFile` pre-buffers
column chunks on its I/O pool by default. The token-count files (`--base` runs, `inspect`, `remap`) and
Parquet inputs were read that way. They are read without the pools now, and these tests hold it:

* the thread census: real `tpu-embed` processes (a Parquet input's run, an incremental `--base` run, and
  `inspect`, which reads token counts) report, when the interpreter has finished (atexit: Python's own
  threads are joined by then), every thread still alive; none but the main thread and jemalloc's named
  housekeeper may remain (OpenBLAS's pool is held at one thread for the census);
* the stress: 200 short `tpu-embed` processes (20 incremental runs, 180 `inspect`s), four at a time, each
  exits 0 with no "terminate" on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.reliability.test_output_faults import SPEC_APPEND, _csv

TPU_EMBED = os.path.join(os.path.dirname(sys.executable), "tpu-embed")
HOUSEKEEPERS = {"jemalloc_bg_thd"}  # jemalloc's background purge thread: C, named, harmless at exit

# The CLI's own entry point, then (atexit, after Python's threads are joined) the names of the native
# threads still alive, on stderr's last line.
CENSUS = r"""
import atexit, os, sys
def census():
    me = os.getpid()
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")
             if int(t) != me]
    sys.stderr.write("THREADS-AT-EXIT " + ",".join(sorted(names)) + "\n")
atexit.register(census)
from pipelines.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """day1.csv, day2.csv, spec.yaml (an append vocabulary), day 1's artifact `day1`, and the same rows as a
    typed Parquet file with its spec (spec_parquet.yaml)."""
    d = str(tmp_path_factory.mktemp("exit"))
    _csv(os.path.join(d, "day1.csv"), 0, 200, 13)
    _csv(os.path.join(d, "day2.csv"), 200, 400, 17)
    with open(os.path.join(d, "spec.yaml"), "w") as fh:
        yaml.safe_dump(SPEC_APPEND, fh)
    rows = [line.split(",") for line in open(os.path.join(d, "day1.csv")).read().split("\n")[1:] if line]
    pq.write_table(pa.table({"label": [int(r[0]) for r in rows], "x": [float(r[1]) for r in rows],
                             "cat": [r[2] for r in rows], "id": [int(r[3]) for r in rows]}),
                   os.path.join(d, "day1.parquet"))
    with open(os.path.join(d, "spec_parquet.yaml"), "w") as fh:
        yaml.safe_dump(dict(SPEC_APPEND, inputs={"format": "parquet", "patterns": ["day1.parquet"]}), fh)
    p = subprocess.run([TPU_EMBED, "run", "--spec", "spec.yaml", "--output", "day1", "--steps-per-file", "5"],
                       cwd=d, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return d


COMMANDS = {
    "parquet run": ["run", "--spec", "spec_parquet.yaml", "--output", "pq", "--steps-per-file", "5"],
    "incremental run": ["run", "--spec", "spec.yaml", "--input", "day2.csv", "--base", "day1", "--output", "day2",
                        "--steps-per-file", "5"],
    "inspect": ["inspect", "day1", "--steps", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_native_worker_thread_outlives_the_work(work, command):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", CENSUS, *COMMANDS[command]], cwd=work, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    census = [line for line in p.stderr.splitlines() if line.startswith("THREADS-AT-EXIT ")]
    assert census, p.stderr
    alive = [n for n in census[-1].split(" ", 1)[1].split(",") if n and n not in HOUSEKEEPERS]
    assert not alive, (f"{command}: {len(alive)} native thread(s) still alive at exit ({alive}): a library's "
                       "thread pool was started (Arrow's, by pq.read_table or a pre-buffering ParquetFile?)")


@pytest.mark.slow
def test_two_hundred_short_runs_exit_zero(work):
    def one(i):
        # Every tenth an incremental run (reads day 1's token counts, writes an artifact), the others `inspect`.
        args = (["run", "--spec", "spec.yaml", "--input", "day2.csv", "--base", "day1", "--output", f"stress{i}",
                 "--steps-per-file", "5"] if i % 10 == 0 else ["inspect", "day1", "--steps", "1"])
        p = subprocess.run([TPU_EMBED, *args], cwd=work, capture_output=True, text=True, timeout=300)
        return i, p.returncode, p.stderr

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(200)))
    bad = [(i, rc, err.strip()[-200:]) for i, rc, err in results if rc != 0 or "terminate" in err]
    assert not bad, f"{len(bad)} of 200 runs did not exit 0 cleanly: {bad[:3]}"
