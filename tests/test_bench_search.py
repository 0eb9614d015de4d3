"""benchmarks/bench_search.py: a tiny ``--quick`` run writes every policy's
record and the goal checks (the timings themselves are not tested)."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_search.py"


def _bench_search():
    spec = importlib.util.spec_from_file_location("_bench_search_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_quick_run_writes_records_and_goals(tmp_path, capsys):
    bench = _bench_search()
    out = tmp_path / "search.jsonl"
    args = ["--quick", "--rows", "1500", "--datasets", "synthetic"]
    args += ["--estimators", "ridge,kmeans", "--parts", "batch,cv", "--no-warmup"]
    assert bench.main([*args, "--out", str(out), "--plot", ""]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    batch = [r for r in records if r["part"] == "batch"]
    assert {(r["estimator"], r["policy"]) for r in batch} == {
        (e, p) for e in ("ridge", "kmeans") for p in bench.POLICIES
    }
    # The same folds and grids on every side: the same choice as scikit-learn's.
    assert all(r["best_params_equal"] for r in batch)
    assert all(r["seconds"] > 0 and r["n_fits"] > 1 for r in batch)
    auto = [r for r in batch if r["policy"] == "auto+sharing"]
    assert all(sum(r["plans"].values()) == r["n_fits"] for r in auto)
    cv = [r for r in records if r["part"] == "cv"]
    assert {r["estimator"] for r in cv} == set(bench.CV_SPECS)
    goals = [r for r in records if r["part"] == "goal"]
    assert len(goals) == 4 + len(bench.CV_SPECS)
    assert "goals" in capsys.readouterr().out


def test_environment_figures_write_with_scipy_mmio_loaded():
    """SciPy's Matrix Market reader registers with threadpoolctl once its core is
    loaded (an earlier ``mmwrite`` in the process) and reports its version as a
    function: every benchmark record of that process failed to write."""
    import io

    import scipy.io
    import scipy.sparse as sp

    scipy.io.mmwrite(io.BytesIO(), sp.eye(2, format="coo"))
    spec = importlib.util.spec_from_file_location(
        "_common_under_test", SCRIPT.parent / "_common.py"
    )
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    info = common._blas_info()
    assert any(d["internal_api"] == "scipy_mmio" for d in info)
    json.loads(json.dumps(info))
