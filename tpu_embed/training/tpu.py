"""The TPU path: `TPUEmbeddingV2` fed from offline shards, skipping `enqueue`.

    with strategy.scope():                      # a tf.distribute.TPUStrategy
        embedding = build_tpu_embedding(artifact_dir)   # plan= optional, must equal the shards' limits
        embedding.build()
        model, optimizer = ..., tf.keras.optimizers.Adam()
    steps = distribute_steps(artifact_dir, strategy, num_epochs=None)
    replica_step = make_replica_step(embedding, model, optimizer, steps.sample_counts,
                                     global_batch_size=steps.global_batch_size)

    @tf.function
    def train(iterator):
        return strategy.run(replica_step, args=(next(iterator),))

Inside `replica_step`, `steps.dequeue_args(element)` (the same as
`dequeue_args(element, sample_counts)`) rebuilds, for this replica's chip,
the `{stack: (PartitionedCsrFormatTensor, row_pointers_unpadded_size,
ids_unpadded_size)}` that `TPUEmbeddingV2.enqueue` would have returned;
`embedding.dequeue(...)` looks the activations up, and
`embedding.apply_gradients(grads, preserved_outputs)` updates the tables.

**Routing.** A shard record holds one training step of one host: the host's
batch (labels, mask, dense, tensor-core ids) and the CSR buffers of each of
its chips.  `distribute_steps` calls
`strategy.distribute_datasets_from_function`; its dataset function reads the
shards of host `input_context.input_pipeline_id` and turns every record into
`chips_per_host` consecutive elements, element c being chip c's CSR buffers
and rows `[c * per_chip, (c + 1) * per_chip)` of the host batch (the
examples the shard job packed into chip c).  A distributed dataset made from
a function is not rebatched: each worker hands consecutive elements to its
local replicas in order (MultiDeviceIterator, round robin over the worker's
devices, which are in replica order), so the c-th local replica of host h
receives chip `h * chips_per_host + c` — with TPUStrategy's default device
assignment, and with MirroredStrategy, that is replica
`h * chips_per_host + c`.  Every element carries its CSR buffers together
with the labels and features of the same examples, so a replica can never
get one chip's CSR and another chip's labels, whatever the device order.

`sample_count` is a Python int in TF's `PartitionedCsrFormatTensor` (TF
takes it from its stacking); a dataset can only hold tensors, so it comes
from the manifest's stacks and is put in by `dequeue_args` inside the replica
function.

**Not executed here** (no TPU): `TPUEmbeddingV2(...)` under a real
TPUStrategy, `build()`, `dequeue`, `apply_gradients`.  Everything up to the
arguments of `dequeue` is tested; see docs/how-to/train-on-tpu.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import tensorflow as tf

from tpu_embed.artifact.load import ids_dropped_by_limits, load_artifact, require_shards
from tpu_embed.core.model import ModelConfig
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.layout import layout_of
from tpu_embed.training.input import ArtifactDirs, dequeue_inputs, per_chip_dataset, window, window_format
from tpu_embed.training.tpu_checks import (
    ArtifactMismatchError,
    check_tf_stacking,
    checked_feature_config,
    checked_limits,
)

__all__ = ["build_tpu_embedding", "distribute_steps", "embedding_setup", "EmbeddingSetup", "DistributedSteps",
           "dequeue_args", "replica_dataset_fn", "make_replica_step", "check_embedding", "ArtifactMismatchError"]


# ---------------------------------------------------------------- the TPUEmbeddingV2 configuration

@dataclasses.dataclass(frozen=True)
class EmbeddingSetup:
    """Everything `TPUEmbeddingV2(...)` is constructed with, and what the shards promise it.

    `kwargs()` are the constructor's arguments; the rest is what
    `check_embedding` compares the constructed object with.
    """

    feature_config: Any  # {feature: tf.tpu.experimental.embedding.FeatureConfig}
    optimizer: Any  # None: every table carries its own optimizer (from the spec)
    sparse_core_embedding_config: Any  # tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig
    pipeline_execution_with_tensor_core: bool
    model: ModelConfig
    topology: Topology
    stacks: Dict[str, Tuple[str, ...]]  # stacked table -> member tables, TF's order
    sample_counts: Dict[str, int]  # stacked table -> samples per chip (PartitionedCsrFormatTensor.sample_count)
    limits: Dict[str, Any]  # max_ids_per_chip_per_sample, max_ids_per_table, ... (per stack)
    table_offsets: Dict[str, Tuple[str, int, int]]  # table -> (stack, col offset, rotation), as TF's
    feature_sample_offsets: Dict[str, int]  # feature path -> first sample in its stack
    limits_source: str

    def kwargs(self) -> Dict[str, Any]:
        return {"feature_config": self.feature_config, "optimizer": self.optimizer,
                "pipeline_execution_with_tensor_core": self.pipeline_execution_with_tensor_core,
                "sparse_core_embedding_config": self.sparse_core_embedding_config}


def embedding_setup(artifact_dir: str, *, plan: Any = None, optimizer: Any = None,
                    pipeline_execution_with_tensor_core: Optional[bool] = None,
                    initialize_tables_on_host: bool = True,
                    enable_fast_table_initialization: bool = False) -> EmbeddingSetup:
    """The TPUEmbeddingV2 configuration for an artifact's shards (pure: no strategy, no TPU).

    * feature config: `spec.model(vocabulary sizes from manifest.json)` →
      `tpu_embed.core.model.to_tf_feature_config`, one TF optimizer per table (the
      table's, or the spec's top-level one);
    * `optimizer`: if given, replaces every table's optimizer (e.g. a learning
      rate schedule); allowed only if the tables still stack as the shards are
      packed (tables stack by optimizer);
    * `SparseCoreEmbeddingConfig`: exactly the limits in the manifest (what the
      shards were packed with); `plan` (a plan file path or a `profiles.Plan`)
      is accepted only if it equals them, else `ArtifactMismatchError`;
    * `pipeline_execution_with_tensor_core`: the spec's
      (`training.pipeline_execution_with_tensor_core`), unless given here.

    Args:
      artifact_dir: the artifact directory (local path or object-store URL).
      plan: a plan file path or a `profiles.Plan`; accepted only if it equals the shards' limits.
      optimizer: one TF optimizer for every table, replacing the spec's.
      pipeline_execution_with_tensor_core: overrides the spec's flag.
      initialize_tables_on_host: passed to `SparseCoreEmbeddingConfig`.
      enable_fast_table_initialization: passed to `SparseCoreEmbeddingConfig`.

    Returns:
      The `EmbeddingSetup`: `TPUEmbeddingV2(**setup.kwargs())` builds the embedding.

    Raises:
      ArtifactMismatchError: `plan` differs from the shards' limits, or `optimizer` would stack
        the tables differently from the shards.
      ManifestError: the manifest's limits do not name the layout's stacks.
    """
    artifact = load_artifact(artifact_dir)
    artifact.require_shards()
    m, spec, model = artifact.manifest, artifact.spec, artifact.model
    check_tf_stacking(model)
    layout = layout_of(model)
    limits = checked_limits(m, list(layout.stacks), plan, artifact_dir)
    feature_config = checked_feature_config(model, layout, optimizer)
    if pipeline_execution_with_tensor_core is None:
        pipeline_execution_with_tensor_core = spec.training.pipeline_execution_with_tensor_core
    sc_config = _sparse_core_config(limits, initialize_tables_on_host, enable_fast_table_initialization)
    S = model.topology.num_sparse_cores
    assert m.limits is not None  # checked by checked_limits
    return EmbeddingSetup(
        feature_config=feature_config, optimizer=None, sparse_core_embedding_config=sc_config,
        pipeline_execution_with_tensor_core=bool(pipeline_execution_with_tensor_core), model=model,
        topology=model.topology, stacks={k: tuple(s.tables) for k, s in layout.stacks.items()},
        sample_counts={k: int(s.sample_count) for k, s in layout.stacks.items()}, limits=limits,
        table_offsets={t: (p.stack, p.shard_row_offset * S, p.rotation) for t, p in layout.tables.items()},
        feature_sample_offsets={f.path: f.sample_offset for f in layout.features},
        limits_source=m.limits.source if plan is None else f"{m.limits.source} (= plan)")


def _sparse_core_config(limits: Mapping[str, Any], initialize_tables_on_host: bool,
                        enable_fast_table_initialization: bool) -> Any:
    """TF's `SparseCoreEmbeddingConfig` with exactly these limits, tables stacked."""
    return tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig(
        disable_table_stacking=False,
        max_ids_per_chip_per_sample=limits["max_ids_per_chip_per_sample"],
        max_ids_per_table=dict(limits["max_ids_per_table"]),
        max_unique_ids_per_table=dict(limits["max_unique_ids_per_table"]),
        allow_id_dropping=limits["allow_id_dropping"],
        initialize_tables_on_host=initialize_tables_on_host,
        enable_fast_table_initialization=enable_fast_table_initialization)


