"""The on-the-fly feeding path with TensorFlow's own SparseCore kernels; runs inside .venv-oracle.

Started by benchmarks/feed.py as a subprocess (`.venv-oracle/bin/python
benchmarks/feed_oracle.py CONFIG.json`, with TPU_LIBRARY_PATH pointing
nowhere so tensorflow-tpu 2.20's CPU kernels run without libtpu).  Of
this repository it imports only the pipe protocol (`pipelines.child_pipe`, standard
library alone): it is the independent side of the comparison.

Per step (one host's global batch), all TensorFlow:
  TFRecord of tf.train.Example -> tf.io.parse_example (batched)
  -> vocabulary lookup (tf.lookup.StaticVocabularyTable over the artifact's
     vocabulary files, `num_oov_buckets` Fingerprint64 buckets, as the spec's
     frequency vocabularies assign OOV ids)
  -> per chip, `TPUEmbeddingV2._preprocess_features` (the code behind
     `enqueue`) on that chip's rows, with the plan's limits.

`make_parse_lookup` is also imported by feed.py (in the main venv) so both
on-the-fly paths parse and look up with the same code.

Protocol: `pipelines.child_pipe` (length-prefixed pickles on stdin/stdout).
Requests: {"op": "round", "epochs": n} -> {mode: {"seconds", "cpu_seconds", "steps"}};
{"op": "check"} -> step 0's CSR prefixes per chip and stack.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pipelines.child_pipe, not installed
from pipelines import child_pipe  # noqa: E402


def make_parse_lookup(cfg):
    """serialized [B] -> {"label", "dense" [B, D], "ids": {feature: RaggedTensor int64 [B, None]}}."""
    import tensorflow as tf
    spec = {cfg["label"]: tf.io.FixedLenFeature([], tf.float32)}
    for d in cfg["dense"]:
        spec[d] = tf.io.FixedLenFeature([], tf.float32, default_value=0.0)  # blank -> the spec's fill 0.0
    for f in cfg["features"]:
        spec[f["name"]] = tf.io.RaggedFeature(tf.string, row_splits_dtype=tf.int64)  # blank -> no value
    tables = {}
    for f in cfg["features"]:
        init = tf.lookup.TextFileInitializer(f["vocab_file"], tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                                             tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
        tables[f["name"]] = tf.lookup.StaticVocabularyTable(init, f["num_oov_buckets"])

    def parse_lookup(serialized):
        ex = tf.io.parse_example(serialized, spec)
        dense = tf.stack([ex[d] for d in cfg["dense"]], axis=1)
        ids = {f["name"]: ex[f["name"]].with_values(tables[f["name"]].lookup(ex[f["name"]].values))
               for f in cfg["features"]}
        return {"label": ex[cfg["label"]], "dense": dense, "ids": ids}

    return parse_lookup, tables


def _tf_preprocessor(cfg):
    """fn(ids {feature: ragged [host_batch, None]}) -> per chip, TF's CSR tensors of every stack."""
    import tensorflow as tf
    from tensorflow.python.tpu import tpu_embedding_v3 as v3
    from tensorflow.python.util import nest
    E = tf.tpu.experimental.embedding
    opt = E.Adagrad(learning_rate=0.05, initial_accumulator_value=0.1)  # one object: one stacking group
    chips, nsc = cfg["num_chips"], cfg["num_sc_per_chip"]
    per_chip = cfg["batch"] // chips
    tables, fc = {}, {}
    for f in cfg["features"]:
        tables[f["table"]] = tables.get(f["table"]) or E.TableConfig(
            vocabulary_size=f["vocabulary_size"], dim=f["dim"], name=f["table"], combiner=f["combiner"],
            optimizer=opt)
        fc[f["name"]] = E.FeatureConfig(table=tables[f["table"]], output_shape=[per_chip], name=f["name"])
    used = []
    for f in nest.flatten(fc):
        if f.table not in used:
            used.append(f.table)
    flat = nest.flatten_with_joined_string_paths(fc)
    s = v3._stack_tables_with_same_table_dim_and_optimizer(used, flat, chips, nsc, None)
    lim = cfg["limits"]
    emb = object.__new__(v3.TPUEmbeddingV2)
    emb._table_to_max_ids_per_sparse_core = {k: lim["max_ids_per_table"][k] for k in s.stacked_table_to_tables}
    emb._table_to_max_unique_ids_per_sparse_core = {
        k: lim["max_unique_ids_per_table"][k] for k in s.stacked_table_to_tables}
    emb._sparse_core_embedding_config = v3.SparseCoreEmbeddingConfig(
        max_ids_per_chip_per_sample=lim["max_ids_per_chip_per_sample"], allow_id_dropping=lim["allow_id_dropping"])
    names = [p for p, _ in flat]

    def preprocess(ids):
        out = []
        for c in range(chips):
            flat_inputs = [ids[n][c * per_chip:(c + 1) * per_chip] for n in names]
            res = emb._preprocess_features(
                chips, lim["max_ids_per_chip_per_sample"], 64, nsc, chips * nsc, s.stacked_table_to_tables,
                s.table_to_stacked_table_offset, s.table_to_sample_count, s.feature_to_sample_offset, flat,
                flat_inputs, [None] * len(flat_inputs))
            out.append({k: (csr.row_pointers, csr.sorted_sample_ids, csr.sorted_token_ids, csr.sorted_gains,
                            csr.num_minibatches_per_physical_sparse_core, rp, n)
                        for k, (csr, rp, n) in res.items()})
        return tuple(out)  # tf.data map functions may not return lists

    return preprocess, list(s.stacked_table_to_tables)


