"""Gradient-boosted trees over joins: scikit-learn's histogram gradient boosting,
trained on the sources."""

from ilargi_sklearn.ensemble._gradient_boosting import (
    FactorizedHistGradientBoostingClassifier,
    FactorizedHistGradientBoostingRegressor,
)

__all__ = [
    "FactorizedHistGradientBoostingClassifier",
    "FactorizedHistGradientBoostingRegressor",
]
