"""Builds the optional native CSR kernel, CSV scanner and token index; everything else is in pyproject.toml.

Also what Beam's --setup_file needs to package the project for Dataflow,
Flink and Spark workers.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        # Optional: without a C compiler the build goes on and the numpy implementation is used.
        Extension(
            "tpu_embed.sparsecore._csr_native",
            sources=["tpu_embed/sparsecore/native/_csr_native.c"],
            extra_compile_args=["-O3", "-fno-fast-math"],
            optional=True,
        ),
        # Optional too: without it CSV framing takes the numpy way (pipelines.io._scan).
        Extension(
            "pipelines._csv_native",
            sources=["pipelines/native/_csv_native.c"],
            depends=["pipelines/native/token_table.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        # Optional too: without it vocabulary lookups take pyarrow's index_in (pipelines.token_index).
        Extension(
            "pipelines._token_index",
            sources=["pipelines/native/_token_index.c"],
            depends=["pipelines/native/token_table.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ],
)
