"""benchmarks/pipelines.py as a module, for the other benchmark scripts (its data, its spec, its single process).

It is loaded by path: its name is the package's, and a script in benchmarks/ has this directory first on
sys.path, where `import pipelines` would find it instead of the package. `load` puts the repository root
first, so that `pipelines` is the package.
"""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load():
    """The module benchmarks/pipelines.py (`bench_spec`, `generate`, `single_process`, ...)."""
    if sys.path[:1] != [ROOT]:
        sys.path.insert(0, ROOT)
    spec = importlib.util.spec_from_file_location("bench", os.path.join(ROOT, "benchmarks", "pipelines.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
