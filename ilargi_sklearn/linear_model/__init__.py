"""Factorized linear models: least squares, logistic regression, and the elastic net
and lasso by coordinate descent."""

from ilargi_sklearn.linear_model._coordinate_descent import (
    FactorizedElasticNet,
    FactorizedLasso,
)
from ilargi_sklearn.linear_model._linear import FactorizedLinearRegression
from ilargi_sklearn.linear_model._logistic import FactorizedLogisticRegression

__all__ = [
    "FactorizedElasticNet",
    "FactorizedLasso",
    "FactorizedLinearRegression",
    "FactorizedLogisticRegression",
]
