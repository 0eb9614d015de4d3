"""Factorized linear models: least squares, logistic regression and the generalized
linear models (Poisson, Gamma, Tweedie)."""

from ilargi_sklearn.linear_model._glm import (
    FactorizedGammaRegressor,
    FactorizedPoissonRegressor,
    FactorizedTweedieRegressor,
)
from ilargi_sklearn.linear_model._linear import FactorizedLinearRegression
from ilargi_sklearn.linear_model._logistic import FactorizedLogisticRegression

__all__ = [
    "FactorizedGammaRegressor",
    "FactorizedLinearRegression",
    "FactorizedLogisticRegression",
    "FactorizedPoissonRegressor",
    "FactorizedTweedieRegressor",
]
