"""`HostEmbedding`'s TensorFlow side: its lookups and updates as `tf.function`s, each traced once and cached.

A function is keyed by what its graph depends on (the step's feature structure, which tables are updated,
which gradients are None, which tables get a multiplier, the pending update's shape) and takes the step's
index (`tpu_embed.training.host_index.PackedIndex`) as a few flat tensors, so a step of a known structure
is one call into a compiled graph.  `CompiledSteps` holds them for one embedding's variables;
`TrainFunctions` holds `HostEmbedding.train_step`'s whole-step functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tpu_embed.training import host_optimizers
from tpu_embed.training.host_config import HostConfig
from tpu_embed.training.host_index import PackedIndex, StepLookup, packed_index


@dataclasses.dataclass(frozen=True)
class Pending:
    """A computed, not yet applied update (pipelining): tables `names[i]` for i in `upd`."""

    names: Tuple[str, ...]
    upd: Tuple[int, ...]
    unique: Any  # int64 tensor, every table's unique rows (`PackedIndex.unique`)
    ucounts: Any  # int32 tensor [len(names)]
    values: Tuple[Any, ...]  # per updated table, [unique rows, dim]
    lrs: Any  # float32 tensor [len(upd)]


class CompiledSteps:
    """The compiled lookups and updates over one built embedding's `tables`, `slots` and `iterations`."""

    def __init__(self, config: HostConfig, tables: Mapping[str, Any], slots: Mapping[str, Any], iterations: Any):
        self.config = config
        self.tables = tables
        self.slots = slots
        self.iterations = iterations
        self._functions: Dict[Any, Any] = {}

    def function(self, key, make):
        """The function cached under `key`, made by `make()` the first time."""
        fn = self._functions.get(key)
        if fn is None:
            fn = self._functions[key] = make()
        return fn

    def value_dims(self, pending: Pending) -> Tuple[int, ...]:
        return tuple(int(self.tables[pending.names[ti]].shape[1]) for ti in pending.upd)

    # -- the calls -------------------------------------------------------------------

    def lookup(self, packed: PackedIndex) -> List[Any]:
        """Every feature's activations of the step, in packed order, in one call."""
        fn = self.function(("lookup", packed.key), lambda: self._lookup_function(packed.key))
        return fn(packed_tensor(packed, "ids"), packed_tensor(packed, "rows"), packed_tensor(packed, "gains"),
                  packed_tensor(packed, "counts"))

    def values(self, packed, grads, upd, nones, scaled, scales, pending=None):
        """This step's accumulated gradients (compiled); with `pending`, that update is applied in the same call."""
        if not upd and pending is None:
            return []
        index = [packed_tensor(packed, k) for k in ("rows", "gains", "counts", "inverse", "ucounts")]
        if pending is None or not pending.upd:
            if not upd:
                return []
            fn = self.function(("values", packed.key, upd, nones, scaled),
                               lambda: self._values_function(packed.key, upd, nones, scaled, "values"))
            return fn(grads, *index, scales)
        p_key = (pending.names, pending.upd, self.value_dims(pending))
        fn = self.function(("pipelined", packed.key, upd, nones, scaled, p_key),
                           lambda: self._values_function(packed.key, upd, nones, scaled, "pipelined", p_key))
        return fn(grads, *index, scales, pending.unique, pending.ucounts, list(pending.values), pending.lrs)

    def update(self, packed, grads, upd, nones, scaled, scales, lrs) -> None:
        """This step's accumulated gradients and every updated table's optimizer update, in one call."""
        key = ("step", packed.key, upd, nones, scaled)
        fn = self.function(key, lambda: self._values_function(packed.key, upd, nones, scaled, "step"))
        fn(grads, *(packed_tensor(packed, k) for k in ("rows", "gains", "counts", "inverse", "ucounts")), scales,
           packed_tensor(packed, "unique"), lrs)

    def apply(self, pending: Pending) -> None:
        """Apply a pending update."""
        if not pending.upd:
            return
        fn = self.function(("apply", pending.names, pending.upd),
                           lambda: self._apply_function(pending.names, pending.upd, self.value_dims(pending)))
        fn(pending.unique, pending.ucounts, list(pending.values), pending.lrs)

    def gradient_inputs(self, flat: Dict[str, Any], step: StepLookup):
        """The gradients w.r.t. the activations as the compiled updates take them: (gradient tensors in packed
        order, indices of the tables to update, features with a None gradient); a wrong shape is refused."""
        packed = packed_index(step)
        grads, upd, nones = [], [], []
        for ti, (table, feats) in enumerate(packed.key):
            if not any(name in flat for name, _ in feats):
                continue
            upd.append(ti)
            dim = int(self.tables[table].shape[1])
            for name, shape in feats:
                g = flat.get(name)
                if g is None:
                    nones.append(name)
                    continue
                g = tf.convert_to_tensor(g, tf.float32)
                if tuple(g.shape) != shape + (dim,):
                    raise ValueError(f"gradient of {name!r} has shape {tuple(g.shape)}, expected {shape + (dim,)}.")
                grads.append(g)
        return grads, tuple(upd), frozenset(nones)

    # -- the graphs --------------------------------------------------------------------

    def graph_lookup(self, key, ids, rows, gains, counts) -> List[Any]:
        """In a tf.function: every feature's activations, in packed order."""
        n = len(key)
        ids, rows, gains = (tf.split(x, counts, num=n) for x in (ids, rows, gains))
        out: List[Any] = []
        for (table, feats), i, r, g in zip(key, ids, rows, gains, strict=True):
            var = self.tables[table]
            dim = int(var.shape[1])
            sizes = [_num_rows(shape) for _, shape in feats]
            acts = tf.math.unsorted_segment_sum(tf.gather(var, i) * g[:, None], r, sum(sizes))
            parts = tf.split(acts, sizes, num=len(sizes)) if len(sizes) > 1 else [acts]
            out.extend(tf.stop_gradient(tf.reshape(a, shape + (dim,))) for (_, shape), a in zip(feats, parts))
        return out

    def graph_values(self, key, upd, nones, scaled, grads, rows, gains, counts, inverse, ucounts, scales):
        """In a tf.function: the accumulated gradient of every updated table (multiplier applied if scaled)."""
        n = len(key)
        rows, gains, inverse = (tf.split(x, counts, num=n) for x in (rows, gains, inverse))
        grads = iter(grads)
        out: List[Any] = []
        for j, ti in enumerate(upd):
            table, feats = key[ti]
            dim = int(self.tables[table].shape[1])
            blocks = [tf.zeros((_num_rows(shape), dim), tf.float32) if name in nones else
                      tf.reshape(next(grads), (-1, dim)) for name, shape in feats]
            g = tf.concat(blocks, 0) if len(blocks) > 1 else blocks[0]
            v = tf.math.unsorted_segment_sum(tf.gather(g, rows[ti]) * gains[ti][:, None], inverse[ti], ucounts[ti])
            out.append(v * scales[j] if scaled[j] else v)
        return out

    def graph_apply(self, names, upd, unique, ucounts, values, lrs) -> None:
        """In a tf.function: every updated table's optimizer update."""
        cfg = self.config
        unique = tf.split(unique, ucounts, num=len(names))
        for j, ti in enumerate(upd):
            table = names[ti]
            opt = cfg.optimizers[table]
            assert opt is not None  # checked when the update was computed
            host_optimizers.apply_update(opt.kind, dict(opt.params), self.tables[table], self.slots[table],
                                         unique[ti], values[j], lrs[j], semantics=cfg.semantics)

    def _lookup_function(self, key):
        def lookup(ids, rows, gains, counts):
            return self.graph_lookup(key, ids, rows, gains, counts)

        i32, i64, f32 = tf.int32, tf.int64, tf.float32
        return tf.function(lookup, autograph=False, input_signature=[
            tf.TensorSpec([None], i64), tf.TensorSpec([None], i32), tf.TensorSpec([None], f32),
            tf.TensorSpec([len(key)], i32)])

    def _values_function(self, key, upd, nones, scaled, mode, pending_key=None):
        """mode "values": the gradients; "step": gradients and updates; "pipelined": gradients, pending applied."""
        i32, i64, f32 = tf.int32, tf.int64, tf.float32
        grad_specs = [tf.TensorSpec(shape + (int(self.tables[table].shape[1]),), f32)
                      for ti in upd for table, feats in [key[ti]] for name, shape in feats if name not in nones]
        specs = [grad_specs] + [tf.TensorSpec([None], d) for d in (i32, f32)] + [tf.TensorSpec([len(key)], i32)] + \
                [tf.TensorSpec([None], i32), tf.TensorSpec([len(key)], i32), tf.TensorSpec([len(upd)], f32)]

        def values(grads, rows, gains, counts, inverse, ucounts, scales):
            return self.graph_values(key, upd, nones, scaled, grads, rows, gains, counts, inverse, ucounts, scales)

        if mode == "values":
            return tf.function(values, autograph=False, input_signature=specs)
        if mode == "step":
            def step(grads, rows, gains, counts, inverse, ucounts, scales, unique, lrs):
                v = values(grads, rows, gains, counts, inverse, ucounts, scales)
                self.graph_apply(tuple(t for t, _ in key), upd, unique, ucounts, v, lrs)
            return tf.function(step, autograph=False, input_signature=specs + [
                tf.TensorSpec([None], i64), tf.TensorSpec([len(upd)], f32)])
        p_names, p_upd, p_dims = pending_key

        def pipelined(grads, rows, gains, counts, inverse, ucounts, scales, p_unique, p_ucounts, p_values, p_lrs):
            v = values(grads, rows, gains, counts, inverse, ucounts, scales)
            self.graph_apply(p_names, p_upd, p_unique, p_ucounts, p_values, p_lrs)
            return v
        return tf.function(pipelined, autograph=False, input_signature=specs + [
            tf.TensorSpec([None], i64), tf.TensorSpec([len(p_names)], i32),
            [tf.TensorSpec([None, d], f32) for d in p_dims], tf.TensorSpec([len(p_upd)], f32)])

    def _apply_function(self, names, upd, dims):

        def apply(unique, ucounts, values, lrs):
            self.graph_apply(names, upd, unique, ucounts, values, lrs)
        return tf.function(apply, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.int64), tf.TensorSpec([len(names)], tf.int32),
            [tf.TensorSpec([None, d], tf.float32) for d in dims], tf.TensorSpec([len(upd)], tf.float32)])


