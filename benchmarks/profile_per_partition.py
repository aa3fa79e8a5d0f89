"""What the per-partition maxima (jax-tpu-embedding's FDO figures) add to `ProfileCollector.add_step`.

    .venv/bin/python benchmarks/profile_per_partition.py [--chips 8] [--batch 4096] [--steps 20] [--repeats 3]

A Criteo-like model (26 tables of one optimizer, one feature each, 1-4 Zipf ids per example) on CHIPS chips x 4
SparseCores; synthetic global batches (`profiles.synthetic`).  The same steps are added to one accumulator with
the per-partition maxima kept (as the collector does) and to one without them (their arrays dropped before the
first step), alternately, REPEATS times; prints ms per step of each and the ratio (best of the repeats).
"""

from __future__ import annotations

import argparse
import time
import types

from profiles import ProfileCollector, synthetic
from tpu_embed.core.topology import Topology


def model(chips: int, batch: int):
    opt = ("adagrad", 0.05)
    fc = {}
    for i in range(1, 27):
        t = types.SimpleNamespace(name=f"C{i}", vocabulary_size=[100, 10_000, 1_000_000][i % 3], dim=16,
                                  combiner="mean", optimizer=opt)
        fc[f"C{i}"] = types.SimpleNamespace(table=t, output_shape=[batch // chips], name=f"C{i}")
    return fc


def without_per_partition(acc):
    for ps in [t.partitions for t in acc.tables.values()] + list(acc.stacks.values()):
        ps.partition_max_ids = ps.partition_max_unique_ids = ps.sc_max_buffer = None
    return acc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chips", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    fc = model(a.chips, a.batch)
    collector = ProfileCollector(fc, Topology(a.chips, 4))
    steps = list(synthetic.global_batches(fc, a.chips, a.steps, seed=0, max_valency=4))

    def run(keep: bool) -> float:
        acc = collector.create_accumulator()
        if not keep:
            without_per_partition(acc)
        t = time.perf_counter()
        for i, b in enumerate(steps):
            collector.add_step(acc, b, step=i, validate=False)
        return (time.perf_counter() - t) / len(steps)

    run(True)  # warm-up (layout caches)
    with_pp, without = [], []
    for _ in range(a.repeats):
        with_pp.append(run(True))
        without.append(run(False))
    w, wo = min(with_pp), min(without)
    print(f"{a.chips} chips x 4 SCs, 26 tables, global batch {a.batch}, {a.steps} steps, best of {a.repeats}: "
          f"add_step {w * 1e3:.2f} ms with per-partition maxima, {wo * 1e3:.2f} ms without ({w / wo:.3f}x)")


if __name__ == "__main__":
    main()
