"""ids/s of SparseCore CSR packing, side by side in one run: ours (kernel and public call), TF's, jax-tpu-embedding's.

Workload: 30 features, 26 univalent + 4 multivalent (1-9 ids per sample),
each on its own table, vocabularies spread log-uniformly over 10^3..2*10^6
(shuffled over the features), dim 16, combiner mean, one SGD optimizer (all
tables stack into one stacked table, in TF's stacking and in
jax-tpu-embedding's), Zipf(1.2) ids, per-chip batch 1024, 4 chips x 4
SparseCores; limits large enough to drop nothing; `--steps` distinct
per-chip batches.

Measured in `--rounds` rounds; in each, every measurement in turn takes
`--repeats` passes over the batches back to back (the steady state of a
loop that feeds one kind of input; the best pass is kept): ours, then jax's,
then TF's; figures are medians over the rounds, ratios the median of the
rounds' ratios:
  ours, kernel     the native kernel on int64 numpy arrays already in its
                   form (`csr.preprocess_stack_native`, what the shard job
                   calls; no layout work, no conversion), for each input
                   structure: every feature values + row_splits (what the
                   headline's tf.RaggedTensors hold), univalent features
                   dense + the others values + row_splits (its fastest), and
                   SparseTensor indices + values.  A public form's internal
                   path is the kernel on its structure;
  ours, public     `tpu_embed.sparsecore.preprocess(features, feature_config,
                   topology, ...)` as a user calls TF's enqueue: the TF
                   FeatureConfigs (a `ModelConfig` without TensorFlow) and one
                   chip's batch as the user has it: every feature a
                   tf.RaggedTensor (the headline), univalent dense tf.Tensor +
                   multivalent tf.RaggedTensor, every feature a
                   tf.SparseTensor, numpy (univalent 1-D arrays + RaggedIds);
  TF               TensorFlow's own kernels (`TPUEmbeddingV2._preprocess_
                   features`, tensorflow-tpu 2.20 in .venv-oracle) on the
                   headline's tf.RaggedTensors, eager and under tf.function;
  jax              jax-tpu-embedding's C++ preprocessing (0.2.0 in .venv-jax,
                   `make jax-oracle`) on the same ids: one call per global
                   batch of the 4 local chips (4 per-chip batches), in both
                   of its input forms (benchmarks/jax_preprocess.py).
ids/s counts the ids given (before dedup) per second of wall time; every
side uses the threads it uses by default (ours: TPU_EMBED_THREADS, else every
CPU; jax-tpu-embedding: its own pool).  The load average printed with each
round says how much of the machine other processes took.  Before timing,
every public form is checked to give the kernel's bytes, and TF's CSR of
step 0 ours.

Run: `make bench`, or
`TPU_EMBED_ORACLE_PYTHON=.venv-oracle/bin/python .venv/bin/python benchmarks/csr.py`
(`--no-tf` / `--no-jax` skip the baselines; a missing venv skips its column).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines import child_pipe  # noqa: E402
from tpu_embed import Topology  # noqa: E402
from tpu_embed.core.model import FeatureConfig, ModelConfig, TableConfig  # noqa: E402
from tpu_embed.sparsecore import RaggedIds, csr, preprocess, stack_tables  # noqa: E402
from tpu_embed.sparsecore.csr_types import stack_limits_of  # noqa: E402

NUM_FEATURES, UNIVALENT = 30, 26
DIM, COMBINER = 16, "mean"
BIG = 1 << 20  # max ids / unique ids per table: nothing dropped
MAX_IDS_PER_CHIP_PER_SAMPLE = 64
JAX_PYTHON = ROOT / ".venv-jax" / "bin" / "python"


def make_workload(per_chip_batch=1024, num_steps=8, seed=0):
    """(tables, features, batches): batches are per-chip {feature: (values int64, row_splits int64)}."""
    rng = np.random.default_rng(seed)
    vocabs = rng.permutation(np.round(np.geomspace(1e3, 2e6, NUM_FEATURES)).astype(np.int64))
    tables = [{"name": f"table_{i:02d}", "vocabulary_size": int(v), "dim": DIM, "combiner": COMBINER}
              for i, v in enumerate(vocabs)]
    features = [{"name": f"f{i:02d}", "table": t["name"], "output_shape": [per_chip_batch]}
                for i, t in enumerate(tables)]
    batches = []
    for _ in range(num_steps):
        b = {}
        for i, t in enumerate(tables):
            lens = np.ones(per_chip_batch, np.int64) if i < UNIVALENT else rng.integers(1, 10, per_chip_batch)
            ids = (rng.zipf(1.2, int(lens.sum())) - 1) % t["vocabulary_size"]
            b[f"f{i:02d}"] = (ids.astype(np.int64), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
        batches.append(b)
    return tables, features, batches


def is_univalent(name):
    return int(name[1:]) < UNIVALENT


def feature_configs(tables, features, topology):
    """TF's FeatureConfigs as a user builds them for TPUEmbeddingV2, else (no TensorFlow) a ModelConfig."""
    try:
        import tensorflow as tf
    except ImportError:
        tabs = {t["name"]: TableConfig(t["name"], t["vocabulary_size"], t["dim"], t["combiner"]) for t in tables}
        return ModelConfig(tuple(FeatureConfig(f["name"], tabs[f["table"]], tuple(f["output_shape"]))
                                 for f in features), topology), "ModelConfig (TensorFlow not installed)"
    emb = tf.tpu.experimental.embedding
    opt = emb.SGD(learning_rate=0.1)
    tabs = {t["name"]: emb.TableConfig(vocabulary_size=t["vocabulary_size"], dim=t["dim"], name=t["name"],
                                       combiner=t["combiner"], optimizer=opt) for t in tables}
    return ({f["name"]: emb.FeatureConfig(table=tabs[f["table"]], output_shape=f["output_shape"], name=f["name"])
             for f in features}, "tf.tpu.experimental.embedding.FeatureConfig dict")


