"""The training side: shards into `TPUEmbeddingV2.dequeue` on TPU, or into `HostEmbedding` on CPU/GPU.

`input` (`input_fn`: an artifact's shards as a `tf.data` dataset, one element per step; `per_chip_dataset`:
one element per chip), `shard_parse` (`parse_fn`: a shard record into TF's full-size CSR buffers), `tpu` (the
TPU path: `build_tpu_embedding`, `distribute_steps`, ...; `tpu_checks`: what the shards promise it, checked),
`host_embedding` (`HostEmbedding`: the same embedding math on CPU/GPU, in TensorFlow; `host_config`: what it
is built from; `host_compiled`: its `tf.function`s), `host_index` (its numpy index: the CSR's ids back to
table rows), `host_optimizers` (TPU embedding's optimizer updates as TensorFlow ops), `remap` (a checkpoint
moved onto another artifact's ids) and `dlrm` (a small DLRM network used by the examples and the demo).
"""

from typing import TYPE_CHECKING

from tpu_embed.core.lazy import lazy_exports

if TYPE_CHECKING:  # the lazy names below, visible to type checkers and the API reference's static analysis
    from tpu_embed.training.input import per_chip_dataset
    from tpu_embed.training.tpu import (
        ArtifactMismatchError,
        DistributedSteps,
        EmbeddingSetup,
        build_tpu_embedding,
        check_embedding,
        dequeue_args,
        distribute_steps,
        embedding_setup,
        make_replica_step,
        replica_dataset_fn,
    )

# The TPU path's names, loaded on first use: `tpu` imports TensorFlow, and the numpy-only modules of this
# package (`host_index`, `shard_parse`, `input` until it builds a dataset) must not pay for it when imported
# alone.
_EXPORTS = {name: "tpu_embed.training.tpu" for name in (
    "ArtifactMismatchError", "DistributedSteps", "EmbeddingSetup", "build_tpu_embedding", "check_embedding",
    "dequeue_args", "distribute_steps", "embedding_setup", "make_replica_step", "replica_dataset_fn")}
_EXPORTS["per_chip_dataset"] = "tpu_embed.training.input"

# Written out (not computed from _EXPORTS) so that static analysis reads it; tests/docs/test_api_reference.py
# checks that the two agree.
__all__ = [
    "ArtifactMismatchError",
    "DistributedSteps",
    "EmbeddingSetup",
    "build_tpu_embedding",
    "check_embedding",
    "dequeue_args",
    "distribute_steps",
    "embedding_setup",
    "make_replica_step",
    "per_chip_dataset",
    "replica_dataset_fn",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
