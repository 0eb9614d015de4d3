"""Pure helpers of the test suite: the tolerance table, ``assert_close``, ``dense``,
``assert_same_linear_model``,
the array namespaces the device tests run on, and small supervised datasets.

Test modules import them as ``from _helpers import ...`` (pytest puts ``tests/`` on
``sys.path``); the fixtures built on them live in ``conftest.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from ilargi_sklearn._backend._gpu import probe_gpu
from ilargi_sklearn._backend._namespace import to_numpy
from ilargi_sklearn.utils._testing import random_dataset

_F64, _F32 = np.dtype(np.float64), np.dtype(np.float32)

# Relative tolerance per kind of comparison and dtype. The float64 column is a few
# hundred ulps of the sums involved; the kinds differ in how much rounding the two
# compared paths accumulate, which the float32 column shows most.
TOLERANCES: dict[str, dict[np.dtype, float]] = {
    # The same products and sums in another order: factorized vs materialized
    # operators (per unit of the magnitude bound, see ``assert_close``), row maps,
    # segment sums and sparse products against dense references.
    "operator": {_F64: 1e-10, _F32: 1e-4},
    # The same kernels on another namespace or device (array_api_strict's
    # standard-only fallbacks, CuPy): only the reduction order differs.
    "device": {_F64: 1e-10, _F32: 1e-5},
    # Loops that reorder whole passes over the data: compiled (numba) kernels
    # against NumPy, the scaler's weighted moments against scikit-learn.
    "compiled": {_F64: 1e-9, _F32: 2e-4},
    # Two fits through different paths (K-Means against scikit-learn, an estimator
    # on another namespace or device): each iteration carries the last's rounding.
    "fit": {_F64: 1e-8, _F32: 1e-4},
    # Whole fits on another device in float32, where reductions in another order
    # move the iterates (linear regression, K-Means and GNMF on a device).
    "device_fit": {_F64: 1e-8, _F32: 1e-3},
    # Linear and logistic regression against scikit-learn at the optimum.
    "solver": {_F64: 1e-7, _F32: 1e-4},
    # Iterative fits stopped by a tolerance, compared across paths: GNMF's
    # multiplicative updates, L-BFGS on another device.
    "iterative": {_F64: 1e-6, _F32: 1e-3},
}


def tolerance(dtype: Any, kind: str = "operator") -> float:
    """The table's tolerance of ``kind`` comparisons in ``dtype``."""
    return TOLERANCES[kind][np.dtype(dtype)]


def dense(x: Any) -> np.ndarray:
    """``x`` as a dense NumPy array: a dataset is materialized, a sparse matrix
    densified, an array of another namespace copied to the host."""
    if hasattr(x, "materialize"):
        x = x.materialize("dense")
    if sp.issparse(x):
        return x.toarray()
    return np.asarray(to_numpy(x))


def assert_close(
    actual: Any,
    expected: Any,
    *,
    dtype: Any = None,
    kind: str = "operator",
    bound: Any = None,
    scale: float = 1.0,
    err_msg: str = "",
) -> None:
    """``|actual - expected| <= tol * (|bound| + scale)`` element-wise.

    ``tol`` is ``tolerance(dtype, kind)``; ``dtype`` defaults to the dtype of
    ``actual`` (float64 unless it is float32). Without ``bound`` this is
    ``np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)``;
    with it, ``bound`` is the same operation applied to absolute values
    (``|T| @ |w|`` for ``T @ w``), which bounds the rounding error of any summation
    order, and shapes must match. Arrays of any namespace are compared on the host;
    two sparse matrices are compared on their stored entries.
    """
    if dtype is None:
        dt = getattr(actual, "dtype", None)
        dtype = np.float32 if dt is not None and np.dtype(dt) == _F32 else np.float64
    tol = tolerance(dtype, kind)
    actual, expected = to_numpy(actual), to_numpy(expected)
    if bound is None:
        if sp.issparse(actual) or sp.issparse(expected):
            actual, expected = dense(actual), dense(expected)
        np.testing.assert_allclose(
            actual, expected, rtol=tol, atol=tol * scale, err_msg=err_msg
        )
        return
    assert actual.shape == expected.shape, (
        f"{err_msg}: shape {actual.shape} != {expected.shape}"
    )
    if sp.issparse(actual) and sp.issparse(expected):
        # Stored entries only (a dense copy of a large gram would not fit).
        err = abs(sp.csr_matrix(actual, dtype=np.float64) - expected)
        excess = (err - tol * abs(sp.csr_matrix(bound, dtype=np.float64))).tocoo()
        bad = ~(excess.data <= tol * scale)
        assert not bad.any(), (
            f"{err_msg}: {int(bad.sum())} entries differ, max error {err.max():.3g}"
        )
        return
    actual, expected, bound = dense(actual), dense(expected), dense(bound)
    err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    limit = tol * (np.abs(bound.astype(np.float64)) + scale)
    bad = ~(err <= limit)
    assert not bad.any(), (
        f"{err_msg}: {int(bad.sum())} entries differ, max error "
        f"{float(np.nanmax(err)):.3g} (tolerance {float(limit.max()):.3g})"
    )


