"""SparseCore layout and CSR packing: the one implementation, used offline and online.

`stack_tables(feature_config, topology)` reproduces TPUEmbeddingV2's table
stacking; `preprocess(features, feature_config, topology, ...)` turns one
chip's batch into `{stacked_table: CsrBatch}` whose meaningful prefixes equal
what TF's `TPUEmbeddingV2.enqueue` computes, bit for bit.  numpy only.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from tpu_embed.sparsecore.csr_types import (
    DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE, DEFAULT_MAX_IDS_PER_TABLE, DEFAULT_MAX_UNIQUE_IDS_PER_TABLE,
    PAD_VALUE, CsrBatch, LimitExceededError, StackLimits, buffer_sizes, resolve_limits)
from tpu_embed.sparsecore.batching import partition_counts, split_global_batch
from tpu_embed.sparsecore.inputs import FeatureIds, RaggedIds, SparseIds, to_feature_ids
from tpu_embed.sparsecore.layout import (
    FeaturePlacement, SparseCoreLayout, StackLayout, TablePlacement, flatten, flatten_with_paths,
    same_structure_flatten, stack_tables)
from tpu_embed.topology import Topology

__all__ = [
    "CsrBatch", "FeatureIds", "FeaturePlacement", "LimitExceededError", "PAD_VALUE", "RaggedIds",
    "SparseCoreLayout", "SparseIds", "StackLayout", "StackLimits", "TablePlacement", "Topology",
    "feature_ids_for", "partition_counts", "preprocess", "preprocess_with_layout", "split_global_batch",
    "stack_tables", "to_feature_ids",
]


def feature_ids_for(features: Any, layout: SparseCoreLayout, feature_config: Any = None,
                    weights: Any = None) -> Dict[str, FeatureIds]:
    """Validate and normalise every feature of a batch to (rows, ids, weights)."""
    if feature_config is not None:
        flat_inputs = same_structure_flatten(feature_config, features, "features")
        flat_weights = (same_structure_flatten(feature_config, weights, "weights")
                        if weights is not None else [None] * len(flat_inputs))
    else:
        flat_inputs = [leaf for _, leaf in _flatten_leaves(features)]
        flat_weights = ([leaf for _, leaf in _flatten_leaves(weights)] if weights is not None
                        else [None] * len(flat_inputs))
        if len(flat_inputs) != len(layout.features):
            raise ValueError(f"Got {len(flat_inputs)} features for a layout of {len(layout.features)}.")
    out = {}
    for feat, value, weight in zip(layout.features, flat_inputs, flat_weights):
        if value is None:
            raise ValueError(f"Feature {feat.path!r} is missing from the batch (got None).")
        out[feat.path] = to_feature_ids(value, weight, path=feat.path, sample_count=feat.sample_count,
                                        vocabulary_size=feat.vocabulary_size)
    return out


def _flatten_leaves(structure):
    return flatten_with_paths(structure)


def preprocess_with_layout(
    features: Any,
    layout: SparseCoreLayout,
    *,
    feature_config: Any = None,
    weights: Any = None,
    max_ids_per_chip_per_sample: int = DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    max_ids_per_table: Optional[Dict[str, int]] = None,
    max_unique_ids_per_table: Optional[Dict[str, int]] = None,
    allow_id_dropping: bool = False,
    implementation: str = "fast",
) -> Dict[str, CsrBatch]:
    """`preprocess` for a precomputed layout (the shard job stacks once, packs many batches)."""
    limits = resolve_limits(layout, max_ids_per_table, max_unique_ids_per_table,
                            max_ids_per_chip_per_sample, allow_id_dropping)
    if isinstance(features, dict) and features and all(isinstance(v, FeatureIds) for v in features.values()):
        fids = features  # already validated, e.g. by the shard job
    else:
        fids = feature_ids_for(features, layout, feature_config, weights)
    if implementation == "fast":
        from tpu_embed.sparsecore.csr import preprocess_stack
    elif implementation == "reference":
        from tpu_embed.sparsecore.csr_reference import preprocess_stack_reference as preprocess_stack
    else:
        raise ValueError(f"implementation must be 'fast' or 'reference', got {implementation!r}")
    return {name: preprocess_stack(stack, layout, fids, limits[name]) for name, stack in layout.stacks.items()}


def preprocess(
    features: Any,
    feature_config: Any,
    topology: Topology,
    *,
    weights: Any = None,
    max_ids_per_chip_per_sample: int = DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    max_ids_per_table: Optional[Dict[str, int]] = None,
    max_unique_ids_per_table: Optional[Dict[str, int]] = None,
    allow_id_dropping: bool = False,
    implementation: str = "fast",
) -> Dict[str, CsrBatch]:
    """One chip's batch -> `{stacked_table_name: CsrBatch}`, as `TPUEmbeddingV2.enqueue` computes it.

    `features` has the nested structure of `feature_config` with, per feature,
    a dense tensor/array (one id per sample), a `tf.SparseTensor` /
    `SparseIds`, or a `tf.RaggedTensor` / `RaggedIds`; `weights` likewise
    (or None).  Limits are keyed by stacked table name (see `stack_tables`);
    missing entries default to TF's 256.  Over-limit batches raise
    `LimitExceededError` naming the stack and the fix; with
    `allow_id_dropping=True` ids that do not fit the id buffer are dropped and
    counted in `CsrBatch.dropped_ids`.
    """
    layout = stack_tables(feature_config, topology)
    return preprocess_with_layout(
        features, layout, feature_config=feature_config, weights=weights,
        max_ids_per_chip_per_sample=max_ids_per_chip_per_sample, max_ids_per_table=max_ids_per_table,
        max_unique_ids_per_table=max_unique_ids_per_table, allow_id_dropping=allow_id_dropping,
        implementation=implementation)