def _check_strategy(strategy: Any, topology: Topology) -> None:
    tpu_types = tuple(t for t in (getattr(tf.distribute, "TPUStrategy", None),
                                  getattr(tf.distribute.experimental, "TPUStrategy", None)) if t is not None)
    if not isinstance(strategy, tpu_types):
        raise RuntimeError(f"build_tpu_embedding must be called inside `strategy.scope()` of a "
                           f"tf.distribute.TPUStrategy (the current strategy is {type(strategy).__name__}). On "
                           "CPU/GPU use the host path instead.")
    if strategy.num_replicas_in_sync != topology.num_chips:
        raise ArtifactMismatchError(
            f"the shards are packed for {topology.num_chips} chips, this TPUStrategy has "
            f"{strategy.num_replicas_in_sync} replicas. SparseCore CSR buffers depend on the chip count: re-shard "
            f"with topology.num_chips={strategy.num_replicas_in_sync}.")
    nsc = int(getattr(getattr(strategy.extended, "tpu_hardware_feature", None),
                      "num_embedding_devices_per_chip", 0) or 4)  # TF assumes 4 when the TPU reports none
    if nsc != topology.num_sc_per_chip:
        raise ArtifactMismatchError(
            f"the shards are packed for {topology.num_sc_per_chip} SparseCores per chip, this TPU has {nsc}: "
            f"re-shard with topology.num_sc_per_chip={nsc}.")


