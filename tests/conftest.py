import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

pytest.register_assert_rewrite("tests.helpers")  # before the first import: their asserts explain failures too
from tests.helpers import native  # noqa: E402

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    max_examples=int(os.environ.get("TPU_EMBED_HYPOTHESIS_EXAMPLES", "100")), derandomize=False)
settings.load_profile("default")


def pytest_configure(config):
    # Built transform graphs (`tpu_embed.serving.tft_output.cache_directory`) go to a directory of this
    # session, not the user's cache: a run of the suite builds what it uses.
    if not os.environ.get("TPU_EMBED_CACHE_DIR"):
        os.environ["TPU_EMBED_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpu_embed_test_cache_")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop("TPU_EMBED_CACHE_DIR"), ignore_errors=True))
    config.addinivalue_line(
        "markers", "native(name): needs the native extension `name` (csr, csv, token_index); fails without it "
                   "unless TPU_EMBED_NATIVE=optional asks for the fallbacks (then skips)")


def pytest_runtest_setup(item):
    for mark in item.iter_markers(name="native"):
        native.require(*mark.args)
