"""Factorized preprocessing: transformers whose output stays a MultiSourceDataset."""

from ilargi_sklearn.preprocessing._polynomial import FactorizedPolynomialFeatures
from ilargi_sklearn.preprocessing._scaler import FactorizedStandardScaler

__all__ = ["FactorizedPolynomialFeatures", "FactorizedStandardScaler"]
