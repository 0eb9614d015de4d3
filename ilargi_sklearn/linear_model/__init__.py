"""Factorized linear models: least squares, ridge, the elastic net and lasso by
coordinate descent, their cross-validated searches, logistic regression (with C chosen by
cross-validation), and the generalized linear models (Poisson, Gamma, Tweedie)."""

from ilargi_sklearn.linear_model._coordinate_descent import (
    FactorizedElasticNet,
    FactorizedLasso,
)
from ilargi_sklearn.linear_model._coordinate_descent_cv import (
    FactorizedElasticNetCV,
    FactorizedLassoCV,
)
from ilargi_sklearn.linear_model._glm import (
    FactorizedGammaRegressor,
    FactorizedPoissonRegressor,
    FactorizedTweedieRegressor,
)
from ilargi_sklearn.linear_model._linear import FactorizedLinearRegression
from ilargi_sklearn.linear_model._logistic import FactorizedLogisticRegression
from ilargi_sklearn.linear_model._logistic_cv import FactorizedLogisticRegressionCV
from ilargi_sklearn.linear_model._ridge import (
    FactorizedRidge,
    FactorizedRidgeClassifier,
)
from ilargi_sklearn.linear_model._ridge_cv import FactorizedRidgeCV

__all__ = [
    "FactorizedElasticNet",
    "FactorizedElasticNetCV",
    "FactorizedGammaRegressor",
    "FactorizedLasso",
    "FactorizedLassoCV",
    "FactorizedLinearRegression",
    "FactorizedLogisticRegression",
    "FactorizedLogisticRegressionCV",
    "FactorizedPoissonRegressor",
    "FactorizedRidge",
    "FactorizedRidgeCV",
    "FactorizedRidgeClassifier",
    "FactorizedTweedieRegressor",
]
