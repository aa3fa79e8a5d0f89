"""tpu_embed: offline SparseCore preprocessing for TPUEmbeddingV2 models.

The public names are loaded lazily so that the pure-numpy core
(`tpu_embed.sparsecore`) can be imported without paying for TensorFlow.

Importing this package keeps TensorFlow quiet, unless `TF_CPP_MIN_LOG_LEVEL` is set: its C++ and Python
logs below errors are dropped and its start-up lines (oneDNN, CUDA, `cuInit`) are not printed
(`tpu_embed.core.quiet`; TensorFlow itself is still imported only when first used).
"""

import importlib
from typing import TYPE_CHECKING

from tpu_embed.core import quiet as _quiet

_quiet.install_unless_user_chose()  # before anything imports TensorFlow

if TYPE_CHECKING:  # the lazy names below, visible to type checkers and the API reference's static analysis
    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.artifact.spec import load_spec
    from tpu_embed.compat.config_spec import EmbeddingConfigSpec
    from tpu_embed.compat.feature_column import embedding_column, shared_embedding_columns
    from tpu_embed.core.optimizers import (
        AdagradParameters,
        AdamParameters,
        FtrlParameters,
        StochasticGradientDescentParameters,
    )
    from tpu_embed.core.topology import Topology
    from tpu_embed.serving.export import export_saved_model
    from tpu_embed.sparsecore import preprocess
    from tpu_embed.training.host_embedding import HostEmbedding
    from tpu_embed.training.input import input_fn
    from tpu_embed.training.remap import remap

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (setuptools attr)

_EXPORTS = {
    # The spec and the artifacts the jobs write.
    "load_spec": "tpu_embed.artifact.spec",
    "load_artifact": "tpu_embed.artifact.load",
    # Topology and the SparseCore core (numpy only): CSR buffers from ids, as TF's kernels make them.
    "Topology": "tpu_embed.core.topology",
    "preprocess": "tpu_embed.sparsecore",
    # Seed API (TensorFlow feature columns and the estimator-era spec).
    "embedding_column": "tpu_embed.compat.feature_column",
    "shared_embedding_columns": "tpu_embed.compat.feature_column",
    "EmbeddingConfigSpec": "tpu_embed.compat.config_spec",
    "AdagradParameters": "tpu_embed.core.optimizers",
    "AdamParameters": "tpu_embed.core.optimizers",
    "StochasticGradientDescentParameters": "tpu_embed.core.optimizers",
    "FtrlParameters": "tpu_embed.core.optimizers",
    # Training side.
    "input_fn": "tpu_embed.training.input",
    "HostEmbedding": "tpu_embed.training.host_embedding",
    "remap": "tpu_embed.training.remap",
    # Serving: the SavedModel that maps raw features as the shards do.
    "export_saved_model": "tpu_embed.serving.export",
}

# Written out (not computed from _EXPORTS) so that static analysis reads it; tests/docs/test_api_reference.py
# checks that the two agree.
__all__ = [
    "AdagradParameters",
    "AdamParameters",
    "EmbeddingConfigSpec",
    "FtrlParameters",
    "HostEmbedding",
    "StochasticGradientDescentParameters",
    "Topology",
    "embedding_column",
    "export_saved_model",
    "input_fn",
    "load_artifact",
    "load_spec",
    "preprocess",
    "remap",
    "shared_embedding_columns",
    "sparsecore",
]


def __getattr__(name):
    if name in _EXPORTS:
        module = importlib.import_module(_EXPORTS[name])
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name == "training":  # the training side (TensorFlow is imported where it is used)
        return importlib.import_module("tpu_embed.training")
    if name == "sparsecore":
        return importlib.import_module("tpu_embed.sparsecore")
    raise AttributeError(f"module 'tpu_embed' has no attribute {name!r}")


def __dir__():
    return __all__
