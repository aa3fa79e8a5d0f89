"""Cost of the profile statistics per step (`ProfileCollector.add_step`, and `add_steps` in the job's groups of
`STEPS_PER_CALL` steps), one thread, no Beam.

    .venv/bin/python benchmarks/profile_step.py [DATA_DIR] [--cprofile]

DATA_DIR: the `data` directory of `benchmarks/run_throughput.py --examples 200000` (default build/bench/data).
Builds every step of it as the shard job does (vocabularies, mapping, steps, CSR with global ids), then
adds them to one accumulator, one by one and in the job's groups, and prints ms per step (best of 3 each);
`--cprofile` also prints the top entries of the grouped form.
"""

from __future__ import annotations

import collections
import cProfile
import os
import pstats
import sys
import time

import run_throughput as bench  # benchmarks/run_throughput.py: this script's directory is first on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assembled_steps(data: str):
    """(the benchmark's spec, vocabulary sizes, every step's ExampleBlock) of benchmarks/run_throughput.py's data:
    the vocabularies counted, the chunks mapped and the steps assembled as the shard job does."""
    import pyarrow as pa

    from pipelines.mapping import ids as mapping
    from pipelines.mapping import vocabulary as pvocab
    from pipelines.read import parse, records, splits
    from pipelines.sharding import batches as batching
    from pipelines.token_index import TokenCounter, TokenIndex
    spec = bench.bench_spec(data, 4096)
    chunks, per_key = [], collections.defaultdict(TokenCounter)
    for f in splits.list_input_files(spec.input_patterns()):
        for i, item in enumerate(splits.read_file("csv", f, spec.required_columns())):
            if isinstance(item, records.RawBatch):
                chunks.append(parse.parse_batch(item, spec, i)[0])
                for k, t in pvocab.chunk_tokens(chunks[-1], spec):
                    per_key[k].add(t)
    vocabs, sizes = {}, {}
    for k, counter in per_key.items():
        v = spec.vocabulary_groups()[k][0].vocabulary
        toks, _, _ = pvocab.finalize(pvocab.counts_table(counter), v.top_k, v.frequency_threshold)
        vocabs[k], sizes[k] = TokenIndex(pa.array(toks, pa.large_binary())), max(1, len(toks))
    blocks = [mapping.map_chunk(c, spec, vocabs, collections.Counter()) for c in chunks]
    B = spec.global_batch_size
    n = sum(b.num_examples for b in blocks) // B
    pieces, start = collections.defaultdict(list), 0
    for b in blocks:
        for s, piece in batching.split_into_steps(b, start, B, n):
            pieces[s].append(piece)
        start += b.num_examples
    return spec, sizes, [batching.assemble_step(pieces.pop(s), B, len(spec.dense)) for s in range(n)]


def steps_of(data: str):
    """(spec, vocabulary sizes, [(step, global ids, OOV counts)]) as the shard job hands them to the profile."""
    spec, sizes, blocks = assembled_steps(data)
    from pipelines.sharding import packing_limits as shard_limits
    from pipelines.sharding import step_records
    layout = spec.layout(sizes)
    limits = shard_limits.resolve_limits(spec, layout)
    steps = []
    for s, block in enumerate(blocks):
        _, gids, oov, _ = step_records.build_step(s, block, spec, layout, limits)
        steps.append((s, gids, oov))
    return spec, sizes, steps


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    data = os.path.abspath(args[0] if args else os.path.join(ROOT, "build", "bench", "data"))
    spec, sizes, steps = steps_of(data)
    import profiles
    from profiles.collector import STEPS_PER_CALL, StepInput
    collector = profiles.ProfileCollector(spec.model(sizes), spec.topology, candidate_chip_counts=[4])

    def one_by_one():
        acc = collector.create_accumulator()
        for s, gids, oov in steps:
            collector.add_step(acc, gids, oov, step=s, validate=False)

    def grouped():
        acc = collector.create_accumulator()
        for first in range(0, len(steps), STEPS_PER_CALL):
            collector.add_steps(acc, [StepInput(gids, oov, s) for s, gids, oov in steps[first:first + STEPS_PER_CALL]],
                                validate=False)

    forms = (("add_step, one by one", one_by_one), (f"add_steps, {STEPS_PER_CALL} at a time (the job)", grouped))
    for name, fn in forms:
        best = min(timed(fn) for _ in range(3))
        print(f"ProfileCollector.{name}: {best / len(steps) * 1e3:.2f} ms per step ({len(steps)} steps of "
              f"{spec.global_batch_size} examples, best of 3)")
    if "--cprofile" in sys.argv:
        prof = cProfile.Profile()
        prof.runcall(grouped)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def timed(fn) -> float:
    """Seconds fn() takes (the benchmark scripts' one timer)."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
