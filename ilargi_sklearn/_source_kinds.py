"""The source kinds of other engines that ``MultiSourceDataset.from_matrices``
takes: Dask arrays become a Dask-backed dataset (``ilargi_sklearn.distributed``).

Registered at the package's top, which stands above both the data-structure
package and the engines, so that ``multisource`` never imports an engine, and
``ilargi_sklearn.distributed`` (and with it Dask) loads only when a Dask source
arrives. A source is Dask's when Dask itself says so
(``dask.is_dask_collection``); Dask is only asked when the process already
imported it, as whoever made a Dask array did.
"""

from __future__ import annotations

import sys
from typing import Any

from ilargi_sklearn.multisource._matrices import register_source_kind


def _is_dask(source: Any) -> bool:
    dask = sys.modules.get("dask")
    return dask is not None and bool(dask.is_dask_collection(source))


def _dask_build(cls: type, *args: Any, **kwargs: Any) -> Any:
    from ilargi_sklearn.distributed._dask import from_matrices_on_dask

    return from_matrices_on_dask(cls, *args, **kwargs)


def register_engines() -> None:
    """Register the Dask source kind (``import ilargi_sklearn`` does)."""
    register_source_kind("dask", _is_dask, _dask_build)
