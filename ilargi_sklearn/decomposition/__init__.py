"""Factorized matrix decomposition: Gaussian NMF over multi-source datasets."""

from ilargi_sklearn.decomposition._gnmf import FactorizedGNMF

__all__ = ["FactorizedGNMF"]