class TrainFunctions:
    """`HostEmbedding.train_step`'s whole steps (lookup, dense forward and backward, both updates), one compiled
    function per feature structure, multipliers and pending update."""

    def __init__(self, model_fn: Callable[[Any, Any], Any], loss_fn: Callable[[Any, Any], Any], optimizer: Any,
                 variables: Any):
        self._model_fn, self._loss_fn, self._optimizer, self._variables = model_fn, loss_fn, optimizer, variables
        self._functions: Dict[Any, Any] = {}

    def __call__(self, steps: CompiledSteps, packed: PackedIndex, scaled, scales, lrs, pending: Optional[Pending],
                 batch: Any) -> Tuple[Any, Optional[Pending]]:
        """Train on one step: (the loss, the step's pending update when pipelining, else None)."""
        pipelining = steps.config.pipelining
        upd = tuple(range(len(packed.key)))
        pending = pending if pipelining else None
        p_key = None if pending is None else (pending.names, pending.upd, steps.value_dims(pending))
        key = (packed.key, scaled, pipelining, p_key)
        fn = self._functions.get(key)
        if fn is None:
            fn = self._functions[key] = self._train_function(steps, packed.key, scaled, p_key)
        index = [packed_tensor(packed, k) for k in ("ids", "rows", "gains", "counts", "inverse", "ucounts", "unique")]
        p_args = [] if pending is None else [pending.unique, pending.ucounts, list(pending.values), pending.lrs]
        out = fn(index, scales, lrs, p_args, batch)
        if pipelining:
            loss, values = out
            return loss, Pending(tuple(t for t, _ in packed.key), upd, packed_tensor(packed, "unique"),
                                 packed_tensor(packed, "ucounts"), tuple(values), lrs)
        return out, None

    def _train_function(self, steps: CompiledSteps, key, scaled, p_key):
        cfg = steps.config
        model_fn, loss_fn, optimizer, variables = self._model_fn, self._loss_fn, self._optimizer, self._variables
        names = tuple(t for t, _ in key)
        order = [n for _, feats in key for n, _ in feats]
        upd = tuple(range(len(key)))

        def train(index, scales, lrs, p_args, batch):
            ids, rows, gains, counts, inverse, ucounts, unique = index
            flat = dict(zip(order, steps.graph_lookup(key, ids, rows, gains, counts), strict=True))
            activations = cfg.pack({f: flat[f] for f in cfg.feature_order(flat)})
            with tf.GradientTape() as tape:
                tape.watch(activations)
                loss = loss_fn(batch, model_fn(activations, batch))
            train_vars = variables if variables is not None else getattr(model_fn, "trainable_variables", None)
            if callable(train_vars):
                train_vars = train_vars()
            train_vars = list(train_vars) if train_vars is not None else list(tape.watched_variables())
            grads, act_grads = tape.gradient(loss, (train_vars, activations))
            optimizer.apply_gradients(zip(grads, train_vars))
            if cfg.structure is None:
                g_flat = dict(act_grads)
            else:
                g_flat = dict(zip((f.name for f in cfg.model.features), tf.nest.flatten(act_grads), strict=True))
            g_list = [g_flat[n] if g_flat.get(n) is not None else tf.zeros_like(flat[n]) for n in order]
            values = steps.graph_values(key, upd, frozenset(), scaled, g_list, rows, gains, counts, inverse,
                                        ucounts, scales)
            if p_key is not None:
                steps.graph_apply(p_key[0], p_key[1], p_args[0], p_args[1], p_args[2], p_args[3])
            if not cfg.pipelining:
                steps.graph_apply(names, upd, unique, ucounts, values, lrs)
            steps.iterations.assign_add(1)
            return (loss, values) if cfg.pipelining else loss

        return tf.function(train, reduce_retracing=True)


