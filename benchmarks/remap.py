"""Time and peak memory of `tpu-embed remap` on a table of 10^7 rows (or --rows), for each --dims.

    .venv/bin/python benchmarks/remap.py --rows 10000000 --dims 16,32 --out build/bench-remap [--repeat 3]

Workload, per dim: a spec with one frequency feature `C1` (1 OOV bucket) on an Adagrad table, so the
checkpoint holds the table and its accumulators, [rows + 1, dim] float32 each. Artifact A and artifact B
are made by `tpu-embed vocab` on a tiny CSV, then their vocabulary files are replaced by synthetic ones
of --rows tokens (16 hex digits each) and their manifests updated to match (sizes, sha256): B keeps
--keep of A's tokens, in a random order, and adds new ones (a daily rebuild whose frequency order was
reshuffled, the worst case for locality). A's checkpoint is a `HostEmbedding` built on A, saved by
`tf.train.Checkpoint` (in a process of its own).

Measured: `tpu-embed remap --from A --to B --checkpoint CKPT --output OUT --overwrite` as a user runs it,
in a process of its own, --repeat times: wall time, CPU time (user + system) and peak RSS (`ru_maxrss`
of the child, from `wait4`). Then, once, the output is checked with TensorFlow's own reader on
--check random rows of each tensor (kept rows equal A's, new rows hold the initial values).
"""

from __future__ import annotations

import argparse
import binascii
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PY = sys.executable

SPEC = """\
name: bench_remap
inputs: {{format: csv, patterns: [tiny.csv]}}
label: {{column: label}}
categorical: [C1]
defaults: {{categorical: {{vocabulary: {{type: frequency, num_oov_buckets: 1}}}}}}
tables: [{{name: C1, dim: {dim}}}]
optimizer: {{type: adagrad, learning_rate: 0.05, initial_accumulator: 0.1}}
topology: {{num_chips: 1, num_sc_per_chip: 4, num_hosts: 1}}
global_batch_size: 8
"""


def tokens_bytes(values: np.ndarray) -> bytes:
    """One line per value: its 16 hex digits."""
    hexed = np.frombuffer(binascii.hexlify(values.astype(">u8").tobytes()), np.uint8).reshape(-1, 16)
    return np.concatenate([hexed, np.full((hexed.shape[0], 1), 10, np.uint8)], axis=1).tobytes()


def make_artifact(directory: str, spec_path: str, tokens: bytes, n: int) -> None:
    from pipelines import runner
    from pipelines.jobs import JobConfig
    from tpu_embed.artifact.spec import load_spec
    runner.run_vocab(JobConfig(spec=load_spec(spec_path), output=directory))
    path = os.path.join(directory, "vocab", "C1.txt")
    with open(path, "wb") as fh:
        fh.write(tokens)
    m_path = os.path.join(directory, "manifest.json")
    with open(m_path) as fh:
        m = json.load(fh)
    v = m["vocabularies"]["C1"]
    v.update(size=n, distinct_tokens=n, tokens_counted=n, tokens_covered=n, coverage=1.0, empty_vocabulary_dummy=False)
    m["features"]["C1"].update(vocabulary_size=n, table_vocabulary_size=n + 1)
    for f in m["files"]:
        if f["path"] == "vocab/C1.txt":
            f.update(sha256=hashlib.sha256(tokens).hexdigest(), bytes=len(tokens))
    with open(m_path, "w") as fh:
        fh.write(json.dumps(m, indent=1, sort_keys=True) + "\n")


