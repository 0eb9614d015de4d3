"""Factorized linear models: least squares, ridge, the elastic net and lasso by
coordinate descent, their cross-validated searches, and logistic regression."""

from ilargi_sklearn.linear_model._coordinate_descent import (
    FactorizedElasticNet,
    FactorizedLasso,
)
from ilargi_sklearn.linear_model._cv import (
    FactorizedElasticNetCV,
    FactorizedLassoCV,
    FactorizedRidgeCV,
)
from ilargi_sklearn.linear_model._linear import FactorizedLinearRegression
from ilargi_sklearn.linear_model._logistic import FactorizedLogisticRegression
from ilargi_sklearn.linear_model._ridge import (
    FactorizedRidge,
    FactorizedRidgeClassifier,
)

__all__ = [
    "FactorizedElasticNet",
    "FactorizedElasticNetCV",
    "FactorizedLasso",
    "FactorizedLassoCV",
    "FactorizedLinearRegression",
    "FactorizedLogisticRegression",
    "FactorizedRidge",
    "FactorizedRidgeCV",
    "FactorizedRidgeClassifier",
]
