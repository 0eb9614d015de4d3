"""Speed on a busy machine: each estimator idle and beside a CPU-bound process.

Usage::

    python benchmarks/bench_load.py [--hamlet PATH] [--hamlet-name NAME]
        [--estimators linear,logistic,kmeans,gnmf] [--threads default,1]
        [--rows N,...] [--repeat N] [--quick] [--out FILE]

For each estimator, on the synthetic goal case of ``bench_estimators.py`` (2e5 target
rows, two left-joined tables, tuple ratio 20, feature ratio 2), on the same schema at
1e6 rows (``--rows``: the compiled kernels take a second thread from about 4e5 rows)
and on one Hamlet dataset (``--hamlet-name``, default Flights; with ``--hamlet``), two
sides fit the same model with the budgets of ``bench_estimators.SETTINGS``:

* ``ilargi``: the factorized estimator on the :class:`~ilargi_sklearn.MultiSourceDataset`;
* ``sklearn``: scikit-learn's estimator on the joined matrix (``pandas.merge``, encoded,
  as a NumPy array for the synthetic case; the SciPy CSR join for Hamlet), built once
  before any timing.

Each side is timed ``idle`` and ``loaded``: beside one CPU-bound process (a Python
busy loop) that the benchmark starts, and stops (``SIGSTOP``) while it times ``idle``.
Conditions and sides are interleaved in every round (the order alternates from round
to round), so that whatever else the machine runs slows all of them alike; each
record also keeps the CPU that other processes took while it was timed
(``foreign_load``, cores: from ``/proc/stat``, less this process and the load
process).

Each thread setting runs in its own child process: ``default`` (nothing set: the
thread counts a user gets) and ``1`` (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
``MKL_NUM_THREADS`` and ``NUMBA_NUM_THREADS`` set to 1 before the child imports
NumPy). A child first fits every estimator on a 2,000-row stand-in (imports, compiled
kernels), then once at full size (numba compiles per argument type), then the rounds.

The table gives, per thread setting, the median seconds of each side and condition,
the slowdowns ``loaded / idle`` of both sides and the speed-up ``sklearn / ilargi``
idle and loaded. The goal (``ok``): ilargi's slowdown no worse than scikit-learn's
(within 5%, the noise of these medians), and ilargi still ahead loaded wherever it is
ahead idle. ``--sides ilargi,ilargi-1`` compares instead ilargi with itself, its
kernels on one thread (an OpenMP limit, which the kernels follow): ``ok`` when the
default threads are nowhere slower (within 5%), idle or loaded. Every figure is one
JSON-lines record (``benchmark="load"``; fields in ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_estimators as be  # noqa: E402
from _common import hardware_info, print_table, write_records  # noqa: E402

SIDES = ("ilargi", "ilargi-1", "sklearn")
CONDITIONS = ("idle", "loaded")
THREAD_SETTINGS = ("default", "1")
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)
#: The CPU-bound neighbour: one core's worth of pure Python.
LOAD_COMMAND = [sys.executable, "-c", "while True: pass"]
#: A fit whose full-size run took longer than this is timed once per condition.
LONG_FIT_SECONDS = 5.0
#: Slowdowns within this factor of scikit-learn's count as no worse: the medians
#: of one-thread fits, which a neighbour should not slow, moved by up to 5%.
NOISE = 1.05
_TICK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ CPU accounting
def _busy_seconds() -> float:
    """CPU seconds all cores have been busy since boot (``/proc/stat``)."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / _TICK  # less idle and iowait


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Neighbour:
    """The CPU-bound load process, stopped (``SIGSTOP``) unless ``loaded``."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(LOAD_COMMAND)
        self.running = True
        self.set(False)

    def set(self, loaded: bool) -> None:
        if loaded != self.running:
            os.kill(self.proc.pid, signal.SIGCONT if loaded else signal.SIGSTOP)
            self.running = loaded
            # Let the scheduler settle (the load process reaches its core).
            time.sleep(0.05)

    def cpu(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def timed(fit: Any, neighbour: Neighbour) -> tuple[float, float]:
    """Seconds of ``fit()`` and the cores other processes used meanwhile."""
    gc.collect()
    own0, load0, busy0 = _cpu_seconds(os.getpid()), neighbour.cpu(), _busy_seconds()
    t0 = time.perf_counter()
    fit()
    seconds = time.perf_counter() - t0
    own1, load1, busy1 = _cpu_seconds(os.getpid()), neighbour.cpu(), _busy_seconds()
    foreign = (busy1 - busy0) - (own1 - own0) - (load1 - load0)
    return seconds, max(foreign, 0.0) / seconds


# --------------------------------------------------------------------------- child
def child_main(
    case: dict[str, Any],
    estimators: list[str],
    repeat: int,
    sides: list[str],
    min_chunk_rows: int | None,
) -> None:
    """Time one case at this process's thread setting; print one JSON line."""
    from threadpoolctl import ThreadpoolController

    from ilargi_sklearn._backend import _launcher

    # Made once: a fresh threadpool_limits scans the loaded libraries (ms).
    controller = ThreadpoolController()

    if min_chunk_rows:
        _launcher.MIN_CHUNK_ROWS = dict.fromkeys(
            _launcher.MIN_CHUNK_ROWS, min_chunk_rows
        )
    inp = be.load_inputs(case)
    tiny = inp.head(be.WARMUP_ROWS)
    contexts = {id(inp): be.make_context(inp, estimators)}
    contexts[id(tiny)] = be.make_context(tiny, estimators)
    inputs: dict[int, dict[str, Any]] = {}  # the dataset and the join, once each
    fits: dict[tuple[str, str], Any] = {}
    for est in estimators:
        for source in (tiny, inp):
            c = contexts[id(source)]
            data = source.nonneg if est == "gnmf" else source
            if id(data) not in inputs:
                inputs[id(data)] = {
                    "ilargi": be.build_dataset(data),
                    "sklearn": be.join_baseline(data),
                }
            for side in sides:
                plan = "merge+sklearn" if side == "sklearn" else "factorized"
                X = inputs[id(data)]["sklearn" if side == "sklearn" else "ilargi"]
                # ilargi-1: the kernels on one thread (an OpenMP limit), BLAS as set.
                one = side == "ilargi-1"

                def fit(est=est, plan=plan, X=X, data=data, c=c, one=one):
                    args = (est, plan, X, data, c, be.fresh_arguments(est, plan, c))
                    if one:
                        with controller.limit(limits=1, user_api="openmp"):
                            be._fit(*args)
                    else:
                        be._fit(*args)

                t0 = time.perf_counter()
                fit()  # stand-in: imports; full size: kernels for its types
                if source is inp:
                    fits[est, side] = fit, time.perf_counter() - t0
    results: dict[str, list[tuple[float, float]]] = {}
    neighbour = Neighbour()
    try:
        for r in range(repeat):
            conditions = CONDITIONS if r % 2 == 0 else CONDITIONS[::-1]
            order = sides if r % 2 == 0 else sides[::-1]
            for cond in conditions:
                neighbour.set(cond == "loaded")
                for est in estimators:
                    for side in order:
                        fit, first = fits[est, side]
                        if r and first > LONG_FIT_SECONDS:
                            continue
                        key = f"{est}|{side}|{cond}"
                        results.setdefault(key, []).append(timed(fit, neighbour))
    finally:
        neighbour.close()
    print(
        json.dumps(
            {
                "fields": contexts[id(inp)].fields,
                "results": results,
                "n_threads": _launcher.n_threads(),
                "min_chunk_rows": _launcher.MIN_CHUNK_ROWS,
                "settings": be.SETTINGS,
            }
        )
    )


