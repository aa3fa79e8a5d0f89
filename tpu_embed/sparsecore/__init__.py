"""SparseCore layout and CSR packing: the one implementation, used offline and online.

`stack_tables(feature_config, topology)` reproduces TPUEmbeddingV2's table
stacking; `preprocess(features, feature_config, topology, ...)` turns one
chip's batch into `{stacked_table: CsrBatch}` whose meaningful prefixes equal
what TF's `TPUEmbeddingV2.enqueue` computes, bit for bit.  numpy only.

`layout` (table stacking, `layout_of(model)`), `layout_cache` (stacking
remembered for `preprocess`), `padding` (the pad value,
the multiple of 8, rounding up), `inputs` (dense, sparse and ragged ids to
COO), `csr_types` (`CsrBatch`, buffer sizes, limits), `packing` (`preprocess`:
a batch matched to the layout's features, then packed), `csr` (the packers:
the C kernel, numpy), `csr_reference` (the per-id transcription of TF's
kernels they are tested against), `batching` (global batch -> per chip).
"""

from tpu_embed.core.nest import flatten, flatten_with_paths
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.batching import partition_counts, split_global_batch
from tpu_embed.sparsecore.csr_types import (
    DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    DEFAULT_MAX_IDS_PER_TABLE,
    DEFAULT_MAX_UNIQUE_IDS_PER_TABLE,
    CsrBatch,
    LimitExceededError,
    StackLimits,
    buffer_sizes,
)
from tpu_embed.sparsecore.inputs import FeatureIds, RaggedIds, SparseIds, to_feature_ids
from tpu_embed.sparsecore.layout import (
    FeaturePlacement,
    SparseCoreLayout,
    StackLayout,
    TablePlacement,
    layout_of,
    stack_tables,
)
from tpu_embed.sparsecore.packing import IMPLEMENTATIONS, feature_ids_for, preprocess, preprocess_with_layout
from tpu_embed.sparsecore.padding import PAD_VALUE

__all__ = [
    "DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE", "DEFAULT_MAX_IDS_PER_TABLE", "DEFAULT_MAX_UNIQUE_IDS_PER_TABLE",
    "IMPLEMENTATIONS", "buffer_sizes", "flatten", "flatten_with_paths", "CsrBatch", "FeatureIds",
    "FeaturePlacement", "LimitExceededError", "PAD_VALUE", "RaggedIds",
    "SparseCoreLayout", "SparseIds", "StackLayout", "StackLimits", "TablePlacement", "Topology",
    "feature_ids_for", "layout_of", "partition_counts", "preprocess", "preprocess_with_layout",
    "split_global_batch", "stack_tables", "to_feature_ids",
]
