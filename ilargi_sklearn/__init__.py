"""ilargi_sklearn: factorized learning over joined data sources, scikit-learn style.

Train models directly on several joined tables without building the join: a
:class:`MultiSourceDataset` holds the sources and the data-integration metadata, and
the factorized estimators compute on it through the operator protocol.
"""

from ilargi_sklearn.dataset import Join, MultiSourceDataset

__version__ = "0.1.0"

__all__ = ["Join", "MultiSourceDataset", "__version__"]
