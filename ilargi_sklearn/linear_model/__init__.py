"""Factorized linear models: least squares, ridge and logistic regression."""

from ilargi_sklearn.linear_model._linear import FactorizedLinearRegression
from ilargi_sklearn.linear_model._logistic import FactorizedLogisticRegression
from ilargi_sklearn.linear_model._ridge import (
    FactorizedRidge,
    FactorizedRidgeClassifier,
)

__all__ = [
    "FactorizedLinearRegression",
    "FactorizedLogisticRegression",
    "FactorizedRidge",
    "FactorizedRidgeClassifier",
]
