"""Run in the JAX oracle venv by test_propose.py beside it: jax-tpu-embedding FeatureSpecs of a description
(stdin: tables, features with their global samples, and the path of a `tpu-embed plan --propose` Python file),
stacked by that file's `stack_feature_specs`; prints (last line) jax's stacking and limits as JSON."""

import json
import os
import runpy
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "conformance"))

import jax_specs  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)

request = json.loads(sys.stdin.read())
specs = jax_specs.feature_specs(request)
runpy.run_path(request["snippet"])["stack_feature_specs"](specs)
print(json.dumps({"stacking": jax_specs.stacking_of(specs), "limits": jax_specs.limits_of(specs)}))