def assert_same_linear_model(
    est: Any,
    ref: Any,
    X: Any = None,
    X_ref: Any = None,
    *,
    dtype: Any = None,
    kind: str = "solver",
    y: Any = None,
    sample_weight: Any = None,
    err_msg: str = "",
) -> None:
    """Two fitted linear models agree within the table's ``kind`` tolerance.

    ``coef_`` and ``intercept_`` (same shapes) relative to the reference's largest
    coefficient, at least 1: the rounding of a solve carries the scale of the
    solution, not of each entry. With ``X``, ``est.predict(X)`` and
    ``ref.predict(X_ref)`` (``X_ref`` defaults to ``X``) relative to the largest
    prediction; with ``y`` also, the two scores.
    """
    assert np.shape(est.coef_) == np.shape(ref.coef_), err_msg
    assert np.shape(est.intercept_) == np.shape(ref.intercept_), err_msg
    scale = float(np.max(np.abs(to_numpy(ref.coef_)), initial=1.0))
    for name in ("coef_", "intercept_"):
        assert_close(
            getattr(est, name),
            getattr(ref, name),
            dtype=dtype,
            kind=kind,
            scale=scale,
            err_msg=f"{err_msg} {name}",
        )
    if X is None:
        return
    X_ref = X if X_ref is None else X_ref
    pred = to_numpy(ref.predict(X_ref))
    assert_close(
        est.predict(X),
        pred,
        dtype=dtype,
        kind=kind,
        scale=float(np.max(np.abs(pred), initial=0.0)),
        err_msg=f"{err_msg} predict",
    )
    if y is not None:
        assert_close(
            est.score(X, y, sample_weight=sample_weight),
            ref.score(X_ref, y, sample_weight=sample_weight),
            dtype=dtype,
            kind=kind,
            err_msg=f"{err_msg} score",
        )


# ----------------------------------------------------------------- namespaces
def strict_namespace() -> tuple[Any, Any]:
    """``array_api_strict`` and the non-default device the device tests run on;
    skips the calling module where it is not installed.

    It refuses silent conversion to NumPy, mixing devices and fancy indexing, as
    CuPy does, so it stands in for a GPU on machines without one.
    """
    xps = pytest.importorskip("array_api_strict")
    return xps, xps.Device("device1")


def gpu_marks() -> list[pytest.MarkDecorator]:
    """``pytestmark`` of a GPU module: the ``gpu`` marker, and a skip with the GPU
    probe's reason where no usable GPU exists."""
    usable, reason = probe_gpu()
    return [
        pytest.mark.gpu,
        pytest.mark.skipif(not usable, reason=f"no usable GPU: {reason}"),
    ]


# The array namespaces the namespace-parametrized tests run on.
NAMESPACES = ("numpy", "array_api_strict", "cupy")


def namespace_and_device(name: str) -> tuple[Any, Any]:
    """``(xp, device)`` of namespace ``name``, as ``MultiSourceDataset.to_device``
    takes them; skips where it cannot run here."""
    if name == "numpy":
        return np, "cpu"
    if name == "array_api_strict":
        return strict_namespace()
    usable, reason = probe_gpu()
    if not usable:
        pytest.skip(f"no usable GPU: {reason}")
    import cupy

    return cupy, "gpu"  # the name the package's ``device`` parameters take


# ------------------------------------------------------------------- data
def regression_data(seed=0, scenario="left", n_rows=90):
    """A random dataset and a linear target of it with a little noise."""
    ds = random_dataset(seed, n_rows=n_rows, scenario=scenario)
    rng = np.random.default_rng(seed)
    T = ds.materialize("dense")
    y = T @ rng.standard_normal(ds.shape[1]) + 0.1 * rng.standard_normal(len(ds))
    return ds, y


def glm_target(ds, seed=0, family="poisson"):
    """A target of a log-linear model of ``ds``: Poisson counts
    (``family="poisson"``, zeros included) or Gamma draws (``"gamma"``, positive)
    around the mean ``exp(0.5 + T beta)``, ``T beta`` scaled to a spread of 0.5."""
    rng = np.random.default_rng(seed)
    T = ds.materialize("dense").astype(np.float64)
    eta = T @ rng.standard_normal(ds.shape[1])
    mean = np.exp(0.5 + 0.5 * eta / max(float(np.std(eta)), 1e-12))
    if family == "poisson":
        return rng.poisson(mean).astype(np.float64)
    if family == "gamma":
        return rng.gamma(2.0, mean / 2.0)
    raise ValueError(f"family must be 'poisson' or 'gamma', got {family!r}.")


def glm_data(seed=0, scenario="left", n_rows=90, family="poisson"):
    """A random dataset and a :func:`glm_target` of it."""
    ds = random_dataset(seed, n_rows=n_rows, scenario=scenario)
    return ds, glm_target(ds, seed, family)


def classification_data(seed=0, scenario="left", n_rows=120, n_classes=2):
    """A random dataset and ``n_classes`` balanced labels: quantiles of a linear
    target."""
    ds, y = regression_data(seed, scenario, n_rows)
    edges = np.quantile(y, np.linspace(0, 1, n_classes + 1)[1:-1])
    return ds, np.digitize(y, edges)


def plant_compile_failure(monkeypatch, kernel=None):
    """numba importable, but kernel ``kernel`` (every kernel when None) fails to
    compile at its first call (the launcher then disables compiled code)."""
    import numba

    from ilargi_sklearn._backend import _launcher

    def broken(*args):
        raise numba.core.errors.TypingError("planted compile failure")

    monkeypatch.setitem(_launcher._state, "numba", _launcher._import_numba())
    original = _launcher._kernel
    monkeypatch.setattr(
        _launcher,
        "_kernel",
        lambda name: broken if kernel in (None, name) else original(name),
    )