def run_child(case: dict, args: argparse.Namespace, threads: str) -> dict:
    env = dict(os.environ)
    for var in THREAD_VARS:
        env.pop(var, None)
        if threads != "default":
            # Read by OpenBLAS, OpenMP and numba when the child imports them.
            env[var] = threads
    argv = [os.path.abspath(__file__), "--child", json.dumps(case)]
    argv += ["--estimators", args.estimators, "--repeat", str(args.repeat)]
    argv += ["--sides", args.sides, "--min-chunk-rows", str(args.min_chunk_rows or 0)]
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"child for {case} (threads {threads}) failed with code "
            f"{proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ reports
def case_records(
    case: dict, out: dict, threads: str, common: dict[str, Any]
) -> list[dict[str, Any]]:
    records = []
    for key, runs in out["results"].items():
        est, side, cond = key.split("|")
        seconds = [s for s, _ in runs]
        records.append(
            {
                **common,
                "benchmark": "load",
                "estimator": est,
                "side": side,
                "sklearn_estimator": be.SKLEARN_NAMES[est],
                "condition": cond,
                "threads": threads,
                "n_threads": {"ilargi": out["n_threads"], "ilargi-1": 1}.get(side),
                "min_chunk_rows": out["min_chunk_rows"],
                "dataset": be.case_label(case),
                "dataset_family": case["dataset"],
                "case": {k: v for k, v in case.items() if k != "path"},
                **out["fields"],
                "seconds": statistics.median(seconds),
                "seconds_min": min(seconds),
                "seconds_max": max(seconds),
                "repeat": len(seconds),
                "seconds_all": seconds,
                "foreign_load": statistics.median(f for _, f in runs),
                "settings": out["settings"],
            }
        )
    return records


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


