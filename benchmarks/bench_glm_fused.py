"""The GLMs' compiled objective: fits before and after, against scikit-learn.

On the star of the logistic goal case (``make_multi_source(200_000, n_sources=2,
tuple_ratio=20, feature_ratio=2)``, 15 columns) with the target
``exp(0.5 * clip(standardized y, -6, 6))``, ``alpha=1e-3``, times interleaved in
one process (``_common.time_calls``), for each GLM:

* ``fused``: the factorized fit as shipped (the compiled row passes);
* ``array``: the same fit on the array code of ``_loss._loss_and_grad`` and
  without the fit's one-BLAS-thread block: the code before the compiled path;
* ``array-1blas``: the array code inside the one-BLAS-thread block (what the
  block alone changed);
* ``sklearn``: scikit-learn's GLM on ``ds.materialize()`` (built once, untimed);
* ``merge+sklearn``: ``pandas.merge`` of the frames, ``to_numpy`` and
  scikit-learn's fit.

Run once at the default threads and once in a child process on one thread
(``OMP_NUM_THREADS``, ``NUMBA_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` = 1 and
``threadpool_limits(1)``)::

    python benchmarks/bench_glm_fused.py [--rows 200000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import time_calls  # noqa: E402

ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def run(rows, repeat):
    from sklearn.linear_model import GammaRegressor, PoissonRegressor, TweedieRegressor

    from ilargi_sklearn.datasets import make_multi_source
    from ilargi_sklearn.linear_model import (
        FactorizedGammaRegressor,
        FactorizedPoissonRegressor,
        FactorizedTweedieRegressor,
        _glm,
        _loss,
    )

    data = make_multi_source(
        rows,
        n_sources=2,
        tuple_ratio=20,
        feature_ratio=2,
        random_state=0,
        return_frames=True,
    )
    ds, frames = data.dataset, data.frames
    t = data.target
    y = np.exp(0.5 * np.clip((t - t.mean()) / t.std(), -6, 6))
    X = ds.materialize()

    def merged():
        base = frames["base"]
        for k in (1, 2):
            dim = frames[f"dim{k}"].rename(columns={"key": f"fk{k}"})
            base = base.merge(dim, on=f"fk{k}", how="left")
        cols = [c for c in base.columns if c[0] in "xd"]
        # Unmatched keys: zeros, as the dataset reads them.
        return base[cols].fillna(0.0).to_numpy(dtype=np.float64)

    plan = _loss.fused_objective_plan

    @contextlib.contextmanager
    def array_code(one_blas):
        # No compiled plan: every fit's objective is the array code.
        _loss.fused_objective_plan = lambda op, power=None: None
        blas = _glm.one_blas_thread
        if not one_blas:
            _glm.one_blas_thread = contextlib.nullcontext
        try:
            yield
        finally:
            _loss.fused_objective_plan = plan
            _glm.one_blas_thread = blas

    cases = [
        ("poisson", FactorizedPoissonRegressor, PoissonRegressor, {}),
        ("gamma", FactorizedGammaRegressor, GammaRegressor, {}),
        ("tweedie-1.5", FactorizedTweedieRegressor, TweedieRegressor, {"power": 1.5}),
    ]
    for name, Ours, Theirs, params in cases:
        kw = dict(alpha=1e-3, **params)
        n_iter = {}

        def fused(Ours=Ours, kw=kw, n_iter=n_iter):
            n_iter["fused"] = Ours(**kw).fit(ds, y).n_iter_

        def array(Ours=Ours, kw=kw, n_iter=n_iter):
            with array_code(one_blas=False):
                n_iter["array"] = Ours(**kw).fit(ds, y).n_iter_

        def array_1blas(Ours=Ours, kw=kw):
            with array_code(one_blas=True):
                Ours(**kw).fit(ds, y)

        def sklearn(Theirs=Theirs, kw=kw, n_iter=n_iter):
            n_iter["sklearn"] = Theirs(**kw).fit(X, y).n_iter_

        def merge_sklearn(Theirs=Theirs, kw=kw):
            Theirs(**kw).fit(merged(), y)

        stats = time_calls(
            {
                "fused": fused,
                "array": array,
                "array-1blas": array_1blas,
                "sklearn": sklearn,
                "merge+sklearn": merge_sklearn,
            },
            repeat=repeat,
        )
        ms = {k: 1e3 * v["seconds"] for k, v in stats.items()}
        spread = {
            k: f"{1e3 * v['seconds_min']:.0f}-{1e3 * v['seconds_max']:.0f}"
            for k, v in stats.items()
        }
        print(
            f"{name:12s} fused {ms['fused']:6.1f} ({spread['fused']}) | "
            f"array {ms['array']:6.1f} ({spread['array']}) | "
            f"array-1blas {ms['array-1blas']:6.1f} ({spread['array-1blas']}) | "
            f"sklearn {ms['sklearn']:6.1f} ({spread['sklearn']}) | "
            f"merge+sklearn {ms['merge+sklearn']:6.1f} ms | "
            f"array/fused {ms['array'] / ms['fused']:.2f}x, "
            f"sklearn/fused {ms['sklearn'] / ms['fused']:.2f}x, "
            f"merge+sklearn/fused {ms['merge+sklearn'] / ms['fused']:.2f}x | "
            f"iterations {n_iter}",
            flush=True,
        )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):
            run(args.rows, args.repeat)
        return
    import ilargi_sklearn

    print(f"ilargi_sklearn from {os.path.dirname(ilargi_sklearn.__file__)}")
    print("default threads:", flush=True)
    run(args.rows, args.repeat)
    print("one thread:", flush=True)
    cmd = [sys.executable, __file__, "--child", f"--rows={args.rows}"]
    cmd.append(f"--repeat={args.repeat}")
    subprocess.run(cmd, env={**os.environ, **ONE_THREAD}, check=True)


if __name__ == "__main__":
    main()