def input_forms(batches):
    """{form: per-step batches as the user passes them} (built once, outside the timing)."""
    forms = {"numpy (1-D arrays + RaggedIds)": [{k: v[0] if is_univalent(k) else RaggedIds(*v) for k, v in b.items()}
                                                for b in batches]}
    try:
        import tensorflow as tf
    except ImportError:
        return forms
    ragged = [{k: tf.RaggedTensor.from_row_splits(v, s) for k, (v, s) in b.items()} for b in batches]
    forms = {"tf.RaggedTensor": ragged,
             "tf.Tensor + tf.RaggedTensor": [{k: tf.constant(v) if is_univalent(k) else r[k]
                                              for k, (v, _) in b.items()} for b, r in zip(batches, ragged)],
             "tf.SparseTensor": [{k: _sparse(tf, v, s) for k, (v, s) in b.items()} for b in batches],
             **forms}
    return forms


def _sparse(tf, values, splits):
    lens = np.diff(splits)
    rows = np.repeat(np.arange(lens.size), lens)
    cols = np.arange(values.size) - np.repeat(splits[:-1], lens)
    return tf.SparseTensor(np.stack([rows, cols], 1), values, [lens.size, max(1, int(lens.max()))])


# The structure of each public form: its internal path is the kernel on int64 numpy arrays of that structure.
STRUCTURE = {"tf.RaggedTensor": "ragged", "tf.Tensor + tf.RaggedTensor": "dense + ragged",
             "tf.SparseTensor": "sparse", "numpy (1-D arrays + RaggedIds)": "dense + ragged"}


def kernel_forms(batches):
    """{structure: per step, the kernel's entries {feature: (rows, ids, weights, row_splits)}}, int64 arrays:
    every feature values + row_splits; univalent ids dense, the others values + row_splits; every feature
    SparseTensor indices [n, 2] + values."""
    def indices(s):
        lens = np.diff(s)
        return np.stack([np.repeat(np.arange(lens.size), lens), np.arange(s[-1]) - np.repeat(s[:-1], lens)], 1)

    return {"ragged": [{k: (None, v, None, s) for k, (v, s) in b.items()} for b in batches],
            "dense + ragged": [{k: (None, v, None, None if is_univalent(k) else s) for k, (v, s) in b.items()}
                               for b in batches],
            "sparse": [{k: (indices(s), v, None, None) for k, (v, s) in b.items()} for b in batches]}


def best_time(fn, items, repeats):
    """Seconds per item of `fn`, the best of `repeats` passes over `items` (after one call to warm up)."""
    fn(items[0])
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        best = min(best, (time.perf_counter() - t0) / len(items))
    return best


def same_batches(a, b, what):
    assert list(a) == list(b), what
    for name in a:
        x, y = a[name], b[name]
        for field in ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains"):
            if not np.array_equal(getattr(x, field).view(np.uint32 if field == "sorted_gains" else np.int32),
                                  getattr(y, field).view(np.uint32 if field == "sorted_gains" else np.int32)):
                raise SystemExit(f"{what}: {name}.{field} differs from the kernel's")


def start_oracle(args):
    if args.no_tf:
        return None, "skipped (--no-tf)"
    sys.path.insert(0, str(ROOT / "tests" / "conformance"))
    from oracle import Oracle, oracle_python
    try:
        oracle_python()
    except RuntimeError as e:
        return None, f"skipped: {e}"
    return Oracle(), None


