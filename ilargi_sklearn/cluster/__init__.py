"""Factorized clustering: K-Means over multi-source datasets."""

from ilargi_sklearn.cluster._kmeans import FactorizedKMeans

__all__ = ["FactorizedKMeans"]
