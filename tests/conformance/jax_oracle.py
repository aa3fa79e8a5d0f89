"""The JAX conformance oracle: jax-tpu-embedding (jax[cpu]) in its own venv (`make jax-oracle`).

jax-tpu-embedding's preprocessing and FDO client run on the host CPU; they are imported only in that venv,
by the scripts and servers of tests/conformance that this module starts (`pipelines.child_pipe` protocol).
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines import child_pipe

ROOT = Path(__file__).resolve().parents[2]


def jax_python() -> str:
    """The JAX oracle venv's python: TPU_EMBED_JAX_PYTHON, else .venv-jax; a one-line error when neither is."""
    env = os.environ.get("TPU_EMBED_JAX_PYTHON")
    if env:
        return env
    default = ROOT / ".venv-jax" / "bin" / "python"
    if default.exists():
        return str(default)
    raise RuntimeError(
        "The JAX conformance oracle needs jax-tpu-embedding==0.2.0 in its own venv: run `make jax-oracle` "
        "(or `make test`, which creates it), or set TPU_EMBED_JAX_PYTHON.")


def jax_env() -> dict:
    """The environment the oracle runs in: jax on the CPU, quiet, as many host devices as a test asks for."""
    return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


class JaxOracle(child_pipe.Helper):
    """A server script of tests/conformance run in the JAX venv: `oracle(request)` -> its answer."""

    def __init__(self, server: Path, name: str = "jax-oracle"):
        super().__init__([jax_python(), str(server)], jax_env(), name=name)
