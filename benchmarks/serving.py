"""Serving on CPU, side by side: the exported SavedModel, its raw -> id mapping alone, and tf.Transform's serving
graph for the same vocabularies.

    .venv/bin/python benchmarks/serving.py [--spec criteo|movielens] [--calls 300] [--out build/bench_serving]

Runs `tpu-embed run`'s jobs on the example spec's data and exports the DLRM of `tpu_embed.training.dlrm` over a
`HostEmbedding` (tables at their initial values: the time does not depend on them) with
`tpu_embed.serving.export_saved_model` (its time is reported). Three callables, each saved and loaded back with
`tf.saved_model.load`, are called on the same serialized tf.train.Examples of the data's rows (every non-blank
cell a bytes value, cycled to fill a batch):

* (a) the SavedModel's `serving_default` (parse, mapping, embedding lookup, the DLRM);
* (b) the mapping alone (`RawFeatureMapping.map_examples`: the ids, weights and dense values per feature);
* (c) tf.Transform: a `tft.compute_and_apply_vocabulary` job (one vocabulary per categorical column, the spec's
  `top_k`, `frequency_threshold` and `num_oov_buckets`; dense columns `tf.strings.to_number`, blank 0) run by
  tensorflow-transform on the same rows, served as TFX serves it: `tf.io.parse_example` with the output's raw
  feature spec, then `tft.TFTransformOutput(...).transform_features_layer()`.

Each is called through a SavedModel signature, as a server calls it (tensors in, a flat dict of tensors out:
(b)'s ragged ids and (c)'s sparse ones as their component tensors, so Python does not rebuild composite
tensors on either side). For each batch size (1, 32, 256) the three are called in turn, call after call, so
that the machine's noise falls on all three alike: p50 and p99 latency per call and examples/s (examples over
the summed latencies). The ids of (b) and (c) are compared on one batch (they are the same where the
vocabulary job orders tokens as tf.Transform does). Op counts: the graph nodes each one runs (called functions
included), with and without constants, and how (b) grows with the spec: the same spec with its columns doubled
and quadrupled.

Prints Markdown for docs/benchmarks.md.
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

BATCHES = (1, 32, 256)
_NOT_COMPUTING = {"Const", "Placeholder", "Identity", "NoOp", "_Arg", "_Retval"}


def _examples(columns, rows):
    import tensorflow as tf
    out = []
    for r in rows:
        feats = {c: tf.train.Feature(bytes_list=tf.train.BytesList(value=[r[c].encode()]))
                 for c in columns if r[c] != ""}
        out.append(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    return out


def op_counts(concrete) -> tuple:
    """(graph nodes, of them computing: not constants, placeholders, identities) of a concrete function, the
    functions it calls counted at each call."""
    graph_def = concrete.graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}

    def count(nodes):
        total = computing = 0
        for node in nodes:
            total += 1
            computing += node.op not in _NOT_COMPUTING and node.op not in library and "PartitionedCall" not in node.op
            called = [node.op] if node.op in library else []
            for attr in node.attr.values():
                if attr.func.name:
                    called.append(attr.func.name)
                called += [f.name for f in attr.list.func]
            for name in called:
                if name in library:
                    t, c = count(library[name].node_def)
                    total, computing = total + t, computing + c
        return total, computing

    return count(graph_def.node)


def _tft_serving(spec, rows, columns, out_dir):
    """(loaded serving function, op counts): tf.Transform's vocabularies computed by a tft job on `rows`, served
    through `tf.io.parse_example` + `transform_features_layer()`."""
    import apache_beam as beam
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import dataset_metadata, schema_utils

    from pipelines import runner

    feature_spec = {c: tf.io.VarLenFeature(tf.string) for c in columns}
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(feature_spec))
    categorical = [(f.column, f.vocabulary) for f in spec.categorical]
    dense = [d.column for d in spec.dense]

    def preprocessing_fn(inputs):
        out = {}
        for column, v in categorical:
            out[column] = tft.compute_and_apply_vocabulary(
                inputs[column], top_k=v.top_k, frequency_threshold=v.frequency_threshold,
                num_oov_buckets=v.num_oov_buckets, vocab_filename=column)
        for column in dense:
            x = tf.sparse.to_dense(tf.sparse.map_values(tf.strings.to_number, inputs[column]))
            out[column] = tf.pad(x, [[0, 0], [0, 1]])[:, 0]
        return out

    instances = [{c: [r[c].encode()] if r[c] != "" else [] for c in columns} for r in rows]
    transform_dir = os.path.join(out_dir, "tft_transform_output")
    opts = runner.pipeline_options()
    with beam.Pipeline(runner=runner.local_runner(opts), options=opts) as p:
        with tft_beam.Context(temp_dir=os.path.join(out_dir, "tft_tmp")):
            data = p | "Rows" >> beam.Create(instances, reshuffle=False)
            transform_fn = (data, metadata) | tft_beam.AnalyzeDataset(preprocessing_fn)
            _ = transform_fn | tft_beam.WriteTransformFn(transform_dir)
    tft_output = tft.TFTransformOutput(transform_dir)

    class TftServing(tf.Module):
        def __init__(self):
            super().__init__()
            self.layer = tft_output.transform_features_layer()
            self.raw_spec = feature_spec  # the raw metadata the job was given

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, "examples")])
        def serve(self, serialized):
            return _flat(self.layer(tf.io.parse_example(serialized, self.raw_spec)))

    module = TftServing()
    concrete = module.serve.get_concrete_function()
    path = os.path.join(out_dir, "tft_serving")
    tf.saved_model.save(module, path, signatures={"serving_default": concrete})
    return tf.saved_model.load(path).signatures["serving_default"], op_counts(concrete)


def _flat(outputs) -> dict:
    """A signature's outputs: every tensor of `outputs` ({name: tensor, SparseTensor or RaggedTensor}), flat."""
    import tensorflow as tf
    out = {}
    for name, value in outputs.items():
        for i, t in enumerate(tf.nest.flatten(value, expand_composites=True)):
            out[f"{name}_{i}"] = t
    return out


