"""Factorized linear models: least squares and logistic regression."""

from ilargi_sklearn.linear_model._linear import FactorizedLinearRegression
from ilargi_sklearn.linear_model._logistic import FactorizedLogisticRegression

__all__ = ["FactorizedLinearRegression", "FactorizedLogisticRegression"]
