"""ilargi_sklearn: factorized learning over joined data sources, scikit-learn style.

Train models directly on several joined tables without building the join: a
:class:`MultiSourceDataset` holds the sources and the data-integration metadata, and
the factorized estimators compute on it through the operator protocol.
"""

from ilargi_sklearn import _compat
from ilargi_sklearn._backend._plan import (
    DeviceUnavailableError,
    Plan,
    UnsupportedOnDeviceError,
)
from ilargi_sklearn.cluster import FactorizedKMeans
from ilargi_sklearn.decomposition import (
    FactorizedGNMF,
    FactorizedPCA,
    FactorizedTruncatedSVD,
)
from ilargi_sklearn.ensemble import (
    FactorizedHistGradientBoostingClassifier,
    FactorizedHistGradientBoostingRegressor,
)
from ilargi_sklearn.linear_model import (
    FactorizedElasticNet,
    FactorizedElasticNetCV,
    FactorizedGammaRegressor,
    FactorizedLasso,
    FactorizedLassoCV,
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
    FactorizedLogisticRegressionCV,
    FactorizedPoissonRegressor,
    FactorizedRidge,
    FactorizedRidgeClassifier,
    FactorizedRidgeCV,
    FactorizedTweedieRegressor,
)
from ilargi_sklearn.multisource import Join, MultiSourceDataset
from ilargi_sklearn.planner import AutoPlan
from ilargi_sklearn.preprocessing import (
    FactorizedPolynomialFeatures,
    FactorizedStandardScaler,
)

__version__ = "0.1.0"

_compat.install()

__all__ = [
    "AutoPlan",
    "DeviceUnavailableError",
    "FactorizedElasticNet",
    "FactorizedElasticNetCV",
    "FactorizedGNMF",
    "FactorizedGammaRegressor",
    "FactorizedHistGradientBoostingClassifier",
    "FactorizedHistGradientBoostingRegressor",
    "FactorizedKMeans",
    "FactorizedLasso",
    "FactorizedLassoCV",
    "FactorizedLinearRegression",
    "FactorizedLogisticRegression",
    "FactorizedLogisticRegressionCV",
    "FactorizedPCA",
    "FactorizedPoissonRegressor",
    "FactorizedPolynomialFeatures",
    "FactorizedRidge",
    "FactorizedRidgeCV",
    "FactorizedRidgeClassifier",
    "FactorizedStandardScaler",
    "FactorizedTruncatedSVD",
    "FactorizedTweedieRegressor",
    "Join",
    "MultiSourceDataset",
    "Plan",
    "UnsupportedOnDeviceError",
    "__version__",
]
