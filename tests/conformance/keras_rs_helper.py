"""examples/train_keras_rs.py where keras-rs is installed: runs in the JAX oracle venv (.venv-jax, with keras and
keras-rs, tests/conformance/jax-requirements.txt) with the repository on sys.path.

Started by tests/conformance/test_keras_rs_in_jax_venv.py (`pipelines.child_pipe`). Requests, by "op":

* "compare": the example's `feature_configs(artifact, fdo_dir)` and `keras_rs_feature_specs` of them; each step
  of `input_iterator(artifact, feature_specs=<those specs>, host_index=...)` as `keras_inputs` makes it, and
  beside it keras-rs' own preprocessing of the request's host features ("steps": per step {feature:
  (row_splits, ids, weights)}): `embedding_utils.create_feature_samples` + `stack_and_shard_samples` with the
  same specs (what `DistributedEmbedding.preprocess` runs on a TPU). -> {"stacks": {stack: [max ids, max
  unique ids]}, "tables": {table: [its TableConfig's limits]}, "steps": [{"ours": {stack: {field: array}},
  "keras_rs": {...}, "dropped": {stack: ids keras-rs' preprocessing dropped}}]}
* "dry_run": the example's `main([... "--dry-run"])`: its summary.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tpu_embed is not installed in this venv
sys.path.insert(0, str(ROOT / "examples"))

from absl import logging as absl_logging  # noqa: E402

from pipelines import child_pipe  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)


def _arrays(coo) -> dict:
    import numpy as np

    return {k: np.asarray(getattr(coo, k)) for k in ("shard_starts", "shard_ends", "col_ids", "row_ids", "values")}


def compare(req):
    import numpy as np
    import train_keras_rs as ex
    from keras_rs.src.layers.embedding.jax import embedding_utils

    from tpu_embed.jax.input import input_iterator

    L, D, nsc = req["local_devices"], req["num_devices"], req["num_sc_per_device"]
    configs = ex.feature_configs(req["artifact"], req["fdo_dir"])
    specs = ex.keras_rs_feature_specs(configs, D, nsc)
    stacks = {f.table_spec.stacked_table_spec.stack_name: [int(f.table_spec.stacked_table_spec.max_ids_per_partition),
                                                           int(f.table_spec.stacked_table_spec.max_unique_ids_per_partition)]
              for f in specs.values()}
    tables = {c.table.name: [c.table.max_ids_per_partition, c.table.max_unique_ids_per_partition]
              for c in configs.values()}
    it = input_iterator(req["artifact"], feature_specs=specs, host_index=req["host_index"], prefetch=0)
    out = []
    for step, host in zip(it, req["steps"]):
        ours = ex.keras_inputs(step.sparse)["preprocessed_inputs_per_placement"]["sparsecore"]["inputs"]
        ids, weights = {}, {}
        weighted = any(w is not None for _, _, w in host.values())
        for n in specs:
            splits, v, w = host[n]
            v = np.asarray(v).astype(np.int32)
            w = np.ones(v.size, np.float32) if w is None else np.asarray(w, np.float32)
            rows = np.empty(len(splits) - 1, dtype=object)
            rows[:] = [v[a:b] for a, b in zip(splits[:-1], splits[1:])]
            wrows = np.empty(len(splits) - 1, dtype=object)
            wrows[:] = [w[a:b] for a, b in zip(splits[:-1], splits[1:])]
            ids[n], weights[n] = rows, wrows
        samples = embedding_utils.create_feature_samples(specs, ids, weights if weighted else None)
        theirs, stats = embedding_utils.stack_and_shard_samples(specs, samples, L, D, nsc)
        out.append({"ours": {k: _arrays(m) for k, m in ours.items()},
                    "keras_rs": {k: _arrays(m) for k, m in theirs.items()},
                    "dropped": {k: int(v) for k, v in stats.id_drop_counters.items()}})
    return {"stacks": stacks, "tables": tables, "steps": out}


def handle(req):
    try:
        if req["op"] == "compare":
            return compare(req)
        if req["op"] == "dry_run":
            import train_keras_rs as ex
            return ex.main(req["argv"])
        return {"error": f"unknown op {req['op']!r}"}
    except Exception as e:  # the test shows the message
        import traceback
        return {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}


if __name__ == "__main__":
    child_pipe.serve(handle, stdout=child_pipe.message_stdout())
