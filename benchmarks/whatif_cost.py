"""Cost of the what-if steps: their recording in a run, and the figures a plan makes of them.

    .venv/bin/python benchmarks/whatif_cost.py [--examples 500000] [--pairs 5] [--out build/bench-whatif]
    .venv/bin/python benchmarks/whatif_cost.py --run with|without --spec SPEC --output DIR   # one run, as timed

Workload: the demo's data and spec (`tpu-embed demo`: 500,000 synthetic Criteo-like examples in 8 TFRecord
files, 30 tables, global batch 2048 on 4 chips x 4 SparseCores), written once under `--out`.  Then
`tpu-embed run` of that spec, each run in a process of its own, with the recording (as shipped) and without it
(`ProfileCollector` in place of `WhatIfCollector` in the profile job: the same profile, no `whatif-*.json`, so
no what-if in the plan either), alternately, `--pairs` times: the wall time of each process, medians and the
ratio pair by pair.  Then plan time from the recorded artifact's profile directory, each median of `--repeat`
calls in this process: `profiles.plan` without and with `what_if`, and `--propose`'s comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HERE = os.path.abspath(__file__)


def _one_run(mode: str, spec: str, output: str) -> int:
    """`tpu-embed run --spec SPEC --output DIR` in this process, with or without the recording."""
    if mode == "without":
        import pipelines.jobs.collect_profile as collect_profile
        from profiles import ProfileCollector
        collect_profile.WhatIfCollector = ProfileCollector  # type: ignore[misc, assignment]
    from pipelines.cli import main
    return main(["run", "--spec", spec, "--output", output])


def _data(out: str, examples: int) -> str:
    from pipelines import demo_data
    spec = os.path.join(out, "spec.yaml")
    if not os.path.exists(spec):
        demo_data.write_dataset(os.path.join(out, "data"), examples, seed=1234, num_files=8)
        with open(spec, "w") as fh:
            fh.write(demo_data.spec_text(["data/part-*.tfrecord"], spec, 2048, None))
    return spec


def _timed_run(mode: str, spec: str, output: str) -> float:
    shutil.rmtree(output, ignore_errors=True)  # a fresh artifact each time, its removal not timed
    start = time.perf_counter()
    subprocess.run([sys.executable, HERE, "--run", mode, "--spec", spec, "--output", output], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _median_call(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_runs(spec: str, out: str, pairs: int) -> str:
    with_dir, without_dir = os.path.join(out, "with"), os.path.join(out, "without")
    _timed_run("with", spec, with_dir)  # warm-up: page cache, compiled modules
    times = {"with": [], "without": []}
    for _ in range(pairs):
        for mode, d in (("with", with_dir), ("without", without_dir)):
            times[mode].append(_timed_run(mode, spec, d))
    ratios = [a / b for a, b in zip(times["with"], times["without"])]
    size = sum(os.path.getsize(os.path.join(with_dir, "profiles", f)) for f in os.listdir(
        os.path.join(with_dir, "profiles")) if f.startswith("whatif-"))
    print(f"tpu-embed run, {pairs} pairs: with the recording median {statistics.median(times['with']):.2f} s, "
          f"without {statistics.median(times['without']):.2f} s; with / without per pair: median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); whatif file "
          f"{size / 2**20:.1f} MiB")
    return with_dir


def bench_plan(artifact: str, repeat: int) -> None:
    import warnings

    import profiles
    from profiles import ProfileStore
    from profiles.planner.proposal import propose_placements
    from profiles.whatif_steps import read_what_if_steps
    d = os.path.join(artifact, "profiles")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = _median_call(lambda: profiles.plan(d, what_if=False), repeat)
        full = _median_call(lambda: profiles.plan(d), repeat)
        profile = ProfileStore(d).read()
        steps = read_what_if_steps(d, profile.model)
        assert steps is not None
        propose = _median_call(lambda: propose_placements(profile, read_what_if_steps(d, profile.model)), repeat)
    print(f"plan ({steps.sampling()}): without what-if {base:.2f} s, with {full:.2f} s (+{full - base:.2f} s); "
          f"--propose's comparison {propose:.2f} s more (medians of {repeat})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", choices=("with", "without"), help="one run of --spec into --output, as timed")
    ap.add_argument("--spec")
    ap.add_argument("--output")
    ap.add_argument("--examples", type=int, default=500_000)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="build/bench-whatif")
    args = ap.parse_args(argv)
    if args.run:
        return _one_run(args.run, args.spec, args.output)
    os.makedirs(args.out, exist_ok=True)
    spec = _data(args.out, args.examples)
    artifact = bench_runs(spec, args.out, args.pairs)
    bench_plan(artifact, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
