"""Factorized learning on a distributed engine (Dask), an optional extra.

Install with ``pip install ilargi-sklearn[dask]``. Importing this package imports
Dask; ``import ilargi_sklearn`` does not.
"""

from ilargi_sklearn.distributed._dask import DaskFactorizedMatrix, dask_dataset
from ilargi_sklearn.distributed._frames import dask_from_frames
from ilargi_sklearn.distributed._namespace import DaskNamespace

__all__ = ["DaskFactorizedMatrix", "DaskNamespace", "dask_dataset", "dask_from_frames"]
