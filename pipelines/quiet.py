"""Keep TensorFlow's start-up noise off the user's terminal.

Importing TensorFlow prints, from C++ before absl logging is initialised
(so `TF_CPP_MIN_LOG_LEVEL` does not reach them), lines such as

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 ... port.cc:153] oneDNN custom operations are on ...
    I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine ...
    E0000 ... cuda_platform.cc:52] failed call to cuInit: ...

`install()` (called first thing by the `tpu-embed` entry point) sets the
usual environment variables and adds an import hook: whenever `tensorflow`
is first imported -- by this package, by Beam, tfx-bsl or anyone -- the
import and the device discovery that follows it run with file descriptor 2
pointed at /dev/null.  Nothing is imported eagerly, so commands that never
touch TensorFlow do not pay for it.  `--debug` leaves stderr alone.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys

ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_VERBOSITY": "ERROR", "GLOG_minloglevel": "2"}


@contextlib.contextmanager
def muted_stderr():
    """fd 2 -> /dev/null for the block (C++ writes there directly, below Python's sys.stderr)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        with muted_stderr():
            self.real.exec_module(module)
            try:
                module.config.list_physical_devices()  # CUDA probing (cuInit) happens here, muted
            except Exception:  # noqa: BLE001 - best effort: the import itself succeeded
                pass


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]  # once
        spec.loader = _QuietLoader(spec.loader)
        return spec


def install() -> None:
    for k, v in ENVIRONMENT.items():
        os.environ.setdefault(k, v)
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietTensorFlowFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietTensorFlowFinder())
