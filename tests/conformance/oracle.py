"""Client for the TensorFlow oracle (tests/conformance/oracle_server.py in its own venv)."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
from pathlib import Path

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


class Oracle:
    def __init__(self):
        env = dict(os.environ, TPU_LIBRARY_PATH="/nonexistent/libtpu.so", TF_CPP_MIN_LOG_LEVEL="3",
                   CUDA_VISIBLE_DEVICES="")
        self.proc = subprocess.Popen([oracle_python(), str(SERVER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        line = self.proc.stdout.readline()
        if line.strip() != b"READY":
            raise RuntimeError(f"oracle failed to start: {line!r}")

    def __call__(self, request: dict) -> dict:
        data = pickle.dumps(request)
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self.proc.stdin.flush()
        head = self.proc.stdout.read(8)
        if len(head) < 8:
            raise RuntimeError("oracle process died")
        (size,) = struct.unpack("<Q", head)
        return pickle.loads(self.proc.stdout.read(size))

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
