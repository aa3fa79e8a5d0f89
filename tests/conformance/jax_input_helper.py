"""tpu_embed.jax.input_iterator / tpu_embed.jax.specs (the product under test) where jax is installed: runs in
the JAX oracle venv (.venv-jax) with the repository on sys.path, as tests/conformance/jax-requirements.txt says.

Started by tests/conformance/test_jax_input_in_jax_venv.py (`pipelines.child_pipe`), with as many CPU devices
as the artifact's host has (XLA_FLAGS). Requests, by "op":

* "specs": `feature_specs(artifact, fdo_dir=...)` described as plain data (per feature its table, optimizer,
  shapes, stack and the stack's limits), or {"error": message}.
* "iterate": `input_iterator(artifact, output=..., feature_specs=<feature_specs(artifact, fdo_dir)> or None,
  host_index=..., has_leading_dimension=...)`, and beside it jax-tpu-embedding's own
  `preprocess_sparse_dense_matmul_input` of the request's host features (`specs_from`: the FeatureSpecs of
  another artifact; `limits`: other limits set on them; `unstacked`: one FeatureSpec not stacked) ("steps": per
  step {feature: (row_splits, ids, weights)}) with the same FeatureSpecs: per step both as numpy, the class of
  `sparse`, and for jax.Arrays their sharding (devices and index of each shard).
* "optimizer": `jax_optimizer` of an `OptimizerConfig.from_dict(request["optimizer"])`: its class and
  numeric fields, or {"error": message}.
* "train_dry_run": examples/train_jax.py's `main([...])` with --dry-run; its summary.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tpu_embed is not installed in this venv

from absl import logging as absl_logging  # noqa: E402

from pipelines import child_pipe  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)


def _describe(specs):
    out = {}
    for name, f in specs.items():
        t, st = f.table_spec, f.table_spec.stacked_table_spec
        out[name] = {"table": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.embedding_dim,
                     "combiner": t.combiner, "optimizer": type(t.optimizer).__name__,
                     "learning_rate": t.optimizer.learning_rate, "input_shape": list(f.input_shape),
                     "output_shape": list(f.output_shape), "stack": st.stack_name,
                     "max_ids_per_partition": st.max_ids_per_partition,
                     "max_unique_ids_per_partition": st.max_unique_ids_per_partition,
                     "suggested_coo_buffer_size_per_device": st.suggested_coo_buffer_size_per_device,
                     "row_offset": f.id_transformation.row_offset, "col_offset": f.id_transformation.col_offset,
                     "col_shift": f.id_transformation.col_shift}
    return {"features": out, "order": list(specs)}


def _on_the_fly(specs, host, L, D, nsc, lead):
    """jax-tpu-embedding's own preprocessing of one host's features (ragged: object arrays of int32 rows)."""
    import numpy as np
    from jax_tpu_embedding.sparsecore.lib.nn import embedding

    feats, weights, weighted = {}, {}, any(w is not None for _, _, w in host.values())
    for n, (splits, ids, w) in host.items():
        ids = np.asarray(ids).astype(np.int32)
        w = np.ones(ids.size, np.float32) if w is None else np.asarray(w, np.float32)
        rows = np.empty(len(splits) - 1, dtype=object)
        rows[:] = [ids[a:b] for a, b in zip(splits[:-1], splits[1:])]
        wrows = np.empty(len(splits) - 1, dtype=object)
        wrows[:] = [w[a:b] for a, b in zip(splits[:-1], splits[1:])]
        feats[n], weights[n] = rows, wrows
    out, stats = embedding.preprocess_sparse_dense_matmul_input(
        feats, weights if weighted else None, specs, local_device_count=L, global_device_count=D,
        num_sc_per_device=nsc, has_leading_dimension=lead, allow_id_dropping=False)
    return out, {k: int(v) for k, v in stats.id_drop_counters.items()}


def _arrays(pre):
    import numpy as np
    return {"row_pointers": {k: np.asarray(v) for k, v in pre.lhs_row_pointers.items()},
            "embedding_ids": {k: np.asarray(v) for k, v in pre.lhs_embedding_ids.items()},
            "sample_ids": {k: np.asarray(v) for k, v in pre.lhs_sample_ids.items()},
            "gains": {k: np.asarray(v) for k, v in pre.lhs_gains.items()},
            "num_minibatches": np.asarray(pre.num_minibatches)}


def _sharding(x):
    import jax
    if not isinstance(x, jax.Array):
        return None
    return {"shape": list(x.shape), "shards": [(int(s.device.id), str(s.index), list(s.data.shape))
                                                for s in x.addressable_shards]}


def handle(req):
    import jax
    import numpy as np

    from tpu_embed.jax.input import input_iterator
    from tpu_embed.jax.specs import feature_specs

    op = req["op"]
    try:
        if op == "specs":
            return _describe(feature_specs(req["artifact"], fdo_dir=req.get("fdo_dir")))
        if op == "optimizer":
            from tpu_embed.core.model import OptimizerConfig
            from tpu_embed.jax.specs import jax_optimizer
            o = jax_optimizer(OptimizerConfig.from_dict(req["optimizer"]))
            return {"class": type(o).__name__,
                    "fields": {k: v for k, v in vars(o).items() if isinstance(v, (int, float, bool))}}
        if op == "train_dry_run":
            sys.path.insert(0, str(ROOT / "examples"))
            import train_jax
            return train_jax.main(req["argv"])
        if op != "iterate":
            return {"error": f"unknown op {op!r}"}
        specs = None
        if req.get("with_specs"):  # `specs_from`: another artifact's FeatureSpecs (a mismatch to refuse)
            specs = feature_specs(req.get("specs_from", req["artifact"]), fdo_dir=req.get("fdo_dir"))
            if req.get("limits"):  # other limits on them: {stack: StackLimits fields}
                from tpu_embed.jax.limits import apply_limits
                apply_limits(specs, req["limits"])
        if req.get("unstacked"):
            from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es
            t = es.TableSpec(vocabulary_size=8, embedding_dim=8, initializer=jax.nn.initializers.zeros,
                             optimizer=es.SGDOptimizerSpec(), combiner="sum", name="t")
            specs = {"f": es.FeatureSpec(name="f", table_spec=t, input_shape=[8, 1], output_shape=[8, 8])}
        sharding = None
        if req["output"] == "jax" and req.get("devices"):
            from jax.sharding import Mesh, NamedSharding, PartitionSpec
            sharding = NamedSharding(Mesh(np.array(jax.devices()[:req["devices"]]), ("device",)),
                                     PartitionSpec("device"))
        it = input_iterator(req["artifact"], host_index=req.get("host_index", 0), output=req["output"],
                            feature_specs=specs, has_leading_dimension=req.get("lead", False), sharding=sharding)
        steps = []
        for s in it:
            cls = type(s.sparse)
            item = {"step": s.step, "epoch": s.epoch, "class": f"{cls.__module__}.{cls.__name__}",
                    "sparse": _arrays(s.sparse), "label": np.asarray(s.label), "mask": np.asarray(s.mask),
                    "dense": np.asarray(s.dense),
                    "tensor_core": {k: (np.asarray(a), np.asarray(b)) for k, (a, b) in s.tensor_core.items()},
                    "sharding": {"label": _sharding(s.label), "dense": _sharding(s.dense),
                                 "row_pointers": {k: _sharding(v) for k, v in s.sparse.lhs_row_pointers.items()},
                                 "embedding_ids": {k: _sharding(v) for k, v in s.sparse.lhs_embedding_ids.items()},
                                 "num_minibatches": _sharding(s.sparse.num_minibatches)}}
            if specs is not None and req.get("steps") is not None:
                L, D, nsc = req["local_devices"], req["num_devices"], req["num_sc_per_device"]
                theirs, dropped = _on_the_fly(specs, req["steps"][s.step], L, D, nsc, req.get("lead", False))
                item["on_the_fly"], item["dropped"] = _arrays(theirs), dropped
            steps.append(item)
        return {"steps": steps}
    except (ValueError, KeyError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    stdout = child_pipe.message_stdout()
    child_pipe.serve(handle, stdout=stdout)


if __name__ == "__main__":
    main()
