"""GPU (CuPy) against CPU for the operators and the device-ready estimators.

Runs only where CuPy and a usable NVIDIA GPU exist; elsewhere every test skips with
the probe's reason. cuSPARSE products and atomic scatter-adds are not
bit-reproducible: operators compare at the "device" tolerance of the table in
``_helpers.py``, fits at the tolerance of their kind.
"""

import numpy as np
import pytest
from _helpers import assert_close, gpu_marks, tolerance

from ilargi_sklearn._backend._namespace import asarray_on, get_namespace, to_numpy
from ilargi_sklearn.linear_model import FactorizedLinearRegression
from ilargi_sklearn.multisource import AffineOperator
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

pytestmark = gpu_marks()


def _check(expected, got, dtype, what):
    assert type(got).__module__.startswith("cupy"), what
    scale = max(1.0, float(np.max(np.abs(expected))) if np.size(expected) else 1.0)
    assert_close(got, expected, dtype=dtype, kind="device", scale=scale, err_msg=what)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_operators_gpu_vs_cpu(scenario):
    ds = random_dataset(11, scenario=scenario, n_rows=200)
    dg = ds.to_device("gpu")
    assert ds.to_device("gpu") is dg
    op, og = ds.operator, dg.operator
    xp = og.xp
    dt = ds.dtype
    rng = np.random.default_rng(0)
    X = rng.standard_normal((ds.shape[1], 3))
    Y = rng.standard_normal((len(ds), 2))
    w = rng.random(len(ds))
    Xg, Yg, wg = (asarray_on(a, xp) for a in (X, Y, w))
    _check(op.matmul(X), og.matmul(Xg), dt, "matmul")
    _check(op.rmatmul(Y), og.rmatmul(Yg), dt, "rmatmul")
    _check(op.gram(w, format="dense"), og.gram(wg, format="dense"), dt, "gram")
    _check(op.col_sums(w), og.col_sums(wg), dt, "col_sums")
    _check(op.col_sq_sums(w), og.col_sq_sums(wg), dt, "col_sq_sums")
    _check(op.row_sq_norms(), og.row_sq_norms(), dt, "row_sq_norms")
    _check(op.materialize("dense"), og.materialize("dense"), dt, "materialize")
    rows = rng.permutation(len(ds))[:50]
    _check(
        ds[rows].operator.matmul(X),
        ds[rows].to_device("gpu").operator.matmul(Xg),
        dt,
        "fold matmul",
    )
    a = AffineOperator(
        op, rng.random(ds.shape[1]) + 0.5, rng.standard_normal(ds.shape[1])
    )
    ag = a.to_namespace(xp)
    _check(a.gram(w, format="dense"), ag.gram(wg, format="dense"), dt, "affine gram")
    _check(a.rmatmul(Y), ag.rmatmul(Yg), dt, "affine rmatmul")


@pytest.mark.parametrize("scenario", ["star", "left", "snowflake", "float32"])
def test_linear_regression_gpu_vs_cpu(scenario):
    ds = random_dataset(5, scenario=scenario, n_rows=300)
    y = ds.operator.matmul(np.arange(ds.shape[1], dtype=np.float64)) + 1.0
    ref = FactorizedLinearRegression().fit(ds, y)
    est = FactorizedLinearRegression(device="gpu").fit(ds, y)
    assert get_namespace(est.coef_).__name__.endswith("cupy")
    tol = tolerance(ds.dtype, "fit")
    np.testing.assert_allclose(to_numpy(est.coef_), ref.coef_, rtol=tol, atol=tol)
    pred = est.predict(ds)  # host data: NumPy predictions
    assert isinstance(pred, np.ndarray)
    np.testing.assert_allclose(pred, ref.predict(ds), rtol=tol, atol=tol)


def _is_cupy(a):
    return type(a).__module__.startswith("cupy")


@pytest.mark.parametrize("scenario", ["star", "left", "snowflake", "float32"])
def test_scaler_gpu_vs_cpu(scenario):
    from ilargi_sklearn.preprocessing import FactorizedStandardScaler

    ds = random_dataset(6, scenario=scenario, n_rows=300)
    ref = FactorizedStandardScaler().fit(ds)
    est = FactorizedStandardScaler(device="gpu").fit(ds)
    for name in ("mean_", "var_", "scale_"):
        _check(getattr(ref, name), getattr(est, name), ds.dtype, name)
    A = ds.materialize()
    out = est.transform(A)  # host array: NumPy back
    assert isinstance(out, np.ndarray)
    assert_close(out, ref.transform(A), dtype=ds.dtype, kind="device")
    Ag = asarray_on(A, get_namespace(est.scale_))
    _check(ref.transform(A), est.transform(Ag), ds.dtype, "transform gpu array")


