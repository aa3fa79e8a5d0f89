"""Train a small DLRM with keras-rs' `DistributedEmbedding` (JAX backend) on TPU SparseCores from offline jax shards.

    tpu-embed run --spec spec.yaml --output build/criteo           # spec with `shards: {layout: jax}` (or both)
    tpu-embed plan --artifact build/criteo --format jax-fdo --output build/criteo-fdo
    KERAS_BACKEND=jax python examples/train_keras_rs.py --artifact build/criteo --fdo build/criteo-fdo --steps 1000
    KERAS_BACKEND=jax python examples/train_keras_rs.py --artifact build/criteo --fdo build/criteo-fdo --dry-run

keras-rs' `DistributedEmbedding.preprocess` runs jax-tpu-embedding's `preprocess_sparse_dense_matmul_input`
on each batch and hands the layer, per stacked table, a `ShardedCooMatrix` made from its arrays (row pointers
as `shard_ends`, each partition's aligned start as `shard_starts`, embedding ids, sample ids, gains); its
`call` also takes that structure directly. Here it comes from `tpu_embed.jax.input_iterator` instead
(`keras_inputs`): the same arrays, read from the shards, so `preprocess` is never called and nothing is
recomputed or re-learned per step. The layer's configuration carries the exact limits of `tpu-embed plan
--artifact ... --format jax-fdo` (`feature_configs`): each `TableConfig`'s `max_ids_per_partition` and
`max_unique_ids_per_partition` are those of its stack (the layer takes each stack's maximum over its
tables), `update_stats=False`, and `table_stacking="auto"` stacks the tables as the records were written
(jax-tpu-embedding's `auto_stack_tables`, checked by `keras_rs_feature_specs`).

The dense side: each SparseCore feature's activations projected to one width, the dense features through a
bottom MLP, their pairwise dot products (DLRM's interaction) and the bottom output through a top MLP to one
logit, binary cross-entropy (or `--loss mse`), the example mask weighing it; Adam on the dense weights.

`--dry-run` runs on CPU up to the device boundary: the `FeatureConfig`s with the exact limits, the
FeatureSpecs the layer's build makes of them (`keras_rs_feature_specs`: keras-rs' own config conversion and
jax-tpu-embedding's stacking, as `DistributedEmbedding.build` runs them on a TPU), checked against the
records' stacking, and every step of the iterator in the layer's preprocessed form with one static shape.
On a CPU keras-rs places the tables on the default device (no SparseCores), whose inputs are the raw ids:
the layer on SparseCores and the training loop below need a TPU and have not run here.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, Optional, Sequence

os.environ.setdefault("KERAS_BACKEND", "jax")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", required=True, help="artifact directory of `tpu-embed run` with jax shards")
    p.add_argument("--fdo", required=True,
                   help="directory of `tpu-embed plan --artifact ARTIFACT --format jax-fdo`: the exact limits")
    p.add_argument("--steps", type=int, default=1000, help="training steps (the shards repeat as needed)")
    p.add_argument("--shuffle-steps", type=int, default=None, help="seed: each epoch's steps in a permutation")
    p.add_argument("--loss", choices=("bce", "mse"), default="bce")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="Adam learning rate of the dense model")
    p.add_argument("--interaction-dim", type=int, default=16, help="width every embedding is projected to")
    p.add_argument("--dry-run", action="store_true",
                   help="no TPU: the configs, the layer's FeatureSpecs and every step's inputs, on CPU")
    return p.parse_args(argv)


# ---------------------------------------------------------------- configuration

def keras_optimizer(opt) -> Any:
    """The Keras optimizer keras-rs turns into the table's jax-tpu-embedding optimizer (`tpu_embed.jax.specs.
    jax_optimizer`'s, through keras-rs' `keras_to_jte_optimizer`)."""
    import keras

    p = dict(opt.params)
    lr = p["learning_rate"]
    if opt.kind == "sgd":
        return keras.optimizers.SGD(learning_rate=lr)
    if opt.kind == "adagrad":
        return keras.optimizers.Adagrad(learning_rate=lr, initial_accumulator_value=p["initial_accumulator"])
    if opt.kind == "adam":
        return keras.optimizers.Adam(learning_rate=lr, beta_1=p["beta1"], beta_2=p["beta2"], epsilon=p["epsilon"])
    if opt.kind == "ftrl":
        if p.get("multiply_linear_by_learning_rate"):
            raise ValueError("ftrl with multiply_linear_by_learning_rate: keras-rs' Ftrl conversion does not carry it; "
                             "set it false in the spec's optimizer, or train with examples/train_jax.py")
        return keras.optimizers.Ftrl(
            learning_rate=lr, learning_rate_power=p["learning_rate_power"],
            initial_accumulator_value=p["initial_accumulator_value"],
            l1_regularization_strength=p["l1_regularization_strength"],
            l2_regularization_strength=p["l2_regularization_strength"], beta=p["beta"])
    raise ValueError(f"optimizer {opt.kind!r} has no keras-rs counterpart here (sgd, adagrad, adam, ftrl)")


def feature_configs(artifact: str, fdo_dir: str, placement: str = "sparsecore") -> Dict[str, Any]:
    """{feature: keras_rs.layers.FeatureConfig} of the artifact's SparseCore features: one TableConfig per table
    (rows, width, combiner, optimizer) whose limits are its jax stack's exact ones from `fdo_dir`; inputs of
    the feature's global samples per step."""
    import keras_rs

    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.jax.specs import feature_specs

    specs = feature_specs(artifact, fdo_dir=fdo_dir)  # the records' stacking with the exact limits, checked
    limits = {f.table_spec.name: (f.table_spec.stacked_table_spec.max_ids_per_partition,
                                  f.table_spec.stacked_table_spec.max_unique_ids_per_partition)
              for f in specs.values()}
    model = load_artifact(artifact).model
    tables = {}
    for t in model.tables:
        if t.optimizer is None:
            raise ValueError(f"table {t.name!r} has no optimizer in the spec: keras-rs needs one per table")
        max_ids, max_unique = limits[t.name]
        tables[t.name] = keras_rs.layers.TableConfig(
            name=t.name, vocabulary_size=t.vocabulary_size, embedding_dim=t.dim, optimizer=keras_optimizer(t.optimizer),
            combiner=t.combiner, placement=placement, max_ids_per_partition=int(max_ids),
            max_unique_ids_per_partition=int(max_unique))
    configs = {}
    for f in model.features:
        n = f.samples * model.topology.num_chips
        configs[f.name] = keras_rs.layers.FeatureConfig(name=f.name, table=tables[f.table.name], input_shape=(n, 1),
                                                        output_shape=(n, f.table.dim))
    return configs


def keras_rs_feature_specs(configs: Dict[str, Any], num_devices: int, num_sc_per_device: int) -> Dict[str, Any]:
    """The jax-tpu-embedding FeatureSpecs `DistributedEmbedding(configs, table_stacking="auto").build` makes on a
    TPU of `num_devices` devices: keras-rs' config conversion, `auto_stack_tables`,
    `prepare_feature_specs_for_training`, each stack's limits the largest of its tables' (no COO buffer size:
    jax's theoretical one)."""
    import numpy as np
    from jax_tpu_embedding.sparsecore.lib.nn import embedding
    from jax_tpu_embedding.sparsecore.lib.nn import table_stacking as jte_stacking
    from keras_rs.src.layers.embedding.jax import config_conversion

    specs = config_conversion.keras_to_jte_feature_configs(configs)
    jte_stacking.auto_stack_tables(specs, num_devices, num_sc_per_device)
    embedding.prepare_feature_specs_for_training(specs, num_devices, num_sc_per_device)
    stacks = jte_stacking.get_table_stacks(embedding.get_table_specs(specs))
    stats = embedding.SparseDenseMatmulInputStats(
        max_ids_per_partition={n: np.max([t.max_ids_per_partition for t in s]) for n, s in stacks.items()},
        max_unique_ids_per_partition={n: np.max([t.max_unique_ids_per_partition for t in s])
                                      for n, s in stacks.items()},
        required_buffer_size_per_sc={}, id_drop_counters={n: 0 for n in stacks})
    embedding.update_preprocessing_parameters(specs, stats, num_sc_per_device)
    return specs


def keras_inputs(sparse) -> Dict[str, Any]:
    """A step's `PreprocessedInput` (flat arrays, `has_leading_dimension=False`) as `DistributedEmbedding` takes
    preprocessed inputs: per stack keras-rs' `ShardedCooMatrix`, made as its `stack_and_shard_samples` makes it."""
    import numpy as np
    from keras_rs.src.layers.embedding.jax.embedding_utils import ShardedCooMatrix

    coo = {}
    for stack, ends in sparse.lhs_row_pointers.items():
        starts = np.concatenate([np.asarray([0]), (ends[:-1] + 7) // 8 * 8])
        coo[stack] = ShardedCooMatrix(shard_starts=starts, shard_ends=ends,
                                      col_ids=sparse.lhs_embedding_ids[stack], row_ids=sparse.lhs_sample_ids[stack],
                                      values=sparse.lhs_gains[stack])
    return {"preprocessed_inputs_per_placement": {"sparsecore": {"inputs": coo}}}


# ---------------------------------------------------------------- the model

def build_model(configs: Dict[str, Any], tensor_core: Sequence[tuple], width: int):
    """DLRM over `DistributedEmbedding` (SparseCores, `update_stats=False`: the limits are the artifact's) and
    Keras `Embedding`s for the tensor-core features ((name, vocabulary size, dim))."""
    import keras
    import keras_rs
    from keras import ops

    class DLRM(keras.Model):
        def __init__(self):
            super().__init__()
            self.embedding = keras_rs.layers.DistributedEmbedding(configs, table_stacking="auto",
                                                                  update_stats=False)
            self.tc = {n: keras.layers.Embedding(vocab, dim, name=f"tc_{n}") for n, vocab, dim in tensor_core}
            names = sorted(configs) + sorted(self.tc)
            self.proj = {n: keras.layers.Dense(width, name=f"proj_{n}") for n in names}
            self.bottom = keras.Sequential([keras.layers.Dense(4 * width, activation="relu"),
                                            keras.layers.Dense(width, activation="relu")])
            self.top = keras.Sequential([keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])

        def call(self, inputs):
            acts = self.embedding(inputs["sparse"])
            vectors = [self.proj[n](acts[n]) for n in sorted(configs)]
            for n in sorted(self.tc):
                ids, w = inputs["tensor_core"][n]
                vectors.append(self.proj[n](ops.sum(self.tc[n](ids) * w[..., None], axis=1)))
            vectors.append(self.bottom(inputs["dense"]))
            v = ops.stack(vectors, axis=1)
            inter = ops.reshape(ops.matmul(v, ops.transpose(v, (0, 2, 1))), (v.shape[0], -1))
            return self.top(ops.concatenate([inter, vectors[-1]], axis=1))[:, 0]

    return DLRM()


# ---------------------------------------------------------------- main

def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax
    import numpy as np

    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.jax.input import input_iterator

    manifest = read_manifest(args.artifact)
    fj = manifest.shard_format.jax
    devices, nsc = int(fj["num_devices"]), int(fj["num_sc_per_device"])
    configs = feature_configs(args.artifact, args.fdo)
    specs = keras_rs_feature_specs(configs, devices, nsc)
    recorded = {s["name"]: (s["max_ids_per_partition"], s["max_unique_ids_per_partition"]) for s in fj["stacks"]}
    built = {f.table_spec.stacked_table_spec.stack_name: f.table_spec.stacked_table_spec for f in specs.values()}
    if sorted(built) != sorted(recorded):
        raise ValueError(f"keras-rs stacks {sorted(built)}, the records {sorted(recorded)}")
    steps = input_iterator(args.artifact, num_epochs=None, shuffle_steps=args.shuffle_steps, feature_specs=specs,
                           host_index=jax.process_index())
    summary: Dict[str, Any] = {
        "features": sorted(configs), "stacks": {n: [int(s.max_ids_per_partition), int(s.max_unique_ids_per_partition)]
                                                for n, s in built.items()},
        "steps": 0, "shapes": set(), "ids": 0}
    if args.dry_run:
        from tpu_embed.sparsecore.jax_layout import PAD_ID

        for _, step in zip(range(args.steps), steps):
            x = keras_inputs(step.sparse)["preprocessed_inputs_per_placement"]["sparsecore"]["inputs"]
            summary["shapes"].add(tuple((n, *(a.shape for a in m)) for n, m in sorted(x.items())))
            summary["ids"] += sum(int(np.count_nonzero(m.col_ids != PAD_ID)) for m in x.values())
            summary["steps"] += 1
        if len(summary["shapes"]) != 1:
            raise ValueError(f"the steps' shapes differ: {summary['shapes']}")
        summary["shapes"] = sorted(summary["shapes"])
        print(f"dry run: {summary['steps']} steps, stacks {summary['stacks']} (max ids, max unique ids per "
              f"partition), {summary['ids']} ids packed")
        return summary

    import keras

    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    tc = [(n, int(manifest.features[n].table_vocabulary_size), int(manifest.features[n].dim))
          for n, _, _ in manifest.shard_format.tensor_core_features]
    model = build_model(configs, tc, args.interaction_dim)
    loss = keras.losses.BinaryCrossentropy(from_logits=True) if args.loss == "bce" else keras.losses.MeanSquaredError()
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss=loss, jit_compile=True)

    def batches():
        for step in steps:
            yield ({"sparse": keras_inputs(step.sparse), "dense": np.asarray(step.dense, np.float32),
                    "tensor_core": step.tensor_core},
                   np.asarray(step.label, np.float32), np.asarray(step.mask, np.float32))

    history = model.fit(batches(), steps_per_epoch=args.steps, epochs=1)
    summary["loss"] = float(history.history["loss"][-1])
    summary["steps"] = args.steps
    return summary


if __name__ == "__main__":
    main()
