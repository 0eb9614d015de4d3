"""Estimators on array_api_strict arrays on a non-default device equal NumPy.

``array_api_strict`` refuses silent conversion to NumPy and mixing devices, as CuPy
does, so these tests stand in for a GPU: fitted attributes must stay on the device
the fit ran on, predictions come back in the caller's namespace, pickles hold NumPy.
"""

import pickle

import numpy as np
import pytest
from _helpers import assert_close, strict_namespace, tolerance

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    to_numpy,
)
from ilargi_sklearn.linear_model import (
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
)
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import random_dataset

xps, DEV = strict_namespace()
DENSE = ["star", "left", "snowflake", "float32"]
pytestmark = [
    pytest.mark.filterwarnings("ignore:X does not have valid feature names"),
    pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning"),
]


def _on_dev(a):
    return get_namespace(a) is xps and device_of(a) == DEV


@pytest.mark.parametrize("scenario", DENSE)
@pytest.mark.parametrize("weighted", [False, True])
def test_scaler_on_strict_device(scenario, weighted):
    ds = random_dataset(3, scenario=scenario, n_rows=60)
    rng = np.random.default_rng(0)
    sw = rng.random(len(ds)) + 0.5 if weighted else None
    ref = FactorizedStandardScaler().fit(ds, sample_weight=sw)
    dd = ds.to_device(DEV, namespace=xps)
    swd = None if sw is None else asarray_on(sw, xps, DEV)
    est = FactorizedStandardScaler().fit(dd, sample_weight=swd)
    within = dict(dtype=ds.dtype, kind="fit")
    for name in ("mean_", "var_", "scale_"):
        assert _on_dev(getattr(est, name)), name
        assert_close(getattr(est, name), getattr(ref, name), **within)
    # A dataset stays where it is, with the scaling implicit in its operator.
    Z = est.transform(dd)
    assert Z.device == DEV
    w = rng.standard_normal(ds.shape[1])
    out = Z.operator.matmul(asarray_on(w, xps, DEV, ds.dtype))
    assert _on_dev(out)
    assert_close(out, ref.transform(ds).operator.matmul(w.astype(ds.dtype)), **within)
    # Arrays: scaled on the device, returned in the caller's namespace.
    A = ds.materialize()
    Ad = asarray_on(A, xps, DEV)
    At = est.transform(Ad)
    assert _on_dev(At)
    assert_close(At, ref.transform(A), **within)
    assert_close(est.inverse_transform(At), A, **within)
    assert isinstance(est.transform(A), np.ndarray)
    loaded = pickle.loads(pickle.dumps(est))
    assert isinstance(loaded.scale_, np.ndarray)
    assert_close(loaded.transform(A), ref.transform(A), **within)


@pytest.mark.parametrize("scenario", DENSE)
@pytest.mark.parametrize("multi", [False, True])
def test_linear_regression_target_on_strict_device(scenario, multi):
    # A target already on the device is validated there (no host round trip)
    # and gives the model of the host target.
    ds = random_dataset(4, scenario=scenario, n_rows=80)
    rng = np.random.default_rng(1)
    y = rng.standard_normal((len(ds), 2) if multi else len(ds))
    ref = FactorizedLinearRegression().fit(ds, y)
    dd = ds.to_device(DEV, namespace=xps)
    est = FactorizedLinearRegression().fit(dd, asarray_on(y, xps, DEV))
    assert _on_dev(est.coef_)
    assert est.coef_.shape == ref.coef_.shape
    within = dict(dtype=ds.dtype, kind="device_fit")
    assert_close(est.coef_, ref.coef_, **within)
    assert_close(est.intercept_, ref.intercept_, **within)
    # Integer targets are cast on the device.
    yi = np.arange(len(ds)) % 5
    assert_close(
        FactorizedLinearRegression().fit(dd, asarray_on(yi, xps, DEV)).coef_,
        FactorizedLinearRegression().fit(ds, yi).coef_,
        **within,
    )


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda y: np.where(np.arange(len(y)) == 3, np.nan, y), "NaN or infinity"),
        (lambda y: y[:-1], "samples but y has"),
        (lambda y: y.reshape(-1, 1, 1), "1d or 2d"),
    ],
)
def test_linear_regression_bad_target_on_strict_device(bad, match):
    dd = random_dataset(4, scenario="star", n_rows=40).to_device(DEV, namespace=xps)
    y = bad(np.linspace(0.0, 1.0, len(dd)))
    yd = asarray_on(y, xps, DEV)
    with pytest.raises(ValueError, match=match):
        FactorizedLinearRegression().fit(dd, yd)


