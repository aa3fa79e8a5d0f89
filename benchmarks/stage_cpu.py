"""Where the CPU time of `tpu-embed run` goes: each stage of its work on one thread, one after the other, timed.

    .venv/bin/python benchmarks/stage_cpu.py [--workload quoted|csv] [--out build/bench] [--examples N]

The data of `benchmarks/run_throughput.py` (same --workload, --out and --examples; generated there). The
stages are the jobs' own functions, in the order a run calls them: the read (framing, the native split
and the categorical columns dictionary-encoded), the parse, the vocabulary counting, the vocabularies
(filtered and ordered), their token indexes, the mapping of every chunk to ids, the global batches, each
step's build (per-chip CSR and its records) and the lookup statistics (the job's collector: the profile's
`add_steps` in the job's groups of steps, the what-if steps kept, and its output). Each stage's figure is its
thread's CPU time; the job runs them on several threads and a child process at once. Last, `tpu-embed run`'s
fixed cost: `runner.run_all` on the first 1,000 rows (the two Beam pipelines, manifests, the transform output),
its wall and CPU time. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import time

import pyarrow as pa
import run_throughput as bench  # benchmarks/run_throughput.py: this script's directory is first on sys.path


def stages(spec) -> "collections.OrderedDict[str, float]":
    from pipelines.jobs.collect_profile import profile_collector
    from pipelines.mapping import ids as mapping
    from pipelines.mapping import vocabulary as pvocab
    from pipelines.read import parse, records, splits
    from pipelines.sharding import batches as batching
    from pipelines.sharding import packing_limits as shard_limits
    from pipelines.sharding import step_records
    from pipelines.token_index import TokenCounter, TokenIndex
    from profiles.collector import STEPS_PER_CALL, StepInput

    cpu: "collections.OrderedDict[str, float]" = collections.OrderedDict()
    clock = [time.thread_time()]

    def tick(name: str) -> None:
        now = time.thread_time()
        cpu[name] = cpu.get(name, 0.0) + now - clock[0]
        clock[0] = now

    encode = parse.encodable_columns(spec)
    raws, chunks = [], []
    for f in splits.list_input_files(spec.input_patterns()):
        clock[0] = time.thread_time()
        for item in splits.read_file(spec.inputs.format, f, spec.required_columns(), encode=encode):
            if isinstance(item, records.RawBatch):
                raws.append(item)
        tick("read: framing, split, categorical columns encoded")
        for raw in raws:
            chunks.append(parse.parse_batch(raw, spec)[0])
        raws.clear()
        tick("parse: label, dense, categorical")
    counters = collections.defaultdict(TokenCounter)
    for c in chunks:
        for key, tokens in pvocab.chunk_tokens(c, spec):
            counters[key].add(tokens)
    tick("vocabulary counts")
    vocabs, sizes = {}, {}
    for key, counter in counters.items():
        v = spec.vocabulary_groups()[key][0].vocabulary
        tokens, _, _ = pvocab.finalize(pvocab.counts_table(counter), v.top_k, v.frequency_threshold)
        vocabs[key], sizes[key] = pa.array(tokens, pa.large_binary()), max(1, len(tokens))
    tick("vocabularies (filter, order)")
    indexes = {key: TokenIndex(tokens) for key, tokens in vocabs.items()}
    tick("token indexes")
    counts: collections.Counter = collections.Counter()
    blocks = [mapping.map_chunk(c, spec, indexes, counts) for c in chunks]
    tick("ids (every chunk mapped)")
    layout = spec.layout(sizes)
    limits = shard_limits.resolve_limits(spec, layout)
    B = spec.global_batch_size
    steps = sum(c.num_rows for c in chunks) // B
    pieces, start, built = collections.defaultdict(list), 0, []
    for block in blocks:
        for s, piece in batching.split_into_steps(block, start, B, steps):
            pieces[s].append(piece)
        start += block.num_examples
        while len(built) < min(steps, start // B):
            s = len(built)
            step = batching.assemble_step(pieces.pop(s), B, len(spec.dense))
            tick("global batches")
            built.append(step_records.build_step(s, step, spec, layout, limits))
            tick("steps built (per-chip CSR, records)")
    collector = profile_collector(spec, sizes)  # the job's: the profile and the what-if steps
    acc = collector.create_accumulator()
    for first in range(0, len(built), STEPS_PER_CALL):  # in the job's groups of steps
        collector.add_steps(acc, [StepInput(global_ids, oov, first + i) for i, (_, global_ids, oov, *_rest)
                                  in enumerate(built[first:first + STEPS_PER_CALL])], validate=False)
    collector.extract_output(acc)
    tick("lookup statistics (profile, what-if steps)")
    return cpu


def fixed_cost(spec, workload: str, out: str) -> "tuple[float, float]":
    """Wall and CPU seconds (of this process: the profile's child not counted) of `runner.run_all`, the transform
    graph cached, on the first 1,000 rows of the first input file: what a run costs besides its data."""
    from pipelines import runner
    from pipelines.jobs import JobConfig
    from pipelines.read import splits
    from tpu_embed.serving.tft_output import TransformGraph
    first = splits.list_input_files(spec.input_patterns())[0].path
    small_dir = os.path.join(out, "stage-cpu-small")
    shutil.rmtree(small_dir, ignore_errors=True)
    os.makedirs(small_dir)
    with open(first, "rb") as src, open(os.path.join(small_dir, "part-000.csv"), "wb") as dst:
        dst.writelines(line for _, line in zip(range(1001), src))
    small = bench.bench_spec(small_dir, 256, workload)
    os.environ["TPU_EMBED_CACHE_DIR"] = os.path.join(out, "cache")
    TransformGraph(small).result()
    wall = cpu = 0.0
    for _ in range(2):  # the second: the imports and first-call costs of the first are not a run's
        art = os.path.join(out, "stage-cpu-run")
        shutil.rmtree(art, ignore_errors=True)
        t, c = time.time(), time.process_time()
        runner.run_all(JobConfig(spec=small, output=art))
        wall, cpu = time.time() - t, time.process_time() - c
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=("quoted", "csv"), default="quoted")
    ap.add_argument("--examples", type=int)
    ap.add_argument("--out", default=os.path.join(bench.ROOT, "build", "bench"))
    args = ap.parse_args()
    args.examples = args.examples or bench.DEFAULT_EXAMPLES[args.workload]
    args.out = os.path.abspath(args.out)
    data = bench.data_dir(args)
    if not os.path.isdir(data):
        raise SystemExit(f"{data}: no data; run benchmarks/run_throughput.py --workload {args.workload} "
                         f"--examples {args.examples} --modes floor --out {args.out} first")
    spec = bench.bench_spec(data, 4096, args.workload)
    cpu = stages(spec)
    wall, fixed = fixed_cost(spec, args.workload, args.out)
    print(f"| stage ({args.workload}, {args.examples:,} rows, one thread) | CPU (s) |")
    print("| --- | ---: |")
    for name, seconds in cpu.items():
        print(f"| {name} | {seconds:.2f} |")
    print(f"| **all stages** | **{sum(cpu.values()):.2f}** |")
    print(f"| run_all on 1,000 rows (fixed cost: wall {wall:.2f} s) | {fixed:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
