"""tpu_embed: offline SparseCore preprocessing for TPUEmbeddingV2 models.

The public names are loaded lazily so that the pure-numpy core
(`tpu_embed.sparsecore`) can be imported without paying for TensorFlow.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # Topology and the SparseCore core (numpy only).
    "Topology": "tpu_embed.topology",
    # Seed API (TensorFlow feature columns and the estimator-era spec).
    "embedding_column": "tpu_embed.feature_column",
    "shared_embedding_columns": "tpu_embed.feature_column",
    "EmbeddingConfigSpec": "tpu_embed.config_spec",
    "AdagradParameters": "tpu_embed.optimizers",
    "AdamParameters": "tpu_embed.optimizers",
    "StochasticGradientDescentParameters": "tpu_embed.optimizers",
    "FtrlParameters": "tpu_embed.optimizers",
    # Training side.
    "input_fn": "tpu_embed.shards",
    "HostEmbedding": "tpu_embed.host_embedding",
}

__all__ = sorted(_EXPORTS) + ["sparsecore"]


def __getattr__(name):
    if name in _EXPORTS:
        module = importlib.import_module(_EXPORTS[name])
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name == "training":  # the TPU path (imports TensorFlow when used); see tpu_embed/training.py
        return importlib.import_module("tpu_embed.training")
    if name == "sparsecore":
        return importlib.import_module("tpu_embed.sparsecore")
    raise AttributeError(f"module 'tpu_embed' has no attribute {name!r}")


def __dir__():
    return __all__