@pytest.mark.parametrize("scenario", ["star", "left", "snowflake", "float32"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_logistic_regression_gpu_vs_cpu(scenario, n_classes):
    from ilargi_sklearn.linear_model import FactorizedLogisticRegression

    ds = random_dataset(8, scenario=scenario, n_rows=300)
    rng = np.random.default_rng(0)
    scores = ds.operator.matmul(
        rng.standard_normal((ds.shape[1], n_classes)).astype(ds.dtype)
    )
    y = np.argmax(scores + rng.standard_normal(scores.shape), axis=1)
    ref = FactorizedLogisticRegression(max_iter=200).fit(ds, y)
    est = FactorizedLogisticRegression(max_iter=200, device="gpu").fit(ds, y)
    assert _is_cupy(est.coef_)
    tol = tolerance(ds.dtype, "iterative")
    np.testing.assert_allclose(to_numpy(est.coef_), ref.coef_, rtol=tol, atol=tol)
    dg = ds.to_device("gpu")
    proba = est.predict_proba(dg)
    assert _is_cupy(proba)
    np.testing.assert_allclose(
        to_numpy(proba), ref.predict_proba(ds), rtol=tol, atol=tol
    )
    np.testing.assert_array_equal(est.predict(ds), ref.predict(ds))


@pytest.mark.parametrize("scenario", ["star", "left", "snowflake", "float32"])
def test_kmeans_gpu_vs_cpu(scenario):
    from ilargi_sklearn.cluster import FactorizedKMeans

    ds = random_dataset(9, scenario=scenario, n_rows=300)
    ref = FactorizedKMeans(n_clusters=5, random_state=0).fit(ds)
    est = FactorizedKMeans(n_clusters=5, random_state=0, device="gpu").fit(ds)
    assert _is_cupy(est.cluster_centers_) and _is_cupy(est.labels_)
    np.testing.assert_array_equal(to_numpy(est.labels_), ref.labels_)
    tol = tolerance(ds.dtype, "device_fit")
    np.testing.assert_allclose(
        to_numpy(est.cluster_centers_), ref.cluster_centers_, rtol=tol, atol=tol
    )
    assert est.inertia_ == pytest.approx(ref.inertia_, rel=tol)
    pred = est.predict(ds)
    assert isinstance(pred, np.ndarray)
    np.testing.assert_array_equal(pred, ref.predict(ds))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("scenario", ["star", "left", "snowflake", "sparse", "float32"])
@pytest.mark.parametrize("init", ["random", "nndsvda"])
def test_gnmf_gpu_vs_cpu(scenario, init):
    from ilargi_sklearn.decomposition import FactorizedGNMF

    ds = random_dataset(10, scenario=scenario, n_rows=300, nonneg=True)
    params = dict(n_components=3, init=init, random_state=0, max_iter=50)
    ref = FactorizedGNMF(**params)
    W_ref = ref.fit_transform(ds)
    est = FactorizedGNMF(device="gpu", **params)
    W = est.fit_transform(ds)  # host data: W comes back as NumPy
    assert isinstance(W, np.ndarray)
    assert _is_cupy(est.components_)
    # 50 multiplicative updates amplify the cuSPARSE / atomic rounding a little.
    tol = tolerance(ds.dtype, "device_fit")
    scale = float(np.max(W_ref))
    np.testing.assert_allclose(W, W_ref, rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(
        to_numpy(est.components_),
        ref.components_,
        rtol=tol,
        atol=tol * float(np.max(ref.components_)),
    )
    assert est.reconstruction_err_ == pytest.approx(ref.reconstruction_err_, rel=tol)
    dg = ds.to_device("gpu")
    out = est.transform(dg)
    assert _is_cupy(out)
    np.testing.assert_allclose(
        to_numpy(out), ref.transform(ds), rtol=tol, atol=tol * scale
    )
