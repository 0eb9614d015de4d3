"""FactorizedPCA and FactorizedTruncatedSVD: parity with scikit-learn's PCA
(``svd_solver="covariance_eigh"``) and TruncatedSVD on the joined matrix, over the
random schemas and real data; factorized == materialized; bad input; composition
with pipelines and searches."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, dense, tolerance
from sklearn.base import clone
from sklearn.decomposition import PCA, TruncatedSVD
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils._param_validation import InvalidParameterError

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn.decomposition import FactorizedPCA, FactorizedTruncatedSVD
from ilargi_sklearn.multisource import FactorizedMatrix
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset


def _close(actual, expected, dtype, kind="fit", err_msg=""):
    """The table's tolerance relative to the largest entry of ``expected`` (the
    rounding of a sum carries the scale of its largest terms, not of each entry)."""
    expected = np.asarray(dense(expected), dtype=np.float64)
    scale = float(np.abs(expected).max(initial=0.0))
    assert_close(
        np.asarray(dense(actual), dtype=np.float64),
        expected,
        dtype=dtype,
        kind=kind,
        scale=scale,
        err_msg=err_msg,
    )


def _resolved(explained_variance, dtype, kind="fit"):
    """How many leading eigenvectors two computations can agree on within the
    tolerance: an eigenvector moves by about ``eps * lambda_max / gap`` (Davis-Kahan)
    under rounding of the covariance, so those whose gap to a neighbour is below
    ``10 eps lambda_max / tol`` (and those of zero eigenvalues) are arbitrary within
    their eigenspace."""
    ev = np.asarray(explained_variance, dtype=np.float64)
    if ev.size == 0:
        return 0
    eps = float(np.finfo(dtype).eps)
    floor = 10 * eps * ev[0] / tolerance(dtype, kind)
    gaps = np.minimum(np.append(np.inf, -np.diff(ev)), np.append(-np.diff(ev), ev[-1]))
    bad = np.flatnonzero(gaps <= floor)
    return int(bad[0]) if bad.size else ev.size


def _tie_signs(ours, ref, dtype, kind="fit"):
    """Per component, the sign that aligns ``ours`` with ``ref`` where the sign
    convention cannot decide it: ``svd_flip`` makes the largest entry positive,
    and where the two largest magnitudes tie (duplicate one-hot columns) rounding
    picks which. Elsewhere 1: a sign flip there is an error."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    signs = np.ones(ref.shape[0])
    if ref.shape[1] < 2:
        return signs
    top2 = -np.sort(-np.abs(ref), axis=1)[:, :2]
    tied = top2[:, 0] - top2[:, 1] <= tolerance(dtype, kind) * top2[:, 0]
    dots = np.sum(ours * ref, axis=1)
    signs[tied] = np.where(dots[tied] < 0, -1.0, 1.0)
    return signs


