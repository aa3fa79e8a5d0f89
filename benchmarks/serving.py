"""Latency and throughput of the exported SavedModel on CPU, and the share of the raw-feature mapping.

    .venv/bin/python benchmarks/serving.py [--spec criteo|movielens] [--calls 300] [--out build/bench_serving]

Runs `tpu-embed run`'s jobs on the example spec's data, exports the DLRM of `tpu_embed.training.dlrm` over a
`HostEmbedding` (tables at their initial values: the time does not depend on them) with
`tpu_embed.serving.export_saved_model`, loads it back with `tf.saved_model.load`, and calls its
`serving_default` signature on serialized tf.train.Examples of the data's rows (cycled to fill a batch):
p50 and p99 latency per call and examples/s at batch 1 and 256. The mapping alone (`RawFeatureMapping.
map_examples`: parsing the Examples and mapping raw values to ids) is saved and loaded the same way and timed
on the same batches; its p50 over the whole model's p50 is the mapping's share.

What the tf.Transform output adds to `tpu-embed run`: `benchmarks/run_throughput.py --modes beam-bare,beam,beam-cold`.

Prints Markdown table rows for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _examples(spec, rows):
    import tensorflow as tf
    columns = [c for c in spec.required_columns() if c != spec.label.column]
    out = []
    for r in rows:
        feats = {c: tf.train.Feature(bytes_list=tf.train.BytesList(value=[r[c].encode()]))
                 for c in columns if r[c] != ""}
        out.append(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    return out


def _time(fn, batches, calls):
    """(p50 ms, p99 ms, examples/s) of `fn(batch)` over `calls` calls after 10 warm-up calls."""
    for b in batches[:10]:
        fn(b)
    lat = []
    n = 0
    start = time.perf_counter()
    for i in range(calls):
        b = batches[i % len(batches)]
        t = time.perf_counter()
        fn(b)
        lat.append(time.perf_counter() - t)
        n += int(b.shape[0])
    total = time.perf_counter() - start
    return float(np.percentile(lat, 50) * 1e3), float(np.percentile(lat, 99) * 1e3), n / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", choices=("criteo", "movielens"), default="criteo")
    ap.add_argument("--calls", type=int, default=300, help="timed calls per batch size")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench_serving"))
    args = ap.parse_args()

    import tensorflow as tf

    from pipelines import runner
    from pipelines.jobs import JobConfig
    from tpu_embed import HostEmbedding
    from tpu_embed.artifact.spec import load_spec
    from tpu_embed.serving import RawFeatureMapping, export_saved_model
    from tpu_embed.training.dlrm import dlrm

    spec = load_spec(os.path.join(ROOT, "examples", args.spec, "spec.yaml"))
    shutil.rmtree(args.out, ignore_errors=True)
    artifact = os.path.join(args.out, "artifact")
    runner.run_all(JobConfig(spec=spec, output=artifact))
    emb = HostEmbedding.from_artifact(artifact, seed=1)
    model = dlrm(len(spec.dense), {f.name: spec.table(f.table).dim for f in spec.categorical}, seed=1)
    model_path = export_saved_model(artifact, emb, model, os.path.join(args.out, "model"))

    mapping = RawFeatureMapping.from_artifact(artifact)
    mapping.map = tf.function(mapping.map_examples, input_signature=[tf.TensorSpec([None], tf.string)])
    mapping_path = os.path.join(args.out, "mapping")
    tf.saved_model.save(mapping, mapping_path)

    with open(spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    examples = _examples(spec, rows)
    served = tf.saved_model.load(model_path).signatures["serving_default"]
    mapped = tf.saved_model.load(mapping_path).map
    print(f"{args.spec}: {len(spec.categorical)} categorical and {len(spec.dense)} dense features, "
          f"{len(rows)} rows cycled; TensorFlow {tf.__version__}, {os.cpu_count()} CPUs")
    print("| batch | p50 (ms) | p99 (ms) | examples/s | mapping alone: p50 (ms) | mapping's share of p50 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in (1, 256):
        batches = [tf.constant([examples[(i * batch + j) % len(examples)] for j in range(batch)])
                   for i in range(max(1, len(examples) // batch) if batch > 1 else len(examples))]
        p50, p99, rate = _time(lambda b: served(examples=b), batches, args.calls)
        m50, _, _ = _time(mapped, batches, args.calls)
        print(f"| {batch} | {p50:.2f} | {p99:.2f} | {rate:,.0f} | {m50:.2f} | {m50 / p50:.0%} |")


if __name__ == "__main__":
    main()
