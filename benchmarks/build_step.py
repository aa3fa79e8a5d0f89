"""Cost of `pipelines.shard.build_step` per step (per-chip CSR and the host's record), one thread, no Beam.

    .venv/bin/python benchmarks/build_step.py [DATA_DIR] [--cprofile]

DATA_DIR: the `data` directory of `benchmarks/pipelines.py --examples 200000` (default build/bench/data).
Maps every chunk as the shard job does, assembles the steps, then builds them all (best of 3) and prints ms
per step; then `narrow_ids` on the steps' sorted sample ids (us per call, best of 3). Run it from two
checkouts to compare them (docs/benchmarks.md); `--cprofile` also prints the top entries.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    sys.path.insert(0, ROOT)  # before benchmarks/ (its pipelines.py is not the package)
    import numpy as np
    from pipelines import shard as pshard
    from tpu_embed import shards
    from tpu_embed.sparsecore import csr, preprocess_with_layout, split_global_batch
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    data = os.path.abspath(args[0] if args else os.path.join(ROOT, "build", "bench", "data"))
    spec, sizes, blocks = _steps(data)
    layout = spec.layout(sizes)
    limits = pshard.resolve_limits(spec, layout)
    print(f"native CSR kernel: {csr.native_available()}")

    def build_all():
        for s, block in enumerate(blocks):
            pshard.build_step(s, block, spec, layout, limits)

    best = min(_timed(build_all) for _ in range(3))
    print(f"build_step: {best / len(blocks) * 1e3:.2f} ms per step ({len(blocks)} steps of "
          f"{spec.global_batch_size} examples, best of 3)")
    kw = dict(max_ids_per_chip_per_sample=limits.max_ids_per_chip_per_sample,
              max_ids_per_table=dict(limits.max_ids_per_table),
              max_unique_ids_per_table=dict(limits.max_unique_ids_per_table), allow_id_dropping=True)
    ids = [np.asarray(b.sorted_sample_ids[:b.ids_unpadded_size], np.int32) for block in blocks[:8]
           for chip in split_global_batch(pshard.global_ids_of(block, spec), layout)
           for b in preprocess_with_layout(chip, layout, **kw).values()]

    def narrow_all():
        for a in ids:
            shards.narrow_ids(a, "uint16")

    best = min(_timed(narrow_all) for _ in range(3))
    print(f"narrow_ids: {best / len(ids) * 1e6:.1f} us per call ({len(ids)} arrays of ~{ids[0].size} sample ids "
          "to uint16, best of 3)")
    if "--cprofile" in sys.argv:
        prof = cProfile.Profile()
        prof.runcall(build_all)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def _steps(data: str):
    """(the benchmark's spec, vocabulary sizes, the steps' ExampleBlocks as the shard job assembles them)."""
    import collections
    import importlib.util
    import pyarrow as pa
    spec_ = importlib.util.spec_from_file_location("bench", os.path.join(ROOT, "benchmarks", "pipelines.py"))
    bench = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(bench)
    spec = bench.bench_spec(data, 4096)
    from pipelines import batching, io as pio, mapping, parse, vocab as pvocab
    from pipelines.token_index import TokenCounter, TokenIndex
    chunks, per_key = [], collections.defaultdict(TokenCounter)
    for f in pio.list_input_files(spec.input_patterns()):
        for i, item in enumerate(pio.read_file("csv", f, spec.required_columns())):
            if isinstance(item, pio.RawBatch):
                chunks.append(parse.parse_batch(item, spec, i)[0])
                for k, t in pvocab.chunk_tokens(chunks[-1], spec):
                    per_key[k].add(t)
    vocabs, sizes = {}, {}
    for k, counter in per_key.items():
        v = spec.vocabulary_groups()[k][0].vocabulary
        toks, _, _ = pvocab.finalize(pvocab.counts_table(counter), v.top_k, v.frequency_threshold)
        vocabs[k], sizes[k] = TokenIndex(pa.array(toks, pa.large_binary())), max(1, len(toks))
    mapped = [mapping.map_chunk(c, spec, vocabs, collections.Counter()) for c in chunks]
    B = spec.global_batch_size
    n = sum(b.num_examples for b in mapped) // B
    pieces, start = collections.defaultdict(list), 0
    for b in mapped:
        for s, piece in batching.split_into_steps(b, start, B, n):
            pieces[s].append(piece)
        start += b.num_examples
    return spec, sizes, [batching.assemble_step(pieces.pop(s), B, len(spec.dense)) for s in range(n)]


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
