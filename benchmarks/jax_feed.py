"""Feeding JAX training: `tpu_embed.jax.input_iterator` from shards vs jax-tpu-embedding's preprocessing on the fly.

    TPU_EMBED_JAX_PYTHON=.venv-jax/bin/python .venv/bin/python benchmarks/jax_feed.py
        [--rows 40960] [--batch 4096] [--chips 4] [--sc 4] [--epochs 3] [--rounds 5]

Workload: the Criteo sample (data/criteo_sample.csv, 200 rows; examples/criteo/spec.yaml) repeated and
shuffled (seed 0) to --rows rows, --chips chips x --sc SparseCores on one host, global batch --batch, with
`shards: {layout: jax}`; `pipelines.runner.run_all` writes the artifact (its limits planned from its own
profile). The raw batches of the on-the-fly side are the same steps' ids after the vocabulary lookup (the
parse and lookup an on-the-fly pipeline also needs are left out of its time, which favours it), per
feature in the form jax's `preprocess_sparse_dense_matmul_input` documents (an int32 [batch, 1] array where
every example has one id, else an object array of per-example int32 arrays), made once, before timing.

Timed, in alternating rounds (median of --rounds, each --epochs passes over every step):
* ours: `input_iterator(artifact, num_epochs=E, prefetch=0)` (numpy output, decoded in the caller's thread:
  one thread), `for step in it: pass`; and with the default `prefetch=2` (a reader thread);
* jax-tpu-embedding (0.2.0 in .venv-jax; this script with --serve): `preprocess_sparse_dense_matmul_input`
  of each step's host batch, FeatureSpecs stacked by its `auto_stack_tables`, its limits from its own
  statistics of every step (`update_preprocessing_parameters`, nothing dropped); its C++ thread pool as it
  comes (the thread count is printed).
"Per core" is steps per CPU-second (user + system of the whole process, every thread). Both sides' step 0
row pointers are checked equal before timing (the same ids are packed). The versions of both sides are printed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pipelines import child_pipe  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- the jax side (--serve, in .venv-jax)

class _JaxSide:
    """jax-tpu-embedding's own stacking, limits and preprocessing of the request's host batches."""

    def __init__(self, req):
        import jax
        import numpy as np
        from jax_tpu_embedding.sparsecore.lib.nn import embedding
        from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es

        self.np, self.embedding = np, embedding
        self.D, self.nsc = req["num_devices"], req["num_sc_per_device"]
        tables = {t["name"]: es.TableSpec(vocabulary_size=t["vocabulary_size"], embedding_dim=t["dim"],
                                          initializer=jax.nn.initializers.zeros,
                                          optimizer=es.SGDOptimizerSpec(learning_rate=0.1),
                                          combiner=t["combiner"], name=t["name"]) for t in req["tables"]}
        self.specs = {}
        for f in req["features"]:
            t = tables[f["table"]]
            self.specs[f["name"]] = es.FeatureSpec(name=f["name"], table_spec=t, input_shape=[f["samples"], 1],
                                                   output_shape=[f["samples"], t.embedding_dim])
        embedding.auto_stack_tables(self.specs, global_device_count=self.D, num_sc_per_device=self.nsc)
        embedding.prepare_feature_specs_for_training(self.specs, global_device_count=self.D,
                                                     num_sc_per_device=self.nsc)
        self.inputs = [self._form(step) for step in req["steps"]]
        # A first pass with limits that cannot overflow (as many ids as a step has, a buffer that holds them)
        # gives jax's statistics of every step; `update_preprocessing_parameters` installs them.
        most = max(int(ids.size) for step in req["steps"] for _, ids in step.values()) * len(self.specs) + 8
        buf = self.nsc * (-(-(most + 8 * self.D * self.nsc) // 8) * 8)
        for f in self.specs.values():
            f.table_spec.stacked_table_spec = dataclasses.replace(
                f.table_spec.stacked_table_spec, max_ids_per_partition=most, max_unique_ids_per_partition=most,
                suggested_coo_buffer_size_per_device=buf)
        stats = None
        for x in self.inputs:
            _, s = self._run(x)
            if stats is None:
                stats = s
            else:
                for field in ("max_ids_per_partition", "max_unique_ids_per_partition", "required_buffer_size_per_sc"):
                    a, b = getattr(stats, field), getattr(s, field)
                    for k in b:
                        a[k] = np.maximum(a[k], b[k])
        embedding.update_preprocessing_parameters(self.specs, stats, self.nsc)

    def _form(self, step):
        np = self.np
        out = {}
        for n, (splits, ids) in step.items():
            ids = np.asarray(ids, np.int32)
            lengths = np.diff(splits)
            if np.all(lengths == 1):
                out[n] = ids.reshape(-1, 1)
            else:
                rows = np.empty(len(lengths), dtype=object)
                rows[:] = [ids[a:b] for a, b in zip(splits[:-1], splits[1:])]
                out[n] = rows
        return out

    def _run(self, x):
        return self.embedding.preprocess_sparse_dense_matmul_input(
            x, None, self.specs, local_device_count=self.D, global_device_count=self.D,
            num_sc_per_device=self.nsc, allow_id_dropping=False)

    def step0(self):
        import importlib.metadata
        import platform

        import jax

        out, stats = self._run(self.inputs[0])
        return {"row_pointers": {k: self.np.asarray(v) for k, v in out.lhs_row_pointers.items()},
                "dropped": sum(int(v) for v in stats.id_drop_counters.values()),
                "threads": len(os.listdir("/proc/self/task")),
                "versions": f"Python {platform.python_version()}, jax-tpu-embedding "
                            f"{importlib.metadata.version('jax-tpu-embedding')}, jax {jax.__version__}"}

    def bench(self, epochs):
        dropped = 0
        c, t = _cpu(), time.perf_counter()
        for _ in range(epochs):
            for x in self.inputs:
                _, s = self._run(x)
                dropped += sum(int(v) for v in s.id_drop_counters.values())
        return {"wall": time.perf_counter() - t, "cpu": _cpu() - c, "dropped": dropped}


def serve():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)
    state = {}

    def handle(req):
        if req["op"] == "setup":
            state["side"] = _JaxSide(req)
            return state["side"].step0()
        return state["side"].bench(req["epochs"])
    child_pipe.serve(handle, stdout=child_pipe.message_stdout())


# ---------------------------------------------------------------- our side

def make_data(out: str, rows: int, seed: int = 0) -> str:
    import numpy as np
    with open(os.path.join(ROOT, "data", "criteo_sample.csv"), newline="") as fh:
        table = list(csv.reader(fh))
    header, body = table[0], table[1:]
    order = np.random.default_rng(seed).permutation(np.resize(np.arange(len(body)), rows))
    path = os.path.join(out, "data.csv")
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(body[i] for i in order)
    return path


def run_job(out: str, data: str, batch: int, chips: int, sc: int):
    import yaml

    from pipelines import runner
    from pipelines.jobs import JobConfig
    from tpu_embed.artifact.spec import parse_spec
    with open(os.path.join(ROOT, "examples", "criteo", "spec.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw["inputs"]["patterns"] = [data]
    raw["topology"] = {"num_chips": chips, "num_sc_per_chip": sc, "num_hosts": 1}
    raw["global_batch_size"] = batch
    raw["shards"] = {"layout": "jax"}
    spec = parse_spec(raw, base_dir=out)
    art = os.path.join(out, "artifact")
    t = time.perf_counter()
    runner.run_all(JobConfig(spec=spec, output=art))
    return spec, art, time.perf_counter() - t


def raw_steps(spec, art):
    """Each step's host features after the vocabulary lookup, as the shard job maps them: {feature:
    (row_splits, ids)} per step (the tail the job drops is left out here too)."""
    import collections

    from pipelines.jobs import map_to_ids
    from pipelines.mapping import ids as mapping
    from pipelines.read import parse, records, splits
    from pipelines.sharding import step_records
    from pipelines.sharding.batches import ExampleBlock
    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.sparsecore import jax_layout as J

    vocabs = map_to_ids.load_vocabularies(spec, art)
    blocks = []
    for f in splits.list_input_files(spec.input_patterns()):
        for raw in splits.read_file("csv", f, spec.required_columns()):
            if isinstance(raw, records.RawBatch):
                chunk, _ = parse.parse_batch(raw, spec)
                blocks.append(mapping.map_chunk(chunk, spec, vocabs, collections.Counter()))
    block = ExampleBlock.concat(blocks)
    B = spec.global_batch_size
    jl = J.jax_layout(load_artifact(art).model)
    return [{n: (hf.row_splits, hf.ids) for n, hf in
             step_records.jax_host_features(block.slice(s * B, (s + 1) * B), spec, jl, 0).items()}
            for s in range(block.num_examples // B)]


def ours(art, epochs, prefetch):
    from tpu_embed.jax.input import input_iterator
    c, t = _cpu(), time.perf_counter()
    n = 0
    for _ in input_iterator(art, num_epochs=epochs, prefetch=prefetch):
        n += 1
    return {"wall": time.perf_counter() - t, "cpu": _cpu() - c, "steps": n}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=40960)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--chips", type=int, default=4)
    p.add_argument("--sc", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve()
    import numpy as np

    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.jax.input import input_iterator

    out = tempfile.mkdtemp(prefix="tpu_embed-jax_feed-")
    try:
        data = make_data(out, args.rows)
        spec, art, job_s = run_job(out, data, args.batch, args.chips, args.sc)
        steps = raw_steps(spec, art)
        model = load_artifact(art).model
        chips = spec.topology.num_chips
        ids_per_step = [sum(int(ids.size) for _, ids in s.values()) for s in steps]
        python = os.environ.get("TPU_EMBED_JAX_PYTHON") or os.path.join(ROOT, ".venv-jax", "bin", "python")
        env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
        helper = child_pipe.Helper([python, os.path.abspath(__file__), "--serve"], env, name="jax-feed")
        try:
            first = helper({"op": "setup", "num_devices": chips, "num_sc_per_device": spec.topology.num_sc_per_chip,
                            "tables": [{"name": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.dim,
                                        "combiner": t.combiner} for t in model.tables],
                            "features": [{"name": f.name, "table": f.table.name, "samples": f.samples * chips}
                                         for f in model.features],
                            "steps": steps})
            mine = next(iter(input_iterator(art, prefetch=0)))
            assert first["dropped"] == 0
            for k, v in first["row_pointers"].items():
                np.testing.assert_array_equal(mine.sparse.lhs_row_pointers[k], v, err_msg=k)
            results = {"ours, prefetch=0": [], "ours, prefetch=2": [], "jax on the fly": []}
            for _ in range(args.rounds):
                results["ours, prefetch=0"].append(ours(art, args.epochs, 0))
                results["jax on the fly"].append(helper({"op": "bench", "epochs": args.epochs}))
                results["ours, prefetch=2"].append(ours(art, args.epochs, 2))
        finally:
            helper.close()
        n = len(steps) * args.epochs
        ids = sum(ids_per_step) * args.epochs
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; ours: Python "
              f"{platform.python_version()}, numpy {np.__version__}; jax side: {first['versions']}")
        print(f"workload: {args.rows} rows, {len(steps)} steps of {args.batch} examples "
              f"({statistics.mean(ids_per_step):,.0f} ids per step), {chips} chips x {spec.topology.num_sc_per_chip} "
              f"SparseCores, 1 host; {args.rounds} rounds of {args.epochs} epochs; job {job_s:.1f} s; jax's "
              f"process had {first['threads']} threads")
        base_wall = statistics.median(r["wall"] for r in results["jax on the fly"]) / n
        base_cpu = statistics.median(r["cpu"] for r in results["jax on the fly"]) / n
        print(f"{'path':<20} {'steps/s':>10} {'per core':>10} {'M ids/s':>9} {'x wall':>7} {'x per core':>10}")
        for name, rs in results.items():
            wall = statistics.median(r["wall"] for r in rs) / n
            cpu = statistics.median(r["cpu"] for r in rs) / n
            print(f"{name:<20} {1 / wall:>10.1f} {1 / cpu:>10.1f} {ids / n / wall / 1e6:>9.2f} "
                  f"{base_wall / wall:>7.2f} {base_cpu / cpu:>10.2f}")
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