#: Short names of the sides in the tables.
LABELS = {"ilargi": "ilargi", "ilargi-1": "1-thread", "sklearn": "sk"}


def summary_rows(
    records: list[dict[str, Any]], other: str = "sklearn"
) -> list[dict[str, Any]]:
    """One row per (threads, dataset, estimator): ilargi and ``other``, idle and
    loaded, their slowdowns and the speed-up ``other / ilargi``."""
    cells: dict[tuple, dict[tuple[str, str], dict]] = {}
    for r in records:
        if r.get("benchmark") == "load":
            key = (r["threads"], r["dataset"], r["estimator"])
            cells.setdefault(key, {})[r["side"], r["condition"]] = r
    o = LABELS[other]
    rows = []
    for (threads, dataset, est), c in cells.items():
        wanted = [(side, cond) for side in ("ilargi", other) for cond in CONDITIONS]
        if any(k not in c for k in wanted):
            continue
        s = {k: c[k]["seconds"] for k in wanted}
        slow_i = _ratio(s["ilargi", "loaded"], s["ilargi", "idle"])
        slow_o = _ratio(s[other, "loaded"], s[other, "idle"])
        up_idle = _ratio(s[other, "idle"], s["ilargi", "idle"])
        up_loaded = _ratio(s[other, "loaded"], s["ilargi", "loaded"])
        if other == "sklearn":
            ok = slow_i <= NOISE * slow_o and (up_idle <= 1.0 or up_loaded > 1.0)
        else:  # the kernels' threads: never slower than one, idle or loaded
            ok = min(up_idle, up_loaded) * NOISE >= 1.0
        rows.append(
            {
                "threads": threads,
                "dataset": dataset,
                "estimator": est,
                "ilargi idle": f"{s['ilargi', 'idle']:.3f}",
                "ilargi loaded": f"{s['ilargi', 'loaded']:.3f}",
                f"{o} idle": f"{s[other, 'idle']:.3f}",
                f"{o} loaded": f"{s[other, 'loaded']:.3f}",
                "slowdown ilargi": f"{slow_i:.2f}x",
                f"slowdown {o}": f"{slow_o:.2f}x",
                f"{o}/ilargi idle": f"{up_idle:.2f}x",
                f"{o}/ilargi loaded": f"{up_loaded:.2f}x",
                "other load": f"{max(c[k]['foreign_load'] for k in wanted):.2f}",
                "ok": "yes" if ok else "NO",
            }
        )
    return rows


