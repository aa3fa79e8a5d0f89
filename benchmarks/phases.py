"""`runner.run_all` on benchmarks/run_throughput.py's data, with the vocabulary and shard jobs timed apart.

    .venv/bin/python benchmarks/phases.py DATA_DIR|SPEC.yaml [OUT_DIR]

DATA_DIR: the `data` directory `benchmarks/run_throughput.py --out DIR` generated (its CSV spec), or a spec file
(`run_throughput.py --workload tfrecord` writes the demo's as DIR/spec-tfrecord.yaml); the jobs run with the
defaults `tpu-embed run` gets. Prints one line: imports, each
job's wall and CPU time (the CPU time of this process: a profile child's is not included), the total
without imports, and examples/s. Runs the tree this script is in, so two checkouts can be measured
alternately in the same minutes (docs/benchmarks.md):

    for i in 1 2 3; do for t in ../base .; do (cd $t && python benchmarks/phases.py DATA /tmp/out); done; done

and profiled with py-spy: `py-spy record -r 100 --threads --idle -f raw -o F -- python benchmarks/phases.py DATA`.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import run_throughput as bench  # benchmarks/run_throughput.py: this script's directory is first on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spec(arg: str):
    """`run_throughput.py`'s CSV spec over DATA_DIR, or the spec file SPEC."""
    if arg.endswith((".yaml", ".yml")):
        from tpu_embed.artifact.spec import load_spec
        return load_spec(arg)
    return bench.bench_spec(os.path.abspath(arg), 4096)


def main() -> None:
    t0 = time.time()
    from pipelines import runner
    from pipelines.jobs import JobConfig
    spec = _spec(sys.argv[1])
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "build", "phases")
    shutil.rmtree(out, ignore_errors=True)
    cfg = JobConfig(spec=spec, output=out)  # the defaults `tpu-embed run` gets
    times = {}

    def timed(name, fn):
        def run(*a, **k):
            w, c = time.time(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                times[name] = (time.time() - w, time.process_time() - c)
        return run

    runner.run_vocab, runner.run_shard = timed("run_vocab", runner.run_vocab), timed("run_shard", runner.run_shard)
    t1 = time.time()
    m = runner.run_all(cfg, [])
    t2 = time.time()
    n = m.counts.examples_written
    jobs = " ".join(f"{k} {w:.2f}s (cpu {c:.2f}s)" for k, (w, c) in times.items())
    print(f"imports {t1 - t0:.2f}s {jobs} total {t2 - t1:.2f}s examples {n} -> {n / (t2 - t1):,.0f} ex/s")


if __name__ == "__main__":
    main()
