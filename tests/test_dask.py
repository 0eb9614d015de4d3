"""The Dask-backed operator and dataset against the in-memory factorized ones."""

import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason="the [dask] extra is not installed")
distributed = pytest.importorskip(
    "dask.distributed", reason="the [dask] extra (distributed) is not installed"
)

from ilargi_sklearn import MultiSourceDataset  # noqa: E402
from ilargi_sklearn.distributed import DaskFactorizedMatrix, dask_dataset  # noqa: E402

N_ROWS, CHUNK = 1000, 128  # 8 row chunks: more than one chunk per worker


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def _parts(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((N_ROWS, 3)).astype(dtype)
    S1 = rng.standard_normal((20, 4)).astype(dtype)
    S2 = rng.standard_normal((7, 2)).astype(dtype)
    idx1 = rng.integers(-1, 20, N_ROWS)  # left join: -1 are unmatched rows
    idx2 = rng.integers(0, 7, N_ROWS)
    return base, S1, S2, idx1, idx2


@pytest.fixture(scope="module")
def pair(client):
    base, S1, S2, idx1, idx2 = _parts()
    mem = MultiSourceDataset.from_matrices([base, S1, S2], [None, idx1, idx2])
    dds = dask_dataset(
        [da.from_array(base, chunks=(CHUNK, 3)), S1, S2],
        [None, da.from_array(idx1, chunks=CHUNK), idx2],
    )
    return mem, dds


def _close(a, b, dtype=np.float64):
    tol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def test_dataset_is_dask_backed(pair):
    mem, dds = pair
    op = dds.operator
    assert isinstance(op, DaskFactorizedMatrix)
    assert op.n_chunks == 8
    assert dds.shape == mem.shape
    assert list(dds.feature_names) == list(mem.feature_names)


@pytest.mark.parametrize("k", [None, 3])
def test_matmul_and_rmatmul(pair, k):
    mem, dds = pair
    rng = np.random.default_rng(1)
    W = rng.standard_normal(9 if k is None else (9, k))
    out = dds @ W
    assert isinstance(out, da.Array)
    assert out.chunks[0] == dds.operator.row_chunks
    _close(out.compute(), mem @ W)
    Y = rng.standard_normal(N_ROWS if k is None else (N_ROWS, k))
    ref = mem.T @ Y
    res = dds.T @ Y
    assert isinstance(res, np.ndarray)
    _close(res, ref)
    # A Dask operand with other chunks is rechunked to the fact table's rows.
    _close(dds.operator.rmatmul(da.from_array(Y, chunks=300)), ref)


@pytest.mark.parametrize("weighted", [False, True])
def test_gram_and_column_statistics(pair, weighted):
    mem, dds = pair
    w = np.random.default_rng(2).uniform(0.5, 2.0, N_ROWS) if weighted else None
    fm, op = mem.operator, dds.operator
    G = op.gram(w, format="dense")
    assert isinstance(G, np.ndarray) and G.shape == (9, 9)
    _close(G, fm.gram(w, format="dense"))
    wd = None if w is None else da.from_array(w, chunks=200)
    _close(op.col_sums(wd), fm.col_sums(w))
    _close(op.col_sq_sums(w), fm.col_sq_sums(w))
    with pytest.raises(TypeError, match="format='dense'"):
        op.gram(w, format="sparse")


def test_row_statistics_slicing_and_materialize(pair):
    mem, dds = pair
    fm, op = mem.operator, dds.operator
    cw = np.random.default_rng(3).uniform(size=9)
    _close(op.row_sq_norms().compute(), fm.row_sq_norms())
    _close(op.row_sq_norms(cw).compute(), fm.row_sq_norms(cw))
    _close(op.row_sums().compute(), fm.row_sums())
    _close(dds.row_norms(squared=False).compute(), mem.row_norms(squared=False))
    _close(float(dds.sum()), float(mem.sum()))
    rows = np.random.default_rng(4).permutation(N_ROWS)[:300]
    sub, ref = op.take_rows(rows), fm.take_rows(rows)
    assert sub.shape == (300, 9)
    _close(sub.gram(), ref.gram())
    _close(sub.matmul(cw).compute(), ref.matmul(cw))
    T = op.materialize()
    assert isinstance(T, da.Array)
    _close(T.compute(), mem.materialize())
    _close(op.to_in_memory().gram(), fm.gram())


def test_without_base_and_float32(client):
    base, S1, S2, idx1, idx2 = _parts(5, np.float32)
    mem = MultiSourceDataset.from_matrices([S1, S2], [idx1, idx2], dtype=np.float32)
    dds = dask_dataset([S1, S2], [idx1, idx2], dtype=np.float32, chunks=CHUNK)
    assert dds.operator.base is None and dds.dtype == np.float32
    Y = np.random.default_rng(6).standard_normal((N_ROWS, 2)).astype(np.float32)
    _close(dds.T @ Y, mem.T @ Y, np.float32)
    _close(dds.gram(), mem.gram(), np.float32)
    _close((dds @ np.ones(6, np.float32)).compute(), mem @ np.ones(6), np.float32)


def test_builder_errors(client):
    base, S1, _, idx1, _ = _parts()
    with pytest.raises(ValueError, match=r"\[-1, 19\]"):
        dask_dataset([base, S1], [None, np.where(idx1 < 0, 25, idx1)], chunks=CHUNK)
    with pytest.raises(ValueError, match="number of target rows"):
        dask_dataset([base, S1], [None, idx1[:10]], chunks=CHUNK)
    bad = base.copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        dask_dataset([bad, S1], [None, idx1], chunks=CHUNK)
    with pytest.raises(ValueError, match="at most one source"):
        dask_dataset([base, base], [None, None], chunks=CHUNK)


def test_linear_regression_normal_solver(pair):
    from ilargi_sklearn.linear_model import FactorizedLinearRegression

    mem, dds = pair
    rng = np.random.default_rng(7)
    y = (mem @ rng.standard_normal(9)) + 0.1 * rng.standard_normal(N_ROWS) + 2.0
    ref = FactorizedLinearRegression().fit(mem, y)
    got = FactorizedLinearRegression().fit(dds, da.from_array(y, chunks=CHUNK))
    _close(np.asarray(got.coef_), ref.coef_)
    _close(float(np.asarray(got.intercept_)), ref.intercept_)
    pred = got.predict(dds)
    assert isinstance(pred, da.Array)
    _close(pred.compute(), ref.predict(mem))


def test_grid_search_dask_joblib_backend(client):
    import joblib
    from sklearn.model_selection import GridSearchCV

    from ilargi_sklearn.linear_model import FactorizedLogisticRegression

    base, S1, S2, idx1, idx2 = _parts(8)
    mem = MultiSourceDataset.from_matrices([base, S1, S2], [None, idx1, idx2])
    y = (mem @ np.random.default_rng(9).standard_normal(9) > 0).astype(int)
    grid = {"C": [0.01, 0.1, 1.0, 10.0]}
    ref = GridSearchCV(FactorizedLogisticRegression(), grid, cv=3).fit(mem, y)
    with joblib.parallel_backend("dask"):
        got = GridSearchCV(FactorizedLogisticRegression(), grid, cv=3, n_jobs=-1)
        got.fit(mem, y)
    assert got.best_params_ == ref.best_params_
    _close(got.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"])
    _close(got.best_estimator_.coef_, ref.best_estimator_.coef_)


def test_logistic_regression_and_scaler(pair):
    from ilargi_sklearn.linear_model import FactorizedLogisticRegression
    from ilargi_sklearn.preprocessing import FactorizedStandardScaler

    mem, dds = pair
    y = (mem @ np.random.default_rng(10).standard_normal(9) > 0).astype(int)
    ref = FactorizedLogisticRegression().fit(mem, y)
    got = FactorizedLogisticRegression().fit(dds, y)
    _close(np.asarray(got.coef_), ref.coef_, np.float32)  # L-BFGS tolerance
    proba = got.predict_proba(dds)
    assert isinstance(proba, da.Array)
    _close(np.asarray(proba), ref.predict_proba(mem), np.float32)
    sc_ref = FactorizedStandardScaler().fit(mem)
    sc = FactorizedStandardScaler().fit(dds)
    _close(np.asarray(sc.scale_), sc_ref.scale_)
    _close(np.asarray(sc.mean_), sc_ref.mean_)
