"""Produce the default cost model shipped in ``ilargi_sklearn/planner/data/``.

One calibration run (10 minutes on a 2-core machine): the Hamlet datasets first,
then the synthetic grid in a seeded random order until the budget is spent; then
the CatBoost model is trained on the records. The model and the records (our own
timings; the Hamlet-derived ones are numbers only, no data) are copied into the
package data folder.

Usage::

    python benchmarks/calibrate_default.py --hamlet ../shared/data/hamlet \
        --work /tmp/calib [--budget 600] [--install]

``--install`` copies ``cost_model.cbm`` and the records (gzip-compressed,
``calibration.jsonl.gz``) into
``ilargi_sklearn/planner/data/``. ``--estimators ridge,lasso,...`` times only those
kinds; with ``--extend`` the shipped records are kept and trained on too, and the
installed records are the shipped ones plus the new (the way a new estimator joins
the shipped model without re-timing the others); ``--add-records FILE`` trains on
and ships records measured elsewhere too (the real datasets' timings of
``eval_planner.py --goals --write-records``):

    python benchmarks/calibrate_default.py --hamlet ../shared/data/hamlet \
        --work /tmp/calib --budget 420 --estimators ridge,lasso,glm,pca,svd \
        --extend --install The run resumes from ``WORK/calibration.jsonl``
when interrupted. Hardware figures are measured into ``WORK/cache`` (set as
``ILARGI_CACHE_DIR``), so the user's own cache is left alone.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import os
import shutil
import time
from pathlib import Path


def _read_text(path: Path) -> str:
    """A records file's text (gzip-compressed when its name ends in .gz)."""
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hamlet", default=None, help="folder of the Hamlet datasets")
    ap.add_argument("--work", required=True, help="folder for records and the model")
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--install", action="store_true")
    ap.add_argument("--estimators", default=None, help="kinds to time (default all)")
    ap.add_argument("--extend", action="store_true", help="keep the shipped records")
    ap.add_argument(
        "--add-records",
        action="append",
        default=[],
        help="records measured elsewhere to train on and ship too (repeatable; "
        "eval_planner.py --goals --write-records writes the real datasets')",
    )
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ["ILARGI_CACHE_DIR"] = str(work / "cache")
    logging.basicConfig(level=logging.INFO, filename=work / "calibrate.log")

    from ilargi_sklearn.planner import calibrate
    from ilargi_sklearn.planner._calibrate import ESTIMATORS
    from ilargi_sklearn.planner._cost_model import checksum_path, shipped_records_path

    estimators = args.estimators.split(",") if args.estimators else ESTIMATORS
    shipped = Path(shipped_records_path())
    # Read before --install overwrites it.
    shipped_text = _read_text(shipped) if args.extend else ""
    added = [Path(p) for p in args.add_records]
    added_text = "".join(_read_text(p) for p in added)
    base = ([shipped] if args.extend else []) + added

    t0 = time.perf_counter()
    result = calibrate(
        work / "calibration.jsonl",
        budget_seconds=args.budget,
        hamlet_path=args.hamlet,
        repeats=args.repeats,
        random_state=0,
        estimators=estimators,
        progress=True,
        model_path=work / "cost_model.cbm",
        # The shipped model is this run's records alone, measured on the current
        # kernels (the records it replaces are not), unless the run only adds
        # estimators to it.
        base_records=base or None,
        install="always",
    )
    print(result.summary())
    print(f"trained {result.model_path} in {time.perf_counter() - t0:.0f} s")
    if args.install:
        data = (
            Path(__file__).resolve().parents[1] / "ilargi_sklearn" / "planner" / "data"
        )
        data.mkdir(exist_ok=True)
        shutil.copyfile(result.model_path, data / "cost_model.cbm")
        # The checksum file travels with the model: without it the model is not
        # loaded (planner._cost_model).
        shutil.copyfile(
            checksum_path(result.model_path), checksum_path(data / "cost_model.cbm")
        )
        new = (work / "calibration.jsonl").read_text()
        # mtime=0: the same records give the same bytes (no spurious diffs).
        with gzip.GzipFile(data / shipped.name, "wb", mtime=0) as fh:
            fh.write((shipped_text + added_text + new).encode())
        print(f"installed into {data}")


if __name__ == "__main__":
    main()
