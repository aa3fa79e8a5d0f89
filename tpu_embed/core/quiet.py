"""Keep TensorFlow's start-up noise and its INFO/WARNING logs off the user's terminal.

Importing TensorFlow prints, from C++ before absl logging is initialised
(so `TF_CPP_MIN_LOG_LEVEL` does not reach them), lines such as

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 ... port.cc:153] oneDNN custom operations are on ...
    I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine ...

and the first device discovery of the CUDA-enabled wheel on a machine without a GPU logs
`E0000 ... cuda_platform.cc:52] failed call to cuInit: ... UNKNOWN ERROR (303)`, which reads as a failure.

`install()` sets the usual environment variables where they are unset (`TF_CPP_MIN_LOG_LEVEL=2`: TensorFlow's
C++ logs below errors are dropped; gRPC's and glog's likewise), sets Python's `tensorflow` logger to ERROR
unless its level was set, and adds an import hook: whenever `tensorflow` is first imported -- by this package,
by Beam, tfx-bsl or the user's code -- the import and the device discovery that follows it run with file
descriptor 2 pointed at /dev/null (a failing import still raises; its traceback is printed as usual).
Nothing is imported eagerly, so code that never touches TensorFlow does not pay for it.  `uninstall()` undoes
what `install()` changed, and only that.

`import tpu_embed` runs `install_unless_user_chose()`: nothing when the user has set `TF_CPP_MIN_LOG_LEVEL`
(their choice wins: TensorFlow then logs as it does without tpu_embed), else `install()`; a child process
inherits the variables with a marker (`TPU_EMBED_QUIET`), so it is quiet too.  The `tpu-embed`
command calls `install()` itself, or `uninstall()` for `--debug` (`pipelines.cli.entry`).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from typing import Dict, Iterator, Optional

ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_VERBOSITY": "ERROR", "GLOG_minloglevel": "2"}
USER_SWITCH = "TF_CPP_MIN_LOG_LEVEL"  # set by the user: `import tpu_embed` leaves TensorFlow's logging alone
# Set beside the variables install() sets, so that a child process (a Beam worker, a helper), which inherits
# them, does not take them for the user's choice.
MARKER = "TPU_EMBED_QUIET"

# What install() changed, so that uninstall() restores exactly that.
_set_environment: Dict[str, str] = {}
_set_logger_level: Optional[int] = None


@contextlib.contextmanager
def muted_stderr() -> Iterator[None]:
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
    """TensorFlow's logs below errors and its import muted (see the module docstring); idempotent."""
    global _set_logger_level
    for k, v in {**ENVIRONMENT, MARKER: ENVIRONMENT[USER_SWITCH]}.items():
        if k not in os.environ:
            os.environ[k] = v
            _set_environment[k] = v
    logger = logging.getLogger("tensorflow")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.ERROR)
        _set_logger_level = logging.ERROR
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietTensorFlowFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietTensorFlowFinder())


def uninstall() -> None:
    """Undo `install()`: its environment variables, logger level and import hook (what it did not set stays)."""
    global _set_logger_level
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietTensorFlowFinder)]
    for k, v in list(_set_environment.items()):
        if os.environ.get(k) == v:
            del os.environ[k]
        del _set_environment[k]
    logger = logging.getLogger("tensorflow")
    if _set_logger_level is not None and logger.level == _set_logger_level:
        logger.setLevel(logging.NOTSET)
    _set_logger_level = None


def install_unless_user_chose() -> None:
    """`install()`, unless the user has set `TF_CPP_MIN_LOG_LEVEL` (what `import tpu_embed` runs).

    A value that an `install()` of a parent process set (and marked) is not the user's choice.
    """
    value = os.environ.get(USER_SWITCH)
    if value is None or value == os.environ.get(MARKER):
        install()