def _widened_op_counts(spec, factor, out_dir):
    """Op counts of the mapping of `spec` with every column `factor` times (names suffixed), over one-token
    vocabularies (the graph does not depend on the files' lines)."""
    import tensorflow as tf

    from tpu_embed.artifact.spec import parse_spec
    from tpu_embed.serving import MappingPlan, RawFeatureMapping
    raw = spec.to_dict()
    raw["categorical"] = [dict(f, name=f"{f['name']}_{k}", column=f"{f['column']}_{k}", table=f"{f['table']}_{k}")
                          for k in range(factor) for f in raw["categorical"]]
    raw["tables"] = [dict(t, name=f"{t['name']}_{k}") for k in range(factor) for t in raw["tables"]]
    raw["dense"] = [dict(d, name=f"{d['name']}_{k}", column=f"{d['column']}_{k}") for k in range(factor)
                    for d in raw["dense"]]
    wide = parse_spec(raw, base_dir=ROOT)
    d = os.path.join(out_dir, f"wide{factor}")
    plan = MappingPlan.from_spec(wide, {k: 1 for k in wide.vocabulary_groups()}, d)
    for path in plan.vocabulary_files.values():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write("token\n")
    kinds = {c: ["bytes_list"] for c in plan.columns}
    mapping = RawFeatureMapping(plan, value_kinds=kinds)
    fn = tf.function(mapping.map_examples, input_signature=[tf.TensorSpec([None], tf.string)])
    return len(plan.columns), len(plan.features), op_counts(fn.get_concrete_function())


