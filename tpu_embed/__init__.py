"""tpu_embed: offline SparseCore preprocessing for TPUEmbeddingV2 models.

The public names are loaded lazily so that the pure-numpy core
(`tpu_embed.sparsecore`) can be imported without paying for TensorFlow.

Importing this package keeps TensorFlow quiet, unless `TF_CPP_MIN_LOG_LEVEL` is set: its C++ and Python
logs below errors are dropped and its start-up lines (oneDNN, CUDA, `cuInit`) are not printed
(`tpu_embed.core.quiet`; TensorFlow itself is still imported only when first used).
"""

from typing import TYPE_CHECKING

from tpu_embed.core import quiet as _quiet
from tpu_embed.core.lazy import lazy_exports

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


# TensorFlow and Beam are imported where a name is first used; the subpackages training and sparsecore too.
__getattr__, __dir__ = lazy_exports(globals(), {**_EXPORTS, "training": "tpu_embed.training",
                                                "sparsecore": "tpu_embed.sparsecore"})
