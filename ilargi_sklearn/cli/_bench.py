"""``ilargi bench``: run the benchmark scripts of a source checkout and chart them.

The scripts (``benchmarks/bench_*.py``) ship with the source, not with the
installed package; each writes JSON-lines records, drawn here as the factorized
plan's speed-up per measured case.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ilargi_sklearn.cli._console import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    PLOT_HINT,
    Console,
    emit_json,
    import_pyplot,
)

logger = logging.getLogger(__name__)

BENCH_SCRIPTS = {
    "operators": "bench_operators.py",
    "estimators": "bench_estimators.py",
}


def find_benchmarks_dir(explicit: str | None = None) -> Path | None:
    """The ``benchmarks/`` folder of a source checkout, or None."""
    if explicit is not None:
        p = Path(explicit)
        return p if p.is_dir() else None
    candidates = [
        Path(__file__).resolve().parents[2] / "benchmarks",
        Path.cwd() / "benchmarks",
    ]
    for p in candidates:
        if any((p / s).is_file() for s in BENCH_SCRIPTS.values()):
            return p
    return None


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    bdir = find_benchmarks_dir(args.benchmarks_dir)
    if bdir is None:
        where = args.benchmarks_dir or "next to the package or in the current folder"
        console.stderr.write(
            "ilargi: error: the benchmark scripts were not found "
            f"({where}). They ship with the source, not with the installed package: "
            "run 'ilargi bench' from a source checkout of ilargi_sklearn, or pass "
            "--benchmarks-dir PATH/TO/benchmarks.\n"
        )
        return EXIT_USAGE
    names = list(BENCH_SCRIPTS) if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in BENCH_SCRIPTS]
    if unknown:
        console.stderr.write(
            f"ilargi: error: --only: unknown benchmark(s) {unknown}; known: "
            f"{list(BENCH_SCRIPTS)}.\n"
        )
        return EXIT_USAGE
    try:
        script_args = shlex.split(args.script_args)
    except ValueError as exc:
        console.stderr.write(
            f"ilargi: error: --script-args {args.script_args!r}: {exc}.\n"
        )
        return EXIT_USAGE
    out = Path(args.out) if args.out is not None else bdir / "results"
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"command": "bench", "out": str(out), "runs": []}
    status = EXIT_OK
    for name in names:
        script = bdir / BENCH_SCRIPTS[name]
        run: dict[str, Any] = {"benchmark": name, "script": str(script)}
        doc["runs"].append(run)
        if not script.is_file():
            console.note(f"note: {script} is missing; skipped.")
            run["status"] = "missing"
            continue
        records = out / f"{name}.jsonl"
        if records.exists():
            records.unlink()  # the scripts append; a rerun starts afresh
        cmd = [sys.executable, str(script), "--out", str(records)]
        if not args.full:
            cmd.append("--quick")
        if args.hamlet:
            cmd += ["--hamlet", args.hamlet]
        cmd += script_args
        console.info(f"\n$ {' '.join(cmd)}")
        t0 = time.perf_counter()
        quiet_child = console.quiet or console.json
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE if quiet_child else None,
            stderr=subprocess.PIPE if quiet_child else None,
            text=True,
            check=False,
        )
        run["seconds"] = time.perf_counter() - t0
        run["returncode"] = proc.returncode
        if proc.returncode != 0:
            tail = (proc.stderr or "").strip().splitlines()[-5:]
            console.stderr.write(
                f"ilargi: error: {script.name} exited with code {proc.returncode}"
                + (":\n  " + "\n  ".join(tail) if tail else "")
                + "\n"
            )
            run["status"] = "failed"
            status = EXIT_FAILURE
            continue
        run["status"] = "ok"
        run["records"] = str(records)
        rows = _read_jsonl(records)
        run["n_records"] = len(rows)
        try:
            chart = draw_bench_chart(rows, out / f"{name}.png", title=script.name)
        except ImportError:
            console.note(f"note: no chart: matplotlib is not installed; {PLOT_HINT}.")
            chart = None
        run["chart"] = None if chart is None else str(chart)
        console.result(
            f"{name}: {len(rows)} records in {records}"
            + (f", chart {chart}" if chart else "")
        )
    if console.json:
        emit_json(console, doc)
    return status


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("skipping a malformed record in %s", path)
    return rows


def bench_speedups(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """``(case, other plan, other seconds / factorized seconds)`` per measured case.

    A case is the records that differ only in ``plan`` (same benchmark, dataset,
    operator or estimator, grid point and device); each of its plans other than
    ``factorized`` gives one speed-up (above 1: factorized is faster).
    """
    cases: dict[str, dict[str, float]] = {}
    for r in rows:
        plan, secs = r.get("plan"), r.get("seconds")
        if not plan or not isinstance(secs, (int, float)) or secs <= 0:
            continue
        what = r.get("estimator") or r.get("operator") or ""
        grid = r.get("grid") or {}
        point = ",".join(
            f"{_abbrev(k)}{v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
            for k, v in grid.items()
        )
        label = " ".join(
            str(x) for x in (r.get("dataset"), what, point, r.get("device")) if x
        )
        cases.setdefault(label, {})[str(plan)] = float(secs)
    return [
        (label, other, secs / plans["factorized"])
        for label, plans in cases.items()
        if "factorized" in plans
        for other, secs in plans.items()
        if other != "factorized"
    ]


def _abbrev(key: str) -> str:
    return {
        "n_rows": "n=",
        "tuple_ratio": "TR=",
        "feature_ratio": "FR=",
        "n_dims": "dims=",
    }.get(key, f"{key}=")


def draw_bench_chart(
    rows: Sequence[dict[str, Any]], path: Path, *, title: str = ""
) -> Path | None:
    """Horizontal bars of factorized speed-ups per case; None when nothing to draw."""
    fig = _bench_figure(rows, title)
    if fig is None:
        return None
    fig.savefig(path, dpi=100)
    import_pyplot().close(fig)
    return path.resolve()


def _bench_figure(rows: Sequence[dict[str, Any]], title: str) -> Any:
    speedups = bench_speedups(rows)
    if not speedups:
        return None
    plt = import_pyplot()
    labels = list(dict.fromkeys(s[0] for s in speedups))
    others = list(dict.fromkeys(s[1] for s in speedups))
    height = 0.8 / len(others)
    # Room for every label: one bar per other plan, at least a text line each.
    fig, ax = plt.subplots(
        figsize=(9, max(0.25, 0.16 * len(others)) * len(labels) + 1.6)
    )
    for k, other in enumerate(others):
        ys, xs = [], []
        for label, o, v in speedups:
            if o == other:
                ys.append(labels.index(label) + (k - (len(others) - 1) / 2) * height)
                xs.append(v)
        ax.barh(ys, xs, height=height, label=f"{other} / factorized")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    # Labels on the 1-2-5 steps only: log-scale minor labels (2x10^-1, 3x10^-1,
    # ...) run into each other on the narrow ranges these ratios span.
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("speed-up of the factorized plan (log scale; right of 1: faster)")
    ax.invert_yaxis()
    ax.legend(fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    return fig