def check_embedding(embedding: Any, setup: EmbeddingSetup) -> None:
    """Compare what a constructed TPUEmbeddingV2 computed with what the shards were packed for.

    TF stacks the tables itself (`_stack_tables_with_same_table_dim_and_optimizer`)
    and derives per-stack limits from the SparseCoreEmbeddingConfig; the CSR
    bytes in the shards encode stack names, row offsets, rotations, sample
    offsets and buffer sizes.  Any difference would make `dequeue` read
    wrong rows.  (Reads TF's private attributes; ones a future TF renames are skipped.)

    Args:
      embedding: the constructed `TPUEmbeddingV2`.
      setup: the `EmbeddingSetup` it was constructed from.

    Raises:
      ArtifactMismatchError: TF computed another stacking, offset, sample count or limit than the
        shards were packed for.
    """
    checks = [
        ("stacked tables", lambda e: {k: tuple(t.name for t in v) for k, v in e._stacked_table_to_tables.items()},
         setup.stacks),
        ("stack order", lambda e: list(e._stacked_table_to_tables), list(setup.stacks)),
        ("table offsets (stack, column offset, rotation)",
         lambda e: {k: (v[0], int(v[1]), int(v[2])) for k, v in e._table_to_stacked_table_offset.items()},
         setup.table_offsets),
        ("feature sample offsets", lambda e: {k: int(v) for k, v in e._feature_to_sample_offset.items()},
         setup.feature_sample_offsets),
        ("sample counts", lambda e: {k: int(v) for k, v in e._table_to_sample_count.items()}, setup.sample_counts),
        ("max_ids_per_table", lambda e: dict(e._table_to_max_ids_per_sparse_core), setup.limits["max_ids_per_table"]),
        ("max_unique_ids_per_table", lambda e: dict(e._table_to_max_unique_ids_per_sparse_core),
         setup.limits["max_unique_ids_per_table"]),
        ("max_ids_per_chip_per_sample", lambda e: int(e.max_ids_per_chip_per_sample),
         setup.limits["max_ids_per_chip_per_sample"]),
        ("allow_id_dropping", lambda e: bool(e._sparse_core_embedding_config.allow_id_dropping),
         setup.limits["allow_id_dropping"]),
        ("SparseCores per chip", lambda e: int(e._num_sc_per_chip), setup.topology.num_sc_per_chip),
        ("pipelining", lambda e: bool(e._pipelining), setup.pipeline_execution_with_tensor_core),
    ]
    for what, get, expected in checks:
        try:
            got = get(embedding)
        except AttributeError:
            continue
        if got != expected:
            raise ArtifactMismatchError(
                f"TPUEmbeddingV2 computed {what} {got}, but the shards were packed for {expected}. The shards cannot "
                "be fed to this TensorFlow version's TPUEmbeddingV2: re-shard with this tpu_embed and TensorFlow.")


