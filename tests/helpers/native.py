"""The native extensions are required by the suite; the pure-Python fallbacks only when asked for.

A test that needs an extension fails when it is missing, so a failed C build cannot pass as a run of
skipped tests. TPU_EMBED_NATIVE=optional (setup.py: a failed build is tolerated) or TPU_EMBED_NATIVE=0 (the
extensions are not loaded) asks for the fallbacks explicitly: such a test is then skipped.
"""

from __future__ import annotations

import importlib
import os

import pytest

# The extensions setup.py builds, by the short name the `native` marker takes.
EXTENSIONS = {
    "csr": "tpu_embed.sparsecore._csr_native",
    "csv": "pipelines._csv_native",
    "token_index": "pipelines._token_index",
    "step_counts": "profiles._step_counts",
}


def fallback_requested() -> bool:
    return os.environ.get("TPU_EMBED_NATIVE") in ("optional", "0")


def missing(name: str) -> str | None:
    """Why the project runs without extension `name` (a key of EXTENSIONS), or None when it uses it."""
    if os.environ.get("TPU_EMBED_NATIVE") == "0":
        return "TPU_EMBED_NATIVE=0 leaves the native extensions unloaded"
    try:
        importlib.import_module(EXTENSIONS[name])
    except ImportError as e:
        return f"{EXTENSIONS[name]} is not built ({e})"
    return None


def require(name: str) -> None:
    """Fail the calling test when extension `name` is missing; skip it when the fallback was asked for."""
    why = missing(name)
    if why is None:
        return
    if fallback_requested():
        pytest.skip(why)
    pytest.fail(f"{why}. The native extensions are required: build them with `pip install -e .` (a C compiler "
                "is needed), or set TPU_EMBED_NATIVE=optional to test the fallbacks alone.", pytrace=False)


def available(name: str) -> bool:
    """True when extension `name` is in use. When it is missing: False if the fallback was asked for, else the
    calling test fails (for tests that check the fallback and, where built, the extension)."""
    if missing(name) is None:
        return True
    if fallback_requested():
        return False
    require(name)  # fails
    return False
