"""TensorFlow's eager tensors read by the C kernel in place, through TF's own C API.

Without this, a TF eager tensor reaches the kernel as a numpy view of its memory
(`EagerTensor._numpy_internal`, what `np.asarray` and `.numpy()` build on): per
tensor, TF resolves the handle, wraps it in a numpy array and a releaser object,
and frees both after the call, ~0.5 us a tensor, 60 tensors for a batch of 30
ragged features.  Registered, the kernel takes the tensor itself and does what
TF's numpy conversion does, without the numpy array:

* `EagerTensor_Handle` (tensorflow/python/eager/pywrap_tensor.h) gives the
  tensor's `TFE_TensorHandle`;
* `TFE_TensorHandleResolve` (tensorflow/c/eager/c_api.h) gives a `TF_Tensor`
  in host memory: a reference to the tensor's buffer on the host CPU, a copy
  from another device;
* `TF_TensorData`, `TF_TensorType`, `TF_NumDims`, `TF_Dim` read it and
  `TF_DeleteTensor` drops it after the call (tensorflow/c/tf_tensor.h).

The functions are looked up in the shared libraries of the TensorFlow the
process has already loaded (`RTLD_NOLOAD`: nothing is loaded or linked).  Where
one is missing (another layout of TF's wheel), where the kernel does not read a
sample tensor back as numpy does, or with `TPU_EMBED_TF_C_API=0`, tensors go to
the kernel as numpy views, as before; the bytes packed are the same either way
(tests/tpu_embed/sparsecore/test_eager_tensors.py).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

log = logging.getLogger(__name__)

# In the order `_csr_native.set_eager_tensor_api` takes them.
_FUNCTIONS = ("_Z18EagerTensor_HandlePK7_object",  # EagerTensor_Handle(const PyObject*), a C++ symbol
              "TFE_TensorHandleResolve", "TF_TensorData", "TF_TensorType", "TF_NumDims", "TF_Dim",
              "TF_DeleteTensor", "TF_NewStatus", "TF_GetCode")

# Where TF's wheels put them (2.1x: libtensorflow_cc, libtensorflow_framework and the pywrap library);
# any other shared library of the package is tried after these.
_LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2", "python/lib_pywrap_tensorflow_common.so",
              "python/_pywrap_tensorflow_internal.so")

_registered: Dict[type, bool] = {}


def _kernel() -> Any:
    try:
        return importlib.import_module("tpu_embed.sparsecore._csr_native")
    except ImportError:  # pragma: no cover - a tree without the C kernel never hands tensors to it
        return None


def _loaded_libraries(package_dir: Path) -> List[ctypes.CDLL]:
    """TF's shared libraries that this process has loaded, the usual ones first."""
    names = [package_dir / n for n in _LIBRARIES]
    names += sorted(p for d in (package_dir, package_dir / "python") for p in d.glob("*.so*") if p not in names)
    libraries = []
    for path in names:
        try:
            libraries.append(ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_NOLOAD))
        except OSError:  # absent, or not loaded
            continue
    return libraries


def _addresses(package_dir: Path) -> Optional[List[int]]:
    libraries = _loaded_libraries(package_dir)
    found: List[int] = []
    for name in _FUNCTIONS:
        for library in libraries:
            try:
                address = ctypes.cast(getattr(library, name), ctypes.c_void_p).value
            except AttributeError:
                continue
            if address:
                found.append(address)
                break
        else:
            log.debug("TF C API: %s not found in %s", name, package_dir)
            return None
    return found


def _reads_as_numpy(kernel: Any, tf: Any, eager_type: type) -> bool:
    """The kernel reads sample tensors (int64, int32, float32; 1-D, 2-D, empty) as numpy does."""
    with tf.init_scope():  # eager even under a graph or a tf.function's tracing
        samples = [tf.constant(np.array([3, -1, 1 << 40], np.int64)),
                   tf.constant(np.arange(6, dtype=np.int32).reshape(3, 2)),
                   tf.constant(np.array([0.5, -2.0], np.float32)),
                   tf.constant(np.zeros((0, 2), np.int64))]
    for sample in samples:
        if type(sample) is not eager_type:
            return False
        want = np.asarray(sample)
        got = kernel.eager_tensor_bytes(sample)
        if got is None or got[1] != want.shape or got[2] != want.tobytes() or np.dtype(got[0]) != want.dtype:
            return False
    return True


def read_in_place(eager_type: type) -> bool:
    """Whether the kernel reads tensors of `eager_type` (TF's EagerTensor) itself: registered now or before."""
    done = _registered.get(eager_type)
    if done is not None:
        return done
    ok = False
    tf = sys.modules.get("tensorflow")
    tf_file = getattr(tf, "__file__", None)
    kernel = _kernel()
    if (os.environ.get("TPU_EMBED_TF_C_API", "1") != "0" and tf_file and kernel is not None
            and eager_type.__name__ == "EagerTensor" and eager_type.__module__.startswith("tensorflow.")):
        addresses = _addresses(Path(tf_file).parent)
        if addresses is not None:
            kernel.set_eager_tensor_api(eager_type, *addresses)
            try:
                ok = _reads_as_numpy(kernel, tf, eager_type)
            except Exception:  # e.g. TF cannot make a tensor here: the numpy views, below
                log.debug("TF C API: sample tensors not read", exc_info=True)
                ok = False
            if not ok:
                kernel.set_eager_tensor_api(None)
    if not ok:
        log.debug("TF eager tensors go to the kernel as numpy views")
    _registered[eager_type] = ok
    return ok


def forget() -> None:
    """Stop reading eager tensors through TF's C API; the next `read_in_place` registers it again."""
    kernel = _kernel()
    if kernel is not None:
        kernel.set_eager_tensor_api(None)
    _registered.clear()
