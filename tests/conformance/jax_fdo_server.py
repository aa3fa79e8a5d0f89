"""jax-tpu-embedding's own FDO client, limit update and preprocessing; executed inside the JAX oracle venv.

Protocol: `pipelines.child_pipe`.  A request describes the tables and features, the stacking the figures are
for, the topology, an FDO directory written by `tpu-embed plan --format jax-fdo`, and every step's local batch
of every process (per feature: row splits, ids, weights or None).  The answer is what jax-tpu-embedding does
with them: the stacking its own stacker gives, what `NPZFileFDOClient.load()` reads, the limits
`update_preprocessing_parameters` sets from that, and, preprocessing every step of every process with those
limits (`allow_id_dropping=True`), the ids it dropped and the element-wise maxima over steps of the statistics
it returned.  Of tpu_embed it imports only that protocol (standard library alone).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: pipelines.child_pipe, not installed here
sys.path.insert(0, str(Path(__file__).resolve().parent))  # jax_specs beside this file

import jax_specs  # noqa: E402
import numpy as np  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.fdo import file_fdo_client  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding, table_stacking  # noqa: E402

from pipelines import child_pipe  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)


def _stack(req, specs):
    devices, nsc = req["global_device_count"], req["num_sc_per_device"]
    if req["stacking"] == "jax":  # jax's own auto-stacking of the specs, in the model's feature order
        embedding.auto_stack_tables(specs, global_device_count=devices, num_sc_per_device=nsc)
    for name, tables in ({} if req["stacking"] == "jax" else req["stacks"]).items():
        if len(tables) > 1:
            table_stacking.stack_tables(specs, list(tables), global_device_count=devices, num_sc_per_device=nsc,
                                        stack_name=name)
    embedding.prepare_feature_specs_for_training(specs, global_device_count=devices, num_sc_per_device=nsc)


def _max(into, stats):
    for k, v in stats.items():
        v = np.asarray(v)
        into[k] = v if k not in into else np.maximum(into[k], v)


def handle(req):
    specs = jax_specs.feature_specs(req)
    _stack(req, specs)
    nsc = req["num_sc_per_device"]
    loaded = file_fdo_client.NPZFileFDOClient(req["fdo_dir"]).load()
    embedding.update_preprocessing_parameters(specs, loaded, nsc)
    answer = {"stacking": jax_specs.stacking_of(specs), "limits": jax_specs.limits_of(specs),
              "loaded": {"max_ids": dict(loaded.max_ids_per_partition),
                         "max_unique_ids": dict(loaded.max_unique_ids_per_partition),
                         "required_buffer_size": dict(loaded.required_buffer_size_per_sc)}}
    hosts = req["local_batches"]  # [step][process] -> {feature: (row_splits, ids, weights or None)}
    observed = [{"max_ids": {}, "max_unique_ids": {}, "required_buffer_size": {}} for _ in hosts[0]] if hosts else []
    dropped = {}
    for step, per_process in enumerate(hosts):
        for p, batch in enumerate(per_process):
            feats = [jax_specs.ragged(batch[f.name][0], batch[f.name][1], np.int32) for f in specs]
            weighted = any(batch[f.name][2] is not None for f in specs)
            weights = None
            if weighted:
                weights = [jax_specs.ragged(batch[f.name][0], batch[f.name][2] if batch[f.name][2] is not None
                                            else np.ones(len(batch[f.name][1]), np.float32), np.float32)
                           for f in specs]
            _, stats = embedding.preprocess_sparse_dense_matmul_input(
                feats, weights, specs, local_device_count=req["local_device_count"],
                global_device_count=req["global_device_count"], num_sc_per_device=nsc,
                allow_id_dropping=True, batch_number=step)
            _max(observed[p]["max_ids"], stats.max_ids_per_partition)
            _max(observed[p]["max_unique_ids"], stats.max_unique_ids_per_partition)
            _max(observed[p]["required_buffer_size"], stats.required_buffer_size_per_sc)
            for k, v in stats.id_drop_counters.items():
                dropped[k] = dropped.get(k, 0) + int(v)
    answer.update(observed=observed, dropped=dropped, steps=len(hosts))
    return answer


if __name__ == "__main__":
    child_pipe.serve(handle)  # an error is answered as {"error": ...}: it is part of the conformance result