def start_jax(args):
    if args.no_jax:
        return None, "skipped (--no-jax)"
    if not JAX_PYTHON.exists():
        return None, f"skipped: {JAX_PYTHON.relative_to(ROOT)} is missing (`make jax-oracle` makes it)"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return child_pipe.Helper([str(JAX_PYTHON), str(ROOT / "benchmarks" / "jax_preprocess.py")], env,
                       name="jax-tpu-embedding"), None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=16, help="distinct per-chip batches (a multiple of 4)")
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per round (the best is kept)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds alternating every measurement")
    ap.add_argument("--batch", type=int, default=1024, help="per-chip batch")
    ap.add_argument("--no-tf", action="store_true", help="skip TensorFlow's kernels")
    ap.add_argument("--no-jax", action="store_true", help="skip jax-tpu-embedding")
    args = ap.parse_args(argv)
    num_chips, nsc = 4, 4
    if args.steps % num_chips:
        raise SystemExit(f"--steps must be a multiple of {num_chips} (jax packs {num_chips} chips per call)")

    tables, features, batches = make_workload(args.batch, args.steps)
    topology = Topology(num_chips, nsc)
    fc, fc_kind = feature_configs(tables, features, topology)
    layout = stack_tables(fc, topology)
    big = {s: BIG for s in layout.stacks}
    limits = stack_limits_of(layout, big, big, MAX_IDS_PER_CHIP_PER_SAMPLE, False)
    kw = dict(max_ids_per_table=big, max_unique_ids_per_table=big,
              max_ids_per_chip_per_sample=MAX_IDS_PER_CHIP_PER_SAMPLE)
    n_ids = float(np.mean([sum(v.size for v, _ in b.values()) for b in batches]))
    vocabs = sorted(t["vocabulary_size"] for t in tables)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at start; ours: Python {platform.python_version()}, numpy {np.__version__}, "
          f"native kernel {csr.native_available()}, "
          f"{csr.native_threads()} threads")
    print(f"workload: {UNIVALENT} univalent + {NUM_FEATURES - UNIVALENT} multivalent (1-9 ids) features, "
          f"vocabularies {vocabs[0]}..{vocabs[-1]}, dim {DIM}, {COMBINER}, Zipf(1.2); per-chip batch {args.batch}, "
          f"{num_chips} chips x {nsc} SparseCores; {n_ids:.0f} ids per chip batch, {args.steps} batches; "
          f"{len(layout.stacks)} stacked table(s); limits {BIG} (nothing dropped); feature_config: {fc_kind}")

    stacks = list(layout.stacks.items())
    kernels = kernel_forms(batches)
    kernel_batches = kernels["dense + ragged"]

    def internal(entries):
        return {name: csr.preprocess_stack_native(stack, layout, entries, limits[name]) for name, stack in stacks}

    def public(features_):
        return preprocess(features_, fc, topology, **kw)

    forms = input_forms(batches)
    reference = internal(kernel_batches[0])
    for structure, bs in kernels.items():
        same_batches(internal(bs[0]), reference, f"kernel on {structure} arrays")
    for form, bs in forms.items():
        same_batches(public(bs[0]), reference, f"public call on {form}")

    oracle, tf_note = start_oracle(args)
    jax, jax_note = start_jax(args)
    tf_req = None
    if oracle is not None:
        spec = lambda b: {k: {"kind": "ragged", "values": v, "row_splits": s} for k, (v, s) in b.items()}  # noqa
        tf_req = {"op": "bench", "tables": tables, "features": features, "num_chips": num_chips,
                  "num_sc_per_chip": nsc, "inputs": spec(batches[0]), "weights": None,
                  "batches": [spec(b) for b in batches], "repeats": args.repeats, "max_ids_per_table": big,
                  "max_unique_ids_per_table": big, "max_ids_per_chip_per_sample": MAX_IDS_PER_CHIP_PER_SAMPLE,
                  "allow_id_dropping": False}
        res = oracle({**tf_req, "op": "preprocess"})
        if "error" in res:
            raise SystemExit(f"TF baseline failed: {res['error']}")
        for name, b in reference.items():
            for field, ours in b.prefixes().items():
                if not np.array_equal(np.asarray(res[name][field]).view(np.uint32), ours.view(np.uint32)):
                    raise SystemExit(f"TF's {name}.{field} of step 0 differs from ours")
        print("TF: tensorflow-tpu 2.20 kernels (.venv-oracle) on the tf.RaggedTensor batches; step 0 is "
              "bit-identical to ours")
    else:
        print(f"TF: {tf_note}")
    jax_ids = None
    if jax is not None:
        glob = []
        for g in range(0, args.steps, num_chips):
            group = batches[g:g + num_chips]
            glob.append({k: (np.concatenate([b[k][0] for b in group]),
                             np.concatenate([[0]] + [b[k][1][1:] + sum(x[k][0].size for x in group[:i])
                                                     for i, b in enumerate(group)]))
                         for k in group[0]})
        res = jax({"op": "setup", "tables": tables, "features": features, "num_chips": num_chips,
                   "num_sc_per_chip": nsc, "global_batches": glob})
        if "error" in res:
            raise SystemExit(f"jax baseline failed: {res['error']}")
        jax_ids = float(np.mean(res["ids_per_batch"]))
        ours_packed = sum(int(internal(e)[s].ids_per_partition.sum()) for e in kernel_batches[:num_chips]
                          for s in layout.stacks)
        print(f"jax: {res['versions']} (.venv-jax), local_device_count = global_device_count = {num_chips}, "
              f"num_sc_per_device {nsc}, {len(res['stacks'])} stacked table(s), {jax_ids:.0f} ids per call "
              f"(one global batch = {num_chips} chip batches); limits from its stats: {res['limits']}; "
              f"{res['threads']} threads in its process after packing; "
              f"ids packed after dedup, global batch 0: jax {res['packed_ids'][0]}, ours {ours_packed}")
    else:
        print(f"jax: {jax_note}")

    headline = "tf.RaggedTensor" if "tf.RaggedTensor" in forms else next(iter(forms))
    rows = {}  # measurement -> per-round M ids/s
    ours = [(f"ours, kernel, {structure} arrays", internal, bs) for structure, bs in kernels.items()]
    ours += [(f"ours, public, {form}", public, bs) for form, bs in forms.items()]
    for r in range(args.rounds):
        # Each measurement's passes back to back (the steady state of a loop that feeds one kind of
        # input), the measurements in turn.
        got = {label: n_ids / best_time(fn, items, args.repeats) for label, fn, items in ours}
        if jax is not None:
            res = jax({"op": "bench", "repeats": args.repeats})
            if "error" in res:
                raise SystemExit(f"jax baseline failed: {res['error']}")
            for form, seconds in res.items():
                got[f"jax, {form}"] = jax_ids / seconds
        if oracle is not None:
            res = oracle(tf_req)
            if "error" in res:
                raise SystemExit(f"TF baseline failed: {res['error']}")
            got["TF, tf.function"] = n_ids / res["tf_function"]
            got["TF, eager"] = n_ids / res["eager"]
        for k, v in got.items():
            rows.setdefault(k, []).append(v / 1e6)
        print(f"round {r + 1} (load average {os.getloadavg()[0]:.2f}): "
              + "; ".join(f"{k} {v / 1e6:.1f}" for k, v in got.items()) + " (M ids/s)", flush=True)
    for helper in (oracle, jax):
        if helper is not None:
            helper.close()

    print(f"\nM ids/s, median of {args.rounds} rounds (min..max):")
    for k, v in rows.items():
        print(f"  {k:44s} {statistics.median(v):7.1f}  ({min(v):.1f}..{max(v):.1f})")

    def ratio(a, b):
        per_round = [x / y for x, y in zip(rows[a], rows[b])]
        return f"{statistics.median(per_round):.2f}x (rounds {min(per_round):.2f}..{max(per_round):.2f})"

    head = f"ours, public, {headline}"
    kernel = "ours, kernel, dense + ragged arrays"
    print("\nratios (per-round, median):")
    for form in forms:
        same = f"ours, kernel, {STRUCTURE[form]} arrays"
        print(f"  time of public {form} / kernel on {STRUCTURE[form]} arrays: {ratio(same, f'ours, public, {form}')}")
    print(f"  time of public {headline} / kernel on dense + ragged arrays (its fastest input): "
          f"{ratio(kernel, head)}")
    if oracle is not None:
        print(f"  ours public {headline} / TF tf.function: {ratio(head, 'TF, tf.function')}")
        print(f"  ours public {headline} / TF eager:       {ratio(head, 'TF, eager')}")
    if jax is not None:
        best = max(("jax, numpy", "jax, sparse"), key=lambda k: statistics.median(rows[k]))
        print(f"  ours public {headline} / {best} (jax's faster form): {ratio(head, best)}")
        print(f"  ours kernel on dense + ragged arrays / {best}: {ratio(kernel, best)}")
    numpy_t = best_time(lambda b: preprocess(b, fc, topology, implementation="numpy", **kw),
                        forms[headline], max(1, args.repeats // 2))
    print(f"\nnumpy implementation (no C kernel), public {headline}: {numpy_t * 1e3:.2f} ms/batch "
          f"({n_ids / numpy_t / 1e6:.1f} M ids/s)")


if __name__ == "__main__":
    main()
