"""Where a GPU fit spends its time: profiles of factorized and materialized fits.

``gpu_check.py`` says how long each fit takes; this script says where the time goes.
Each fit runs once as a warm-up, once timed (device synchronized), and once under
:mod:`cProfile` with ``CUDA_LAUNCH_BLOCKING=1`` so that every kernel launch returns
only when the kernel has finished and the profile charges device time to the Python
call that launched it (the profiled fit is slower than the timed one; the ranking is
what matters). The data is ``gpu_check``'s synthetic star schema.

Run on a machine with a GPU (about a minute at 1e7 rows)::

    python benchmarks/gpu_profile.py --rows 1e7 --estimators linear_regression

``--dry-run`` runs the same code on NumPy (tiny sizes) to check the script itself.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def _profile(fn, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, default=1e7)
    parser.add_argument(
        "--estimators",
        default="linear_regression,logistic_regression",
        help="comma-separated names from gpu_check (linear_regression, "
        "logistic_regression, kmeans, gnmf, standard_scaler)",
    )
    parser.add_argument("--plans", default="factorized,materialized")
    parser.add_argument(
        "--dim-cols", type=int, default=8, help="columns of each dimension table"
    )
    parser.add_argument(
        "--dim-rows",
        type=int,
        default=10_000,
        help="rows of each dimension table (tuple ratio = rows / dim-rows)",
    )
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument(
        "--no-profile", action="store_true", help="time only, no cProfile tables"
    )
    parser.add_argument("--dry-run", action="store_true", help="NumPy, tiny sizes")
    args = parser.parse_args(argv)
    if not args.dry_run and not args.no_profile:
        # Before CuPy is imported: each launch waits for its kernel.
        os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    import gpu_check
    import numpy as np

    n = 2_000 if args.dry_run else int(args.rows)
    if args.dry_run:
        xp = np

        def sync() -> None:
            return None

        def device(ds):
            return ds
    else:
        import cupy as xp

        def sync() -> None:
            xp.cuda.Device().synchronize()

        def device(ds):
            return ds.to_device("gpu")

    wanted = set(args.estimators.split(","))
    plans = args.plans.split(",")
    data = {
        nonneg: device(
            gpu_check._star(
                n, nonneg=nonneg, dim_rows=args.dim_rows, dim_cols=args.dim_cols
            )
        )
        for nonneg in (False, True)
    }
    rng = np.random.default_rng(0)
    y = rng.standard_normal(n)
    targets = {"y": xp.asarray(y), "labels": xp.asarray((y > 0).astype(np.int64))}
    sync()
    for name, make, target, has_strategy in gpu_check._estimators():
        if name not in wanted:
            continue
        for plan in plans if has_strategy else ["factorized"]:
            kw = {"strategy": plan} if has_strategy else {}
            X = data[name == "gnmf"]
            yt = targets[target] if target else None

            def fit(make=make, kw=kw, X=X, yt=yt):
                make(**kw).fit(X, yt)
                sync()

            fit()
            t0 = time.perf_counter()
            fit()
            seconds = time.perf_counter() - t0
            print(
                f"\n##### {name} {plan}, {n:,} rows x {X.shape[1]} columns: "
                f"{seconds:.4f} s (synchronized)"
            )
            if not args.no_profile:
                print(_profile(fit, args.top))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
