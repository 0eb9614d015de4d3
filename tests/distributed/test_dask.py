"""The Dask-backed operator and dataset against the in-memory factorized ones."""

import dask
import numpy as np
import pytest
from _helpers import assert_close

da = pytest.importorskip("dask.array", reason="the [dask] extra is not installed")
distributed = pytest.importorskip(
    "dask.distributed", reason="the [dask] extra (distributed) is not installed"
)

from ilargi_sklearn import MultiSourceDataset  # noqa: E402
from ilargi_sklearn.distributed import DaskFactorizedMatrix, dask_dataset  # noqa: E402

N_ROWS, CHUNK = 1000, 128  # 8 row chunks: more than one chunk per worker


def _parts(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((N_ROWS, 3)).astype(dtype)
    S1 = rng.standard_normal((20, 4)).astype(dtype)
    S2 = rng.standard_normal((7, 2)).astype(dtype)
    idx1 = rng.integers(-1, 20, N_ROWS)  # left join: -1 are unmatched rows
    idx2 = rng.integers(0, 7, N_ROWS)
    return base, S1, S2, idx1, idx2


@pytest.fixture(scope="module")
def pair(dask_client):
    base, S1, S2, idx1, idx2 = _parts()
    mem = MultiSourceDataset.from_matrices([base, S1, S2], [None, idx1, idx2])
    dds = dask_dataset(
        [da.from_array(base, chunks=(CHUNK, 3)), S1, S2],
        [None, da.from_array(idx1, chunks=CHUNK), idx2],
    )
    return mem, dds


def _close(a, b, dtype=np.float64):
    # np.asarray computes a Dask array; float64 unless the test says otherwise.
    assert_close(np.asarray(a), np.asarray(b), dtype=dtype)


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


def test_without_base_and_float32(dask_client):
    base, S1, S2, idx1, idx2 = _parts(5, np.float32)
    mem = MultiSourceDataset.from_matrices([S1, S2], [idx1, idx2], dtype=np.float32)
    dds = dask_dataset([S1, S2], [idx1, idx2], dtype=np.float32, chunks=CHUNK)
    assert dds.operator.base is None and dds.dtype == np.float32
    Y = np.random.default_rng(6).standard_normal((N_ROWS, 2)).astype(np.float32)
    _close(dds.T @ Y, mem.T @ Y, np.float32)
    _close(dds.gram(), mem.gram(), np.float32)
    _close((dds @ np.ones(6, np.float32)).compute(), mem @ np.ones(6), np.float32)


def test_builder_errors(dask_client):
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
    # Parameter-sized fitted attributes come back as NumPy.
    assert isinstance(got.coef_, np.ndarray)
    _close(got.coef_, ref.coef_)
    _close(float(got.intercept_), ref.intercept_)
    pred = got.predict(dds)
    assert isinstance(pred, da.Array)
    _close(pred.compute(), ref.predict(mem))


def test_grid_search_dask_joblib_backend(dask_client):
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
    assert isinstance(got.coef_, np.ndarray)
    assert isinstance(got.intercept_, np.ndarray)
    _close(got.coef_, ref.coef_, np.float32)  # L-BFGS tolerance
    proba = got.predict_proba(dds)
    assert isinstance(proba, da.Array)
    _close(np.asarray(proba), ref.predict_proba(mem), np.float32)
    sc_ref = FactorizedStandardScaler().fit(mem)
    sc = FactorizedStandardScaler().fit(dds)
    assert isinstance(sc.scale_, np.ndarray) and isinstance(sc.mean_, np.ndarray)
    _close(sc.scale_, sc_ref.scale_)
    _close(sc.mean_, sc_ref.mean_)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_logistic_regression_gd(pair):
    from ilargi_sklearn.linear_model import FactorizedLogisticRegression

    mem, dds = pair
    y = (mem @ np.random.default_rng(11).standard_normal(9) > 0).astype(int)
    params = dict(solver="gd", max_iter=4, tol=0.0, learning_rate=0.5)
    ref = FactorizedLogisticRegression(**params).fit(mem, y)
    got = FactorizedLogisticRegression(**params).fit(dds, y)
    assert isinstance(got.coef_, np.ndarray)
    _close(got.coef_, ref.coef_)
    _close(got.intercept_, ref.intercept_)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_logistic_regression_predict(pair):
    from ilargi_sklearn.linear_model import FactorizedLogisticRegression

    mem, dds = pair
    y = (mem @ np.random.default_rng(10).standard_normal(9) > 0).astype(int)
    params = dict(solver="gd", max_iter=2, tol=0.0, learning_rate=0.5)
    got = FactorizedLogisticRegression(**params).fit(dds, y)
    labels = got.predict(dds)
    assert isinstance(labels, da.Array)
    ref = FactorizedLogisticRegression(**params).fit(mem, y).predict(mem)
    np.testing.assert_array_equal(labels.compute(), ref)


def test_kmeans(pair):
    from ilargi_sklearn.cluster import FactorizedKMeans

    mem, dds = pair
    params = dict(n_clusters=3, n_init=1, random_state=0, max_iter=30)
    ref = FactorizedKMeans(**params).fit(mem)
    got = FactorizedKMeans(**params).fit(dds)
    assert isinstance(got.cluster_centers_, np.ndarray)
    _close(got.cluster_centers_, ref.cluster_centers_)
    assert got.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(got.inertia_, ref.inertia_, rtol=1e-9)
    # n-length results stay on the cluster.
    assert isinstance(got.labels_, da.Array)
    np.testing.assert_array_equal(got.labels_.compute(), ref.labels_)
    pred = got.predict(dds)
    assert isinstance(pred, da.Array)
    np.testing.assert_array_equal(pred.compute(), ref.predict(mem))
    dist = got.transform(dds)
    assert isinstance(dist, da.Array)
    _close(dist.compute(), ref.transform(mem))
    np.testing.assert_allclose(got.score(dds), ref.score(mem), rtol=1e-9)


def test_kmeans_several_inits(pair):
    from ilargi_sklearn.cluster import FactorizedKMeans

    mem, dds = pair
    params = dict(n_clusters=3, init="random", n_init=2, random_state=0, max_iter=10)
    got = FactorizedKMeans(**params).fit(dds)
    ref = FactorizedKMeans(**params).fit(mem)
    _close(got.cluster_centers_, ref.cluster_centers_)


@pytest.mark.parametrize("init", ["nndsvda", "random"])
def test_gnmf(dask_client, init):
    from ilargi_sklearn.decomposition import FactorizedGNMF

    base, S1, S2, idx1, idx2 = _parts(13)
    base, S1, S2 = np.abs(base), np.abs(S1), np.abs(S2)
    mem = MultiSourceDataset.from_matrices([base, S1, S2], [None, idx1, idx2])
    # Two row chunks: this test is about the kernels, not the chunking.
    dds = dask_dataset([base, S1, S2], [None, idx1, idx2], chunks=N_ROWS // 2)
    params = dict(n_components=3, init=init, max_iter=5, tol=0, random_state=0)
    ref = FactorizedGNMF(**params)
    W_ref = ref.fit_transform(mem)
    est = FactorizedGNMF(**params)
    W = est.fit_transform(dds)
    assert isinstance(W, da.Array)
    assert isinstance(est.components_, np.ndarray)
    tol = 1e-7 if init == "nndsvda" else 1e-10  # QR vs LU in the range finder
    np.testing.assert_allclose(est.components_, ref.components_, rtol=tol, atol=tol)
    np.testing.assert_allclose(W.compute(), W_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(
        est.reconstruction_err_, ref.reconstruction_err_, rtol=1e-7
    )


def test_namespace_keeps_small_results_on_the_client(pair):
    from ilargi_sklearn.distributed import DaskNamespace

    _, dds = pair
    xp = dds.operator.xp
    assert isinstance(xp, DaskNamespace) and xp is dds.operator.xp
    P = dds @ np.random.default_rng(14).standard_normal((9, 4))
    labels = xp.argmin(P, axis=1)
    assert isinstance(labels, da.Array)  # n-length: stays on the cluster
    counts = xp.sum(xp.astype(labels[:, None] == xp.arange(4)[None, :], xp.int64), 0)
    assert isinstance(counts, np.ndarray) and int(counts.sum()) == N_ROWS
    chosen = xp.take_along_axis(P, labels[:, None], axis=1)
    Pc = P.compute()
    _close(chosen.compute()[:, 0], Pc.min(axis=1))
    # Parameter-sized uploads stay NumPy, n-length ones become row-chunked Dask.
    assert isinstance(xp.asarray(np.ones(9)), np.ndarray)
    w = xp.asarray(np.ones(N_ROWS))
    assert isinstance(w, da.Array) and w.chunks[0] == dds.operator.row_chunks
    Q, R = xp.linalg.qr(P)
    assert isinstance(Q, da.Array) and isinstance(R, np.ndarray)
    _close(Q.compute() @ R, Pc)


def test_row_chunks_are_co_located(dask_client):
    """Base, index vectors and aligned operands share each chunk's worker."""
    n, chunk = 40_000, 5_000
    rng = np.random.default_rng(15)
    base = rng.standard_normal((n, 4))
    S = rng.standard_normal((50, 3))
    idx = rng.integers(0, 50, n)
    dds = dask_dataset([base, S], [None, idx], chunks=chunk)
    op = dds.operator
    assert op.placement is not None and len(op.placement) == op.n_chunks

    def holders(A):
        who = dask_client.who_has(A)
        return [sorted(who[k]) for k in dask.core.flatten(A.__dask_keys__())]

    distributed.wait([op.base, *op.indices])
    expected = [[w] for w in op.placement]
    assert holders(op.base) == expected
    assert holders(op.indices[0]) == expected
    y = op.align_rows(rng.standard_normal(n))
    distributed.wait(y)
    assert holders(y) == expected
    mem = MultiSourceDataset.from_matrices([base, S], [None, idx])
    _close(op.rmatmul(op.matmul(np.ones(7)) - y), mem.T @ (mem @ np.ones(7) - y))


def test_materialized_strategy_is_refused(pair):
    from ilargi_sklearn.linear_model import FactorizedLinearRegression

    _, dds = pair
    with pytest.raises(NotImplementedError, match="strategy='materialized' is not"):
        FactorizedLinearRegression(strategy="materialized").fit(dds, np.ones(len(dds)))


def test_from_matrices_with_a_dask_source_builds_the_dask_dataset(dask_client):
    base, S1, S2, idx1, idx2 = _parts()
    mem = MultiSourceDataset.from_matrices([base, S1, S2], [None, idx1, idx2])
    dds = MultiSourceDataset.from_matrices(
        [da.from_array(base, chunks=(CHUNK, 3)), S1, S2], [None, idx1, idx2]
    )
    assert isinstance(dds.operator, DaskFactorizedMatrix)
    w = np.arange(mem.shape[1], dtype=np.float64)
    _close((dds @ w).compute(), mem @ w)
    np.testing.assert_array_equal(dds.base_rows_, np.arange(N_ROWS))
    with pytest.raises(TypeError, match="dask_dataset"):
        MultiSourceDataset.from_matrices(
            [da.from_array(base, chunks=(CHUNK, 3)), S1],
            [None, idx1],
            [None, None],
            priority=[1, 0],
        )


def test_elastic_net_on_the_gram(pair):
    # One factorized gram and one transposed product on the Dask operator, then
    # coordinate descent on the host: the in-memory dataset's model.
    from ilargi_sklearn.linear_model import FactorizedElasticNet

    mem, dds = pair
    rng = np.random.default_rng(8)
    y = (mem @ rng.standard_normal(9)) + 0.1 * rng.standard_normal(N_ROWS) + 2.0
    sw = rng.uniform(0.5, 2.0, N_ROWS)
    ref = FactorizedElasticNet(alpha=0.05).fit(mem, y, sample_weight=sw)
    got = FactorizedElasticNet(alpha=0.05).fit(
        dds, da.from_array(y, chunks=CHUNK), sample_weight=sw
    )
    assert isinstance(got.coef_, np.ndarray) and got.n_iter_ == ref.n_iter_
    _close(got.coef_, ref.coef_)
    _close(float(got.intercept_), ref.intercept_)
    _close(got.predict(dds).compute(), ref.predict(mem))


@pytest.mark.parametrize(
    "name", ["FactorizedPoissonRegressor", "FactorizedGammaRegressor"]
)
def test_glm_regressors(pair, name):
    import ilargi_sklearn.linear_model as lm

    mem, dds = pair
    rng = np.random.default_rng(12)
    mean = np.exp(0.5 + 0.2 * (mem @ rng.standard_normal(9)))
    y = rng.poisson(mean) + 0.5  # positive, for both families
    Est = getattr(lm, name)
    ref = Est(alpha=0.01, tol=1e-8).fit(mem, y)
    got = Est(alpha=0.01, tol=1e-8).fit(dds, y)
    assert isinstance(got.coef_, np.ndarray)
    _close(got.coef_, ref.coef_, np.float32)  # L-BFGS tolerance
    pred = got.predict(dds)
    assert isinstance(pred, da.Array)
    _close(pred, ref.predict(mem), np.float32)
    _close(got.score(dds, y), ref.score(mem, y), np.float32)
