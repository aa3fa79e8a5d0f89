"""The native extensions setup.py builds are there: a failed C build fails the suite, not skips its tests."""

import importlib
import os
import runpy
from unittest import mock

import pytest

from tests.helpers import ROOT, native


@pytest.mark.parametrize("name", sorted(native.EXTENSIONS))
def test_the_native_extension_is_built_and_importable(name):
    native.require(name)
    module = importlib.import_module(native.EXTENSIONS[name])
    assert module.__file__.endswith(".so"), module.__file__  # the compiled module, not a stand-in


def test_the_suite_knows_every_extension_setup_py_builds():
    # setup.py run with setuptools.setup captured: the extensions it would build, however it spells them.
    with mock.patch("setuptools.setup") as setup:
        runpy.run_path(os.path.join(ROOT, "setup.py"))
    built = {ext.name for ext in setup.call_args.kwargs["ext_modules"]}
    assert built == set(native.EXTENSIONS.values())
