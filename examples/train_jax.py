"""Train a small DLRM with JAX on TPU SparseCores from offline jax shards (no preprocessing at each step).

    tpu-embed run --spec spec.yaml --output build/criteo           # spec with `shards: {layout: jax}` (or both)
    tpu-embed plan --profiles build/criteo/profiles --format jax-fdo --jax-stacking jax --output build/criteo-fdo
    python examples/train_jax.py --artifact build/criteo --fdo build/criteo-fdo --steps 1000
    python examples/train_jax.py --artifact build/criteo --fdo build/criteo-fdo --dry-run   # no TPU needed

The embedding side is jax-tpu-embedding's Flax layer (`SparseCoreEmbed`, its `tpu_sparse_dense_matmul` and
its gradient, which applies each table's optimizer on the SparseCores); its FeatureSpecs come from the
artifact (`tpu_embed.jax.specs.feature_specs`: the spec's tables, optimizers and features, stacked as the
records were written, with the exact limits of the FDO directory), and each step's `PreprocessedInput` from
`tpu_embed.jax.input_iterator` instead of the layer's `preprocess_inputs`. keras-rs' `DistributedEmbedding`
is not used: on the JAX backend its `preprocess` makes a structure of its own (per-table COO matrices) that
its `call` takes, not jax-tpu-embedding's `PreprocessedInput`.

The dense side: SparseCore activations and tensor-core embeddings projected to one width, the dense
features through a bottom MLP, their pairwise dot products (DLRM's interaction) and the bottom output
through a top MLP to one logit; `--loss bce` (0/1 labels) or `mse` (ratings); the example mask (0 on the
examples that pad the last step) weighs the loss. optax Adam on the dense parameters.

Run it on every host of the slice (`jax.distributed.initialize()` first on several hosts); the artifact's
topology (devices, SparseCores per device, hosts) must be the slice's. `--dry-run` runs on CPU up to the
device boundary: the FeatureSpecs, the mesh over the host's devices (`--dry-run` on CPU: run with
XLA_FLAGS=--xla_force_host_platform_device_count=<the artifact's local devices>), every step of the
iterator as sharded jax.Arrays with one static shape, and the dense model's loss, jit-compiled and run,
with zeros standing in for the SparseCore activations. `SparseCoreEmbed` itself needs a TPU (it asks the
device for its SparseCores): the training loop below has not run here.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any, Dict, List, Optional, Sequence


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", required=True, help="artifact directory of `tpu-embed run` with jax shards")
    p.add_argument("--fdo", default=None,
                   help="directory of `tpu-embed plan --format jax-fdo --jax-stacking jax`: the exact limits "
                        "(default: the COO buffer sizes the manifest records, jax's default id limits)")
    p.add_argument("--steps", type=int, default=1000, help="training steps (the shards repeat as needed)")
    p.add_argument("--shuffle-steps", type=int, default=None, help="seed: each epoch's steps in a permutation")
    p.add_argument("--loss", choices=("bce", "mse"), default="bce")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="Adam learning rate of the dense model")
    p.add_argument("--interaction-dim", type=int, default=16, help="width every embedding is projected to")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--dry-run", action="store_true",
                   help="no TPU: build the specs, iterate the inputs and run the dense model's loss on CPU")
    return p.parse_args(argv)


# ---------------------------------------------------------------- the model

def _modules():
    """The Flax modules (imported here: jax, flax and jax-tpu-embedding are needed only to run)."""
    import jax.numpy as jnp
    from flax import linen as nn

    class Head(nn.Module):
        """The dense model: embeddings (SparseCore activations {feature: [samples, dim]}, tensor-core
        features {feature: (ids, weights)}) and dense features -> one logit per example."""

        batch: int
        tensor_core: tuple  # (name, vocabulary size, dim)
        width: int

        @nn.compact
        def __call__(self, activations: Dict[str, Any], dense, tensor_core: Dict[str, Any]):
            vectors = [nn.Dense(self.width, name=f"proj_{n}")(jnp.reshape(a, (self.batch, -1)))
                       for n, a in sorted(activations.items())]
            for name, vocab, dim in self.tensor_core:
                ids, w = tensor_core[name]
                e = nn.Embed(vocab, dim, name=f"tc_{name}")(ids) * w[..., None]
                vectors.append(nn.Dense(self.width, name=f"proj_{name}")(jnp.sum(e, axis=1)))
            bottom = nn.relu(nn.Dense(self.width)(nn.relu(nn.Dense(4 * self.width)(dense))))
            vectors.append(bottom)
            x = jnp.stack(vectors, axis=1)
            inter = jnp.einsum("bik,bjk->bij", x, x)
            iu = jnp.triu_indices(len(vectors), k=1)
            top = jnp.concatenate([bottom, inter[:, iu[0], iu[1]]], axis=1)
            top = nn.relu(nn.Dense(4 * self.width)(top))
            return nn.Dense(1)(top)[:, 0]

    class DLRM(nn.Module):
        feature_specs: Any
        mesh: Any
        sharding_axis: str
        head: Any

        @nn.compact
        def __call__(self, sparse, dense, tensor_core):
            from jax_tpu_embedding.sparsecore.lib.flax.linen import embed
            activations = embed.SparseCoreEmbed(feature_specs=self.feature_specs, mesh=self.mesh,
                                                sharding_axis=self.sharding_axis)(sparse)
            return self.head(activations, dense, tensor_core)

    return Head, DLRM


def loss_of(logits, label, mask, kind: str):
    """The mean loss over the real examples (mask 1)."""
    import jax.numpy as jnp
    import optax
    per = optax.sigmoid_binary_cross_entropy(logits, label) if kind == "bce" else (logits - label) ** 2
    return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def setup(args: argparse.Namespace):
    """(FeatureSpecs, mesh, Head, the artifact's format, tensor-core tables) for the artifact, on this host."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.jax.input import DEFAULT_AXIS
    from tpu_embed.jax.specs import feature_specs

    m = read_manifest(args.artifact)
    fmt = m.shard_format
    specs = feature_specs(args.artifact, fdo_dir=args.fdo)
    if jax.device_count() != int(fmt.jax["num_devices"]):
        raise SystemExit(f"{args.artifact} was sharded for {fmt.jax['num_devices']} devices; this run has "
                         f"{jax.device_count()} ({jax.devices()[0].platform}). Run on the artifact's slice (on CPU, "
                         f"--dry-run with XLA_FLAGS=--xla_force_host_platform_device_count="
                         f"{fmt.jax['local_devices']}), or shard again for this topology.")
    mesh = Mesh(np.array(jax.devices()), (DEFAULT_AXIS,))
    tc = tuple((name, int(m.features[name].table_vocabulary_size), int(m.features[name].dim))
               for name, _, _ in fmt.tensor_core_features)
    Head, _ = _modules()
    head = Head(batch=int(fmt.host_batch_size) * int(fmt.num_hosts), tensor_core=tc, width=args.interaction_dim)
    return specs, mesh, head, fmt


def _stand_in_activations(specs) -> Dict[str, Any]:
    """Zeros shaped as SparseCoreEmbed's activations: {feature: [global samples, dim]}."""
    import jax.numpy as jnp
    return {name: jnp.zeros(tuple(f.output_shape), jnp.float32) for name, f in specs.items()}


def dry_run(args: argparse.Namespace) -> dict:
    """Everything up to the SparseCore lookup, on whatever devices jax has: returns a summary."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from tpu_embed.jax.input import DEFAULT_AXIS, input_iterator

    specs, mesh, head, fmt = setup(args)
    acts = _stand_in_activations(specs)
    shapes = None
    losses: List[float] = []
    ids = 0
    it = input_iterator(args.artifact, output="jax", feature_specs=specs, shuffle_steps=args.shuffle_steps,
                        num_epochs=None, sharding=NamedSharding(mesh, PartitionSpec(DEFAULT_AXIS)))
    params = None
    loss_fn = jax.jit(lambda p, a, d, t, y, w: loss_of(head.apply(p, a, d, t), y, w, args.loss))
    try:
        for step in itertools.islice(it, args.steps):
            s = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), step.sparse)
            if shapes is None:
                shapes = s
            elif s != shapes:  # one static signature for jax.jit
                raise SystemExit(f"step {step.step}: input shapes changed ({s} after {shapes})")
            ids += sum(int(np.sum(np.asarray(x) != 2**31 - 1)) for x in step.sparse.lhs_sample_ids.values())
            if params is None:
                params = head.init(jax.random.PRNGKey(0), acts, step.dense, step.tensor_core)
            losses.append(float(loss_fn(params, acts, step.dense, step.tensor_core, step.label, step.mask)))
    finally:
        it.close()
    stacks = {k: {"row_pointers": list(step.sparse.lhs_row_pointers[k].shape),
                  "coo": list(step.sparse.lhs_embedding_ids[k].shape)} for k in step.sparse.lhs_row_pointers}
    return {"steps": len(losses), "ids": ids, "devices": len(mesh.devices.reshape(-1)),
            "features": list(specs), "stacks": stacks, "loss": losses[-1] if losses else None}


def train(args: argparse.Namespace) -> None:  # pragma: no cover - needs a TPU
    import jax
    import optax
    from jax.sharding import NamedSharding, PartitionSpec
    from jax_tpu_embedding.sparsecore.lib.flax.linen import embed_optimizer

    from tpu_embed.jax.input import DEFAULT_AXIS, input_iterator

    specs, mesh, head, _ = setup(args)
    _, DLRM = _modules()
    model = DLRM(feature_specs=specs, mesh=mesh, sharding_axis=DEFAULT_AXIS, head=head)
    it = input_iterator(args.artifact, output="jax", feature_specs=specs, shuffle_steps=args.shuffle_steps,
                        num_epochs=None, sharding=NamedSharding(mesh, PartitionSpec(DEFAULT_AXIS)))
    first = next(it)
    params = model.init(jax.random.PRNGKey(0), first.sparse, first.dense, first.tensor_core)
    tx = embed_optimizer.create_optimizer_for_sc_model(params, optax.adam(args.learning_rate))
    opt_state = tx.init(params)

    @jax.jit
    def step_fn(params, opt_state, batch):
        def loss_fn(p):
            return loss_of(model.apply(p, batch.sparse, batch.dense, batch.tensor_core), batch.label, batch.mask,
                           args.loss)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)  # SparseCore tables: updated by the grad op
        return embed_optimizer.apply_updates_for_sc_model(params, updates), opt_state, loss

    batch = first
    for i in range(args.steps):
        params, opt_state, loss = step_fn(params, opt_state, batch)
        if (i + 1) % args.log_every == 0 or i + 1 == args.steps:
            print(f"step {i + 1}: loss {float(loss):.4f} (artifact step {batch.step}, epoch {batch.epoch})")
        if i + 1 < args.steps:
            batch = next(it)
    it.close()


def main(argv: Optional[Sequence[str]] = None):
    args = parse_args(argv)
    if args.dry_run:
        summary = dry_run(args)
        print(f"dry run: {summary['steps']} steps of {args.artifact} on {summary['devices']} device(s), "
              f"{summary['ids']} ids; per stack {summary['stacks']}; loss with zero activations "
              f"{summary['loss']:.4f}")
        return summary
    train(args)
    return None


if __name__ == "__main__":
    main(sys.argv[1:])
