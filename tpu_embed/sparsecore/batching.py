"""Global batch -> per-chip batches, and per-chip partition counts.

A global batch of a feature is a `FeatureIds` whose rows number the
feature's samples over the whole slice: chip c owns rows
[c * n, (c + 1) * n) where n = the feature's per-chip sample count
(`prod(output_shape)`).  TPUStrategy splits a global batch across replicas
the same way (contiguous blocks), so chip c's batch is that block, rebased.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from tpu_embed.sparsecore.csr import count_partitions
from tpu_embed.sparsecore.inputs import FeatureIds
from tpu_embed.sparsecore.layout import SparseCoreLayout


def split_global_batch(global_ids: Dict[str, FeatureIds], layout: SparseCoreLayout,
                       chips=None) -> List[Dict[str, FeatureIds]]:
    """Per chip (all chips, or the given chip indices), the feature ids of that chip's block."""
    num_chips = layout.topology.num_chips
    chips = range(num_chips) if chips is None else chips
    out: List[Dict[str, FeatureIds]] = [dict() for _ in chips]
    for feat in layout.features:
        fid = global_ids[feat.path]
        n = feat.sample_count
        if fid.rows.size and (fid.rows[-1] >= n * num_chips or fid.rows[0] < 0):
            raise ValueError(
                f"Feature {feat.path!r}: global row {int(fid.rows[-1])} is outside the global batch of "
                f"{n * num_chips} samples ({num_chips} chips x {n}).")
        bounds = np.searchsorted(fid.rows, np.arange(num_chips + 1, dtype=np.int64) * n, side="left")
        for i, c in enumerate(chips):
            lo, hi = bounds[c], bounds[c + 1]
            out[i][feat.path] = FeatureIds(
                rows=fid.rows[lo:hi] - c * n, ids=fid.ids[lo:hi],
                weights=None if fid.weights is None else fid.weights[lo:hi])
    return out


def partition_counts(chip_ids: Dict[str, FeatureIds], layout: SparseCoreLayout) -> Dict[str, tuple]:
    """{stack: (ids, unique ids)} per (local SC, destination SC) for one chip, after dedup.

    The same numbers `preprocess` reports in `CsrBatch.ids_per_partition`, and
    whose maxima TF's `GetStatsFromListOfSparseCoreCooTensors` returns, without
    building the CSR buffers.
    """
    return {name: count_partitions(stack, layout, chip_ids) for name, stack in layout.stacks.items()}
