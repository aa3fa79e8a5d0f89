"""Peak memory and time of `tpu-embed run`, and of `tpu-embed vocab` then `tpu-embed shard` alone, each job in a
process of its own as the CLI runs it, with its RSS over time.

    .venv/bin/python benchmarks/job_memory.py --data build/bench10m/data --out build/mem [--jobs run,shard]
    .venv/bin/python benchmarks/job_memory.py --spec build/bench/spec-tfrecord.yaml --out build/mem

`--data`: benchmarks/run_throughput.py's CSV data directory, read with its spec (generate it with that script
first); or `--spec`: any spec (`run_throughput.py --workload tfrecord` writes the demo's). The jobs run with
the defaults a user gets (`JobConfig(spec, output)`). `run`: `runner.run_all` into OUT/run; `shard`:
`runner.run_vocab` into OUT/shard, then, in a new process, `runner.run_shard` there (it reads the vocabulary
job's record of its read and streams; `--no-record` deletes the record first, so the shard job reads the
input twice). Each process samples its own RSS and its child processes' (the profile worker) every 0.5 s
from /proc; printed per job: wall and CPU time (user + system, its children included), peak RSS of the
process (`ru_maxrss`) and the sampled peak of it plus its children, and the RSS timeline (seconds since
the start, MB, the children's MB).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time

import run_throughput as bench  # benchmarks/run_throughput.py: this script's directory is first on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _rss_mb(pid="self") -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) // 1024
    except OSError:  # the process ended meanwhile
        pass
    return 0


def _children_rss_mb() -> int:
    """The RSS of this process's child processes (the profile worker), as they are now."""
    me, total = str(os.getpid()), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = fh.read().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        if ppid == me:
            total += _rss_mb(pid)
    return total


def _spec(args):
    if args.spec:
        from tpu_embed.artifact.spec import load_spec
        return load_spec(args.spec)
    return bench.bench_spec(os.path.abspath(args.data), args.batch)


def _one_job(args) -> None:
    """In the child: one job, sampled; one JSON line."""
    from pipelines import runner
    from pipelines.jobs import JobConfig
    samples = []

    def sample():
        while True:
            samples.append((time.time(), _rss_mb(), _children_rss_mb()))
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()
    cfg = JobConfig(spec=_spec(args), output=os.path.abspath(args.job_out))
    t0, c0 = time.time(), os.times()
    m = {"run": runner.run_all, "vocab": runner.run_vocab, "shard": runner.run_shard}[args.job](cfg)
    c1 = os.times()
    every = max(1, len(samples) // 40)
    print(json.dumps({
        "job": args.job, "seconds": time.time() - t0,
        "cpu_s": (c1.user - c0.user) + (c1.system - c0.system) + (c1.children_user - c0.children_user)
        + (c1.children_system - c0.children_system),
        "system_s": (c1.system - c0.system) + (c1.children_system - c0.children_system),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "peak_with_children_mb": max((mb + cmb for _, mb, cmb in samples), default=0),
        "examples": m.counts.examples_written if m.counts is not None else None,
        "rss": [(round(t - t0, 1), mb, cmb) for t, mb, cmb in samples[::every]]}))


def _child(args, job: str, out: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--job", job, "--job-out", out, "--out", args.out,
           "--batch", str(args.batch)] + (["--spec", args.spec] if args.spec else ["--data", args.data])
    res = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout.decode().strip().splitlines()[-1])
    print(f"{job:5s}: {res['seconds']:.1f} s, CPU {res['cpu_s']:.1f} s (system {res['system_s']:.1f} s), peak RSS "
          f"{res['peak_rss_mb']:,} MB (with its child processes, sampled: {res['peak_with_children_mb']:,} MB), "
          f"{res['examples'] if res['examples'] is not None else '-'} examples written", flush=True)
    print(f"       RSS (s, MB, children's MB): {res['rss']}", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", help="benchmarks/run_throughput.py's data directory (the CSV files)")
    ap.add_argument("--spec", help="a spec file instead of --data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=4096, help="global batch of --data's spec")
    ap.add_argument("--jobs", default="run,shard", help="run: `tpu-embed run`; shard: `vocab` then `shard` alone")
    ap.add_argument("--no-record", action="store_true", help="shard: without the vocabulary job's record of its read")
    ap.add_argument("--job", help=argparse.SUPPRESS)  # internal: one job in this process
    ap.add_argument("--job-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if bool(args.data) == bool(args.spec):
        ap.error("give --data or --spec")
    if args.job:
        _one_job(args)
        return
    from pipelines.read import chunk_sizes
    for job in args.jobs.split(","):
        out = os.path.join(os.path.abspath(args.out), job)
        shutil.rmtree(out, ignore_errors=True)
        if job == "run":
            _child(args, "run", out)
            continue
        _child(args, "vocab", out)
        if args.no_record:
            os.remove(chunk_sizes.path(out))
        _child(args, "shard", out)


if __name__ == "__main__":
    main()
