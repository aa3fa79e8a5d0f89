"""HostEmbedding: the SparseCore embedding of a model, trained on CPU or GPU from the same CSR bytes.

A trainer that feeds `TPUEmbeddingV2.dequeue` from offline shards can run
the same loop off TPU:

    emb = HostEmbedding.from_artifact(artifact_dir)        # or HostEmbedding(model_config, ...)
    for record in tpu_embed.input_fn(artifact_dir):        # one element per step (this host)
        activations, preserved = emb.dequeue(record)       # {feature: [batch, dim] / [batch, L, dim]}
        with tf.GradientTape() as tape:
            tape.watch(activations)
            loss = dense_model(activations, record["dense"], record["label"])
        emb.apply_gradients(tape.gradient(loss, activations), preserved)

The index.  `prepare` (`tpu_embed.training.host_index`, numpy) undoes the
SparseCore layout: it computes (output row, table row, gain) of every
meaningful id of a step once; the lookup (`tf.gather` +
`unsorted_segment_sum`) and the gradients reuse it.

Compiled steps.  The TensorFlow side runs as `tf.function`s traced once per
feature structure (`tpu_embed.training.host_compiled`), the index handed over as a few flat tensors
(`StepLookup.packed`): `lookup` is one call, `apply_gradients` one call
(sparse gradients and every table's update; SGD and Adagrad through TF's
fused kernels, bit-identical to the rule).  `prepare_ahead(records)` runs
`prepare` one step ahead in a background thread, and
`train_step(model_fn, loss_fn, optimizer)` makes the whole step (lookup,
dense model, both updates) one compiled call:

    step = emb.train_step(model_fn, loss_fn, optimizer)
    for record, prepared in emb.prepare_ahead(tpu_embed.input_fn(artifact_dir)):
        loss = step(record, prepared)

Chips of one step are replicas of one global batch: activations are
concatenated in global chip order (host h, local chip c -> h *
chips_per_host + c, as the labels are), and a table row's gradient is the
sum over every chip, as on TPU.  Tensor-core features (not in the
SparseCore model; `tc/<feature>/...` in the shards) are looked up densely
from their ids with their table's combiner (same gains as SparseCore's).

Training follows TPU embedding's optimizer semantics (see
`tpu_embed.training.host_optimizers`).  `experimental_gradient_multiplier_fn` is the
estimator-era `EmbeddingConfigSpec` argument (TF 2.21's
`tf.tpu.experimental.embedding` has none): `fn(global_step)` returns
`{table name: multiplier}` and the table's activation gradients are
multiplied by it before anything else (TF1's
`generate_send_gradients_op(gradient_multipliers=...)`).

Pipelining.  TF: with `pipeline_execution_with_tensor_core=True` "the TPU
embedding computations will overlap with the TensorCore computations (and
hence will be one step old)".  The MLIR pass
(tensorflow/compiler/mlir/tensorflow/transforms/sparsecore/
embedding_pipelining.cc) runs, in loop iteration i: the SparseCore backward
pass (update) of step i-2, the TensorCore step i-1, then the SparseCore
forward pass (lookup) of step i; after the loop it finishes the last two
steps.  So the lookup of step n sees the updates of steps <= n-2, not that
of step n-1, and every update is applied to the tables as they are when it
runs.  Here: `apply_gradients` for step n computes step n's update (with
step n's learning rate and multiplier) and keeps it pending; it first
applies the pending update of step n-1.  A lookup therefore sees every
update but the last one; `flush()` applies the pending update (TF's loop
epilogue) -- call it before saving, exporting or evaluating.  (TF itself
falls back to sequential execution while summaries are recorded or when
`embedding_pipelining_state.enabled` is False; here the flag alone decides.)

Variables: `tables[name]` ([vocabulary_size, dim], unstacked) and
`slots[name][slot]` (TF's slot names), `iterations` (steps applied); all
are saved by `tf.train.Checkpoint(embedding=host_embedding)` under those
names.  Tables are initialised like TF's TableConfig default
(truncated normal, mean 0, stddev 1/sqrt(dim)), deterministically from
`seed` and the table name.

Deliberate differences from TPUEmbeddingV2: `dequeue` is called eagerly (the
index precompute is numpy; the lookup itself is compiled); `embedding_tables` is keyed by table name, not
stacked table; `use_gradient_accumulation=False` behaves as True;
activations are `tf.stop_gradient` tensors (watch them in the tape, as with
TPUEmbeddingV2's); tensor-core tables are updated with their table's
optimizer when their features' gradients are passed (on TPU they are dense
variables of the TensorCore model).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tpu_embed.artifact.load import load_artifact
from tpu_embed.core.model import FeatureConfig, ModelConfig, to_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.layout import SparseCoreLayout
from tpu_embed.training import host_optimizers
from tpu_embed.training.host_compiled import (
    CompiledSteps,
    Pending,
    TrainFunctions,
    dense_batch,
    f32_vector,
    packed_tensor,
)
from tpu_embed.training.host_config import host_config, table_seed
from tpu_embed.training.host_index import FeatureLookup, PackedIndex, StepLookup, packed_index

__all__ = ["HostEmbedding", "StepLookup", "FeatureLookup"]


class HostEmbedding(tf.Module):
    """`TPUEmbeddingV2`'s lookups and updates on CPU/GPU, fed the same SparseCore CSR buffers.

    Args:
      feature_config: a `tpu_embed.core.model.ModelConfig`, or the nested
        `tf.tpu.experimental.embedding.FeatureConfig`s TPUEmbeddingV2 takes
        (then `topology` is required and activations come back in that nest).
      topology: the `tpu_embed.Topology` the CSR was made for (a ModelConfig carries it).
      optimizer: for tables without their own (TPUEmbeddingV2's `optimizer`).
      tensor_core_features: `tpu_embed.core.model.FeatureConfig`s looked up densely
        (spec `embedding_lookup_device: tpu_tensor_core`).
      pipeline_execution_with_tensor_core: one-step-stale updates (see the module docstring).
      seed: tables are initialised deterministically from it and their names.
      initializers: `{table: fn(shape, dtype)}` replacing the default initializer.
      experimental_gradient_multiplier_fn: `fn(global_step) -> {table: multiplier}`.
      global_step: a tf.Variable or zero-argument callable passed to the
        multiplier function; default: this object's `iterations`.
      optimizer_semantics: "tpu_embedding" (TPU embedding's documented
        semantics, every option honoured) or "tf221_sparsecore" (what TF
        2.21's TPUEmbeddingV2 passes to the SparseCore kernels); see
        `tpu_embed.training.host_optimizers`.
      name: the `tf.Module`'s name.

    Raises:
      ValueError: tensor-core features with a TF feature-config nest, a feature both tensor-core
        and SparseCore, a table configured twice differently, an optimizer option the semantics
        do not support, or an unknown `optimizer_semantics`.
    """

    def __init__(self, feature_config: Any, *, topology: Optional[Topology] = None, optimizer: Any = None,
                 tensor_core_features: Sequence[FeatureConfig] = (),
                 pipeline_execution_with_tensor_core: bool = False, seed: int = 0,
                 initializers: Optional[Mapping[str, Callable]] = None,
                 experimental_gradient_multiplier_fn: Optional[Callable[[Any], Mapping[str, Any]]] = None,
                 global_step: Any = None, optimizer_semantics: str = "tpu_embedding",
                 name: str = "host_embedding"):
        super().__init__(name=name)
        self._config = host_config(
            feature_config, topology=topology, optimizer=optimizer, tensor_core_features=tensor_core_features,
            pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core, seed=seed,
            initializers=initializers, experimental_gradient_multiplier_fn=experimental_gradient_multiplier_fn,
            global_step=global_step, optimizer_semantics=optimizer_semantics)
        self._state = _State()
        self._built = False

    # -- construction from an artifact ----------------------------------------

    @classmethod
    def from_artifact(cls, artifact_dir: str, **kwargs: Any) -> "HostEmbedding":
        """From an artifact directory: its spec.yaml and the vocabulary sizes of its manifest.json.

        The model is `Spec.model(vocab_sizes)` (checked against the layout the
        shard job recorded), plus the spec's tensor-core features.

        Args:
          artifact_dir: the artifact directory (local path or object-store URL).
          **kwargs: the other arguments of `HostEmbedding` (`optimizer`, `seed`, ...);
            `pipeline_execution_with_tensor_core` defaults to the spec's.

        Returns:
          A `HostEmbedding` for the artifact's model (tables not built yet).
        """
        artifact = load_artifact(artifact_dir)
        spec, sizes = artifact.spec, artifact.manifest.vocabulary_sizes
        tc = [FeatureConfig(f.name, spec.table_config(f.table, sizes), (spec.per_chip_batch_size,))
              for f in spec.tensor_core_features]
        kwargs.setdefault("pipeline_execution_with_tensor_core", spec.training.pipeline_execution_with_tensor_core)
        return cls(artifact.model, tensor_core_features=tc, **kwargs)

    # -- properties ------------------------------------------------------------

    @property
    def model(self) -> ModelConfig:
        """The SparseCore model: tables, features and topology."""
        return self._config.model

    @property
    def layout(self) -> SparseCoreLayout:
        """The model's SparseCore layout: how TPUEmbeddingV2 stacks its tables (`tpu_embed.sparsecore.stack_tables`)."""
        return self._config.index.layout

    @property
    def tensor_core_features(self) -> Dict[str, FeatureConfig]:
        """{feature name: FeatureConfig} of the features looked up densely (not on SparseCore)."""
        return dict(self._config.tc_features)

    @property
    def embedding_tables(self) -> Dict[str, Any]:
        """{table name: [vocabulary_size, dim] variable} (SparseCore and tensor-core tables)."""
        self.build()
        return dict(self.tables)

    @property
    def variables_by_table(self) -> Dict[str, Dict[str, Any]]:
        """{table name: {"parameters": table, slot: variable}}, as TPUEmbeddingV2.variables nests them."""
        self.build()
        return {n: {"parameters": v, **dict(self.slots.get(n, {}))} for n, v in self.tables.items()}

    # -- variables ---------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # `tables`, `slots` and `iterations` exist once built; reading one builds (as TF's lazy _maybe_build).
        d = self.__dict__
        if name in ("tables", "slots", "iterations") and "_config" in d and not d.get("_built", False) \
                and not d.get("_building", False):
            self.build()
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def build(self) -> None:
        """Create the tables and slot variables (idempotent)."""
        if self._built:
            return
        self.__dict__["_building"] = True  # tf.Module's __setattr__ reads the attribute first: no re-entry
        cfg = self._config
        tables, slots = {}, {}
        for name, t in sorted(cfg.tables.items()):
            init = cfg.initializers.get(name)
            if init is not None:
                value = init(shape=(t.vocabulary_size, t.dim), dtype=tf.float32)
            else:  # TF's TableConfig default, seeded: truncated normal, mean 0, stddev 1/sqrt(dim)
                value = tf.random.stateless_truncated_normal(
                    (t.vocabulary_size, t.dim), seed=table_seed(cfg.seed, name), stddev=1.0 / math.sqrt(t.dim))
            tables[name] = tf.Variable(value, name=name, trainable=False, dtype=tf.float32)
            opt = cfg.optimizers[name]
            if opt is not None:
                slots[name] = {s: tf.Variable(tf.fill((t.vocabulary_size, t.dim), v), name=f"{name}/{s}",
                                              trainable=False)
                               for s, v in host_optimizers.slot_initial_values(opt.kind, dict(opt.params)).items()}
        self.tables = tables
        self.slots = slots
        self.iterations = tf.Variable(0, dtype=tf.int64, name="iterations", trainable=False)
        self._state.compiled = CompiledSteps(cfg, self.tables, self.slots, self.iterations)
        self._built = True

    def _compiled(self) -> CompiledSteps:
        """The compiled lookups and updates over this embedding's variables (built first)."""
        self.build()
        assert self._state.compiled is not None  # made by build()
        return self._state.compiled

    # -- lookups -------------------------------------------------------------------

    def prepare(self, chips: Any, tensor_core: Any = None) -> StepLookup:
        """The numpy index of a step: (output row, table row, gain) of every meaningful id.

        Args:
          chips: one step's per-chip CSR in global chip order (a list of `{stack: buffers}`:
            a record's `["sparse_core"]` or `CsrBatch`es), or an `input_fn` element, or a list of
            records of all hosts in host order (see `HostIndex.prepare` in `tpu_embed.training.host_index`).
          tensor_core: the tensor-core features' ids; default: the record's, when `chips` is a record.

        Returns:
          The step's `StepLookup`, what `lookup`, `dequeue` and `apply_gradients` take.
        """
        return self._config.index.prepare(chips, tensor_core)

    def lookup(self, step: Any, tensor_core: Any = None) -> Any:
        """Activations of a step (a `StepLookup`, or anything `prepare` takes), nested like the feature config.

        One compiled call per step (a `tf.function` per feature structure, traced once): per table,
        `unsorted_segment_sum(gather(table, ids) * gains, rows)` over its features' entries, split
        into the features' activations.

        Args:
          step: a `StepLookup` from `prepare`, or anything `prepare` takes.
          tensor_core: as for `prepare`.

        Returns:
          The activations, `[batch, dim]` (or `[batch, L, dim]` for sequence features) per feature,
          nested like the feature config (a `{feature: tensor}` dict for a `ModelConfig`).
        """
        self.build()
        if not isinstance(step, StepLookup):
            step = self.prepare(step, tensor_core)
        packed = packed_index(step)
        acts = self._compiled().lookup(packed)
        by_name = dict(zip((n for _, feats in packed.key for n, _ in feats), acts))
        return self._config.pack({name: by_name[name] for name in step.features})

    def dequeue(self, chips: Any, tensor_core: Any = None) -> Tuple[Any, StepLookup]:
        """The step's activations and lookups, as `TPUEmbeddingV2.dequeue` returns them. Also `emb(record)`.

        Args:
          chips: an `input_fn` element (or anything `prepare` takes), or its `StepLookup`.
          tensor_core: as for `prepare`.

        Returns:
          `(activations, preserved_outputs)`: the activations as `lookup` returns them, and the
          step's `StepLookup`, to pass to `apply_gradients`.
        """
        step = chips if isinstance(chips, StepLookup) else self.prepare(chips, tensor_core)
        self._state.last_step = step
        return self.lookup(step), step

    __call__ = dequeue

    def prepare_ahead(self, steps: Iterable[Any], depth: int = 1) -> Iterator[Tuple[Any, StepLookup]]:
        """`(step, self.prepare(step))` for every element of `steps`, prepared `depth` steps ahead.

        `prepare` (numpy; its sorts release the GIL) runs in a background
        thread while the caller trains on the previous step, so on a machine
        with a spare core the index costs no step time.  Elements are taken
        from `steps` on the calling thread (a `tf.data` iterator stays
        there); an error of `prepare` is raised where its step is yielded.

        Args:
          steps: the steps, e.g. `tpu_embed.input_fn(artifact_dir)`.
          depth: how many steps are prepared ahead of the one being trained on.

        Yields:
          `(step, prepared)`: every element of `steps` with its `StepLookup`.

        Raises:
          ValueError: `depth` below 1.
        """
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}.")
        it = iter(steps)
        queue: deque = deque()
        with ThreadPoolExecutor(1, thread_name_prefix="HostEmbedding.prepare") as pool:
            def submit() -> None:
                for item in it:
                    queue.append((item, pool.submit(self.prepare, item)))
                    return
            for _ in range(depth):
                submit()
            while queue:
                item, future = queue.popleft()
                submit()
                yield item, future.result()

    # Long for its docstring, which writes out the eager loop the step compiles; its code is the closure.
    def train_step(self, model_fn: Callable[[Any, Any], Any], loss_fn: Callable[[Any, Any], Any], optimizer: Any,
                   *, variables: Any = None) -> Callable[..., Any]:
        """A whole training step as one compiled call: `step = emb.train_step(model_fn, loss_fn, optimizer)`.

        `loss = step(record)` (or `step(record, prepared)` with the record's
        `StepLookup` from `prepare_ahead`) is the eager loop of the module
        docstring in one `tf.function`:

        ```python
        activations, preserved = emb.dequeue(record)
        with tf.GradientTape() as tape:
            tape.watch(activations)
            loss = loss_fn(batch, model_fn(activations, batch))
        grads, act_grads = tape.gradient(loss, (variables, activations))
        optimizer.apply_gradients(zip(grads, variables))
        emb.apply_gradients(act_grads, preserved)
        ```

        `batch` is the record without its CSR (`"sparse_core"`,
        `"tensor_core"`): e.g. `batch["dense"]`, `batch["label"]`,
        `batch["mask"]` (a list of such dicts for a list of records).
        Same results and pipelining as the loop above; the one difference is
        when the embedding's learning-rate and multiplier functions are
        evaluated: as the step starts, before `optimizer` runs (with the
        default global step, `iterations`, that is the same value).  An
        activation the loss does not use gets a zero gradient (as None in
        `apply_gradients`).

        ```python
        step = emb.train_step(model_fn, loss_fn, optimizer)
        for record, prepared in emb.prepare_ahead(tpu_embed.input_fn(artifact_dir)):
            loss = step(record, prepared)
        ```

        Args:
          model_fn: `model_fn(activations, batch)`, the dense model's output.
          loss_fn: `loss_fn(batch, output)`, the scalar loss.
          optimizer: the dense variables' optimizer (e.g. a Keras optimizer).
          variables: the dense variables to train (a list, or a callable
            returning it); default `model_fn.trainable_variables` (a Keras model or
            `tf.Module`), else every trainable variable the forward pass reads.

        Returns:
          `step(record, prepared=None)`, which trains on one record (or a list of records) and
          returns the loss.
        """
        train = TrainFunctions(model_fn, loss_fn, optimizer, variables)

        def step(record: Any, prepared: Optional[StepLookup] = None):
            self.build()
            lookup = prepared if prepared is not None else (
                record if isinstance(record, StepLookup) else self.prepare(record))
            self._state.last_step = lookup
            packed = packed_index(lookup)
            scaled, scales, lrs = self._update_inputs(packed, tuple(range(len(packed.key))))
            loss, pending = train(self._compiled(), packed, scaled, scales, lrs, self._state.pending,
                                  dense_batch(record))
            if self._config.pipelining:
                self._state.pending = pending
            return loss

        return step

    # -- gradients and updates ------------------------------------------------------

    def sparse_gradients(self, gradients: Any, preserved_outputs: Optional[StepLookup] = None) -> Dict[str, Any]:
        """{table: tf.IndexedSlices} of the step: per-row sums over every chip of gain x activation gradient.

        This is the accumulated gradient TPU embedding's optimizer sees, before
        the gradient multiplier and clipping.  Tensor-core tables appear when
        their features are in `gradients`.

        Args:
          gradients: the gradients w.r.t. the activations, nested like them.
          preserved_outputs: the step's `StepLookup`; default: the last `dequeue`'s.

        Returns:
          `{table name: tf.IndexedSlices}` over the table's rows of this step.
        """
        self.build()
        step = self._step(preserved_outputs)
        packed = packed_index(step)
        grads, upd, nones = self._compiled().gradient_inputs(self._flat_gradients(gradients, step), step)
        scaled = (False,) * len(upd)
        values = self._compiled().values(packed, grads, upd, nones, scaled, tf.zeros((len(upd),), tf.float32))
        out = {}
        for ti, v in zip(upd, values, strict=True):
            table = packed.key[ti][0]
            out[table] = tf.IndexedSlices(v, tf.constant(step.tables[table][0], tf.int64),
                                          dense_shape=tf.constant(self.tables[table].shape, tf.int64))
        return out

    def apply_gradients(self, gradients: Any, preserved_outputs: Optional[StepLookup] = None) -> None:
        """Update the tables from gradients w.r.t. the activations, as `TPUEmbeddingV2.apply_gradients`.

        `gradients` is nested like the activations; a None gradient applies a
        zero gradient to that feature's rows (TF's rule).  Tensor-core
        features may be left out (their tables are then not updated).
        The sparse gradients and the updates run as one compiled call (two with
        pipelining: this step's gradients, and the pending update applied).

        Args:
          gradients: the gradients w.r.t. the activations, nested like them.
          preserved_outputs: the step's `StepLookup`; default: the last `dequeue`'s.

        Raises:
          ValueError: a table to update has no optimizer.
          KeyError: `experimental_gradient_multiplier_fn` returned no multiplier for a SparseCore table.
        """
        cfg = self._config
        self.build()
        step = self._step(preserved_outputs)
        packed = packed_index(step)
        grads, upd, nones = self._compiled().gradient_inputs(self._flat_gradients(gradients, step), step)
        scaled, scale_t, lr_t = self._update_inputs(packed, upd)
        names = tuple(t for t, _ in packed.key)
        if cfg.pipelining:
            pending = self._state.pending
            values = self._compiled().values(packed, grads, upd, nones, scaled, scale_t, pending=pending)
            self._state.pending = Pending(names, upd, packed_tensor(packed, "unique"),
                                          packed_tensor(packed, "ucounts"), tuple(values), lr_t)
        elif upd:
            self._compiled().update(packed, grads, upd, nones, scaled, scale_t, lr_t)
        self.iterations.assign_add(1)

    def _update_inputs(self, packed: PackedIndex, upd: Tuple[int, ...]):
        """(which tables get a multiplier, multipliers, learning rates) of this update; checks first."""
        cfg = self._config
        step_value = self._global_step()
        multipliers = cfg.multiplier_fn(step_value) if cfg.multiplier_fn is not None else None
        # The multiplier covers the SparseCore (TPU embedding) tables; tensor-core tables only if named.
        tc_tables = {f.table.name for f in cfg.tc_features.values()}
        scaled, scales, lrs = [], [], []
        for ti in upd:
            table = packed.key[ti][0]
            opt = cfg.optimizers[table]
            if opt is None:
                raise ValueError(f"Table {table!r} has no optimizer: give its TableConfig one or pass `optimizer`.")
            if multipliers is not None and table in multipliers:
                scaled.append(True)
                scales.append(multipliers[table])
            elif multipliers is not None and table not in tc_tables:
                raise KeyError(f"experimental_gradient_multiplier_fn returned no multiplier for table "
                                   f"{table!r} (it returned {sorted(multipliers)}).")
            else:
                scaled.append(False)
                scales.append(1.0)
            lrs.append(opt.learning_rate_fn() if opt.learning_rate_fn is not None else
                       dict(opt.params)["learning_rate"])
        return tuple(scaled), f32_vector(scales), f32_vector(lrs)

    def flush(self) -> None:
        """Apply the pending (pipelined) update now: TF's loop epilogue. A no-op without pipelining."""
        pending, self._state.pending = self._state.pending, None
        if pending is not None:
            self._compiled().apply(pending)

    @property
    def has_pending_update(self) -> bool:
        """Whether a pipelined update waits for the next `apply_gradients` or `flush`."""
        return self._state.pending is not None

    def _global_step(self):
        gs = self._config.global_step
        if gs is None:
            return self.iterations
        if callable(gs) and not hasattr(gs, "assign"):
            return gs()
        return gs

    def _step(self, preserved: Optional[StepLookup]) -> StepLookup:
        step = preserved if preserved is not None else self._state.last_step
        if step is None:
            raise ValueError("apply_gradients needs the step's preserved outputs: call dequeue first or pass them.")
        if not isinstance(step, StepLookup):
            raise TypeError(f"preserved_outputs must be what dequeue returned (a StepLookup), got "
                            f"{type(step).__name__}.")
        return step

    def _flat_gradients(self, gradients: Any, step: StepLookup) -> Dict[str, Any]:
        if self._config.structure is not None:
            leaves = _leaves(gradients)
            if len(leaves) != len(self._config.model.features):
                raise ValueError(f"gradients have {len(leaves)} leaves, the feature config "
                                 f"{len(self._config.model.features)}.")
            flat = dict(zip((f.name for f in self._config.model.features), leaves, strict=True))
        else:
            if not isinstance(gradients, Mapping):
                raise TypeError("gradients must be nested like the activations: {feature: tensor}.")
            flat = dict(gradients)
        unknown = sorted(set(flat) - set(step.features))
        if unknown:
            raise ValueError(f"gradients for unknown features {unknown}.")
        missing = sorted(f.name for f in self._config.model.features if f.name not in flat)
        if missing:
            raise ValueError(f"gradients for SparseCore features {missing} are missing (pass None for a zero "
                             "gradient, as TPUEmbeddingV2 takes).")
        return flat

    # -- serving -----------------------------------------------------------------

    def to_serving(self):
        """A built `tf.tpu.experimental.embedding.TPUEmbeddingForServing` holding these SparseCore tables.

        Its feature config is `tpu_embed.core.model.to_tf_feature_config(model)`
        without the per-chip output shapes (a TPU training detail): serving
        takes any batch size, sequence features keep `max_sequence_length`.
        Pending pipelined updates are not included: `flush()` first.

        Returns:
          The built `TPUEmbeddingForServing`, its tables holding these tables' values.
        """
        self.build()
        feature_config = to_tf_feature_config(self._config.model)
        for fc in tf.nest.flatten(feature_config):
            fc.output_shape = tf.TensorShape(None)
        serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(feature_config, optimizer=None)
        serving.build()
        for table, var in serving.embedding_tables.items():
            var.assign(self.tables[table.name])
        return serving


def _leaves(structure: Any) -> List[Any]:
    return tf.nest.flatten(structure)


@dataclasses.dataclass
class _State:
    last_step: Optional[StepLookup] = None
    pending: Optional[Pending] = None
    compiled: Optional[CompiledSteps] = None  # made by build()
