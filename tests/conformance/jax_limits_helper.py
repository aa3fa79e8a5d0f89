"""tpu_embed.jax.limits (the product under test) on jax-tpu-embedding's FeatureSpecs; run in the JAX oracle venv.

Protocol: `pipelines.child_pipe`.  A request describes the tables and features (as for jax_fdo_server.py) and
names an FDO directory written by `tpu-embed plan --format jax-fdo`; the answer is the stacking that
`limits.stack_tables` gives and the limits `limits.apply_limits` sets, or the error it raises on specs that
differ from the profiled ones (`mutate`: 'vocabulary' enlarges the first table, 'unstacked' leaves every table
its own stack by jax's `prepare_feature_specs_for_training`).  With `mapping`, the limits are that mapping.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository (tpu_embed), not installed here
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax_specs  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from pipelines import child_pipe  # noqa: E402
from tpu_embed.jax import limits  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)


def handle(req):
    mutate = req.get("mutate")
    if mutate == "vocabulary":
        req = dict(req, tables=[dict(t, vocabulary_size=t["vocabulary_size"] + 8 * req["num_sparse_cores"])
                                if i == 0 else t for i, t in enumerate(req["tables"])])
    specs = jax_specs.feature_specs(req)
    if mutate == "unstacked":
        from jax_tpu_embedding.sparsecore.lib.nn import embedding
        embedding.prepare_feature_specs_for_training(specs, global_device_count=req["global_device_count"],
                                                     num_sc_per_device=req["num_sc_per_device"])
    else:
        limits.stack_tables(specs, req["fdo_dir"])
    applied = limits.apply_limits(specs, req["mapping"] if req.get("mapping") else req["fdo_dir"])
    return {"stacking": jax_specs.stacking_of(specs), "limits": jax_specs.limits_of(specs),
            "returned": {k: vars(v) for k, v in applied.items()}}


if __name__ == "__main__":
    child_pipe.serve(handle)
