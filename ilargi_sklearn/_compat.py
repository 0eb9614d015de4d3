"""Old module paths that still import, with a FutureWarning.

``ilargi_sklearn.dataset`` (the dataset and its operators) was renamed
``ilargi_sklearn.multisource``: one letter from ``ilargi_sklearn.datasets`` (the
loaders) was one too few. Code that imports the old path, and models pickled before
the rename (a pickle names the module of every class in it, e.g. a fitted model's
``dataset_schema_``), keep working: the old names resolve to the new modules.
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


class _RenamedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path (and its submodules) to the renamed module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        for old in RENAMED:
            if fullname == old or fullname.startswith(old + "."):
                return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: Any) -> ModuleType:
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


def install() -> None:
    """Add the finder once (at ``import ilargi_sklearn``), first: only the old
    paths match it, and no other finder may resolve them to stale files."""
    if not any(isinstance(f, _RenamedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RenamedFinder())
