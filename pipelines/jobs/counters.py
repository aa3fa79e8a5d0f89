"""The jobs' counters: Beam metrics in one namespace as steps count, and their sum for the manifest.

A counter whose name starts with `MAX_PREFIX` is a maximum over steps instead (e.g. the largest COO buffer a
step of the jax records needs): `SumCounters` keeps the largest value, and it is not a Beam counter.
"""

from __future__ import annotations

import collections
from typing import Dict

import apache_beam as beam
from apache_beam.metrics import Metrics

NAMESPACE = "tpu_embed"
MAX_PREFIX = "max/"


def inc_counters(counts: Dict[str, int], prefix: str = "") -> None:
    """Add `counts` ({name: count}) to the job's Beam counters."""
    for k, v in counts.items():
        if v and not k.startswith(MAX_PREFIX):
            Metrics.counter(NAMESPACE, prefix + k).inc(int(v))


def add_counts(acc: collections.Counter, x: Dict[str, int]) -> collections.Counter:
    """`acc` plus the counter dict `x`: sums, and the larger value of each maximum (`MAX_PREFIX`)."""
    for k, v in x.items():
        acc[k] = max(acc.get(k, 0), int(v)) if k.startswith(MAX_PREFIX) else acc[k] + int(v)
    return acc


class SumCounters(beam.CombineFn):
    """Counter dicts (one per bundle and step) -> their sum (the maximum of a `MAX_PREFIX` key), keys sorted."""

    def create_accumulator(self):
        return collections.Counter()

    def add_input(self, acc, x):
        return add_counts(acc, x)

    def merge_accumulators(self, accs):
        out: collections.Counter = collections.Counter()
        for a in accs:
            add_counts(out, a)
        return out

    def extract_output(self, acc):
        return dict(sorted(acc.items()))
