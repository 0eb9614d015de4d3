"""The cost of the pilot shift of the centered statistics (``multisource/_statistics.py``).

Columns whose mean is large against their spread are shifted by a pilot value
inside the factorized terms before any sum is formed: copies of those columns and
one-row sources for the cells a left join leaves unmatched. Well-scaled data are
not shifted; what remains is choosing the pilots (a sample of 256 target rows).

Usage::

    python benchmarks/bench_shift.py [--rows 200000] [--tr 20] [--rounds 5]
        [--threads 0] [--out FILE]

A star schema (a base table of 5 columns, two dimension tables of 10 columns each
at the given tuple ratio, the second left-joined with 10% unmatched rows) in four
variants: well-scaled; a base column of mean 1e8 (spread 1); a column of the
inner-joined dimension of mean 1e8; a column of the left-joined dimension of mean
1e6 with one unmatched row in ten thousand (shifted, with the unmatched cells' term).
Per variant, interleaved: the centered gram (statistics cache off), the fit of
``FactorizedLinearRegression`` and of ``FactorizedStandardScaler``, and the
tracemalloc peak of the centered gram. Prints the medians and each variant's ratio
to the well-scaled one; appends JSON lines to ``--out`` (default
``benchmarks/results/shift.jsonl``).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)


def make_variants(n_rows: int, tr: float, seed: int = 0) -> dict:
    """The four datasets (same values but for the offsets) and a target."""
    import numpy as np

    from ilargi_sklearn import MultiSourceDataset

    rng = np.random.default_rng(seed)
    r = max(2, int(n_rows / tr))
    base = rng.standard_normal((n_rows, 5))
    dim1 = rng.standard_normal((r, 10))
    dim2 = rng.standard_normal((r, 10))
    fk1 = rng.integers(0, r, n_rows)
    fk2 = rng.integers(0, r, n_rows)
    fk2_sparse_miss = fk2.copy()
    fk2_sparse_miss[rng.random(n_rows) < 0.1] = -1
    fk2_rare_miss = fk2.copy()
    fk2_rare_miss[rng.choice(n_rows, n_rows // 10_000, replace=False)] = -1
    y = base @ rng.standard_normal(5) + rng.standard_normal(n_rows)

    def build(b, d1, d2, idx2):
        return MultiSourceDataset.from_matrices([b, d1, d2], [None, fk1, idx2])

    big_base = base.copy()
    big_base[:, 0] += 1e8
    big_dim = dim1.copy()
    big_dim[:, 0] += 1e8
    # Its unmatched cells vary the column by its mean: at 1e6 and one row in ten
    # thousand, 1e8 times the others' variance (at 1e8, 1e12 times, where
    # LinearRegression's tol, lstsq's cond, is at its edge and the fit refines).
    big_left = dim2.copy()
    big_left[:, 0] += 1e6
    return {
        "variants": {
            "well-scaled": build(base, dim1, dim2, fk2_sparse_miss),
            "base 1e8": build(big_base, dim1, dim2, fk2_sparse_miss),
            "inner dim 1e8": build(base, big_dim, dim2, fk2_sparse_miss),
            "left dim 1e6": build(base, dim1, big_left, fk2_rare_miss),
        },
        "y": y,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--tr", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "shift.jsonl"))
    args = p.parse_args()
    if args.threads:
        # Before NumPy (and its BLAS) and numba are first imported.
        for var in THREAD_VARS:
            os.environ[var] = str(args.threads)
    sys.path.insert(0, HERE)
    from _common import hardware_info, peak_tracemalloc, time_calls, write_records

    from ilargi_sklearn.linear_model import FactorizedLinearRegression
    from ilargi_sklearn.multisource import set_statistics_cache
    from ilargi_sklearn.multisource._statistics import centered_gram, choose_shift
    from ilargi_sklearn.preprocessing import FactorizedStandardScaler
    from ilargi_sklearn.utils._validation import validate_X

    set_statistics_cache(0)  # every call computes
    data = make_variants(args.rows, args.tr)
    y = data["y"]
    ops = {
        name: validate_X(FactorizedLinearRegression(), ds, reset=True)
        for name, ds in data["variants"].items()
    }
    funcs = {}
    for name, ds in data["variants"].items():
        op = ops[name]
        funcs[f"gram|{name}"] = lambda op=op: centered_gram(op, None, True)
        funcs[f"linear|{name}"] = lambda ds=ds: FactorizedLinearRegression().fit(ds, y)
        funcs[f"scaler|{name}"] = lambda ds=ds: FactorizedStandardScaler().fit(ds)
    timings = time_calls(funcs, repeat=args.rounds)
    hw = hardware_info()
    records = []
    print(
        f"{args.rows} rows, tuple ratio {args.tr:g}, threads "
        f"{args.threads or 'default'}; median of {args.rounds} interleaved rounds"
    )
    print(f"{'what':8s} {'variant':14s} {'seconds':>9s} {'x well':>7s} {'peak':>9s}")
    for what in ("gram", "linear", "scaler"):
        well = timings[f"{what}|well-scaled"]["seconds"]
        for name in data["variants"]:
            t = timings[f"{what}|{name}"]["seconds"]
            peak = None
            if what == "gram":
                op = ops[name]
                peak = peak_tracemalloc(lambda op=op: centered_gram(op, None, True))
            shifted = choose_shift(ops[name]).cols.tolist()
            records.append(
                {
                    "benchmark": "shift",
                    "what": what,
                    "variant": name,
                    "shifted_columns": shifted,
                    "n_rows": args.rows,
                    "tuple_ratio": args.tr,
                    "threads": args.threads,
                    "peak_bytes": peak,
                    **timings[f"{what}|{name}"],
                    "hardware": hw,
                }
            )
            mib = "" if peak is None else f"{peak / 2**20:7.1f}M"
            print(f"{what:8s} {name:14s} {t:9.4f} {t / well:7.2f} {mib:>9s}")
    write_records(args.out, records)


if __name__ == "__main__":
    main()
