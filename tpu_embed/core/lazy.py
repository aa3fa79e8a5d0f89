"""A package's public names imported on first use (PEP 562), so that importing the package stays cheap.

    __getattr__, __dir__ = lazy_exports(globals(), {"build_tpu_embedding": "tpu_embed.training.tpu", ...})

The package's `__init__.py` keeps its table of names, a written-out `__all__` and `TYPE_CHECKING` imports of the
same names (what type checkers and the API reference read); this module holds the loading.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Mapping, Tuple


def lazy_exports(namespace: Dict[str, Any], exports: Mapping[str, str]
                 ) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """The `__getattr__` and `__dir__` of the package whose globals are `namespace`: a name of `exports`
    ({name: module}) is imported from its module when first read, then kept in the package's globals; a name
    whose module is the package's own subpackage of that name is the subpackage."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name in exports:
            module = importlib.import_module(exports[name])
            # A subpackage is exported as its own module path (`"training": "tpu_embed.training"`).
            value = module if exports[name] == f"{package}.{name}" else getattr(module, name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
