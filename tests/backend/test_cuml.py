"""The cuML path of materialized GPU plans, as far as it can be tested without one.

Without cuML and a GPU the path must never be taken and ``cuml`` never imported.
A fake ``cuml`` module (scikit-learn underneath, NumPy arrays) with the probe and
the device check patched exercises the parameter and attribute mapping. The real
path (CuPy arrays, cuML's solvers) is checked only where a GPU and cuML exist.
"""

import importlib.machinery
import importlib.util
import sys
import types

import numpy as np
import pytest
import sklearn.cluster
import sklearn.linear_model

from ilargi_sklearn._backend import _cuml, _gpu
from ilargi_sklearn.cluster import FactorizedKMeans
from ilargi_sklearn.decomposition import FactorizedGNMF
from ilargi_sklearn.linear_model import (
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
)
from ilargi_sklearn.utils._testing import random_dataset

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _data(seed=0, scenario="star"):
    ds = random_dataset(seed, scenario=scenario, n_rows=80)
    rng = np.random.default_rng(seed)
    y = ds.operator.matmul(rng.standard_normal(ds.shape[1])) + 0.1 * (
        rng.standard_normal(len(ds))
    )
    return ds, y


def _fits(ds, y):
    labels = (y > np.median(y)).astype(int)
    return [
        FactorizedLinearRegression(strategy="materialized").fit(ds, y),
        FactorizedLogisticRegression(strategy="materialized").fit(ds, labels),
        FactorizedKMeans(3, strategy="materialized", random_state=0).fit(ds),
    ]


def test_not_taken_without_cuml_or_gpu(monkeypatch):
    if _cuml.cuml_available():
        pytest.skip("cuML and a GPU are usable here")
    calls = []
    monkeypatch.setattr(_cuml, "fit_cuml", lambda *a, **k: calls.append(a))
    ds, y = _data()
    lin, log, km = _fits(ds, y)
    assert isinstance(lin.coef_, np.ndarray) and isinstance(log.coef_, np.ndarray)
    assert isinstance(km.labels_, np.ndarray)
    assert calls == []
    assert "cuml" not in sys.modules


def test_cuml_available_never_imports(monkeypatch):
    find_spec = importlib.util.find_spec

    def fake_find_spec(name, *args):
        if name == "cuml":
            return importlib.machinery.ModuleSpec("cuml", None)
        return find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec)
    monkeypatch.setattr(_gpu, "probe_gpu", lambda: (False, "no GPU here"))
    assert not _cuml.cuml_available()
    monkeypatch.setattr(_gpu, "probe_gpu", lambda: (True, "fake GPU"))
    assert _cuml.cuml_available()
    assert "cuml" not in sys.modules


# ------------------------------------------------------------- a fake cuML
class _Recorder:
    calls: list = []

    def __init__(self, **params):
        self.params = params
        _Recorder.calls.append((type(self).__name__, params))


class _LinearRegression(_Recorder):
    def fit(self, X, y, sample_weight=None):
        assert self.params["algorithm"] == "eig"
        m = sklearn.linear_model.LinearRegression(
            fit_intercept=self.params["fit_intercept"]
        ).fit(X, y, sample_weight=sample_weight)
        self.coef_, self.intercept_ = m.coef_, m.intercept_
        return self


class _LogisticRegression(_Recorder):
    def fit(self, X, y, sample_weight=None):
        p = self.params
        assert p["solver"] == "qn" and p["linesearch_max_iter"] == 50
        m = sklearn.linear_model.LogisticRegression(
            C=p["C"] if p["penalty"] == "l2" else np.inf,
            fit_intercept=p["fit_intercept"],
            max_iter=p["max_iter"],
            tol=p["tol"],
        ).fit(X, y, sample_weight=sample_weight)
        # cuML's coef_ and intercept_ shapes are scikit-learn's.
        self.coef_, self.intercept_, self.n_iter_ = m.coef_, m.intercept_, m.n_iter_
        return self


class _KMeans(_Recorder):
    def fit(self, X, sample_weight=None):
        p = dict(self.params)
        p.pop("output_type")
        assert isinstance(p["random_state"], int)
        if isinstance(p["init"], str) and p["init"] == "scalable-k-means++":
            p["init"] = "k-means++"
        m = sklearn.cluster.KMeans(**p).fit(X, sample_weight=sample_weight)
        self.cluster_centers_, self.inertia_ = m.cluster_centers_, m.inertia_
        self.labels_, self.n_iter_ = m.labels_.astype(np.int64), m.n_iter_
        return self