def columns(other: str = "sklearn") -> list[str]:
    o = LABELS[other]
    return [
        "threads",
        "dataset",
        "estimator",
        "ilargi idle",
        "ilargi loaded",
        f"{o} idle",
        f"{o} loaded",
        "slowdown ilargi",
        f"slowdown {o}",
        f"{o}/ilargi idle",
        f"{o}/ilargi loaded",
        "other load",
        "ok",
    ]


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hamlet", metavar="PATH", help="folder of the Hamlet datasets")
    p.add_argument(
        "--hamlet-name", default="Flights", help="Hamlet dataset (default %(default)s)"
    )
    p.add_argument(
        "--estimators", default=",".join(be.ESTIMATORS), help="comma-separated subset"
    )
    p.add_argument(
        "--threads",
        default=",".join(THREAD_SETTINGS),
        help="comma-separated thread settings: default, or a number (default "
        "%(default)s)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds (default %(default)s; fits longer than "
        f"{LONG_FIT_SECONDS:g} s run in the first only)",
    )
    p.add_argument(
        "--rows",
        default="200000,1000000",
        help="target rows of the synthetic cases, comma-separated (default "
        "%(default)s: the goal case, and one large enough for the kernels to take "
        "two threads)",
    )
    p.add_argument(
        "--sides",
        default="ilargi,sklearn",
        help="comma-separated subset of ilargi, ilargi-1 (ilargi with its kernels on "
        "one thread: where a second thread pays, idle and loaded), sklearn "
        "(default %(default)s)",
    )
    p.add_argument(
        "--min-chunk-rows",
        type=int,
        default=None,
        metavar="N",
        help="set every kernel's fewest rows per chunk to N (the thresholds of "
        "_launcher.MIN_CHUNK_ROWS; to measure them)",
    )
    p.add_argument(
        "--quick", action="store_true", help="one synthetic case of 5e4 rows, 1 round"
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        default=os.path.join("benchmarks", "results", "load.jsonl"),
        help="append JSON-lines records to FILE (default %(default)s; '' for none)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    estimators = [e for e in args.estimators.split(",") if e]
    unknown = set(estimators) - set(be.ESTIMATORS)
    if unknown:
        p.error(f"unknown estimators {sorted(unknown)}; choose from {be.ESTIMATORS}")
    sides = [t for t in args.sides.split(",") if t]
    if not sides or set(sides) - set(SIDES):
        p.error(f"--sides takes a subset of {SIDES}, got {args.sides!r}")
    if args.child:
        warnings.simplefilter("ignore")  # convergence warnings at fixed budgets
        child = json.loads(args.child)
        child_main(child, estimators, args.repeat, sides, args.min_chunk_rows)
        return 0
    settings = [t.strip() for t in args.threads.split(",") if t.strip()]
    for t in settings:
        if t != "default" and not (t.isdigit() and int(t) >= 1):
            p.error(f"--threads takes 'default' or a positive integer, got {t!r}")
    others = [o for o in ("sklearn", "ilargi-1") if o in sides]
    if "ilargi" not in sides or not others:
        p.error("--sides needs ilargi and at least one of sklearn, ilargi-1")
    rows = [50_000] if args.quick else [int(r) for r in args.rows.split(",") if r]
    if args.quick:
        args.repeat = 1
    cases = [
        {
            "dataset": "synthetic",
            "n_rows": n,
            "tuple_ratio": be.GOAL_TR,
            "feature_ratio": be.GOAL_FR,
            "n_sources": be.N_SOURCES,
            "n_base_features": be.N_BASE_FEATURES,
            "seed": 0,
        }
        for n in rows
    ]
    if args.hamlet and not args.quick:
        cases += be.hamlet_cases(args.hamlet, False, args.hamlet_name)
    common = {
        "run_id": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": " ".join(
            ["python", "benchmarks/bench_load.py", *(argv or sys.argv[1:])]
        ),
        "load_command": "python -c 'while True: pass'",
        "code": be.code_version(),
        "hardware": hardware_info(),
    }
    hw = common["hardware"]
    print(f"{hw['cpu']}, {hw['cores']} cores; settings {be.SETTINGS}")
    out = args.out or None
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    for threads in settings:
        for case in cases:
            t0 = time.perf_counter()
            res = run_child(case, args, threads)
            recs = case_records(case, res, threads, common)
            write_records(out, recs)
            records += recs
            print(
                f"\n{be.case_label(case)}, threads {threads} (ilargi's kernels: "
                f"{res['n_threads']}; {time.perf_counter() - t0:.0f} s)"
            )
            for other in others:
                print_table(summary_rows(recs, other), columns(other)[3:])
    for other in others:
        print(
            f"\n=== slowdown = loaded / idle; speed-up = {other} / ilargi "
            f"({LABELS[other]}) ==="
        )
        print_table(summary_rows(records, other), columns(other))
    print(
        f"\nok: against sklearn, ilargi's slowdown at most {NOISE:g} x sklearn's, "
        "and ilargi ahead loaded where ahead idle; against 1-thread (ilargi with its "
        f"kernels on one thread), ilargi at most {NOISE:g} x slower idle and "
        "loaded; 'other load': cores other processes used (worst cell)"
    )
    print(f"total {time.perf_counter() - start:.0f} s; records appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