def build_tpu_embedding(artifact_dir: str, *, plan: Any = None, optimizer: Any = None,
                        pipeline_execution_with_tensor_core: Optional[bool] = None,
                        initialize_tables_on_host: bool = True, enable_fast_table_initialization: bool = False):
    """A `tf.tpu.experimental.embedding.TPUEmbeddingV2` for the shards in `artifact_dir`.

    Call it inside `strategy.scope()` of the `tf.distribute.TPUStrategy` you
    train with (TPUEmbeddingV2 takes the current strategy); then call
    `.build()` (still in the scope) or let the first `dequeue` build it.
    The configuration is `embedding_setup(...)` (see there: spec feature
    config with per-table optimizers, exactly the shards' limits, `plan`
    only if it equals them, the spec's pipelining flag).  The strategy must
    have one replica per chip the shards were packed for and the same
    SparseCores per chip; after construction, TF's own stacking, offsets
    and limits are compared with the shards' (`check_embedding`).

    Args:
      artifact_dir: the artifact directory (local path or object-store URL).
      plan: as for `embedding_setup`.
      optimizer: as for `embedding_setup`.
      pipeline_execution_with_tensor_core: as for `embedding_setup`.
      initialize_tables_on_host: as for `embedding_setup`.
      enable_fast_table_initialization: as for `embedding_setup`.

    Returns:
      The `TPUEmbeddingV2`, not built yet.

    Raises:
      RuntimeError: not called inside the scope of a `TPUStrategy`.
      ArtifactMismatchError: the strategy's replicas or SparseCores per chip are not the shards',
        or TF configured the embedding otherwise than the shards were packed for.
    """
    setup = embedding_setup(artifact_dir, plan=plan, optimizer=optimizer,
                            pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
                            initialize_tables_on_host=initialize_tables_on_host,
                            enable_fast_table_initialization=enable_fast_table_initialization)
    _check_strategy(tf.distribute.get_strategy(), setup.topology)
    embedding = tf.tpu.experimental.embedding.TPUEmbeddingV2(**setup.kwargs())
    check_embedding(embedding, setup)
    return embedding


# ---------------------------------------------------------------- input: one element per replica

def replica_dataset_fn(artifact_dir: ArtifactDirs, **kwargs) -> Callable[[Any], Any]:
    """The `dataset_fn(input_context)` `distribute_steps` gives `strategy.distribute_datasets_from_function`.

    Reads host `input_context.input_pipeline_id`'s shards (of one artifact, or of a window of days: see
    `input_fn`); the input pipelines must be the artifact's hosts and the replicas its chips.

    Args:
      artifact_dir: one artifact, or a window of days of one lineage, oldest first.
      **kwargs: passed to `per_chip_dataset` (`num_epochs`, `shuffle_steps`, ...).

    Returns:
      `dataset_fn(input_context)`, which raises `ArtifactMismatchError` when the input pipelines
      are not the artifact's hosts or the replicas not its chips.
    """
    dirs, manifests = window(artifact_dir)
    source, where = (dirs[0] if len(dirs) == 1 else dirs), dirs[-1]  # where: the artifact the errors name
    m = manifests[-1]
    fmt = m.shard_format
    topo = m.topology

    def dataset_fn(input_context):
        if input_context.num_input_pipelines != fmt.num_hosts:
            raise ArtifactMismatchError(
                f"the shards in {where} are written for {fmt.num_hosts} host(s), but this strategy has "
                f"{input_context.num_input_pipelines} input pipeline(s). Run one input pipeline per host (a "
                f"multi-host TPUStrategy has one per TPU host), or re-shard with topology.num_hosts="
                f"{input_context.num_input_pipelines}.")
        if input_context.num_replicas_in_sync != topo.num_chips:
            raise ArtifactMismatchError(
                f"the shards in {where} are packed for {topo.num_chips} chips, but this strategy has "
                f"{input_context.num_replicas_in_sync} replicas: re-shard with topology.num_chips="
                f"{input_context.num_replicas_in_sync}.")
        return per_chip_dataset(source, input_context.input_pipeline_id, **kwargs)

    return dataset_fn


