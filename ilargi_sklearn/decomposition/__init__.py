"""Factorized matrix decomposition over multi-source datasets: Gaussian NMF, PCA
and truncated SVD."""

from ilargi_sklearn.decomposition._gnmf import FactorizedGNMF
from ilargi_sklearn.decomposition._pca import FactorizedPCA
from ilargi_sklearn.decomposition._truncated_svd import FactorizedTruncatedSVD

__all__ = ["FactorizedGNMF", "FactorizedPCA", "FactorizedTruncatedSVD"]
