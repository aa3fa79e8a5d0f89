"""Cost of `pipelines.sharding.step_records.build_step` per step (per-chip CSR and the host's record), one
thread, no Beam.

    .venv/bin/python benchmarks/build_step.py [DATA_DIR] [--cprofile]

DATA_DIR: the `data` directory of `benchmarks/run_throughput.py --examples 200000` (default build/bench/data).
Maps every chunk as the shard job does, assembles the steps, then builds them all (best of 3) and prints ms
per step; then `narrow_ids` on the steps' sorted sample ids (us per call, best of 3). Run it from two
checkouts to compare them (docs/benchmarks.md); `--cprofile` also prints the top entries.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    sys.path.insert(0, ROOT)  # the repository's packages, also without an install
    import numpy as np
    from profile_step import assembled_steps, timed

    from pipelines.sharding import packing_limits as shard_limits
    from pipelines.sharding import step_records
    from tpu_embed.artifact import shard_records
    from tpu_embed.sparsecore import csr, preprocess_with_layout, split_global_batch
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    data = os.path.abspath(args[0] if args else os.path.join(ROOT, "build", "bench", "data"))
    spec, sizes, blocks = assembled_steps(data)
    layout = spec.layout(sizes)
    limits = shard_limits.resolve_limits(spec, layout)
    print(f"native CSR kernel: {csr.native_available()}")

    def build_all():
        for s, block in enumerate(blocks):
            step_records.build_step(s, block, spec, layout, limits)

    best = min(timed(build_all) for _ in range(3))
    print(f"build_step: {best / len(blocks) * 1e3:.2f} ms per step ({len(blocks)} steps of "
          f"{spec.global_batch_size} examples, best of 3)")
    kw = dict(max_ids_per_chip_per_sample=limits.max_ids_per_chip_per_sample,
              max_ids_per_table=dict(limits.max_ids_per_table),
              max_unique_ids_per_table=dict(limits.max_unique_ids_per_table), allow_id_dropping=True)
    ids = [np.asarray(b.sorted_sample_ids[:b.ids_unpadded_size], np.int32) for block in blocks[:8]
           for chip in split_global_batch(step_records.global_ids_of(block, spec), layout)
           for b in preprocess_with_layout(chip, layout, **kw).values()]

    def narrow_all():
        for a in ids:
            shard_records.narrow_ids(a, "uint16")

    best = min(timed(narrow_all) for _ in range(3))
    print(f"narrow_ids: {best / len(ids) * 1e6:.1f} us per call ({len(ids)} arrays of ~{ids[0].size} sample ids "
          "to uint16, best of 3)")
    if "--cprofile" in sys.argv:
        prof = cProfile.Profile()
        prof.runcall(build_all)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