@pytest.mark.parametrize("scenario", DENSE)
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("solver", ["lbfgs", "gd"])
def test_logistic_regression_on_strict_device(scenario, n_classes, solver):
    ds = random_dataset(5, scenario=scenario, n_rows=80)
    rng = np.random.default_rng(1)
    scores = ds.operator.matmul(
        rng.standard_normal((ds.shape[1], n_classes)).astype(ds.dtype)
    )
    y = np.argmax(scores + rng.standard_normal(scores.shape), axis=1) * 2 + 1
    sw = rng.random(len(ds)) + 0.5
    params = dict(solver=solver, max_iter=30, C=2.0)
    ref = FactorizedLogisticRegression(**params).fit(ds, y, sample_weight=sw)
    dd = ds.to_device(DEV, namespace=xps)
    est = FactorizedLogisticRegression(**params).fit(
        dd, asarray_on(y, xps, DEV), sample_weight=asarray_on(sw, xps, DEV)
    )
    within = dict(dtype=ds.dtype, kind="iterative")
    assert _on_dev(est.coef_) and _on_dev(est.intercept_)
    assert isinstance(est.classes_, np.ndarray)
    assert_close(est.coef_, ref.coef_, **within)
    assert_close(est.intercept_, ref.intercept_, **within)
    for method in ("decision_function", "predict_proba", "predict_log_proba"):
        out = getattr(est, method)(dd)
        assert _on_dev(out), method
        assert_close(out, getattr(ref, method)(ds), **within)
        assert isinstance(getattr(est, method)(ds), np.ndarray)
    pred = est.predict(dd)
    assert _on_dev(pred)
    np.testing.assert_array_equal(to_numpy(pred), ref.predict(ds))
    loaded = pickle.loads(pickle.dumps(est))
    assert isinstance(loaded.coef_, np.ndarray)
    np.testing.assert_array_equal(loaded.predict(ds), ref.predict(ds))
    est.set_params(device="cpu")
    pred_cpu = est.predict(dd)
    assert _on_dev(pred_cpu)


def test_logistic_string_labels_on_strict_arrays():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((60, 3))
    y = np.where(X[:, 0] - X[:, 2] > 0, "yes", "no")
    ref = FactorizedLogisticRegression().fit(X, y)
    est = FactorizedLogisticRegression().fit(asarray_on(X, xps, DEV), y)
    assert_close(est.coef_, ref.coef_, dtype=np.float64, kind="iterative")
    # Labels without an array type come back as NumPy.
    np.testing.assert_array_equal(est.predict(asarray_on(X, xps, DEV)), ref.predict(X))


@pytest.mark.parametrize("scenario", DENSE)
@pytest.mark.parametrize("init", ["k-means++", "random", "array"])
def test_kmeans_on_strict_device(scenario, init):
    from ilargi_sklearn.cluster import FactorizedKMeans

    ds = random_dataset(11, scenario=scenario, n_rows=90)
    rng = np.random.default_rng(4)
    sw = rng.random(len(ds)) + 0.5
    if init == "array":
        init = ds.materialize()[[0, 10, 20, 30]] + 0.01
    params = dict(n_clusters=4, init=init, random_state=0, max_iter=50)
    ref = FactorizedKMeans(**params).fit(ds, sample_weight=sw)
    dd = ds.to_device(DEV, namespace=xps)
    est = FactorizedKMeans(**params).fit(dd, sample_weight=asarray_on(sw, xps, DEV))
    within = dict(dtype=ds.dtype, kind="device_fit")
    assert _on_dev(est.cluster_centers_) and _on_dev(est.labels_)
    np.testing.assert_array_equal(to_numpy(est.labels_), ref.labels_)
    assert_close(est.cluster_centers_, ref.cluster_centers_, **within)
    assert est.inertia_ == pytest.approx(ref.inertia_, rel=tolerance(**within))
    assert est.n_iter_ == ref.n_iter_
    pred = est.predict(dd)
    assert _on_dev(pred)
    np.testing.assert_array_equal(to_numpy(pred), ref.predict(ds))
    dist = est.transform(dd)
    assert _on_dev(dist)
    assert_close(dist, ref.transform(ds), **within)
    assert est.score(dd) == pytest.approx(ref.score(ds), rel=tolerance(**within))
    assert isinstance(est.predict(ds), np.ndarray)
    loaded = pickle.loads(pickle.dumps(est))
    assert isinstance(loaded.cluster_centers_, np.ndarray)
    assert isinstance(loaded.labels_, np.ndarray)
    np.testing.assert_array_equal(loaded.predict(ds), ref.predict(ds))


@pytest.mark.parametrize("name", ["scaler", "logistic", "kmeans"])
def test_gpu_request_without_gpu_carries_probe_reason(name, no_gpu):
    from ilargi_sklearn.cluster import FactorizedKMeans

    make = {
        "scaler": FactorizedStandardScaler,
        "logistic": FactorizedLogisticRegression,
        "kmeans": FactorizedKMeans,
    }[name]
    ds = random_dataset(0)
    y = np.arange(len(ds)) % 2
    with pytest.raises(RuntimeError) as info:
        make(device="gpu").fit(ds, y)
    assert no_gpu in str(info.value)
    with pytest.raises(ValueError, match="device"):
        make(device="tpu").fit(ds, y)


