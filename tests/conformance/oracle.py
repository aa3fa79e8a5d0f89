"""Client for the TensorFlow oracle (tests/conformance/oracle_server.py in its own venv)."""

from __future__ import annotations

import os
from pathlib import Path

from pipelines import child_pipe

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("oracle_server.py")


def oracle_python() -> str:
    env = os.environ.get("TPU_EMBED_ORACLE_PYTHON")
    if env:
        return env
    default = ROOT / ".venv-oracle" / "bin" / "python"
    if default.exists():
        return str(default)
    raise RuntimeError(
        "The conformance oracle needs tensorflow-tpu==2.20.0 in its own venv: run `make oracle` "
        "(or `make test`, which creates it), or set TPU_EMBED_ORACLE_PYTHON.")


class Oracle(child_pipe.Helper):
    """oracle_server.py in the oracle's venv: `oracle(request)` -> TensorFlow's answer (`pipelines.child_pipe`)."""

    def __init__(self):
        env = dict(os.environ, TPU_LIBRARY_PATH="/nonexistent/libtpu.so", TF_CPP_MIN_LOG_LEVEL="3",
                   CUDA_VISIBLE_DEVICES="")
        super().__init__([oracle_python(), str(SERVER)], env, name="oracle")
