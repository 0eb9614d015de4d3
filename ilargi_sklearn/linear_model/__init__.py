"""Factorized linear models: least squares, ridge, the elastic net and lasso by
coordinate descent, and logistic regression (with C chosen by cross-validation)."""

from ilargi_sklearn.linear_model._coordinate_descent import (
    FactorizedElasticNet,
    FactorizedLasso,
)
from ilargi_sklearn.linear_model._linear import FactorizedLinearRegression
from ilargi_sklearn.linear_model._logistic import FactorizedLogisticRegression
from ilargi_sklearn.linear_model._logistic_cv import FactorizedLogisticRegressionCV
from ilargi_sklearn.linear_model._ridge import (
    FactorizedRidge,
    FactorizedRidgeClassifier,
)

__all__ = [
    "FactorizedElasticNet",
    "FactorizedLasso",
    "FactorizedLinearRegression",
    "FactorizedLogisticRegression",
    "FactorizedLogisticRegressionCV",
    "FactorizedRidge",
    "FactorizedRidgeClassifier",
]