# ------------------------------------------------------------------ PCA parity
def _assert_pca_like(ours, ref, ds, X, dtype, kind="fit"):
    """Every fitted attribute and method output of ``ours`` (on ``ds``) against
    ``ref`` (on ``X``)."""
    assert ours.n_components_ == ref.n_components_
    assert ours.n_samples_ == ref.n_samples_
    assert ours.components_.dtype == ref.components_.dtype == dtype
    for name in ("explained_variance_", "explained_variance_ratio_", "mean_"):
        _close(getattr(ours, name), getattr(ref, name), dtype, kind, name)
    # Squared: a zero singular value comes out as the square root of the
    # eigenvalue's rounding error, sqrt(eps) times the scale.
    _close(ours.singular_values_**2, ref.singular_values_**2, dtype, kind, "S^2")
    scale = float(ref.explained_variance_[0]) if ref.n_components_ else 1.0
    assert_close(
        ours.noise_variance_, ref.noise_variance_, dtype=dtype, kind=kind, scale=scale
    )
    m = _resolved(ref.explained_variance_, dtype, kind)
    signs = _tie_signs(ours.components_[:m], ref.components_[:m], dtype, kind)
    V = ours.components_[:m] * signs[:, None]
    _close(V, ref.components_[:m], dtype, kind, "components_")
    Z, Zr = ours.transform(ds), ref.transform(X)
    assert isinstance(Z, np.ndarray) and Z.dtype == dtype
    _close(Z[:, :m] * signs, Zr[:, :m], dtype, kind, "transform")
    if np.any(signs < 0):
        return m  # below, the tied components' signs would enter the products
    if m < ref.n_components_:
        return m
    Zr = Zr[:200]  # the reconstruction is dense, the joined matrix's size
    _close(
        ours.inverse_transform(Zr), ref.inverse_transform(Zr), dtype, kind, "inverse"
    )
    _close(ours.get_covariance(), ref.get_covariance(), dtype, kind, "covariance")
    if ref.noise_variance_ > 0 or ref.n_components_ == X.shape[1]:
        _close(ours.get_precision(), ref.get_precision(), dtype, kind, "precision")
        # A few rows, densified: scikit-learn's score_samples takes no sparse
        # input.
        rows = np.arange(min(300, X.shape[0]))
        Xd, part = dense(X[rows]), ds[rows]
        _close(ours.score_samples(part), ref.score_samples(Xd), dtype, kind, "score")
        assert_close(ours.score(part), ref.score(Xd), dtype=dtype, kind=kind)
    return m


