"""Feeding training from shards vs on the fly, and HostEmbedding vs a plain Keras model.

    TPU_EMBED_ORACLE_PYTHON=.venv-oracle/bin/python .venv/bin/python benchmarks/feed.py
        [--rows 40960] [--batch 4096] [--epochs 3] [--rounds 5] [--train-steps 20] [--no-tf] [--no-train]

Workload: the Criteo sample (data/criteo_sample.csv, 200 rows; examples/criteo/spec.yaml) repeated
and shuffled (seed 0) to --rows rows, 4 chips x 4 SparseCores on one host, global batch --batch.
The same rows, in the same order, are written as CSV (for the job) and as a TFRecord of
tf.train.Example (label and I1-I13 float features, absent when blank; C1-C26 bytes features,
absent when blank) for the on-the-fly paths.  `pipelines.runner.run_all` makes the shards; `run`
plans the limits from its own profile (exact maxima) and records plan-sized buffers in the manifest.

Part 1, feeding (one host, every path parses its records; timed in alternating rounds, median):
* input_fn, plan buffers: `tpu_embed.input_fn(artifact)`, `for element in ds: pass`.
* input_fn, TF default buffers: the same, with `parse_fn` given a ShardFormat whose id buffers are
  TF's default size (max_ids_per_chip_per_sample 64 x samples): what padding to them costs.
* on the fly, tpu_embed: TFRecordDataset.batch -> parse_example -> StaticVocabularyTable lookup
  (tf.data map, AUTOTUNE) -> per chip `tpu_embed.sparsecore.preprocess_with_layout` (native kernel)
  on the looked-up ids, the plan's limits.  Stops at CsrBatch (prefixes, unpadded; no tensors made),
  which favours this path.
* on the fly, TF kernels: the same parse and lookup, then `TPUEmbeddingV2._preprocess_features` per
  chip, in .venv-oracle (benchmarks/feed_oracle.py), timed in that process; two modes: all inside
  the tf.data map ("tf.data"), or parse in tf.data and the CSR in a tf.function per step.
CPU seconds (user + system of the whole process, every thread) give steps per core-second.

Part 2, training (same 4096-row steps, inputs materialised in memory first, Adagrad lr 0.05,
initial accumulator 0.1 for tables and the DLRM; `tpu_embed.training.dlrm.dlrm` on top):
* HostEmbedding: `dequeue(record)` (numpy index `prepare`, then one compiled lookup), DLRM
  forward/backward under a GradientTape, keras Adagrad on the DLRM, `apply_gradients` (one compiled
  call: sparse gradients and Adagrad on the tables).
* Keras: one tf_keras `Embedding` per feature on the looked-up ragged ids, mean combiner
  (sum over the row / max(1, row length), as SparseCore's mean), same DLRM, one keras Adagrad on
  everything (sparse IndexedSlices updates for the tables).
Both with the DLRM eager, then both with the DLRM part in a tf.function (HostEmbedding's dequeue and
apply_gradients are called from Python, each one compiled call; Keras' whole step is one tf.function),
then HostEmbedding's `train_step` helper fed by `prepare_ahead` (the numpy index of step n+1 is
prepared in a background thread while step n trains).
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import dataclasses
import itertools
import json
import os
import pstats
import resource
import shutil
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pipelines import child_pipe  # noqa: E402

TF_DEFAULT_IDS_PER_SAMPLE = 64  # TF's max_ids_per_chip_per_sample default


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- data and job

def make_data(out: str, rows: int, seed: int = 0):
    """The Criteo sample repeated and shuffled to `rows` rows: data.csv and examples.tfrecord (same order)."""
    import tensorflow as tf
    with open(os.path.join(ROOT, "data", "criteo_sample.csv"), newline="") as fh:
        table = list(csv.reader(fh))
    header, body = table[0], table[1:]
    order = np.random.default_rng(seed).permutation(np.resize(np.arange(len(body)), rows))
    picked = [body[i] for i in order]
    with open(os.path.join(out, "data.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(picked)
    with tf.io.TFRecordWriter(os.path.join(out, "examples.tfrecord")) as wr:
        for row in picked:
            feats = {}
            for name, v in zip(header, row):
                if v == "":
                    continue
                if name == "label" or name.startswith("I"):
                    feats[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(v)]))
                else:
                    feats[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
            wr.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())


def run_job(out: str, batch: int, chips: int, sc: int):
    """The real job on data.csv -> artifact directory `out/artifact`, limits planned from its profile."""
    import yaml

    from pipelines import runner
    from pipelines.jobs import JobConfig
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.artifact.spec import parse_spec
    with open(os.path.join(ROOT, "examples", "criteo", "spec.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw["inputs"]["patterns"] = [os.path.join(out, "data.csv")]
    raw["topology"] = {"num_chips": chips, "num_sc_per_chip": sc, "num_hosts": 1}
    raw["global_batch_size"] = batch
    art = os.path.join(out, "artifact")
    shutil.rmtree(art, ignore_errors=True)
    spec = parse_spec(raw, base_dir=out)
    t = time.perf_counter()
    planned_by_run = True
    try:
        runner.run_all(JobConfig(spec=spec, output=art))
        m = read_manifest(art)
        planned_by_run = m.limits is not None and m.limits.source.startswith("planned")
    except Exception as e:  # a `run` that packs with TF's default limits overflows here
        print(f"note: `run` without limits failed ({type(e).__name__}); planning explicitly", flush=True)
        planned_by_run = False
    if not planned_by_run:
        # This tree's `run` does not plan limits itself: pack with pinned large limits, plan the
        # profile (exact maxima), and run again with the plan.
        import profiles
        shutil.rmtree(art, ignore_errors=True)
        big = dict(raw, limits={"max_ids_per_chip_per_sample": 64})
        stacks = parse_spec(big, base_dir=out).layout({f"C{i}": 1000 for i in range(1, 27)}).stacks
        big["limits"].update({"max_ids_per_table": {s: 1 << 20 for s in stacks},
                              "max_unique_ids_per_table": {s: 1 << 20 for s in stacks}})
        runner.run_all(JobConfig(spec=parse_spec(big, base_dir=out), output=art + "-profile"))
        pm = read_manifest(art + "-profile")
        plan = profiles.plan(os.path.join(art + "-profile", "profiles"), spec.model(pm.vocabulary_sizes),
                             quantile="max", partition_quantile="max")
        plan_path = plan.write(os.path.join(out, "plan.json"))
        runner.run_all(JobConfig(spec=spec, output=art, plan=plan_path))
    seconds = time.perf_counter() - t
    return art, seconds, planned_by_run


def oracle_config(art: str, out: str, manifest, spec_model, batch: int) -> dict:
    from tpu_embed.artifact.spec import load_spec
    spec = load_spec(os.path.join(art, "spec.yaml"))
    vocabs = {k: v for k, v in (manifest.vocabularies or {}).items()}
    feats = []
    for f in spec_model.features:
        info = manifest.features[f.name]
        feats.append({"name": f.name, "table": f.table.name, "vocabulary_size": f.table.vocabulary_size,
                      "dim": f.table.dim, "combiner": f.table.combiner,
                      "vocab_file": os.path.join(art, info.vocabulary_file),
                      "num_oov_buckets": int(vocabs[info.vocabulary_key].num_oov_buckets)})
    lim = manifest.limits
    return {"examples": os.path.join(out, "examples.tfrecord"), "batch": batch, "label": spec.label.column,
            "dense": [d.name for d in spec.dense], "features": feats,
            "num_chips": spec.topology.num_chips, "num_sc_per_chip": spec.topology.num_sc_per_chip,
            "limits": {"max_ids_per_chip_per_sample": int(lim.max_ids_per_chip_per_sample),
                       "max_ids_per_table": dict(lim.max_ids_per_table),
                       "max_unique_ids_per_table": dict(lim.max_unique_ids_per_table),
                       "allow_id_dropping": bool(lim.allow_id_dropping)}}


class OracleFeeder(child_pipe.Helper):
    """benchmarks/feed_oracle.py in .venv-oracle (TF's SparseCore CPU kernels), over `pipelines.child_pipe`."""

    def __init__(self, config_path: str):
        python = os.environ.get("TPU_EMBED_ORACLE_PYTHON") or os.path.join(ROOT, ".venv-oracle", "bin", "python")
        env = dict(os.environ, TPU_LIBRARY_PATH="/nonexistent/libtpu.so", TF_CPP_MIN_LOG_LEVEL="3",
                   CUDA_VISIBLE_DEVICES="")
        super().__init__([python, os.path.join(ROOT, "benchmarks", "feed_oracle.py"), config_path], env,
                         name="feed_oracle.py")

    def __call__(self, req: dict) -> dict:
        resp = super().__call__(req)
        if "error" in resp:
            raise RuntimeError(f"feed_oracle.py: {resp['error']}")
        return resp

    def close(self, timeout: float = 60) -> None:
        super().close(timeout)


# ---------------------------------------------------------------- part 1: feeding

def buffer_bytes(fmt) -> int:
    """Bytes of the padded CSR tensors of one step (every chip and stack): int32/float32 buffers."""
    return fmt.chips_per_host * sum(rp * 4 + ids * 12 for _, rp, ids in fmt.stacks)


def tf_default_format(fmt, layout):
    from tpu_embed.sparsecore import buffer_sizes
    stacks = tuple((name, rp, buffer_sizes(layout.stacks[name], layout.topology, TF_DEFAULT_IDS_PER_SAMPLE).ids)
                   for name, rp, _ in fmt.stacks)
    return dataclasses.replace(fmt, stacks=stacks)


def input_fn_with_format(art: str, fmt, epochs: int):
    """`tpu_embed.input_fn` itself, its `parse_fn` handed `fmt` instead of the manifest's format."""
    from tpu_embed.training import input as training_input
    original = training_input.parse_fn
    training_input.parse_fn = lambda _manifest_fmt: original(fmt)
    try:
        return training_input.input_fn(art, num_epochs=epochs)
    finally:
        training_input.parse_fn = original


def time_input_fn(ds, in_graph: bool = False):
    """Iterate a dataset once: `for element in ds: pass` (eager tensors), or in-graph with `ds.reduce`."""
    import tensorflow as tf
    t0, c0 = time.perf_counter(), _cpu()
    if in_graph:
        steps = int(ds.reduce(tf.constant(0, tf.int64), lambda n, _el: n + 1))
    else:
        steps = 0
        for _el in ds:
            steps += 1
    return {"seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0, "steps": steps}


class OnTheFly:
    """Examples -> parse_example -> vocabulary lookup (tf.data) -> per-chip native CSR (tpu_embed)."""

    def __init__(self, cfg: dict, layout, limits):
        import tensorflow as tf
        from feed_oracle import make_parse_lookup
        parse_lookup, self._tables = make_parse_lookup(cfg)
        self.parsed = tf.data.TFRecordDataset(cfg["examples"]).batch(cfg["batch"], drop_remainder=True).map(
            parse_lookup, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        self.ds = self.parsed.prefetch(2)  # one epoch
        self._repeated = {}
        self.layout, self.names = layout, [f["name"] for f in cfg["features"]]
        self.chips, self.per_chip = cfg["num_chips"], cfg["batch"] // cfg["num_chips"]
        self.kwargs = dict(max_ids_per_chip_per_sample=limits.max_ids_per_chip_per_sample,
                           max_ids_per_table=dict(limits.max_ids_per_table),
                           max_unique_ids_per_table=dict(limits.max_unique_ids_per_table),
                           allow_id_dropping=limits.allow_id_dropping)

    def step(self, el):
        from tpu_embed.sparsecore import RaggedIds, preprocess_with_layout
        flat = {n: (el["ids"][n].values.numpy(), el["ids"][n].row_splits.numpy()) for n in self.names}
        out = []
        b = self.per_chip
        for c in range(self.chips):
            feats = {}
            for n, (values, splits) in flat.items():
                s = splits[c * b:(c + 1) * b + 1]
                feats[n] = RaggedIds(values[s[0]:s[-1]], s - s[0])
            out.append(preprocess_with_layout(feats, self.layout, **self.kwargs))
        return out

    def time(self, epochs: int):
        if epochs not in self._repeated:  # built once, iterated per measurement
            self._repeated[epochs] = self.parsed.repeat(epochs).prefetch(2)
        ds = self._repeated[epochs]
        t0, c0 = time.perf_counter(), _cpu()
        steps = 0
        for el in ds:
            self.step(el)
            steps += 1
        return {"seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0, "steps": steps}


def _prefixes(x) -> dict:
    """The meaningful prefixes of a chip's stack: a CsrBatch, a decoded shard record's dict, or TF's (sliced)."""
    get = (lambda k: x[k]) if isinstance(x, dict) else (lambda k: getattr(x, k))  # noqa: E731
    try:
        r, n = int(get("row_pointers_unpadded_size")), int(get("ids_unpadded_size"))
    except (KeyError, AttributeError):
        r = n = None
    out = {}
    for k in ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains"):
        a = np.asarray(get(k))
        out[k] = a[:(r if k == "row_pointers" else n)] if r is not None else a
    return out


def same_csr(chip: dict, record_chip: dict) -> bool:
    """True if a chip's CSR prefixes equal a shard record's (gains compared as float32 bits)."""
    if set(chip) != set(record_chip):
        return False
    for stack in record_chip:
        got, want = _prefixes(chip[stack]), _prefixes(record_chip[stack])
        for k, w in want.items():
            g = got[k]
            if g.shape != w.shape or not np.array_equal(g.view(np.int32), w.view(np.int32)):
                return False
    return True


# ---------------------------------------------------------------- part 2: training

def keras_model(names, vocab_sizes, dim, num_dense, seed=0):
    import tensorflow as tf
    import tf_keras as keras

    from tpu_embed.training.dlrm import dlrm

    class KerasDLRM(keras.Model):
        def __init__(self):
            super().__init__(name="keras_dlrm")
            self.emb = {n: keras.layers.Embedding(vocab_sizes[n], dim, name=f"emb_{n}") for n in names}
            self.top = dlrm(num_dense, {n: dim for n in names}, seed=seed)

        def embed(self, ids):
            out = {}
            for n in names:
                x = ids[n]
                e = self.emb[n](x)  # ragged [B, None, dim]
                total = tf.reduce_sum(e, axis=1)
                count = tf.cast(tf.maximum(x.row_lengths(), 1), tf.float32)[:, None]
                out[n] = total / count  # the mean combiner (0 for a row without ids)
            return out

        def call(self, inputs):
            return self.top({"dense": inputs["dense"], "embeddings": self.embed(inputs["ids"])})

    return KerasDLRM()


def make_trainers(art: str, records, raw_steps, names):
    import tensorflow as tf
    import tf_keras as keras

    from tpu_embed import HostEmbedding
    from tpu_embed.training.dlrm import dlrm

    def bce(label, logits):
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))

    emb = HostEmbedding.from_artifact(art, seed=0)
    emb.build()
    dims = {f.name: f.table.dim for f in emb.model.features}
    table_of = {f.name: f.table.name for f in emb.model.features}
    top = dlrm(13, dims, seed=0)
    opt_he = keras.optimizers.Adagrad(learning_rate=0.05, initial_accumulator_value=0.1)

    def he_eager(rec):
        acts, preserved = emb.dequeue(rec)
        with tf.GradientTape() as tape:
            tape.watch(acts)
            loss = bce(rec["label"], top({"dense": rec["dense"], "embeddings": acts}))
        g_model, g_acts = tape.gradient(loss, (top.trainable_variables, acts))
        opt_he.apply_gradients(zip(g_model, top.trainable_variables))
        emb.apply_gradients(g_acts, preserved)
        return loss

    @tf.function(reduce_retracing=True)
    def he_dense(acts, dense, label):
        with tf.GradientTape() as tape:
            tape.watch(acts)
            loss = bce(label, top({"dense": dense, "embeddings": acts}))
        g_model, g_acts = tape.gradient(loss, (top.trainable_variables, acts))
        opt_he.apply_gradients(zip(g_model, top.trainable_variables))
        return loss, g_acts

    def he_fn(rec):
        acts, preserved = emb.dequeue(rec)
        loss, g_acts = he_dense(acts, rec["dense"], rec["label"])
        emb.apply_gradients(g_acts, preserved)
        return loss

    vocab = {n: int(emb.tables[table_of[n]].shape[0]) for n in names}
    km = keras_model(names, vocab, next(iter(dims.values())), 13, seed=0)
    opt_k = keras.optimizers.Adagrad(learning_rate=0.05, initial_accumulator_value=0.1)
    km(raw_steps[0])  # build
    for n in names:  # same starting tables
        km.emb[n].embeddings.assign(emb.tables[table_of[n]])
    # Same model: the activations of step 0 agree (HostEmbedding from CSR, Keras from raw ids).
    acts, _ = emb.dequeue(records[0])
    kacts = km.embed(raw_steps[0]["ids"])
    worst = max(float(tf.reduce_max(tf.abs(acts[n] - kacts[n]))) for n in names)
    if worst > 1e-5:
        raise SystemExit(f"HostEmbedding and the Keras model disagree on step 0's activations (max |diff| {worst})")
    emb._state.last_step = None

    def k_eager(x):
        with tf.GradientTape() as tape:
            loss = bce(x["label"], km(x))
        grads = tape.gradient(loss, km.trainable_variables)
        opt_k.apply_gradients(zip(grads, km.trainable_variables))
        return loss

    k_fn = tf.function(k_eager, reduce_retracing=True)

    # The helper: the same three compiled calls as he_fn, `prepare` one step ahead in a background thread.
    # `time_train` hands it inputs[i]; the prefetching iterator cycles through the same records in order.
    step = emb.train_step(lambda acts, b: top({"dense": b["dense"], "embeddings": acts}),
                          lambda b, logits: bce(b["label"], logits), opt_he, variables=lambda: top.trainable_variables)
    ahead = emb.prepare_ahead(itertools.cycle(records))

    def he_train_step(_rec):
        record, prepared = next(ahead)
        return step(record, prepared)

    return {"HostEmbedding, DLRM eager": (he_eager, records), "Keras Embedding, eager": (k_eager, raw_steps),
            "HostEmbedding, DLRM in tf.function": (he_fn, records),
            "Keras Embedding, tf.function": (k_fn, raw_steps),
            "HostEmbedding, train_step + prepare_ahead": (he_train_step, records)}, worst


def time_train(fn, inputs, steps: int):
    t0, c0 = time.perf_counter(), _cpu()
    for i in range(steps):
        loss = fn(inputs[i % len(inputs)])
    float(loss)
    return {"seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0, "steps": steps}


def profile_host_embedding(fn, inputs, steps: int, top: int):
    prof = cProfile.Profile()
    prof.enable()
    for i in range(steps):
        fn(inputs[i % len(inputs)])
    prof.disable()
    st = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():
        short = file.replace(ROOT + "/", "")
        if "site-packages/" in short:
            short = short.split("site-packages/", 1)[1]
        rows.append((ct, tt, nc, f"{short}:{line}({func})"))
    total = sum(r[1] for r in rows)
    out = [f"cProfile of {steps} HostEmbedding steps (DLRM in tf.function, prepare inline): "
           f"{total / steps * 1e3:.1f} ms/step profiled "
           f"(profiler overhead included); top {top} by own time, then top {top} tpu_embed functions by "
           "cumulative time (ms per step):"]
    out.append("  own ms  cum ms   calls/step  function")
    for ct, tt, nc, name in sorted(rows, key=lambda r: -r[1])[:top]:
        out.append(f"  {tt / steps * 1e3:6.2f}  {ct / steps * 1e3:6.2f}  {nc / steps:10.1f}  {name}")
    out.append("  ---")
    for ct, tt, nc, name in sorted((r for r in rows if r[3].startswith("tpu_embed/")), key=lambda r: -r[0])[:top]:
        out.append(f"  {tt / steps * 1e3:6.2f}  {ct / steps * 1e3:6.2f}  {nc / steps:10.1f}  {name}")
    return "\n".join(out)


# ---------------------------------------------------------------- main

def rate_row(name, results, ids_per_step):
    steps_s = [r["steps"] / r["seconds"] for r in results]
    per_core = [r["steps"] / r["cpu_seconds"] for r in results]
    med, core = float(np.median(steps_s)), float(np.median(per_core))
    cores = float(np.median([r["cpu_seconds"] / r["seconds"] for r in results]))
    row = {"name": name, "steps_s": med, "min": min(steps_s), "max": max(steps_s), "core": core, "cores": cores,
           "ids_s": med * ids_per_step if ids_per_step else None}
    return row


def print_table(rows, base, unit="steps/s", ids=True):
    head = f"| path | {unit} (median) | min–max | "
    head += "M ids/s | " if ids else ""
    head += "cores busy | steps per core-second | × baseline (wall) | × baseline (per core) |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for r in rows:
        line = f"| {r['name']} | {r['steps_s']:.1f} | {r['min']:.1f}–{r['max']:.1f} | "
        if ids:
            line += f"{r['ids_s'] / 1e6:.2f} | "
        line += (f"{r['cores']:.2f} | {r['core']:.1f} | {r['steps_s'] / base['steps_s']:.2f}× | "
                 f"{r['core'] / base['core']:.2f}× |")
        print(line)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=40960, help="rows (the 200-row sample repeated and shuffled)")
    ap.add_argument("--batch", type=int, default=4096, help="global batch (one host)")
    ap.add_argument("--chips", type=int, default=4)
    ap.add_argument("--sc", type=int, default=4, help="SparseCores per chip")
    ap.add_argument("--epochs", type=int, default=3, help="passes over the steps per timed feeding measurement")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (feeding and training)")
    ap.add_argument("--train-steps", type=int, default=20, help="training steps per timed measurement")
    ap.add_argument("--profile-top", type=int, default=12, help="cProfile entries printed (0: no profile)")
    ap.add_argument("--no-tf", action="store_true", help="skip TF's kernels (.venv-oracle)")
    ap.add_argument("--no-train", action="store_true", help="skip part 2")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench_feed"))
    args = ap.parse_args(argv)

    import tensorflow as tf

    from tpu_embed import input_fn
    from tpu_embed.artifact import shard_records, tfrecord
    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.sparsecore.csr import native_available, native_threads
    from tpu_embed.sparsecore.layout import layout_of

    os.makedirs(args.out, exist_ok=True)
    t = time.perf_counter()
    make_data(args.out, args.rows)
    data_s = time.perf_counter() - t
    art, job_s, planned_by_run = run_job(args.out, args.batch, args.chips, args.sc)
    m = read_manifest(art)
    artifact = load_artifact(art)
    layout, fmt = layout_of(artifact.model), m.shard_format
    steps = int(m.counts.steps)
    shard_bytes = sum(os.path.getsize(p) for p in shard_records.shard_files(art, 0, m)) / steps
    fmt_tf = tf_default_format(fmt, layout)
    lim = m.limits
    cfg = oracle_config(art, args.out, m, artifact.model, args.batch)
    cfg_path = os.path.join(args.out, "oracle_config.json")
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh)
    onthefly = OnTheFly(cfg, layout, lim)
    per_step_ids = [sum(int(v.values.shape[0]) for v in el["ids"].values()) for el in onthefly.ds]
    ids_per_step = float(np.mean(per_step_ids))
    if len(per_step_ids) != steps:
        raise SystemExit(f"the examples file has {len(per_step_ids)} steps, the shards {steps}")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start; TF {tf.__version__}; "
          f"native kernel: {native_available()}, "
          f"threads: {native_threads()}")
    if not native_available():
        print("WARNING: the native CSR kernel is not loaded; figures are for the numpy fallback")
    print(f"workload: Criteo sample x {args.rows / 200:g} = {args.rows} rows (seed 0 shuffle), global batch "
          f"{args.batch}, {args.chips} chips x {args.sc} SCs, 1 host, {steps} steps, {ids_per_step:,.0f} ids/step, "
          f"{len(layout.stacks)} stack(s); data written in {data_s:.1f} s; job (run_all) {job_s:.1f} s; "
          f"limits: {m.limits.source}" + ("" if planned_by_run else " (planned by this script)"))
    print(f"plan: max_ids_per_chip_per_sample {lim.max_ids_per_chip_per_sample}, max_ids_per_table "
          f"{sorted(lim.max_ids_per_table.values())}, max_unique_ids_per_table "
          f"{sorted(lim.max_unique_ids_per_table.values())}")
    print(f"CSR tensors per step: plan buffers {buffer_bytes(fmt) / 1e6:.2f} MB (ids buffer "
          f"{fmt.stacks[0][2]:,}/chip/stack), TF default buffers {buffer_bytes(fmt_tf) / 1e6:.2f} MB (ids buffer "
          f"{fmt_tf.stacks[0][2]:,}); the plan saves {(buffer_bytes(fmt_tf) - buffer_bytes(fmt)) / 1e6:.2f} MB "
          f"per step ({buffer_bytes(fmt_tf) / buffer_bytes(fmt):.1f}x less); shard record "
          f"{shard_bytes / 1e6:.2f} MB/step")


    # Same ids everywhere: step 0 packed on the fly (ours, and TF's kernels) equals the shards' step 0.
    rec0 = shard_records.decode_record(tfrecord.read_records(shard_records.shard_files(art, 0, m)[0])[0], fmt)
    el0 = next(iter(onthefly.ds))
    if not np.array_equal(el0["label"].numpy(), rec0["label"]):
        raise SystemExit("the examples file and the shards disagree on step 0's labels")
    ours0 = onthefly.step(el0)
    check = [same_csr(ours0[c], rec0["sparse_core"][c]) for c in range(args.chips)]
    oracle = None
    if not args.no_tf:
        oracle = OracleFeeder(cfg_path)
        tf0 = oracle({"op": "check"})
        check += [same_csr(tf0["chips"][c], rec0["sparse_core"][c]) for c in range(args.chips)]
    print(f"check: step 0 packed on the fly ({'tpu_embed and TF' if oracle else 'tpu_embed'}) equals the "
          f"shards' step 0 on every chip: {all(check)}")
    if not all(check):
        raise SystemExit("on-the-fly CSR differs from the shards")

    # ---- part 1
    # Each dataset is built once (input_fn reads the manifest and traces parse_fn) and iterated per round.
    ds_plan = input_fn(art, num_epochs=args.epochs)
    ds_tfbuf = input_fn_with_format(art, fmt_tf, args.epochs)
    for ds in (ds_plan, ds_tfbuf):  # warm up
        time_input_fn(ds)
    time_input_fn(ds_plan, in_graph=True)
    onthefly.time(args.epochs)
    feed = {k: [] for k in ("plan", "plan_graph", "tfbuf", "ours", "tf_data", "tf_function")}
    for r in range(args.rounds):
        feed["plan"].append(time_input_fn(ds_plan))
        feed["plan_graph"].append(time_input_fn(ds_plan, in_graph=True))
        feed["tfbuf"].append(time_input_fn(ds_tfbuf))
        feed["ours"].append(onthefly.time(args.epochs))
        line = (f"round {r + 1}: input_fn {feed['plan'][-1]['steps'] / feed['plan'][-1]['seconds']:.1f} steps/s, "
                f"TF-size buffers {feed['tfbuf'][-1]['steps'] / feed['tfbuf'][-1]['seconds']:.1f}, on the fly "
                f"(tpu_embed) {feed['ours'][-1]['steps'] / feed['ours'][-1]['seconds']:.2f}")
        if oracle is not None:
            res = oracle({"op": "round", "epochs": args.epochs})
            for k in ("tf_data", "tf_function"):
                feed[k].append(res[k])
            line += (f", on the fly (TF, tf.data) {res['tf_data']['steps'] / res['tf_data']['seconds']:.2f}, "
                     f"(TF, tf.function) {res['tf_function']['steps'] / res['tf_function']['seconds']:.2f}")
        print(line + f"; load average {os.getloadavg()[0]:.2f}", flush=True)
    if oracle is not None:
        oracle.close()
    names = {"plan": "input_fn, plan buffers (shards)",
             "plan_graph": "input_fn, plan buffers, consumed in-graph (ds.reduce)",
             "tfbuf": "input_fn, TF default buffers (shards)",
             "ours": "on the fly: parse + lookup + tpu_embed native CSR",
             "tf_data": "on the fly: parse + lookup + TF kernels, all in tf.data (.venv-oracle)",
             "tf_function": "on the fly: parse + lookup in tf.data, TF kernels in tf.function (.venv-oracle)"}
    rows = {k: rate_row(names[k], v, ids_per_step) for k, v in feed.items() if v}
    otf = [rows[k] for k in ("ours", "tf_data", "tf_function") if k in rows]
    fastest_wall = max(otf, key=lambda r: r["steps_s"])
    fastest_core = max(otf, key=lambda r: r["core"])
    print()
    print(f"Feeding one host ({args.rounds} rounds x {args.epochs} epochs x {steps} steps; baseline = the fastest "
          f"on-the-fly path: {fastest_wall['name']})")
    print()
    print_table(list(rows.values()), fastest_wall)
    print()
    print(f"input_fn (plan buffers) vs the fastest on-the-fly path: "
          f"{rows['plan']['steps_s'] / fastest_wall['steps_s']:.1f}x "
          f"wall, {rows['plan']['core'] / fastest_core['core']:.1f}x per core (fastest per core: "
          f"{fastest_core['name']}); target >= 10x per host core")
    print(f"padding to TF's default buffers: {rows['tfbuf']['steps_s']:.1f} vs {rows['plan']['steps_s']:.1f} "
          f"steps/s ({rows['plan']['steps_s'] / rows['tfbuf']['steps_s']:.1f}x slower), "
          f"{buffer_bytes(fmt_tf) / 1e6:.1f} vs {buffer_bytes(fmt) / 1e6:.2f} MB of CSR tensors per step")
    if oracle is not None:
        tf_best = max(rows["tf_data"]["steps_s"], rows["tf_function"]["steps_s"])
        print(f"tpu_embed's on-the-fly path vs TF's best: {rows['ours']['steps_s'] / tf_best:.2f}x wall")

    if args.no_train:
        return
    # ---- part 2
    records = list(input_fn(art))  # materialised: eager tensors, one dict per step
    raw_steps = list(onthefly.ds)
    feat_names = [f.name for f in artifact.model.features]
    trainers, worst = make_trainers(art, records, raw_steps, feat_names)
    print()
    print(f"training: {len(records)} distinct steps of {args.batch} rows in memory, {args.train_steps} steps per "
          f"measurement; step 0's activations agree (max |diff| {worst:.1e})")
    for fn, inputs in trainers.values():  # warm up (traces)
        time_train(fn, inputs, 2)
    train = {k: [] for k in trainers}
    for r in range(args.rounds):
        parts = []
        for k, (fn, inputs) in trainers.items():
            train[k].append(time_train(fn, inputs, args.train_steps))
            parts.append(f"{k} {train[k][-1]['steps'] / train[k][-1]['seconds']:.2f}")
        print(f"round {r + 1} (steps/s): " + "; ".join(parts) + f"; load average {os.getloadavg()[0]:.2f}",
              flush=True)
    trows = {k: rate_row(k, v, None) for k, v in train.items()}
    print()
    print("Training steps on CPU (baseline: Keras in the same mode)")
    print()
    keys = list(trainers)
    for he, ke in ((keys[0], keys[1]), (keys[2], keys[3])):
        print_table([trows[he], trows[ke]], trows[ke], ids=False)
        print()
    print_table([trows[keys[4]], trows[keys[3]]], trows[keys[3]], ids=False)
    print()
    best_he = max(trows[keys[0]]["steps_s"], trows[keys[2]]["steps_s"], trows[keys[4]]["steps_s"])
    best_k = max(trows[keys[1]]["steps_s"], trows[keys[3]]["steps_s"])
    print(f"HostEmbedding / Keras: DLRM eager {trows[keys[0]]['steps_s'] / trows[keys[1]]['steps_s']:.2f}x, "
          f"DLRM in tf.function {trows[keys[2]]['steps_s'] / trows[keys[3]]['steps_s']:.2f}x, train_step + "
          f"prepare_ahead {trows[keys[4]]['steps_s'] / trows[keys[3]]['steps_s']:.2f}x, best vs best "
          f"{best_he / best_k:.2f}x; target >= 1x")
    if args.profile_top:
        print()
        fn, inputs = trainers[keys[2]]
        print(profile_host_embedding(fn, inputs, args.train_steps, args.profile_top))


if __name__ == "__main__":
    main()
