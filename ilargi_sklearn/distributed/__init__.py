"""Factorized learning on a distributed engine (Dask), an optional extra.

Install with ``pip install ilargi-sklearn[dask]``. Importing this package imports
Dask; ``import ilargi_sklearn`` does not.
"""

from ilargi_sklearn.distributed._dask import DaskFactorizedMatrix, dask_dataset

__all__ = ["DaskFactorizedMatrix", "dask_dataset"]