@pytest.fixture
def fake_cuml(monkeypatch):
    mod = types.ModuleType("cuml")
    mod.__spec__ = importlib.machinery.ModuleSpec("cuml", None)
    mod.LinearRegression = _LinearRegression
    mod.LogisticRegression = _LogisticRegression
    mod.KMeans = _KMeans
    monkeypatch.setitem(sys.modules, "cuml", mod)
    monkeypatch.setattr(_gpu, "probe_gpu", lambda: (True, "fake GPU"))
    monkeypatch.setattr(_cuml, "_on_gpu", lambda op: True)
    _Recorder.calls = []
    return _Recorder.calls


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("multi", [False, True])
def test_linear_regression_mapping(fake_cuml, fit_intercept, multi):
    ds, y = _data(1)
    if multi:
        y = np.column_stack([y, 2.0 * y + 1.0])
    sw = np.random.default_rng(0).random(len(ds)) + 0.5
    est = FactorizedLinearRegression(
        strategy="materialized", fit_intercept=fit_intercept
    ).fit(ds, y, sample_weight=sw)
    ref = FactorizedLinearRegression(fit_intercept=fit_intercept).fit(
        ds, y, sample_weight=sw
    )
    assert len(fake_cuml) == (2 if multi else 1)
    assert fake_cuml[0][1]["fit_intercept"] is fit_intercept
    assert est.coef_.shape == ref.coef_.shape and est.coef_.dtype == ds.dtype
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)
    assert est.n_iter_ == 1
    np.testing.assert_allclose(est.predict(ds), ref.predict(ds), rtol=1e-8)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("penalty", ["l2", None])
def test_logistic_regression_mapping(fake_cuml, n_classes, penalty):
    ds, y = _data(2)
    labels = np.digitize(y, np.quantile(y, np.linspace(0, 1, n_classes + 1)[1:-1]))
    labels = np.asarray(["a", "b", "c"])[labels]
    params = dict(penalty=penalty, C=0.5, max_iter=200, tol=1e-8)
    est = FactorizedLogisticRegression(strategy="materialized", **params).fit(
        ds, labels
    )
    ref = FactorizedLogisticRegression(**params).fit(ds, labels)
    ((name, cuml_params),) = fake_cuml
    assert name == "_LogisticRegression"
    assert cuml_params["penalty"] == penalty and cuml_params["C"] == 0.5
    assert cuml_params["max_iter"] == 200 and cuml_params["tol"] == 1e-8
    np.testing.assert_array_equal(est.classes_, ref.classes_)
    assert est.coef_.shape == ref.coef_.shape and est.coef_.dtype == ds.dtype
    assert est.intercept_.shape == ref.intercept_.shape
    assert est.n_iter_.shape == (1,)
    np.testing.assert_allclose(
        est.predict_proba(ds), ref.predict_proba(ds), rtol=1e-4, atol=1e-5
    )


def test_kmeans_mapping(fake_cuml):
    ds, _ = _data(3)
    init = ds.materialize()[[0, 20, 40]]
    est = FactorizedKMeans(3, init=init, strategy="materialized").fit(ds)
    ref = FactorizedKMeans(3, init=init).fit(ds)
    ((_, p),) = fake_cuml
    assert p["n_clusters"] == 3 and p["n_init"] == 1 and p["max_iter"] == 300
    assert est.labels_.dtype == np.int32
    np.testing.assert_array_equal(est.labels_, ref.labels_)
    np.testing.assert_allclose(est.cluster_centers_, ref.cluster_centers_, rtol=1e-8)
    assert est.inertia_ == pytest.approx(ref.inertia_, rel=1e-8)
    np.testing.assert_array_equal(est.predict(ds), ref.predict(ds))
    assert est.get_feature_names_out().shape == (3,)
    FactorizedKMeans(3, strategy="materialized", random_state=0).fit(ds)
    assert fake_cuml[-1][1]["init"] == "scalable-k-means++"


def test_other_plans_keep_the_project_kernels(fake_cuml):
    ds, y = _data(4)
    FactorizedLinearRegression().fit(ds, y)  # factorized
    FactorizedLinearRegression(strategy="materialized", solver="gd").fit(ds, y)
    FactorizedLogisticRegression(strategy="materialized", solver="gd").fit(ds, y > 0)
    FactorizedKMeans(2, random_state=0).fit(ds)
    nn = random_dataset(4, n_rows=60, nonneg=True)
    FactorizedGNMF(2, strategy="materialized", max_iter=20).fit(nn)
    sparse = random_dataset(4, scenario="sparse", n_rows=60)
    FactorizedKMeans(2, strategy="materialized", random_state=0).fit(sparse)
    assert fake_cuml == []