@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("n_components", [None, 2, 0.8, "mle"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pca_matches_sklearn_on_random_schemas(scenario, n_components, whiten):
    ds = random_dataset(1, n_rows=120, scenario=scenario)
    X = ds.materialize()  # sparse for the sparse scenario: PCA takes it there
    ours = FactorizedPCA(n_components, whiten=whiten).fit(ds)
    ref = PCA(n_components, whiten=whiten, svd_solver="covariance_eigh").fit(X)
    m = _assert_pca_like(ours, ref, ds, X, ds.dtype)
    assert m >= min(ref.n_components_, 2)  # the comparisons above were not empty
    # fit_transform projects as transform does.
    Z = FactorizedPCA(n_components, whiten=whiten).fit_transform(ds)
    _close(Z[:, :m], ref.transform(X)[:, :m], ds.dtype, err_msg="fit_transform")


@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("solver", ["arpack", "randomized"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pca_truncated_solvers_match_sklearn(scenario, solver, whiten):
    ds = random_dataset(2, n_rows=120, scenario=scenario)
    # scikit-learn's randomized PCA refuses sparse input (it centers densely); the
    # same draws on the dense array are the reference.
    X = ds.materialize("dense" if solver == "randomized" else "auto")
    k = min(3, ds.shape[1] - 1)
    params = {"svd_solver": solver, "whiten": whiten, "random_state": 0}
    ours = FactorizedPCA(k, **params)
    ref = PCA(k, **params)
    Z, Zr = ours.fit_transform(ds), ref.fit_transform(X)
    m = _assert_pca_like(ours, ref, ds, X, ds.dtype)
    assert m >= 1
    _close(Z[:, :m], Zr[:, :m], ds.dtype, err_msg="fit_transform (U S)")


@pytest.mark.parametrize("fmt", ["dense", "sparse"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pca_matches_sklearn_on_arrays(fmt, dtype):
    rng = np.random.default_rng(0)
    # Distinct column scales: well separated eigenvalues, comparable in float32.
    scales = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    X = (rng.standard_normal((80, 6)) * scales + 7).astype(dtype)
    if fmt == "sparse":
        X = sp.random(80, 6, density=0.4, random_state=1, format="csr", dtype=dtype)
        X = (X @ sp.diags(scales.astype(dtype))).tocsr()
    ours = FactorizedPCA(3).fit(X)
    ref = PCA(3, svd_solver="covariance_eigh").fit(X)
    assert _assert_pca_like(ours, ref, X, X, np.dtype(dtype)) == 3


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pca_factorized_equals_materialized(scenario):
    ds = random_dataset(4, n_rows=100, scenario=scenario)
    f = FactorizedPCA(whiten=True).fit(ds)
    mat = FactorizedPCA(whiten=True, strategy="materialized").fit(ds)
    m = _resolved(mat.explained_variance_, ds.dtype, "operator")
    assert m >= 2
    for name in ("explained_variance_", "mean_"):
        _close(getattr(f, name), getattr(mat, name), ds.dtype, "operator", name)
    _close(f.singular_values_**2, mat.singular_values_**2, ds.dtype, "operator")
    _close(f.components_[:m], mat.components_[:m], ds.dtype, "operator")
    _close(f.transform(ds)[:, :m], mat.transform(ds)[:, :m], ds.dtype, "operator")


def test_pca_fit_never_materializes_and_keeps_sparse_sources(monkeypatch):
    ds = random_dataset(0, n_rows=200, scenario="sparse")
    assert ds.operator.is_sparse
    ref = PCA(3, svd_solver="covariance_eigh").fit(ds.materialize())

    def forbidden(self, format="auto"):
        raise AssertionError("the factorized fit built the joined matrix")

    monkeypatch.setattr(FactorizedMatrix, "materialize", forbidden)
    ours = FactorizedPCA(3).fit(ds)
    Z = ours.transform(ds)
    ll = ours.score_samples(ds)
    monkeypatch.undo()
    X = ds.materialize()
    _close(ours.explained_variance_, ref.explained_variance_, ds.dtype)
    _close(Z, ref.transform(X), ds.dtype)
    _close(ll, ref.score_samples(X.toarray()), ds.dtype)


def test_pca_n_components_fraction_is_the_smallest_count_above_it():
    ds = random_dataset(2, n_rows=150, scenario="star")
    full = FactorizedPCA().fit(ds)
    cumulative = np.cumsum(full.explained_variance_ratio_)
    for fraction in (0.3, 0.5, 0.9, 0.99):
        k = FactorizedPCA(fraction).fit(ds).n_components_
        assert cumulative[k - 1] > fraction
        assert k == 1 or cumulative[k - 2] <= fraction


def test_pca_whiten_gives_unit_variance_and_inverts():
    ds = random_dataset(3, n_rows=200, scenario="left")
    pca = FactorizedPCA(3, whiten=True).fit(ds)
    Z = pca.transform(ds)
    np.testing.assert_allclose(
        Z.var(axis=0, ddof=1), 1.0, rtol=tolerance(ds.dtype, "fit")
    )
    # Reconstruction from all components is the data itself.
    full = FactorizedPCA(whiten=True).fit(ds)
    _close(
        full.inverse_transform(full.transform(ds)), ds.materialize("dense"), ds.dtype
    )


def test_pca_float32_attributes_and_outputs():
    ds = random_dataset(5, scenario="float32")
    pca = FactorizedPCA(2).fit(ds)
    for name in ("components_", "explained_variance_", "singular_values_", "mean_"):
        assert getattr(pca, name).dtype == np.float32, name
    assert pca.transform(ds).dtype == np.float32
    assert pca.score_samples(ds).dtype == np.float32


def test_pca_bad_n_components_raise_sklearns_errors():
    X = np.random.default_rng(0).standard_normal((5, 8))
    ds = MultiSourceDataset.from_matrices(
        [X[:, :3], X[:2, 3:]], [None, [0, 1, 0, 1, 0]]
    )
    too_many = (
        r"n_components=6 must be between 0 and min\(n_samples, n_features\)=5 with "
        r"svd_solver='covariance_eigh'"
    )
    for Est, data in (
        (FactorizedPCA, ds),
        (FactorizedPCA, X),
        (lambda k: PCA(k, svd_solver="covariance_eigh"), X),
    ):
        with pytest.raises(ValueError, match=too_many):
            Est(6).fit(data)
        with pytest.raises(ValueError, match="'mle' is only supported if n_samples"):
            Est("mle").fit(data)
    for Est, data in (
        (FactorizedPCA, ds),
        (FactorizedPCA, X),
        (PCA, X),
    ):
        with pytest.raises(ValueError, match="'mle' cannot be a string with svd_"):
            Est("mle", svd_solver="arpack").fit(data)
        with pytest.raises(ValueError, match="=5 must be strictly less than min"):
            Est(5, svd_solver="arpack").fit(data)
        with pytest.raises(ValueError, match=r"=0.5 must be between 1 and min\("):
            Est(0.5, svd_solver="randomized").fit(data)
    for bad in (-1, 1.5, "auto"):
        with pytest.raises(InvalidParameterError, match="n_components"):
            FactorizedPCA(bad).fit(X)
    with pytest.raises(ValueError, match="n_samples=1: FactorizedPCA needs at least 2"):
        FactorizedPCA().fit(X[:1])


def test_pca_refuses_other_features_and_unfitted_use():
    from sklearn.exceptions import NotFittedError

    ds = random_dataset(0, scenario="star")
    with pytest.raises(NotFittedError):
        FactorizedPCA().transform(ds)
    pca = FactorizedPCA(2).fit(ds)
    other = random_dataset(1, scenario="star")
    if other.shape[1] == ds.shape[1]:
        other = random_dataset(2, scenario="star")
    with pytest.raises(ValueError, match="features, but FactorizedPCA is expecting"):
        pca.transform(other)
    names = pca.get_feature_names_out()
    assert list(names) == ["factorizedpca0", "factorizedpca1"]


# ------------------------------------------------------------------ SVD parity
SVD_VARIANTS = [
    ("randomized", {}),
    ("randomized", {"n_iter": 2}),  # "auto" normalizer: none
    ("randomized", {"power_iteration_normalizer": "QR"}),
    ("randomized", {"power_iteration_normalizer": "none", "n_oversamples": 3}),
    ("arpack", {}),
]


def _assert_svd_like(ours, Z, ref, Zr, ds, X, dtype, kind="fit"):
    for name in (
        "singular_values_",
        "explained_variance_",
        "explained_variance_ratio_",
    ):
        _close(getattr(ours, name), getattr(ref, name), dtype, kind, name)
    assert ours.components_.dtype == ref.components_.dtype == dtype
    m = _resolved(ref.singular_values_**2, dtype, kind)
    signs = _tie_signs(ours.components_[:m], ref.components_[:m], dtype, kind)
    V = ours.components_[:m] * signs[:, None]
    _close(V, ref.components_[:m], dtype, kind, "components_")
    assert isinstance(Z, np.ndarray) and Z.dtype == dtype
    _close(Z[:, :m] * signs, Zr[:, :m], dtype, kind, "fit_transform")
    Zt = ours.transform(ds)[:, :m] * signs
    _close(Zt, ref.transform(X)[:, :m], dtype, kind, "transform")
    if m == ref.components_.shape[0] and np.all(signs > 0):
        Zr = Zr[:200]  # the reconstruction is dense, the joined matrix's size
        _close(
            ours.inverse_transform(Zr), ref.inverse_transform(Zr), dtype, kind, "inv"
        )
    return m


@pytest.mark.parametrize("variant", range(len(SVD_VARIANTS)))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_truncated_svd_matches_sklearn_on_random_schemas(scenario, variant):
    algorithm, params = SVD_VARIANTS[variant]
    ds = random_dataset(1, n_rows=120, scenario=scenario)
    X = ds.materialize()
    k = min(3, ds.shape[1] - 1)
    ours = FactorizedTruncatedSVD(k, algorithm=algorithm, random_state=0, **params)
    ref = TruncatedSVD(k, algorithm=algorithm, random_state=0, **params)
    Z, Zr = ours.fit_transform(ds), ref.fit_transform(X)
    m = _assert_svd_like(ours, Z, ref, Zr, ds, X, ds.dtype)
    assert m >= 1


@pytest.mark.parametrize("algorithm", ["randomized", "arpack"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_truncated_svd_factorized_equals_materialized(scenario, algorithm):
    ds = random_dataset(4, n_rows=100, scenario=scenario)
    k = min(2, ds.shape[1] - 1)
    fits = {
        s: FactorizedTruncatedSVD(k, algorithm=algorithm, random_state=0, strategy=s)
        for s in ("factorized", "materialized")
    }
    Z = {s: est.fit_transform(ds) for s, est in fits.items()}
    f, mat = fits["factorized"], fits["materialized"]
    # The iterations amplify the products' reordering a little: "fit", not
    # "operator".
    _close(f.singular_values_, mat.singular_values_, ds.dtype)
    m = _resolved(mat.singular_values_**2, ds.dtype)
    _close(f.components_[:m], mat.components_[:m], ds.dtype)
    _close(Z["factorized"][:, :m], Z["materialized"][:, :m], ds.dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_truncated_svd_on_sparse_arrays_matches_sklearn(dtype):
    X = sp.random(200, 30, density=0.1, random_state=0, format="csr", dtype=dtype)
    for algorithm in ("randomized", "arpack"):
        ours = FactorizedTruncatedSVD(5, algorithm=algorithm, random_state=3)
        ref = TruncatedSVD(5, algorithm=algorithm, random_state=3)
        Z, Zr = ours.fit_transform(X), ref.fit_transform(X)
        assert _assert_svd_like(ours, Z, ref, Zr, X, X, np.dtype(dtype)) >= 3


def test_truncated_svd_bad_input_raises_sklearns_errors():
    X = np.random.default_rng(0).standard_normal((10, 4))
    ds = MultiSourceDataset.from_matrices(
        [X[:, :2], X[:3, 2:]], [None, np.arange(10) % 3]
    )
    one = MultiSourceDataset.from_matrices([X[:, :1]], [None])
    for Est, data, narrow in (
        (FactorizedTruncatedSVD, ds, one),
        (FactorizedTruncatedSVD, X, X[:, :1]),
        (TruncatedSVD, X, X[:, :1]),
    ):
        with pytest.raises(
            ValueError, match=r"n_components\(5\) must be <= n_features\(4\)"
        ):
            Est(5).fit(data)
        with pytest.raises(
            ValueError,
            match=r"`k` must be an integer satisfying `0 < k < min\(A.shape\)`",
        ):
            Est(4, algorithm="arpack").fit(data)
        with pytest.raises(ValueError, match="1 feature.* a minimum of 2"):
            Est(1).fit(narrow)
    with pytest.raises(InvalidParameterError, match="algorithm"):
        FactorizedTruncatedSVD(algorithm="full").fit(X)


# ------------------------------------------------------------- composition
def test_scaler_pca_regression_pipeline_equals_sklearn():
    ds = random_dataset(6, n_rows=150, scenario="left")
    y = np.random.default_rng(0).standard_normal(len(ds)) + dense(ds) @ np.arange(
        ds.shape[1]
    )
    ours = Pipeline(
        [
            ("scale", FactorizedStandardScaler()),
            ("pca", FactorizedPCA(3)),
            ("lr", LinearRegression()),
        ]
    ).fit(ds, y)
    ref = Pipeline(
        [
            ("scale", StandardScaler()),
            ("pca", PCA(3, svd_solver="covariance_eigh")),
            ("lr", LinearRegression()),
        ]
    ).fit(dense(ds), y)
    _close(ours.predict(ds), ref.predict(dense(ds)), ds.dtype)
    _close(ours[-1].coef_, ref[-1].coef_, ds.dtype)


@pytest.mark.parametrize(
    "est, ref, param",
    [
        (FactorizedPCA(), PCA(svd_solver="covariance_eigh"), [1, 2, 0.9]),
        (
            FactorizedTruncatedSVD(random_state=0),
            TruncatedSVD(random_state=0),
            [1, 2, 3],
        ),
    ],
    ids=["pca", "svd"],
)
def test_grid_search_over_n_components_equals_sklearn(est, ref, param):
    ds = random_dataset(7, n_rows=150, scenario="star")
    y = dense(ds) @ np.linspace(-1, 1, ds.shape[1])
    y = y + 0.1 * np.random.default_rng(1).standard_normal(len(ds))
    grid = {"dec__n_components": param}
    ours = GridSearchCV(
        Pipeline([("dec", est), ("lr", LinearRegression())]), grid, cv=3
    )
    theirs = GridSearchCV(
        Pipeline([("dec", ref), ("lr", LinearRegression())]), grid, cv=3
    )
    ours.fit(ds, y)
    theirs.fit(dense(ds), y)
    assert ours.best_params_ == theirs.best_params_
    _close(
        ours.cv_results_["mean_test_score"],
        theirs.cv_results_["mean_test_score"],
        ds.dtype,
    )
    scores = cross_val_score(ours.best_estimator_, ds, y, cv=3)
    _close(
        scores, cross_val_score(theirs.best_estimator_, dense(ds), y, cv=3), ds.dtype
    )


def test_transform_datasets_built_with_the_training_schema():
    from ilargi_sklearn.datasets import load_flights

    data = load_flights(n_rows=1500)
    ds, frames = data.dataset, data.frames
    tables = {
        "airlines": frames["airlines"],
        "planes": frames["planes"],
        "origin": frames["airports"],
        "dest": frames["airports"],
        "weather": frames["weather"],
    }
    for est in (FactorizedPCA(4), FactorizedTruncatedSVD(4, random_state=0)):
        est.fit(ds)
        rows = np.arange(100, 160)
        new = est.dataset_schema_.build(frames["flights"].iloc[rows], tables)
        assert new.shape[1] == ds.shape[1]
        _close(est.transform(new), est.transform(ds[rows]), ds.dtype, "operator")


# ------------------------------------------------------------------ devices
@pytest.mark.parametrize(
    "est",
    [
        FactorizedPCA(3, whiten=True),
        FactorizedPCA(3, svd_solver="randomized", whiten=True, random_state=0),
        FactorizedTruncatedSVD(3, random_state=0),
    ],
    ids=["pca", "pca-randomized", "svd"],
)
def test_every_method_on_a_device_dataset_matches_the_host(est, namespace):
    """Fit and every method on a dataset in another namespace: the host's results
    (the randomized SVD normalizes by Cholesky QR there instead of LU: the same
    subspace, another rounding), returned in that namespace."""
    from ilargi_sklearn._backend._namespace import get_namespace

    xp, device = namespace
    ds = random_dataset(0, n_rows=90, scenario="left")
    dsd = ds.to_device(device, namespace=None if isinstance(device, str) else xp)
    host = clone(est).fit(ds)
    dev = clone(est).fit(dsd)
    outputs = {
        "transform": (host.transform(ds), dev.transform(dsd)),
        "fit_transform": (clone(est).fit_transform(ds), clone(est).fit_transform(dsd)),
        "inverse_transform": (
            host.inverse_transform(host.transform(ds)),
            dev.inverse_transform(dev.transform(dsd)),
        ),
    }
    if hasattr(est, "score_samples"):
        outputs["score_samples"] = (host.score_samples(ds), dev.score_samples(dsd))
        outputs["get_covariance"] = (host.get_covariance(), dev.get_covariance())
    for method, (want, got) in outputs.items():
        assert get_namespace(got) is get_namespace(xp.asarray(0)), method
        _close(got, want, ds.dtype, "device_fit", method)


# ------------------------------------------------------------------ real data
@pytest.mark.slow
def test_pca_and_svd_match_sklearn_on_nycflights13():
    from ilargi_sklearn.datasets import load_flights

    ds = load_flights(n_rows=20_000).dataset
    X = ds.materialize()
    ours = FactorizedPCA(8).fit(ds)
    ref = PCA(8, svd_solver="covariance_eigh").fit(X)
    assert _assert_pca_like(ours, ref, ds, X, ds.dtype) >= 6
    svd = FactorizedTruncatedSVD(5, random_state=0)
    ref_svd = TruncatedSVD(5, random_state=0)
    Z, Zr = svd.fit_transform(ds), ref_svd.fit_transform(X)
    assert _assert_svd_like(svd, Z, ref_svd, Zr, ds, X, ds.dtype) >= 4


@pytest.fixture(scope="module")
def walmart_stores(hamlet_dir, tmp_path_factory):
    """Hamlet Walmart without its large dimension table (R1, 2,387 one-hot
    columns, whose dense eigenproblem alone takes 15 s here): the sales, their
    one-hot departments and the stores table (R2), linked (not copied) under the
    Morpheus names of a one-table dataset."""
    from ilargi_sklearn.datasets import load_hamlet

    src = hamlet_dir / "Walmart"
    if not (src / "MLSraw.txt").is_file():
        pytest.skip(f"Hamlet Walmart is not available at {src}")
    folder = tmp_path_factory.mktemp("hamlet") / "WalmartStores"
    folder.mkdir()
    for link, target in (
        ("MLY.csv", "MLY.csv"),
        ("MLSraw.txt", "MLSraw.txt"),
        ("MLR1Sparse.txt", "MLR2Sparse.txt"),
        ("MLFK1.csv", "MLFK2.csv"),
    ):
        (folder / link).symlink_to(src / target)
    return load_hamlet("WalmartStores", folder.parent).dataset


@pytest.mark.slow
def test_pca_matches_sklearn_on_hamlet_walmart(walmart_stores):
    ds = walmart_stores
    assert ds.operator.is_sparse
    X = ds.materialize()
    ours = FactorizedPCA(10).fit(ds)
    ref = PCA(10, svd_solver="covariance_eigh").fit(X)
    assert _assert_pca_like(ours, ref, ds, X, ds.dtype) >= 5


@pytest.mark.slow
def test_pca_arpack_matches_sklearn_on_hamlet_flights(hamlet_dir):
    """13,669 one-hot features: too wide for the covariance eigenproblem, which
    ARPACK on the implicitly centered operator never forms."""
    from ilargi_sklearn.datasets import load_hamlet

    if not (hamlet_dir / "Flights" / "MLSSparse.txt").is_file():
        pytest.skip("Hamlet Flights is not available")
    ds = load_hamlet("Flights", hamlet_dir).dataset
    X = ds.materialize()
    ours = FactorizedPCA(6, svd_solver="arpack", random_state=0)
    ref = PCA(6, svd_solver="arpack", random_state=0)
    Z, Zr = ours.fit_transform(ds), ref.fit_transform(X)
    m = _assert_pca_like(ours, ref, ds, X, ds.dtype)
    assert m >= 4
    signs = _tie_signs(ours.components_[:m], ref.components_[:m], ds.dtype)
    _close(Z[:, :m] * signs, Zr[:, :m], ds.dtype, err_msg="fit_transform (U S)")


@pytest.mark.slow
def test_truncated_svd_matches_sklearn_on_hamlet_flights(hamlet_dir):
    from ilargi_sklearn.datasets import load_hamlet

    if not (hamlet_dir / "Flights" / "MLSSparse.txt").is_file():
        pytest.skip("Hamlet Flights is not available")
    ds = load_hamlet("Flights", hamlet_dir).dataset
    X = ds.materialize()
    for algorithm in ("randomized", "arpack"):
        ours = FactorizedTruncatedSVD(6, algorithm=algorithm, random_state=0)
        ref = TruncatedSVD(6, algorithm=algorithm, random_state=0)
        Z, Zr = ours.fit_transform(ds), ref.fit_transform(X)
        assert _assert_svd_like(ours, Z, ref, Zr, ds, X, ds.dtype) >= 4
