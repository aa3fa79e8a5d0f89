"""`runner.run_all` on benchmarks/run_throughput.py's data, with a timeline: when each job's phases and each Beam
stage start and end.

    .venv/bin/python benchmarks/stages.py DATA_DIR|SPEC.yaml [OUT_DIR]

DATA_DIR: the `data` directory `benchmarks/run_throughput.py --out DIR` generated (its CSV spec), or a spec file
(`run_throughput.py --workload tfrecord` writes the demo's as DIR/spec-tfrecord.yaml); the jobs run with the
defaults `tpu-embed run` gets. Prints one line per event,
seconds since `run_all` started and since the line before: the jobs (`run_vocab`, `run_shard`), the
construction of their pipelines (`build_*_pipeline`), `Pipeline.run` until the runner executes its first
stage (`run_stages`: Beam's proto translation and fusion), every stage the FnApiRunner executes (its fused
name, cut to 70 characters), and inside them the first read, the reader's end, the first step built and
the shard file written. What lies between a job's first read and the reader's end is the data; the rest
is each job's fixed cost and tail (docs/benchmarks.md). The times include this
script's wrappers (a few microseconds per call).
"""

from __future__ import annotations

import functools
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
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    from pipelines import jobs, runner
    from pipelines.jobs import JobConfig, build_shards, read_examples
    from tpu_embed.artifact import io as tio

    events, start = [], [0.0]

    def mark(name: str) -> None:
        events.append((time.time() - start[0], name))

    def wrap(owner, attr: str, label: str, first_only: bool = False) -> None:
        fn, calls = getattr(owner, attr), [0]

        @functools.wraps(fn)
        def timed(*a, **k):
            calls[0] += 1
            shown = calls[0] == 1 or not first_only
            if shown:
                mark(label + " >")
            try:
                return fn(*a, **k)
            finally:
                if shown:
                    mark(label + " <")
        setattr(owner, attr, timed)

    wrap(runner, "run_vocab", "run_vocab")
    wrap(runner, "run_shard", "run_shard")
    wrap(jobs, "build_vocab_pipeline", "build_vocab_pipeline")
    wrap(jobs, "build_shard_pipeline", "build_shard_pipeline")
    wrap(beam.Pipeline, "run", "Pipeline.run")
    wrap(fn_runner.FnApiRunner, "run_stages", "run_stages")
    wrap(read_examples._ReadAndParse, "process", "first read", first_only=True)
    wrap(read_examples._ReadAndParse, "finish_bundle", "reader's end")
    wrap(build_shards._BuildStep, "process", "first step built", first_only=True)
    wrap(tio, "move", "shard file moved into place")
    execute = fn_runner.FnApiRunner._execute_bundle

    def stage(self, context, bundle_context_manager, bundle_input):
        name = bundle_context_manager.stage.name[:70]
        mark("  stage " + name + " >")
        try:
            return execute(self, context, bundle_context_manager, bundle_input)
        finally:
            mark("  stage " + name + " <")
    fn_runner.FnApiRunner._execute_bundle = stage

    spec = _spec(sys.argv[1])
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "build", "stages")
    shutil.rmtree(out, ignore_errors=True)
    cfg = JobConfig(spec=spec, output=out)  # the defaults `tpu-embed run` gets
    start[0] = time.time()
    runner.run_all(cfg, [])
    mark("end")
    before = 0.0
    for t, name in events:
        print(f"{t:7.3f} +{t - before:6.3f} {name}")
        before = t


if __name__ == "__main__":
    main()