def _side_by_side(fns, batches, calls):
    """{name: (p50 ms, p99 ms, examples/s)}: `fns` called in turn on the same batches, after 10 warm-up calls."""
    for b in batches[:10]:
        for fn in fns.values():
            fn(b)
    lat = {name: [] for name in fns}
    examples = 0
    for i in range(calls):
        b = batches[i % len(batches)]
        examples += int(b.shape[0])
        for name, fn in fns.items():
            t = time.perf_counter()
            fn(b)
            lat[name].append(time.perf_counter() - t)
    return {name: (float(np.percentile(v, 50) * 1e3), float(np.percentile(v, 99) * 1e3), examples / sum(v))
            for name, v in lat.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", choices=("criteo", "movielens"), default="criteo")
    ap.add_argument("--calls", type=int, default=300, help="timed calls per batch size (each of the three)")
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
    t = time.perf_counter()
    model_path = export_saved_model(artifact, emb, model, os.path.join(args.out, "model"))
    export_seconds = time.perf_counter() - t

    mapping = RawFeatureMapping.from_artifact(artifact)
    mapping_fn = tf.function(lambda examples: _flat(mapping.map_examples(examples)),
                             input_signature=[tf.TensorSpec([None], tf.string, "examples")], autograph=False)
    mapping_ops = op_counts(mapping_fn.get_concrete_function())
    mapping_path = os.path.join(args.out, "mapping")
    tf.saved_model.save(mapping, mapping_path, signatures={"serving_default": mapping_fn.get_concrete_function()})

    columns = mapping.columns
    with open(spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    examples = _examples(columns, rows)
    # tf.Transform's graph here maps a column through one frequency vocabulary of its own: a spec with other
    # features (identity, hashing, delimiters, weights, columns shared) is timed without it.
    comparable = all(f.vocabulary.type == "frequency" and f.delimiter is None and not f.weight_column
                     and f.column == f.name for f in spec.categorical)
    tft_serve, tft_ops = _tft_serving(spec, rows, columns, args.out) if comparable else (None, (0, 0))

    loaded = tf.saved_model.load(model_path)
    served = loaded.signatures["serving_default"]
    model_ops = op_counts(served)
    mapped = tf.saved_model.load(mapping_path).signatures["serving_default"]

    fns = {"model": lambda b: served(examples=b), "mapping": lambda b: mapped(examples=b)}
    same = None
    if tft_serve is not None:
        # The same ids on both sides (where the vocabulary files order tokens as tf.Transform does).
        probe = tf.constant(examples[:64])
        ours, theirs = mapping.map_examples(probe), tft_serve(examples=probe)
        same = all(ours["ids"][f.name].to_list() == tf.RaggedTensor.from_sparse(tf.SparseTensor(
            theirs[f"{f.column}_0"], theirs[f"{f.column}_1"], theirs[f"{f.column}_2"])).to_list()
            for f in spec.categorical)
        fns["tft"] = lambda b: tft_serve(examples=b)
    results = {}
    for batch in BATCHES:
        batches = [tf.constant([examples[(i * batch + j) % len(examples)] for j in range(batch)])
                   for i in range(max(1, len(examples) // batch) if batch > 1 else len(examples))]
        results[batch] = _side_by_side(fns, batches, args.calls)

    ncols, nfeat = len(columns), len(spec.categorical)
    print(f"{args.spec}: {nfeat} categorical and {len(spec.dense)} dense features ({ncols} columns), "
          f"{len(rows)} rows cycled; TensorFlow {tf.__version__}, {os.cpu_count()} CPUs; "
          + (f"ids of the mapping and tf.Transform's equal: {same}" if same is not None else
             "tf.Transform's graph here does not map this spec's features as the shards do: not timed"))
    print(f"\nexport_saved_model: {export_seconds:.1f} s\n")
    print("| batch | (a) SavedModel p50 / p99 (ms) | examples/s | (b) mapping p50 / p99 (ms) | examples/s "
          "| (c) tf.Transform p50 / p99 (ms) | examples/s | (b) / (c) p50 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch, r in results.items():
        (a50, a99, ar), (m50, m99, mr) = r["model"], r["mapping"]
        tft = (f"{r['tft'][0]:.2f} / {r['tft'][1]:.2f} | {r['tft'][2]:,.0f} | {m50 / r['tft'][0]:.2f}x"
               if "tft" in r else "— | — | —")
        print(f"| {batch} | {a50:.2f} / {a99:.2f} | {ar:,.0f} | {m50:.2f} / {m99:.2f} | {mr:,.0f} | {tft} |")
    print("\n| graph | nodes | computing nodes | computing nodes per column |")
    print("| --- | ---: | ---: | ---: |")
    graphs = [("(a) SavedModel serving_default", model_ops), ("(b) mapping", mapping_ops)]
    graphs += [("(c) tf.Transform parse + layer", tft_ops)] if tft_serve is not None else []
    for name, (total, computing) in graphs:
        print(f"| {name} | {total:,} | {computing:,} | {computing / ncols:.1f} |")
    print("\n| the spec's columns | columns | categorical features | mapping nodes | computing nodes |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    print(f"| x1 | {ncols} | {nfeat} | {mapping_ops[0]:,} | {mapping_ops[1]:,} |")
    for factor in (2, 4):
        n, f, (total, computing) = _widened_op_counts(spec, factor, args.out)
        print(f"| x{factor} | {n} | {f} | {total:,} | {computing:,} |")


if __name__ == "__main__":
    main()