def dense_batch(record: Any) -> Any:
    """A record (or a list of records) without its CSR, every value a tensor (no retracing on Python ints)."""
    if isinstance(record, (list, tuple)):
        records = [r for r in record if isinstance(r, Mapping) and "sparse_core" in r]
        return [dense_batch(r) for r in records] if records and len(records) == len(record) else None
    if not isinstance(record, Mapping) or "sparse_core" not in record:
        return None  # per-chip CSR or a StepLookup: nothing dense to hand the model
    return {k: v if tf.is_tensor(v) else tf.convert_to_tensor(v) for k, v in record.items()
            if k not in ("sparse_core", "tensor_core")}


def packed_tensor(packed: PackedIndex, name: str) -> Any:
    """An eager constant of one of the step's index arrays, made once per step."""
    t = packed.tensors.get(name)
    if t is None:
        t = packed.tensors[name] = tf.constant(getattr(packed, name))
    return t


def f32_vector(values: Sequence[Any]):
    """A float32 vector of scalars (numbers or tensors), each rounded to float32 as tf.cast rounds it."""
    if all(isinstance(v, (int, float, np.number)) or (isinstance(v, np.ndarray) and v.ndim == 0) for v in values):
        return tf.constant(np.array([np.float64(v) for v in values], np.float64).astype(np.float32).reshape(-1))
    return tf.stack([tf.cast(v, tf.float32) for v in values]) if values else tf.zeros((0,), tf.float32)


def _num_rows(shape: Tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))
