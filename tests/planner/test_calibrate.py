"""Calibration installs a new cost model only when it predicts no worse.

The worlds are the shipped calibration records, split by workload: most of them are
the base (and train the "current" model), a few play a new calibration run, and the
K-Means workloads of the rest are the probe on which predictions are checked
against their measured times.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types

import numpy as np
import pytest

from ilargi_sklearn import cli
from ilargi_sklearn.planner import (
    default_model_path,
    load_cost_model,
    read_records,
    shipped_model_path,
    train_cost_model,
)
from ilargi_sklearn.planner._calibrate import (
    _base_records,
    _predict_records,
    _train_and_install,
)
from ilargi_sklearn.planner._cost_model import checksum_path, shipped_records_path

pytest.importorskip("catboost")
if not shipped_records_path().is_file():
    pytest.skip("no shipped calibration records", allow_module_level=True)

#: Small, single-threaded models: fast and deterministic.
FAST = {"iterations": 100, "thread_count": 1}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    """Models go to a temporary cache, never the user's."""
    monkeypatch.setenv("ILARGI_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("world")
    records = read_records(shipped_records_path())
    synthetic = [r for r in records if r["group"] == "synthetic"]
    ids = list(dict.fromkeys(r["workload"] for r in synthetic))
    # The probe: the last K-Means workloads of the records (later records may be of
    # other estimators only).
    kmeans = [r["workload"] for r in synthetic if r["estimator"] == "kmeans"]
    probe = set(list(dict.fromkeys(kmeans))[-20:])
    tiny, later = set(ids[:4]), set(ids[4:12])
    base = [r for r in records if r["workload"] not in tiny | later | probe]
    _write(tmp / "base.jsonl", base)
    current = train_cost_model(None, tmp / "current.cbm", records=base, **FAST)
    return types.SimpleNamespace(
        base=tmp / "base.jsonl",
        current=current,
        # A run on this machine: the first 4 workloads (12 records), then 8 more.
        tiny=[r for r in synthetic if r["workload"] in tiny],
        later=[r for r in synthetic if r["workload"] in later],
        probe=[
            r
            for r in synthetic
            if r["workload"] in probe and r["estimator"] == "kmeans"
        ],
    )


def _copy_model(src, dest):
    """Copy a model file with its checksum file (without it, it is not loaded)."""
    dest.write_bytes(src.read_bytes())
    checksum_path(dest).write_text(
        checksum_path(src).read_text().replace(src.name, dest.name)
    )


def _write(path, records, time=None, mode="w"):
    """Records as JSON lines; ``time``: stamps them as measured from then on."""
    with open(path, mode) as fh:
        for i, r in enumerate(records):
            fh.write(json.dumps(r if time is None else {**r, "time": time + i}) + "\n")


def _kmeans_error(model_path, probe):
    """Median and largest factor between predicted and measured K-Means seconds."""
    model = load_cost_model(os.fspath(model_path))
    predicted = np.asarray(_predict_records(model, probe))
    measured = np.array([r["seconds"] for r in probe])
    err = np.abs(np.log10(predicted / measured))
    return 10 ** np.median(err), 10 ** err.max()


def test_a_tiny_run_does_not_spoil_the_kmeans_predictions(world, tmp_path):
    """The reported failure: 12 records alone made a model whose K-Means
    predictions are far off; trained with the base records and judged, the model
    in effect predicts K-Means as well as the current one."""
    records = tmp_path / "records.jsonl"
    _write(records, world.tiny, time=3e9)
    alone = train_cost_model(records, tmp_path / "alone.cbm", **FAST)
    current_median, _ = _kmeans_error(world.current, world.probe)
    alone_median, alone_max = _kmeans_error(alone, world.probe)
    assert current_median < 1.25
    assert alone_median > 1.4 and alone_max > 3.0

    dest = tmp_path / "model.cbm"
    _copy_model(world.current, dest)
    result = _train_and_install(records, dest, base_records=world.base, **FAST)
    assert (result.n_records, result.n_new_records, result.n_new_workloads) == (
        12,
        12,
        4,
    )
    assert result.n_base_records == len(read_records(world.base))
    assert result.n_folds == 3
    after_median, _ = _kmeans_error(result, world.probe)
    assert after_median < 1.25 and after_median < current_median * 1.05


def test_a_later_run_replaces_a_spoiled_model(world, tmp_path):
    """The model that the tiny run alone wrote is replaced by the next run, which
    is judged on the records that model has not seen."""
    records = tmp_path / "records.jsonl"
    _write(records, world.tiny, time=3e9)
    dest = train_cost_model(records, tmp_path / "model.cbm", **FAST)
    assert load_cost_model(str(dest)).records_until == pytest.approx(3e9 + 11)
    _write(records, world.later, time=4e9, mode="a")

    result = _train_and_install(records, dest, base_records=world.base, **FAST)
    assert result.installed and result.model_path == dest
    assert result.current_model == str(dest)
    assert (result.n_records, result.n_new_records, result.n_new_workloads) == (
        36,
        24,
        8,
    )
    assert (
        result.new["median_abs_log10_error"]
        < 0.5 * result.current["median_abs_log10_error"]
    )
    assert result.new["time_lost"] <= result.current["time_lost"]
    assert result.current["n_choices"] == result.new["n_choices"] == 8
    median, _ = _kmeans_error(dest, world.probe)
    assert median < 1.25
    text = result.summary()
    assert "24 new to the current model (8 workloads)" in text
    assert f"installed the new model at {dest}" in text
    cur = result.current["median_abs_log10_error"]
    assert f"current model  {cur:.3f} (x{10**cur:.2f})" in text

    # Nothing newer than the installed model: nothing to judge, nothing written.
    before = dest.read_bytes()
    again = _train_and_install(records, dest, base_records=world.base, **FAST)
    assert not again.installed and again.n_new_records == 0 and again.n_folds == 0
    assert "no records new" in again.reason
    assert dest.read_bytes() == before and again.model_path == dest


def test_keeps_a_model_that_predicts_the_new_records_exactly(world, tmp_path):
    current = load_cost_model(str(world.current))
    exact = [
        {**r, "seconds": s}
        for r, s in zip(world.later, _predict_records(current, world.later))
    ]
    records = tmp_path / "records.jsonl"
    _write(records, exact, time=3e9)
    dest = tmp_path / "model.cbm"
    _copy_model(world.current, dest)
    before = dest.read_bytes()
    result = _train_and_install(records, dest, base_records=world.base, **FAST)
    assert not result.installed and result.model_path == dest
    assert result.current["median_abs_log10_error"] == pytest.approx(0.0, abs=1e-9)
    assert result.new["median_abs_log10_error"] > 1e-3
    assert result.reason.startswith("the new model's error is larger")
    assert dest.read_bytes() == before
    assert f"kept the current model: {result.reason}" in result.summary()


def test_without_base_records(world, tmp_path):
    records = tmp_path / "records.jsonl"
    _write(records, world.tiny[:3], time=3e9)  # one workload
    dest = tmp_path / "model.cbm"
    kept = _train_and_install(records, dest, base_records=None, **FAST)
    # Nothing to train a model on without the one workload: not judged.
    assert not kept.installed and kept.n_folds == 0 and not dest.exists()
    assert kept.model_path == default_model_path() == shipped_model_path()
    assert "no base records" in kept.reason
    # How the shipped model is produced: its own records alone, always installed.
    _write(records, world.tiny[3:], time=4e9, mode="a")
    result = _train_and_install(records, dest, base_records=None, install="always")
    assert result.installed and dest.is_file() and result.n_base_records == 0
    assert result.n_folds == 3 and result.new["n_choices"] == 4

    # A result stands for the model to use, wherever a path is expected.
    assert os.fspath(kept) == str(shipped_model_path())
    assert 'AutoPlan(cost_model="default") uses' in kept.summary()
    assert os.fspath(result) == str(dest)
    assert f'AutoPlan(cost_model="{dest}")' in result.summary()
    assert json.loads(json.dumps(result.to_dict()))["model_path"] == str(dest)
    with pytest.raises(TypeError, match="analytical"):
        os.fspath(dataclasses.replace(kept, model_path=None))


def test_base_records_skip_those_of_the_records_file():
    shipped = read_records(shipped_records_path())
    assert _base_records("shipped", exclude=shipped) == []
    assert len(_base_records("shipped", exclude=shipped[:30])) == len(shipped) - 30
    assert _base_records(None, exclude=[]) == []


def test_install_must_be_known(tmp_path):
    with pytest.raises(ValueError, match="install must be 'if_better' or 'always'"):
        _train_and_install(tmp_path / "r.jsonl", install="better")


def test_cli_calibrate_shows_the_figures(monkeypatch, tmp_path, capsys):
    """A real (tiny) calibration through the command line: its text and its JSON
    carry the held-out figures and the decision."""
    from ilargi_sklearn.planner import _calibrate

    work = [
        {
            "group": "synthetic",
            "estimator": kind,
            "params": {"max_iter": 3} if kind != "linear" else {},
            "data": {"n_rows": 400, "tuple_ratio": tr},
        }
        for kind in ("linear", "kmeans")
        for tr in (2.0, 20.0)
    ]
    monkeypatch.setattr(_calibrate, "default_workloads", lambda **kw: work)
    records, model = tmp_path / "r.jsonl", tmp_path / "m.cbm"
    args = ["calibrate", "--records", str(records), "--model", str(model), "-q"]
    assert cli.main([*args, "--budget", "30"]) == 0
    out = capsys.readouterr().out
    n_shipped = len(read_records(shipped_records_path()))
    assert f"records: {n_shipped} shipped + 12 in {records}" in out
    assert "held-out figures on the 12 new records (3-fold" in out
    assert "current model  " in out and "new model  " in out
    assert ("installed the new model" in out) == model.is_file()
    assert ("kept the current model" in out) != model.is_file()

    # Resumed: no new workload, no new record; the JSON says so.
    assert cli.main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_records"] == 12 and doc["n_base_records"] == n_shipped
    if model.is_file():
        assert doc["n_new_records"] == 0 and not doc["installed"]
        assert doc["model_path"] == str(model)
    else:
        assert doc["n_new_records"] == 12 and doc["current"] and doc["new"]
        assert doc["model_path"] == str(shipped_model_path())
    assert isinstance(doc["reason"], str) and doc["records_path"] == str(records)
