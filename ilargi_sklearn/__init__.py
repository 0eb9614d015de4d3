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
from ilargi_sklearn._config import config_context, get_config, set_config
from ilargi_sklearn._source_kinds import register_engines
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
# Dask sources in ``from_matrices``, without ``multisource`` importing Dask's package.
register_engines()


def clear_caches() -> None:
    """Drop every cache of the package, so that later fits compute from the data.

    The caches never change a result, as long as the sources are not changed in
    place: a dataset of :meth:`MultiSourceDataset.from_matrices` keeps the arrays
    it was given when they already have its dtype and layout (no copy), and
    writing into one of them changes the dataset's data, but not what was computed
    from it before. After such a change call ``clear_caches()`` (or build the
    dataset again). It drops

    * the sufficient statistics that gram-based fits share, and the row slices of
      searches (:func:`~ilargi_sklearn.multisource.clear_statistics_cache`);
    * the joined matrices of materialized fits
      (:func:`~ilargi_sklearn.planner.clear_materialization_cache`);
    * the planner's measured plan times
      (:func:`~ilargi_sklearn.planner.clear_plan_history`) and its data figures;
    * the compiled kernels' layouts of the sources, and the copies of datasets on
      other devices (:meth:`MultiSourceDataset.to_device`; datasets already moved
      keep their data).

    The per-cache functions keep working. The settings (the caches' budgets,
    :func:`set_config`) stay as they are.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import FactorizedRidge, MultiSourceDataset, clear_caches
    >>> rng = np.random.default_rng(0)
    >>> S, R = rng.normal(size=(100, 2)), rng.normal(size=(10, 3))
    >>> ds = MultiSourceDataset.from_matrices([S, R], [None, np.arange(100) % 10])
    >>> y = rng.normal(size=100)
    >>> ridge = FactorizedRidge(strategy="materialized")
    >>> before = ridge.fit(ds, y).coef_
    >>> R *= 2.0  # in place: the dataset's data change
    >>> clear_caches()
    >>> after = ridge.fit(ds, y).coef_
    >>> fresh = MultiSourceDataset.from_matrices([S, R], [None, np.arange(100) % 10])
    >>> bool(np.allclose(after, ridge.fit(fresh, y).coef_))
    True
    >>> bool(np.allclose(after, before))
    False
    """
    from ilargi_sklearn.multisource._cache import clear_materialization_cache
    from ilargi_sklearn.multisource._operators import drop_fused_layouts
    from ilargi_sklearn.multisource._placement import drop_device_copies
    from ilargi_sklearn.multisource._stats_cache import clear_statistics_cache
    from ilargi_sklearn.planner._auto import clear_plan_history
    from ilargi_sklearn.planner._features import _DATA_FEATURES

    clear_statistics_cache()
    clear_materialization_cache()
    clear_plan_history()
    _DATA_FEATURES.clear()
    drop_fused_layouts()
    drop_device_copies()


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
    "clear_caches",
    "config_context",
    "get_config",
    "set_config",
]