class Feeder:
    def __init__(self, cfg):
        import tensorflow as tf
        self.cfg = cfg
        parse_lookup, self._tables = make_parse_lookup(cfg)
        preprocess, self.stacks = _tf_preprocessor(cfg)
        raw = tf.data.TFRecordDataset(cfg["examples"]).batch(cfg["batch"], drop_remainder=True)

        def build(epochs):  # built once per epoch count, then iterated (no retracing inside the timing)
            # Mode "tf_data": everything inside the tf.data map, parallel (AUTOTUNE).
            all_in = raw.map(lambda s: (lambda x: (x["label"], x["dense"], preprocess(x["ids"])))(parse_lookup(s)),
                             num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).repeat(epochs).prefetch(2)
            # Mode "tf_function": parse + lookup in tf.data, the CSR in a tf.function per step (as enqueue
            # runs it inside the training step's function).
            parsed = raw.map(parse_lookup, num_parallel_calls=tf.data.AUTOTUNE,
                             deterministic=True).repeat(epochs).prefetch(2)
            return {"tf_data": all_in, "tf_function": parsed}

        self._build, self._datasets = build, {}
        self.step_fn = tf.function(lambda x: preprocess(x["ids"]))

    def datasets(self, epochs):
        if epochs not in self._datasets:
            self._datasets[epochs] = self._build(epochs)
        return self._datasets[epochs]

    def _loop(self, mode, epochs):
        ds = self.datasets(epochs)[mode]
        t0, c0 = time.perf_counter(), _cpu()
        steps = 0
        if mode == "tf_data":
            for _el in ds:
                steps += 1
        else:
            for el in ds:
                self.step_fn(el)
                steps += 1
        return {"seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0, "steps": steps}

    def round(self, epochs):
        if epochs not in self._datasets:  # warm up: tracing, lookup tables, thread pools
            for mode in ("tf_data", "tf_function"):
                self._loop(mode, epochs)
        return {mode: self._loop(mode, epochs) for mode in ("tf_data", "tf_function")}

    def check(self):
        """Step 0's CSR prefixes (chip -> stack -> arrays), to check both sides packed the same ids."""
        el = next(iter(self.datasets(1)["tf_function"]))
        out = []
        for chip in self.step_fn(el):
            d = {}
            for k, (rp, sids, toks, gains, _mb, r, n) in chip.items():
                r, n = int(r), int(n)
                d[k] = {"row_pointers": rp.numpy()[:r], "sorted_sample_ids": sids.numpy()[:n],
                        "sorted_token_ids": toks.numpy()[:n], "sorted_gains": gains.numpy()[:n]}
            out.append(d)
        return {"chips": out, "label": el["label"].numpy()}


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    with open(sys.argv[1]) as fh:
        cfg = json.load(fh)
    stdout = child_pipe.message_stdout()  # before TensorFlow starts: its chatter stays off the protocol stream
    feeder = Feeder(cfg)

    def handle(req):
        if req["op"] == "round":
            return feeder.round(int(req["epochs"]))
        if req["op"] == "check":
            return feeder.check()
        raise ValueError(f"unknown op {req['op']!r}")

    child_pipe.serve(handle, stdout=stdout)  # an error is answered as {"error": ...}; feed.py stops with it


if __name__ == "__main__":
    os.environ.setdefault("TPU_LIBRARY_PATH", "/nonexistent/libtpu.so")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