def setup(out: str, rows: int, dim: int, keep: float, seed: int = 0) -> dict:
    d = os.path.join(out, f"rows{rows}-dim{dim}")
    done = os.path.join(d, "setup.json")
    if os.path.exists(done):
        with open(done) as fh:
            return json.load(fh)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "tiny.csv"), "w") as fh:
        fh.write("label,C1\n" + "".join(f"{i % 2},x{i}\n" for i in range(16)))
    spec = os.path.join(d, "spec.yaml")
    with open(spec, "w") as fh:
        fh.write(SPEC.format(dim=dim))
    rng = np.random.default_rng(seed)
    values = np.unique(rng.integers(1, 2**63, int(rows * (2 - keep)) + 1000, dtype=np.uint64))
    values = rng.permutation(values)
    a = values[:rows]
    kept = rng.choice(a, int(rows * keep), replace=False)
    b = rng.permutation(np.concatenate([kept, values[rows:rows + rows - kept.size]]))
    t = time.time()
    make_artifact(os.path.join(d, "A"), spec, tokens_bytes(a), rows)
    make_artifact(os.path.join(d, "B"), spec, tokens_bytes(b), rows)
    del values, a, b, kept
    code = ("import tensorflow as tf, sys; from tpu_embed.training.host_embedding import HostEmbedding; "
            "e = HostEmbedding.from_artifact(sys.argv[1]); e.build(); "
            "print(tf.train.Checkpoint(embedding=e).save(sys.argv[2]))")
    ckpt = subprocess.run([PY, "-c", code, os.path.join(d, "A"), os.path.join(d, "ckpt", "ckpt")], check=True,
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    info = {"dir": d, "checkpoint": ckpt.stdout.strip().splitlines()[-1], "setup_s": time.time() - t}
    with open(done, "w") as fh:
        json.dump(info, fh)
    return info


def measure(info: dict, chunk_rows: int | None) -> dict:
    d = info["dir"]
    cmd = [os.path.join(os.path.dirname(PY), "tpu-embed"), "remap", "--from", os.path.join(d, "A"), "--to",
           os.path.join(d, "B"), "--checkpoint", info["checkpoint"], "--output", os.path.join(d, "out", "ckpt-0"),
           "--overwrite"] + (["--chunk-rows", str(chunk_rows)] if chunk_rows else [])
    t = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"remap failed:\n{err}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
            "summary": out}


CHECK = """
import sys, numpy as np, tensorflow as tf
sys.path.insert(0, sys.argv[1])
from tpu_embed.training.remap import row_mapping as rmapping
d, n = sys.argv[2], int(sys.argv[3])
p = rmapping.row_mappings(rmapping.load(d + "/A"), rmapping.load(d + "/B"))["C1"]
a, b = tf.train.load_checkpoint(sys.argv[4]), tf.train.load_checkpoint(d + "/out/ckpt-0")
rng = np.random.default_rng(1)
rows = np.concatenate([rng.integers(0, p.rows_b, n), [p.rows_b - 1]])  # and the OOV bucket
for key, init in (("tables/C1", None), ("slots/C1/accumulators", 0.1)):
    name = f"embedding/{key}/.ATTRIBUTES/VARIABLE_VALUE"
    x, y = a.get_tensor(name), b.get_tensor(name)
    assert y.shape == (p.rows_b, p.dim), y.shape
    src = p.source[rows]
    kept = src >= 0
    assert np.array_equal(y[rows[kept]], x[src[kept]]), key
    if init is not None:
        assert np.all(y[rows[~kept]] == np.float32(init)), key
    print(key, "ok:", int(kept.sum()), "kept rows,", int((~kept).sum()), "new rows checked")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dims", default="16,32")
    ap.add_argument("--keep", type=float, default=0.9, help="share of A's tokens B keeps")
    ap.add_argument("--out", default="build/bench-remap")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chunk-rows", type=int, default=None)
    ap.add_argument("--check", type=int, default=100_000, help="random rows checked with TF's reader (0: none)")
    args = ap.parse_args()
    rows = []
    for dim in [int(x) for x in args.dims.split(",")]:
        info = setup(args.out, args.rows, dim, args.keep)
        print(f"rows {args.rows} dim {dim}: setup {info['setup_s']:.0f} s, checkpoint {info['checkpoint']}")
        runs = [measure(info, args.chunk_rows) for _ in range(args.repeat)]
        print(runs[-1]["summary"])
        for r in runs:
            print(f"  wall {r['wall_s']:.1f} s, cpu {r['cpu_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB")
        if args.check:
            subprocess.run([PY, "-c", CHECK, ROOT, info["dir"], str(args.check), info["checkpoint"]], check=True,
                           cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        tensor_mb = (args.rows + 1) * dim * 4 / 2**20
        rows.append((dim, tensor_mb, runs))
    print("\n| rows | dim | checkpoint (table + accumulators) | wall (s) | CPU (s) | peak RSS (MB) |")
    print("| ---: | ---: | ---: | --- | --- | --- |")
    for dim, mb, runs in rows:
        def fmt(k: str, f: str, runs=runs) -> str:
            return " / ".join(f.format(r[k]) for r in runs)
        print(f"| {args.rows:,} | {dim} | {2 * mb:,.0f} MB | {fmt('wall_s', '{:.1f}')} | {fmt('cpu_s', '{:.1f}')} "
              f"| {fmt('peak_rss_mb', '{:.0f}')} |")


if __name__ == "__main__":
    main()
