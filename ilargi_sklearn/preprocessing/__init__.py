"""Factorized preprocessing: scalers whose output stays a MultiSourceDataset."""

from ilargi_sklearn.preprocessing._scaler import FactorizedStandardScaler

__all__ = ["FactorizedStandardScaler"]
