"""Throughput of `tpu-embed run` on the local runner vs the same work in one process without Beam.

    .venv/bin/python benchmarks/pipelines.py [--examples 200000] [--workers 1] [--out build/bench]

Synthetic Criteo-like data (deterministic seed): label, 13 dense columns with
blanks, 26 categorical columns of Zipf-distributed hex ids, two of them
multivalent ('|'-separated, 1-5 values), in 4 CSV files.  Both measurements
do the same work: read + parse, exact vocabularies, ids, global batches,
per-chip CSR, shard records written, lookup statistics.  Prints a Markdown
table row for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NUM_CAT = 26
MULTIVALENT = ("C3", "C12")


def generate(out_dir: str, examples: int, files: int = 4, seed: int = 1234) -> None:
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    per = examples // files
    for fi in range(files):
        n = per if fi < files - 1 else examples - per * (files - 1)
        cols = {"label": pa.array((rng.random(n) < 0.25).astype(np.int64).astype(str))}
        for j in range(13):
            v = rng.zipf(1.5, n).astype(np.int64)
            s = v.astype(str).astype(object)
            s[rng.random(n) < 0.2] = ""
            cols[f"I{j + 1}"] = pa.array(s, pa.string())
        for j in range(NUM_CAT):
            name = f"C{j + 1}"
            card = int(10 ** (2 + j % 5))
            if name in MULTIVALENT:
                k = rng.integers(1, 6, n)
                ids = rng.zipf(1.2, int(k.sum())) % card
                toks = np.char.mod("%08x", ids)
                splits = np.concatenate([[0], np.cumsum(k)])
                vals = ["|".join(toks[splits[i]:splits[i + 1]]) for i in range(n)]
                cols[name] = pa.array(vals, pa.string())
            else:
                ids = rng.zipf(1.2, n) % card
                s = np.char.mod("%08x", ids).astype(object)
                s[rng.random(n) < 0.1] = ""
                cols[name] = pa.array(s, pa.string())
        pacsv.write_csv(pa.table(cols), os.path.join(out_dir, f"part-{fi:03d}.csv"))


def bench_spec(data_dir: str, batch: int):
    from tpu_embed.spec import parse_spec
    cat = []
    for j in range(NUM_CAT):
        name = f"C{j + 1}"
        d = {"name": name, "vocabulary": {"type": "frequency", "frequency_threshold": 2, "num_oov_buckets": 1}}
        if name in MULTIVALENT:
            d["delimiter"] = "|"
        cat.append(d)
    raw = {
        "name": "bench", "inputs": {"format": "csv", "patterns": [os.path.join(data_dir, "*.csv")]},
        "label": {"column": "label"}, "dense": [f"I{j + 1}" for j in range(13)], "categorical": cat,
        "defaults": {"table": {"dim": 16}}, "optimizer": {"type": "adagrad", "learning_rate": 0.05},
        "topology": {"num_chips": 4, "num_sc_per_chip": 4, "num_hosts": 1}, "global_batch_size": batch,
        "limits": {"max_ids_per_chip_per_sample": 64, "allow_id_dropping": True},
    }
    # Zipf-hot ids overflow TF's default 256 ids per partition: use large limits (recorded in the manifest).
    stacks = parse_spec(raw, base_dir=data_dir).layout({f"C{j + 1}": 1000 for j in range(NUM_CAT)}).stacks
    raw["limits"].update({"max_ids_per_table": {s: 65536 for s in stacks},
                          "max_unique_ids_per_table": {s: 65536 for s in stacks}})
    return parse_spec(raw, base_dir=data_dir)


def single_process(spec, out: str, candidates) -> int:
    """The same work, plain Python + numpy, no Beam."""
    import profiles
    from pipelines import batching, io as pio, mapping, parse, shard as pshard, vocab as pvocab
    files = pio.list_input_files(spec.input_patterns())
    chunks = []
    for f in files:
        for i, item in enumerate(pio.read_file("csv", f, spec.required_columns())):
            if isinstance(item, pio.RawBatch):
                chunks.append(parse.parse_batch(item, spec, i)[0])
    per_key = collections.defaultdict(list)
    for c in chunks:
        for k, t in pvocab.chunk_token_counts(c, spec):
            per_key[k].append(t)
    vocabs, sizes = {}, {}
    os.makedirs(os.path.join(out, "vocab"), exist_ok=True)
    for k, tables in per_key.items():
        v = spec.vocabulary_groups()[k][0].vocabulary
        toks, _, _ = pvocab.finalize(pvocab.merge_counts(tables), v.top_k, v.frequency_threshold)
        with open(os.path.join(out, "vocab", k + ".txt"), "wb") as fh:
            fh.write(pvocab.vocabulary_file_bytes(toks))
        vocabs[k] = pa.array(toks, pa.large_binary())
        sizes[k] = max(1, len(toks))
    layout = spec.layout(sizes)
    limits = pshard.resolve_limits(spec, layout)
    counts = collections.Counter()
    blocks = [mapping.map_chunk(c, spec, vocabs, counts) for c in chunks]
    allb = batching.ExampleBlock.concat(blocks)
    steps = allb.num_examples // spec.global_batch_size
    collector = profiles.ProfileCollector(spec.model(sizes), spec.topology,
                                          candidate_chip_counts=candidates)
    acc = collector.create_accumulator()
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    with open(os.path.join(out, "shards", "host0.tfrecord"), "wb") as fh:
        B = spec.global_batch_size
        for s in range(steps):
            block = allb.slice(s * B, (s + 1) * B)
            recs, gids, oov, _ = pshard.build_step(s, block, spec, layout, limits)
            for _, r in recs:
                fh.write(pio.tfrecord_frame(r))
            acc = collector.add_step(acc, gids, oov, step=s)
    profiles.ProfileStore(os.path.join(out, "profiles")).write(collector.extract_output(acc))
    return steps * spec.global_batch_size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--candidates", default="4", help="profile candidate chip counts (comma-separated)")
    args = ap.parse_args()
    from pipelines import runner
    from pipelines.jobs import JobConfig
    candidates = [int(x) for x in args.candidates.split(",")]
    data = os.path.join(args.out, "data")
    if not os.path.exists(os.path.join(data, "part-003.csv")):
        t = time.time()
        generate(data, args.examples)
        print(f"generated {args.examples} examples in {time.time() - t:.1f} s", flush=True)
    spec = bench_spec(data, args.batch)
    for d in ("beam", "single"):
        shutil.rmtree(os.path.join(args.out, d), ignore_errors=True)

    t = time.time()
    n_single = single_process(spec, os.path.join(args.out, "single"), candidates)
    single = time.time() - t
    print(f"single process: {n_single} examples in {single:.1f} s = {n_single / single:,.0f} examples/s", flush=True)

    beam_args = []
    if args.workers > 1:
        beam_args = [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing"]
    t = time.time()
    m = runner.run_all(JobConfig(spec=spec, output=os.path.join(args.out, "beam"),
                                 candidate_chip_counts=candidates), beam_args)
    beam_s = time.time() - t
    n_beam = m["counts"]["examples_written"]
    print(f"tpu-embed run (DirectRunner, {args.workers} worker(s)): {n_beam} examples in {beam_s:.1f} s = "
          f"{n_beam / beam_s:,.0f} examples/s", flush=True)
    print(f"ratio Beam / single process: {beam_s / single:.2f}x")
    print(f"| {args.examples:,} | {args.batch} | {args.workers} | {n_single / single:,.0f} | {n_beam / beam_s:,.0f} | "
          f"{beam_s / single:.2f}x |")


if __name__ == "__main__":
    main()
