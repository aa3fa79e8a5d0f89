"""Builds the native extensions (CSR kernel, CSV scanner, token index, step counts); the rest: pyproject.toml.

The extensions are required: when one does not compile (no C compiler, a compiler error), the install fails,
so `make test` and CI fail rather than run the slower fallbacks unnoticed.

TPU_EMBED_NATIVE=optional (or 0) asks for the fallbacks explicitly: an extension that does not compile is then
skipped and its pure-Python implementation is used (numpy CSR packing, numpy CSV framing, pyarrow's index_in for
vocabulary lookups): the same results, slower. At run time TPU_EMBED_NATIVE=0 also leaves built extensions
unloaded. The test suite reads the same variable: without it, a test that needs a missing extension fails;
with it, the test is skipped.

Also what Beam's --setup_file needs to package the project for Dataflow, Flink and Spark workers.
"""
import os

from setuptools import Extension, setup

NATIVE = os.environ.get("TPU_EMBED_NATIVE", "required")
if NATIVE not in ("required", "1", "optional", "0"):
    raise SystemExit(f"TPU_EMBED_NATIVE={NATIVE!r}: expected 'optional' (or 0) to allow the fallbacks, "
                     "or 'required' (the default).")
OPTIONAL = NATIVE in ("optional", "0")


def native_extension(name: str, source: str, *, depends=(), flags=("-O3",)) -> Extension:
    # Every extension follows the one TPU_EMBED_NATIVE policy above.
    return Extension(name, sources=[source], depends=list(depends), extra_compile_args=list(flags), optional=OPTIONAL)


TOKEN_TABLE = "pipelines/native/token_table.h"  # the slot layout both token-table modules include

setup(
    ext_modules=[
        # Fallback: the numpy CSR packer.
        # -fno-wrapv: Python's CFLAGS carry -fwrapv, which costs this kernel 10-14%; it has no signed overflow.
        native_extension("tpu_embed.sparsecore._csr_native", "tpu_embed/sparsecore/native/_csr_native.c",
                         flags=("-O3", "-fno-fast-math", "-fno-wrapv")),
        # Fallback: CSV framing the numpy way.
        native_extension("pipelines._csv_native", "pipelines/native/_csv_native.c", depends=[TOKEN_TABLE]),
        # Fallback: vocabulary lookups with pyarrow's index_in.
        native_extension("pipelines._token_index", "pipelines/native/_token_index.c", depends=[TOKEN_TABLE]),
        # Fallback: the lookup statistics' numpy counting (profiles/counting.py).
        native_extension("profiles._step_counts", "profiles/native/_step_counts.c"),
    ],
)
