"""Old module paths that still import, with a FutureWarning.

``ilargi_sklearn.dataset`` (the dataset and its operators) was renamed
``ilargi_sklearn.multisource``: one letter from ``ilargi_sklearn.datasets`` (the
loaders) was one too few. Code that imports the old path, and models pickled before
the rename (a pickle names the module of every class in it, e.g. a fitted model's
``dataset_schema_``), keep working: the old names resolve to the new modules.

Classes that moved out of a private module that is gone (:data:`MOVED`) resolve
the same way, name by name: a model pickled before the move (which names the old
module) loads, and re-pickled it names the new one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

#: Old package path -> new one.
RENAMED = {"ilargi_sklearn.dataset": "ilargi_sklearn.multisource"}

#: Old module path -> {class name: the module it moved to}, for modules split up.
MOVED = {
    # The cross-validated linear models sit beside the models they search
    # (scikit-learn's places): RidgeCV beside Ridge, LassoCV and ElasticNetCV
    # beside the coordinate descent.
    "ilargi_sklearn.linear_model._cv": {
        "FactorizedRidgeCV": "ilargi_sklearn.linear_model._ridge_cv",
        "FactorizedElasticNetCV": "ilargi_sklearn.linear_model._coordinate_descent_cv",
        "FactorizedLassoCV": "ilargi_sklearn.linear_model._coordinate_descent_cv",
    },
}


class _RenamedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path (and its submodules) to the renamed module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        for old in RENAMED:
            if fullname == old or fullname.startswith(old + "."):
                return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: Any) -> ModuleType:
        if spec.name in MOVED:
            return _moved_module(spec.name, MOVED[spec.name])
        for old, new in RENAMED.items():
            if spec.name == old or spec.name.startswith(old + "."):
                target = new + spec.name[len(old) :]
                warnings.warn(
                    f"{spec.name} was renamed {target}; the old path will be "
                    "removed in a future release.",
                    FutureWarning,
                    stacklevel=2,
                )
                return importlib.import_module(target)
        raise ImportError(spec.name)  # pragma: no cover - find_spec matched

    def exec_module(self, module: ModuleType) -> None:
        """The renamed module is imported already."""


def _moved_module(old: str, moved: dict[str, str]) -> ModuleType:
    """A stand-in for the module ``old`` whose classes moved (``moved``: name ->
    new module): each name resolves to the new module, with a FutureWarning."""
    module = ModuleType(old)

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        new = moved[name]
        warnings.warn(
            f"{old}.{name} moved to {new}.{name}: save the object again (pickle "
            "it anew) to refer to the new path; the old one will be removed in a "
            "future release.",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


def install() -> None:
    """Add the finder once (at ``import ilargi_sklearn``), first: only the old
    paths match it, and no other finder may resolve them to stale files."""
    if not any(isinstance(f, _RenamedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RenamedFinder())