def dequeue_args(element: Mapping[str, Any], sample_counts: Mapping[str, int]):
    """`{stack: (PartitionedCsrFormatTensor, row_pointers_unpadded_size, ids_unpadded_size)}` of a replica's element.

    Call it inside the replica function: `sample_count` becomes the Python
    int TF's own `enqueue` puts there.

    Args:
      element: a replica's element of `distribute_steps`' dataset (a `per_chip_dataset` element).
      sample_counts: `{stack: samples per chip}`, the manifest's (`DistributedSteps.sample_counts`).

    Returns:
      What `TPUEmbeddingV2.dequeue` takes, per stack.

    Raises:
      ValueError: the element has no CSR buffers for a stack of `sample_counts`.
    """
    sc = element["sparse_core"]
    missing = sorted(set(sample_counts) - set(sc))
    if missing:
        raise ValueError(f"the element has no CSR buffers for stacks {missing}; it has {sorted(sc)}.")
    return dequeue_inputs({k: sc[k] for k in sample_counts}, sample_counts)


@dataclasses.dataclass(frozen=True)
class DistributedSteps:
    """What `distribute_steps` returns: the distributed dataset and what the replica function needs."""

    dataset: Any  # tf.distribute.DistributedDataset: per replica, one `per_chip_dataset` element per step
    sample_counts: Dict[str, int]  # stack -> PartitionedCsrFormatTensor.sample_count (Python ints)
    steps_per_epoch: int
    num_epochs: Optional[int]
    global_batch_size: int
    per_chip_batch_size: int
    topology: Topology
    shard_format: Any  # tpu_embed.artifact.shard_format.ShardFormat
    ids_dropped_by_limits: Dict[str, int] = dataclasses.field(default_factory=dict)  # per stack (allow_id_dropping)

    def __iter__(self):
        return iter(self.dataset)

    @property
    def element_spec(self):
        return self.dataset.element_spec

    def dequeue_args(self, element: Mapping[str, Any]):
        """`dequeue_args(element, self.sample_counts)`: call inside the replica function."""
        return dequeue_args(element, self.sample_counts)


def distribute_steps(artifact_dir: ArtifactDirs, strategy: Any, *, num_epochs: Optional[int] = 1, prefetch: int = 2,
                     num_parallel_calls: Optional[int] = None, expected_fingerprint: Optional[str] = None,
                     reader: str = "auto", input_options: Any = None,
                     shuffle_steps: Optional[int] = None) -> DistributedSteps:
    """The artifact's shards as a distributed dataset: replica r gets its own chip's buffers and examples.

    `strategy.distribute_datasets_from_function(replica_dataset_fn(...))`:
    host `input_context.input_pipeline_id` reads its own shards and yields,
    per step, one element per chip, in chip order; the worker's iterator
    gives its local replicas consecutive elements, so local replica c gets
    chip c (see the module docstring).

    Args:
      artifact_dir: one artifact, or a window of days of one lineage, oldest first (read as `input_fn`
        reads it: `steps_per_epoch` and the ids dropped are the window's).
      strategy: the `tf.distribute.TPUStrategy`, one replica per chip the shards were packed for.
      num_epochs: passes over the steps; None repeats forever.
      prefetch: as for `input_fn`.
      num_parallel_calls: as for `input_fn`.
      expected_fingerprint: as for `input_fn`.
      reader: as for `input_fn`.
      input_options: a `tf.distribute.InputOptions` passed through (e.g.
        `experimental_fetch_to_device=False` to keep the buffers on the host).
      shuffle_steps: a seed permuting the steps (of the whole window) every epoch, as `input_fn`'s.

    Returns:
      The `DistributedSteps`: the distributed dataset, its sample counts, steps per epoch and batch sizes.

    Raises:
      ArtifactMismatchError: the strategy's replicas are not the shards' chips.
    """
    dirs, manifests = window(artifact_dir)
    for d, day in zip(dirs, manifests):
        require_shards(day, d)
    source, where = (dirs[0] if len(dirs) == 1 else dirs), dirs[-1]  # where: the artifact the errors name
    m = manifests[-1]  # the newest day's: its layout and batch are every day's (`check_window`)
    topo = m.topology.to_topology()
    if strategy.num_replicas_in_sync != topo.num_chips:
        raise ArtifactMismatchError(
            f"the shards in {where} are packed for {topo.num_chips} chips, but the strategy has "
            f"{strategy.num_replicas_in_sync} replicas: use one replica per chip, or re-shard with "
            f"topology.num_chips={strategy.num_replicas_in_sync}.")
    assert m.stacks is not None and m.shards is not None
    fn = replica_dataset_fn(source, num_epochs=num_epochs, prefetch=prefetch,
                            num_parallel_calls=num_parallel_calls, expected_fingerprint=expected_fingerprint,
                            reader=reader, shuffle_steps=shuffle_steps)
    dataset = strategy.distribute_datasets_from_function(fn, options=input_options)
    dropped: Dict[str, int] = {}
    for day in manifests:
        for stack, n in ids_dropped_by_limits(day).items():
            dropped[stack] = dropped.get(stack, 0) + n
    return DistributedSteps(
        dataset=dataset, sample_counts={k: int(v.sample_count) for k, v in m.stacks.items()},
        steps_per_epoch=sum(int(day.shards.steps) for day in manifests if day.shards is not None),
        num_epochs=num_epochs, global_batch_size=int(m.batch_sizes.global_),
        per_chip_batch_size=int(m.batch_sizes.per_chip), topology=topo,
        shard_format=window_format(dirs, manifests) if len(dirs) > 1 else m.shard_format,
        ids_dropped_by_limits=dropped)


