"""A day's incremental run over a base of N days against a rebuild over the whole window (N+1 days).

    .venv/bin/python benchmarks/incremental.py --days 6 --rows-per-day 100000 --out build/bench-incremental

Workload: synthetic CSV days (seed 1234), --rows-per-day rows each: a label, 2 dense columns and 6
categorical columns of Zipf(1.2) ids over 60 k values, the values drifting a little every day (each day's
ranks map to a window of the id space 1 k further on), so every day brings new tokens. Every vocabulary has
mode append, capacity 150 k and 1 OOV bucket; 2 chips x 4 SparseCores, global batch 1024, the tail padded.

Setup (timed, not compared): the lineage of days 1..N, day 1 without a base and each later day with the
previous day's artifact as its base (`tpu-embed run --input dayK.csv --base ...`).

Measured, --repeat times, the two commands interleaved, each in a process of its own as a user runs it:

* incremental: `tpu-embed run --spec S --input day{N+1}.csv --base day{N} --output inc` (reads the new day;
  merges the counts and the base's profile);
* rebuild: `tpu-embed run --spec S --input day1.csv ... day{N+1}.csv --output rebuild` (a first day over the
  whole window: reads and shards N+1 days);
* alone: `tpu-embed run --spec S --input day{N+1}.csv --output alone` (the new day as a first day, no base):
  what the incremental run costs beyond reading and sharding the day's data is the difference.

Wall time, CPU time (user + system of the child) and peak RSS (`ru_maxrss`, from `wait4`); the best of
--repeat rounds of each. Then the
incremental artifact is checked: its profile covers days 1..N+1 and the steps of every day.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TPU_EMBED = os.path.join(os.path.dirname(sys.executable), "tpu-embed")
CATEGORICAL = [f"C{i}" for i in range(1, 7)]
POOL = 60_000
DRIFT = 1_000

SPEC = """\
name: bench_incremental
inputs: {{format: csv, patterns: [day1.csv]}}
label: {{column: label}}
dense: [I1, I2]
categorical: [{categorical}]
defaults: {{categorical: {{vocabulary: {{mode: append, capacity: 150000, num_oov_buckets: 1}}}}, table: {{dim: 16}}}}
optimizer: {{type: adagrad, learning_rate: 0.05}}
topology: {{num_chips: 2, num_sc_per_chip: 4, num_hosts: 1}}
global_batch_size: 1024
policies: {{tail: pad}}
"""


def write_day(path: str, day: int, rows: int, seed: int = 1234) -> None:
    rng = np.random.default_rng(seed + day)
    cols = {"label": rng.integers(0, 2, rows), "I1": rng.integers(0, 100, rows), "I2": rng.integers(0, 1000, rows)}
    for i, c in enumerate(CATEGORICAL):
        ranks = (rng.zipf(1.2, rows) - 1) % POOL
        # A fixed shuffle of the id space per feature; day d's ranks map to ids d * DRIFT further on.
        ids = np.random.default_rng(i).permutation(POOL + 64 * DRIFT)[ranks + day * DRIFT]
        cols[c] = ids
    with open(path, "w") as f:
        f.write(",".join(cols) + "\n")
        table = np.stack([np.asarray(v) for v in cols.values()], axis=1)
        np.savetxt(f, table, fmt="%d", delimiter=",")


def timed(args: list) -> dict:
    """`tpu-embed run ARGS` in a process of its own: wall, CPU (user + system) and peak RSS of the child."""
    t = time.time()
    proc = subprocess.Popen([TPU_EMBED, "run", *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t
    err = proc.stderr.read()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"tpu-embed run {' '.join(args)} failed:\n{err}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=6, help="N: the base's days (the window is N+1 days)")
    ap.add_argument("--rows-per-day", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-incremental"))
    a = ap.parse_args(argv)
    n = a.days
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    spec = os.path.join(a.out, "spec.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(categorical=", ".join(CATEGORICAL)))
    files = []
    for d in range(1, n + 2):
        files.append(os.path.join(a.out, f"day{d}.csv"))
        write_day(files[-1], d, a.rows_per_day)
    mib = sum(os.path.getsize(f) for f in files) / 2 ** 20
    print(f"{n + 1} days of {a.rows_per_day} rows ({mib:.0f} MiB of CSV)", flush=True)
    base = None
    for d in range(1, n + 1):  # the lineage of the base days
        out = os.path.join(a.out, f"lineage{d}")
        r = timed(["--spec", spec, "--input", files[d - 1], "--output", out] + (["--base", base] if base else []))
        print(f"setup: day {d}{' over day ' + str(d - 1) if base else ''}: {r['wall_s']:.1f} s", flush=True)
        base = out
    inc_args = ["--spec", spec, "--input", files[n], "--base", base, "--output", os.path.join(a.out, "inc"),
                "--overwrite"]
    rebuild_args = ["--spec", spec, *sum((["--input", f] for f in files), []), "--output",
                    os.path.join(a.out, "rebuild"), "--overwrite"]
    alone_args = ["--spec", spec, "--input", files[n], "--output", os.path.join(a.out, "alone"), "--overwrite"]
    results: dict = {"incremental": [], "rebuild": [], "alone": []}
    for _ in range(a.repeat):
        results["incremental"].append(timed(inc_args))
        results["rebuild"].append(timed(rebuild_args))
        results["alone"].append(timed(alone_args))
        print(json.dumps({k: v[-1] for k, v in results.items()}), flush=True)

    from tpu_embed.artifact.manifest import read_manifest
    inc = read_manifest(os.path.join(a.out, "inc"))
    days = [read_manifest(os.path.join(a.out, f"lineage{d}")) for d in range(1, n + 1)] + [inc]
    assert inc.profile is not None and inc.profile.days == list(range(1, n + 2)), inc.profile
    assert inc.counts is not None and inc.counts.records_read == a.rows_per_day
    plan = json.load(open(os.path.join(a.out, "inc", "plan.json")))
    assert plan["steps"] == sum(m.shards.steps for m in days if m.shards is not None)
    best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in results.items()}
    cell = {k: f"{v['wall_s']:.1f} s ({v['cpu_s']:.1f} s CPU, {v['peak_rss_mb']:.0f} MB)" for k, v in best.items()}
    i, r, o = best["incremental"], best["rebuild"], best["alone"]
    print("| base days + new day | rows per day | incremental | rebuild over the window | the new day alone | "
          "rebuild / incremental | incremental / alone |")
    print(f"| {n} + 1 | {a.rows_per_day} | {cell['incremental']} | {cell['rebuild']} | {cell['alone']} | "
          f"{r['wall_s'] / i['wall_s']:.1f}x | {i['wall_s'] / o['wall_s']:.2f}x |")


if __name__ == "__main__":
    main()