@pytest.mark.filterwarnings("ignore:The multiplicative update solver")
@pytest.mark.parametrize("scenario", DENSE)
@pytest.mark.parametrize("init", ["random", "nndsvd", "nndsvda", "nndsvdar"])
def test_gnmf_on_strict_device(scenario, init):
    from ilargi_sklearn.decomposition import FactorizedGNMF

    ds = random_dataset(3, scenario=scenario, n_rows=60, nonneg=True)
    params = dict(n_components=3, init=init, random_state=0, max_iter=60)
    ref = FactorizedGNMF(**params)
    W_ref = ref.fit_transform(ds)
    dd = ds.to_device(DEV, namespace=xps)
    est = FactorizedGNMF(**params)
    W = est.fit_transform(dd)
    # QR instead of LU in the device SVD, and pairwise sums: rounding only.
    within = dict(dtype=ds.dtype, kind="operator")
    assert _on_dev(W) and _on_dev(est.components_)
    assert est.n_iter_ == ref.n_iter_
    assert_close(W, W_ref, **within)
    assert_close(est.components_, ref.components_, **within)
    assert est.reconstruction_err_ == pytest.approx(
        ref.reconstruction_err_, rel=tolerance(**within)
    )
    out = est.transform(dd)
    assert _on_dev(out)
    assert_close(out, ref.transform(ds), **within)
    assert isinstance(est.transform(ds), np.ndarray)
    back = est.inverse_transform(W)
    assert _on_dev(back)
    assert_close(back, ref.inverse_transform(W_ref), **within)
    loaded = pickle.loads(pickle.dumps(est))
    assert isinstance(loaded.components_, np.ndarray)
    assert_close(loaded.transform(ds), ref.transform(ds), **within)


def test_gnmf_custom_init_arrays_and_device_cpu_on_strict():
    from ilargi_sklearn.decomposition import FactorizedGNMF

    ds = random_dataset(4, scenario="star", n_rows=50, nonneg=True)
    A = ds.materialize()
    rng = np.random.default_rng(5)
    W0 = rng.random((A.shape[0], 2))
    H0 = rng.random((2, A.shape[1]))
    params = dict(n_components=2, init="custom", max_iter=40, tol=0)
    ref = FactorizedGNMF(**params)
    W_ref = ref.fit_transform(A, W=W0, H=H0)
    Ad = asarray_on(A, xps, DEV)
    W0d, H0d = asarray_on(W0, xps, DEV), asarray_on(H0, xps, DEV)
    est = FactorizedGNMF(**params)
    W = est.fit_transform(Ad, W=W0d, H=H0d)
    assert _on_dev(W) and _on_dev(est.components_)
    assert_close(W, W_ref, dtype=np.float64)
    assert_close(est.components_, ref.components_, dtype=np.float64)
    # The caller's initial factors are not modified.
    np.testing.assert_array_equal(to_numpy(W0d), W0)
    # device="cpu": the fit runs on NumPy, W comes back on the caller's device.
    cpu = FactorizedGNMF(device="cpu", **params)
    Wc = cpu.fit_transform(Ad, W=W0d, H=H0d)
    assert _on_dev(Wc) and isinstance(cpu.components_, np.ndarray)
    assert_close(Wc, W_ref, dtype=np.float64)


def test_gnmf_gpu_request_without_gpu_carries_probe_reason(no_gpu):
    from ilargi_sklearn.decomposition import FactorizedGNMF

    ds = random_dataset(0, nonneg=True)
    with pytest.raises(RuntimeError) as info:
        FactorizedGNMF(2, device="gpu").fit(ds)
    assert no_gpu in str(info.value)
    with pytest.raises(ValueError, match="device"):
        FactorizedGNMF(2, device="tpu").fit(ds)


def test_logistic_float_labels_and_bad_labels_on_strict_device():
    # Integral float labels on the device are encoded there, like on the host;
    # continuous or non-finite ones get scikit-learn's errors.
    ds = random_dataset(6, scenario="star", n_rows=60)
    dd = ds.to_device(DEV, namespace=xps)
    y = (np.arange(len(ds)) % 3).astype(np.float64) - 1.0
    ref = FactorizedLogisticRegression(max_iter=50).fit(ds, y)
    est = FactorizedLogisticRegression(max_iter=50).fit(dd, asarray_on(y, xps, DEV))
    np.testing.assert_array_equal(est.classes_, ref.classes_)
    assert_close(est.coef_, ref.coef_, dtype=np.float64, kind="iterative")
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        FactorizedLogisticRegression().fit(dd, asarray_on(y + 0.5 * (y > 0), xps, DEV))
    with pytest.raises(ValueError, match="NaN or infinity"):
        FactorizedLogisticRegression().fit(
            dd, asarray_on(np.where(y > 0, np.nan, y), xps, DEV)
        )
    with pytest.raises(ValueError, match="only one class"):
        FactorizedLogisticRegression().fit(dd, asarray_on(np.zeros(len(ds)), xps, DEV))