# ---------------------------------------------------------------- the training step

def _loss_fn(loss: Union[str, Callable]) -> Callable:
    if callable(loss):
        return loss
    if loss == "bce":
        return lambda labels, logits: tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    if loss == "mse":
        return lambda labels, logits: tf.math.squared_difference(labels, logits)
    raise ValueError(f"loss must be 'bce', 'mse' or a callable (labels, logits) -> per-example loss, got {loss!r}")


def default_model_inputs(element: Mapping[str, Any], activations: Any) -> Dict[str, Any]:
    """What the Keras model gets: {"sparse": activations per feature, "dense": ..., "tensor_core": ...}."""
    return {"sparse": activations, "dense": element["dense"], "tensor_core": element["tensor_core"]}


def make_replica_step(embedding: Any, model: Any, optimizer: Any, sample_counts: Mapping[str, int], *,
                      global_batch_size: int, loss: Union[str, Callable] = "bce",
                      model_inputs: Callable[[Mapping[str, Any], Any], Any] = default_model_inputs
                      ) -> Callable[[Mapping[str, Any]], Any]:
    """The per-replica training step, for `strategy.run(step, args=(element,))`; returns the replica's loss.

    `enqueue` is skipped: `embedding.dequeue(dequeue_args(element))` →
    activations → `model(model_inputs(element, activations))` → masked loss
    summed over the replica's examples / `global_batch_size` (so the SUM over
    replicas is the mean over the global batch) → dense gradients to
    `optimizer` (Keras all-reduces them), activation gradients to
    `embedding.apply_gradients(grads, preserved_outputs)`.

    Args:
      embedding: the `TPUEmbeddingV2` of `build_tpu_embedding`.
      model: the Keras model, called on `model_inputs(element, activations)`.
      optimizer: the dense model's optimizer.
      sample_counts: `{stack: samples per chip}` (`DistributedSteps.sample_counts`).
      global_batch_size: the global batch the loss is averaged over.
      loss: "bce" (sigmoid cross-entropy on logits), "mse", or a callable
        `(labels, logits) -> per-example loss`.
      model_inputs: `(element, activations) -> the model's input`; default `default_model_inputs`.

    Returns:
      `step(element)`, which trains on the replica's element and returns the replica's loss.

    Raises:
      ValueError: `loss` is not "bce", "mse" or a callable.
    """
    per_example = _loss_fn(loss)
    counts = dict(sample_counts)

    def step(element):
        csr = dequeue_args(element, counts)
        with tf.GradientTape() as tape:
            activations, preserved = embedding.dequeue(csr)
            tape.watch(activations)
            logits = model(model_inputs(element, activations), training=True)
            logits = tf.reshape(logits, tf.shape(element["label"]))
            losses = per_example(element["label"], logits) * element["mask"]
            replica_loss = tf.reduce_sum(losses) / float(global_batch_size)
        variables = model.trainable_variables
        emb_grads, dense_grads = tape.gradient(replica_loss, (activations, variables))
        optimizer.apply_gradients(zip(dense_grads, variables, strict=True))
        embedding.apply_gradients(emb_grads, preserved)
        return replica_loss

    return step
