"""The ``ilargi`` command line: demo, fit from a TOML spec, calibrate, bench."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest

from ilargi_sklearn import _demo, cli
from ilargi_sklearn._demo import Console, Progress, merge_and_encode
from ilargi_sklearn.cli import SpecError, find_line, load_spec, main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HAS_MPL = _demo.importlib.util.find_spec("matplotlib") is not None


def run(argv, capsys):
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    # On a shared machine, spinning BLAS threads make the tiny fits of these tests
    # 10x slower; one thread changes no result.
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


# ---------------------------------------------------------------- data
def write_star(folder: Path, n: int = 400, seed: int = 0) -> None:
    """A tiny star schema with a snowflake hop and a string key."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    brands = pd.DataFrame({"brand_id": np.arange(5), "rating": rng.uniform(1, 5, 5)})
    products = pd.DataFrame(
        {
            "product_id": np.arange(30),
            "brand_id": rng.integers(0, 5, 30),
            "price": rng.uniform(1, 50, 30),
            "category": rng.choice(["a", "b", "c"], 30),
        }
    )
    customers = pd.DataFrame(
        {"customer_id": [f"C{i}" for i in range(40)], "age": rng.integers(18, 80, 40)}
    )
    cust = np.array(customers["customer_id"])[rng.integers(0, 40, n)]
    cust[rng.random(n) < 0.1] = "GUEST"
    sales = pd.DataFrame(
        {
            "customer_id": cust,
            "product_id": rng.integers(0, 30, n),
            "quantity": rng.integers(1, 5, n),
        }
    )
    p = products.set_index("product_id").loc[sales["product_id"]]
    b = brands.set_index("brand_id").loc[p["brand_id"]]
    sales["y"] = (
        2.0 * sales["quantity"].to_numpy()
        + 0.5 * p["price"].to_numpy()
        + 3.0 * b["rating"].to_numpy()
        + rng.normal(0, 0.5, n)
    )
    sales.loc[3, "y"] = np.nan  # a row without a target is dropped
    for name, frame in [
        ("sales", sales),
        ("products", products),
        ("brands", brands),
        ("customers", customers),
    ]:
        frame.to_csv(folder / f"{name}.csv", index=False)


SPEC = """\
base = "sales"

[tables.sales]
path = "data/sales.csv"
numeric = ["quantity"]

[tables.products]
path = "data/products.csv"
key = "product_id"
numeric = ["price"]
categorical = ["category"]

[tables.brands]
path = "data/brands.csv"
key = "brand_id"
numeric = ["rating"]

[tables.customers]
path = "data/customers.csv"
key = "customer_id"
numeric = ["age"]

[[joins]]
table = "products"
on = "product_id"

[[joins]]
table = "brands"
via = "products"
on = "brand_id"

[[joins]]
table = "customers"
left_on = "customer_id"
how = "left"
indicator = true

[target]
column = "y"

[estimator]
name = "FactorizedLinearRegression"
plan = "factorized"

[cv]
folds = 3
scoring = "r2"
"""


@pytest.fixture
def star(tmp_path):
    write_star(tmp_path / "data")
    spec = tmp_path / "star.toml"
    spec.write_text(SPEC)
    return spec


def variant(spec: Path, old: str, new: str, name: str = "bad.toml") -> Path:
    text = spec.read_text()
    assert old in text, old
    out = spec.parent / name
    out.write_text(text.replace(old, new, 1))
    return out


# ---------------------------------------------------------------- help
def test_help_lists_every_command(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for cmd in ("demo", "fit", "calibrate", "bench"):
        assert cmd in out


@pytest.mark.parametrize("cmd", ["demo", "fit", "calibrate", "bench"])
def test_help_of_each_command(cmd, capsys):
    code, out, _ = run([cmd, "--help"], capsys)
    assert code == 0
    assert f"usage: ilargi {cmd}" in out
    assert "--quiet" in out and "--json" in out


def test_no_command_prints_help_and_fails(capsys):
    code, out, _ = run([], capsys)
    assert code == 2
    assert "COMMAND" in out


def test_usage_error_exit_code(capsys):
    code, _, err = run(["demo", "--n-rows", "-3"], capsys)
    assert code == 2
    assert "positive integer" in err


def test_python_dash_m():
    proc = subprocess.run(
        [sys.executable, "-m", "ilargi_sklearn", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("ilargi ")


# ---------------------------------------------------------------- console
class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_redraws_in_place():
    s = _TTY()
    with Progress(3, "work", stream=s) as bar:
        bar.advance()
        bar.advance(2, note="done")
    text = s.getvalue()
    assert text.count("\r") >= 3  # initial draw + two advances (+ close)
    assert "3/3" in text and "done" in text and text.endswith("\n")


def test_progress_bar_elsewhere_writes_one_line_and_quiet_nothing():
    s = io.StringIO()
    with Progress(2, "work", stream=s) as bar:
        bar.advance()
        bar.advance()
    assert s.getvalue().count("\n") == 1 and "\r" not in s.getvalue()
    s = _TTY()
    with Progress(2, "work", stream=s, enabled=False) as bar:
        bar.advance()
    assert s.getvalue() == ""


def test_console_modes():
    out, err = io.StringIO(), io.StringIO()
    c = Console(quiet=True, stdout=out, stderr=err)
    c.info("narration")
    c.result("result")
    assert out.getvalue() == "result\n"
    out = io.StringIO()
    c = Console(json=True, stdout=out, stderr=err)
    c.info("narration")
    c.result("result")
    assert out.getvalue() == ""


# ---------------------------------------------------------------- baseline
def test_merge_and_encode_equals_the_materialized_dataset():
    from ilargi_sklearn.datasets import load_flights
    from ilargi_sklearn.datasets._flights import BASE_FEATURES

    data = load_flights(n_rows=1500)
    X, names = merge_and_encode(
        data.frames["flights"], BASE_FEATURES, data.joins, base_name="flights"
    )
    T = data.dataset.materialize()
    T = T.toarray() if hasattr(T, "toarray") else np.asarray(T)
    fn = [str(f) for f in data.dataset.feature_names]
    assert X.shape[0] == T.shape[0]
    assert set(names) <= set(fn)
    pos = {n: i for i, n in enumerate(names)}
    for j, name in enumerate(fn):
        if name in pos:
            np.testing.assert_allclose(X[:, pos[name]], T[:, j], rtol=1e-12, atol=0)
        else:  # a category that no joined row takes: all zero in the dataset
            assert not np.any(T[:, j]), name


# ---------------------------------------------------------------- demo
@pytest.fixture(scope="module")
def demo_json(tmp_path_factory):
    """One small demo run with --json (the planner as installed)."""
    chart = tmp_path_factory.mktemp("demo") / "chart.png"
    out, err = io.StringIO(), io.StringIO()
    console = Console(json=True, stdout=out, stderr=err)
    report = _demo.run_demo(console, n_rows=3000, cv=2, chart=chart)
    return report, chart, err.getvalue()


def test_demo_compares_side_by_side(demo_json):
    report, chart, err = demo_json
    assert report["schema"]["summary"]["n_rows"] == 3000
    assert set(report["schema"]["sources"]) == {
        "flights",
        "airlines",
        "planes",
        "origin",
        "dest",
        "weather",
    }
    # Both sides fit the same models on the same matrix and folds.
    for task in ("regressor", "classifier"):
        ours = report["cv"][task]["ilargi"]
        theirs = report["cv"][task]["baseline"]
        assert len(ours["scores"]) == len(theirs["scores"]) == 2
        np.testing.assert_allclose(ours["scores"], theirs["scores"], atol=2e-3)
    steps = [c["step"] for c in report["comparison"]]
    assert steps[-1] == "total" and len(steps) == 4
    for c in report["comparison"]:
        assert c["ilargi_seconds"] > 0 and c["baseline_seconds"] > 0
        if report["peak_method"] is not None:
            assert c["ilargi_peak_bytes"] >= 0 and c["baseline_peak_bytes"] >= 0
    # Progress bars went to stderr.
    assert "ilargi: classifier CV" in err


def test_demo_reports_the_planner(demo_json):
    report, _, _ = demo_json
    if not report["planner_installed"]:
        pytest.skip("ilargi_sklearn.planner is not installed")
    for task in ("regressor", "classifier"):
        plans = report["plans"][task]
        assert plans["n_fits"] == 2
        assert sum(plans["chosen"].values()) == 2
        assert all(v > 0 for v in plans["predicted_seconds"].values())
        assert {_demo.strategy_of(p) for p in plans["predicted_seconds"]} == {
            "factorized",
            "materialized",
        }


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed")
def test_demo_writes_the_chart(demo_json):
    report, chart, _ = demo_json
    assert report["chart"] == str(chart.resolve())
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_without_planner_and_matplotlib(monkeypatch, tmp_path, capsys):
    """The fallbacks: no planner (factorized plan), no matplotlib (a hint); -q."""
    monkeypatch.setattr(_demo, "import_planner", lambda: None)

    def no_pyplot():
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(_demo, "import_pyplot", no_pyplot)
    chart = tmp_path / "c.png"
    code, out, err = run(
        ["demo", "--n-rows", "1000", "--cv", "2", "--chart", chart, "-q"], capsys
    )
    assert code == 0
    assert "planner not installed -> factorized" in out
    assert "ilargi_sklearn.planner is not installed" in err
    assert "matplotlib is not installed" in err and "pip install" in err
    assert not chart.exists()
    assert "Schema and redundancy" in out and "side by side" in out
    assert "tuple_ratio" in out
    assert "[####" not in err  # --quiet: no progress bars


# ---------------------------------------------------------------- fit
def test_fit_spec_end_to_end(star, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, out, err = run(["fit", star, "--out", out_dir], capsys)
    assert code == 0, err
    assert "plan: factorized" in out
    assert "cross-validated r2" in out
    report = json.loads((out_dir / "star.report.json").read_text())
    assert report["dataset"]["summary"]["n_rows"] == 399  # one row had no target
    assert report["dataset"]["rows_without_target"] == 1
    assert report["plan"]["strategy"] == "factorized"
    assert report["cv"]["folds"] == 3 and len(report["cv"]["scores"]) == 3
    assert report["cv"]["mean"] > 0.9  # the planted model is linear
    assert "brands__rating" in report["dataset"]["feature_names"]
    assert "customers__matched" in report["dataset"]["feature_names"]
    # The saved model predicts on the dataset that load_spec rebuilds.
    model = joblib.load(out_dir / "star.joblib")
    ds, y, _ = load_spec(star).build()
    assert model.score(ds, y) > 0.9
    assert model.n_features_in_ == ds.shape[1]


def test_fit_json_and_forced_plan(star, tmp_path, capsys):
    code, out, err = run(
        ["fit", star, "--json", "--plan", "materialized", "--cv", "2", "--no-save"],
        capsys,
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["plan"]["strategy"] == "materialized"
    assert doc["cv"]["folds"] == 2
    assert "model_path" not in doc


def test_fit_auto_without_planner(star, monkeypatch, capsys):
    monkeypatch.setattr(cli, "import_planner", lambda: None)
    spec = variant(star, 'plan = "factorized"', 'plan = "auto"')
    code, out, err = run(["fit", spec, "--no-save", "--cv", "0"], capsys)
    assert code == 0, err
    assert "planner" in err and "factorized plan" in err
    assert "plan: factorized (planner not installed)" in out


def test_fit_auto_with_planner(star, capsys):
    if _demo.import_planner() is None:
        pytest.skip("ilargi_sklearn.planner is not installed")
    spec = variant(star, 'plan = "factorized"', 'plan = "auto"')
    code, out, err = run(["fit", spec, "--json", "--no-save", "--cv", "2"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["plan"]["plan"] in doc["plan"]["predicted_seconds"]
    assert doc["plan"]["strategy"] in ("factorized", "materialized")
    assert doc["cv"]["plans"]["n_fits"] == 2


def test_fit_classifier_with_scaler_and_threshold(star, capsys):
    spec = variant(
        star,
        'name = "FactorizedLinearRegression"',
        'name = "logistic_regression"\nscale = true',
    )
    spec = variant(spec, 'column = "y"', 'column = "y"\nthreshold = 30.0', "clf.toml")
    spec = variant(spec, 'scoring = "r2"', 'scoring = "roc_auc"', "clf.toml")
    code, out, err = run(["fit", spec, "--json", "--no-save"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["estimator"]["name"] == "FactorizedLogisticRegression"
    assert doc["cv"]["scoring"] == "roc_auc" and doc["cv"]["mean"] > 0.8


def test_fit_unsupervised_ignores_target(star, capsys):
    spec = variant(
        star,
        'name = "FactorizedLinearRegression"',
        'name = "FactorizedKMeans"\nparams = { n_clusters = 3, random_state = 0 }',
    )
    spec = variant(spec, 'scoring = "r2"\n', "", "km.toml")
    code, out, err = run(["fit", spec, "--no-save", "--json"], capsys)
    assert code == 0, err
    assert "target is ignored" in err
    doc = json.loads(out)
    assert len(doc["cv"]["scores"]) == 3 and all(s < 0 for s in doc["cv"]["scores"])


BAD_SPECS = [
    # (old, new, expected key in the message, expected text)
    (
        'path = "data/products.csv"',
        'path = "data/product.csv"',
        "tables.products.path",
        "not found",
    ),
    (
        'numeric = ["price"]',
        'numeric = ["prize"]',
        "tables.products.numeric",
        "Did you mean 'price'",
    ),
    (
        'left_on = "customer_id"',
        'left_on = "client_id"',
        "joins[3].left_on",
        "'client_id' not found",
    ),
    ('on = "brand_id"', 'on = "brand"', "joins[2].on", "'brand' not found"),
    (
        'name = "FactorizedLinearRegression"',
        'name = "SVR"',
        "estimator.name",
        "unknown estimator 'SVR'",
    ),
    ('plan = "factorized"', 'plan = "fast"', "estimator.plan", "plan must be one of"),
    (
        "[cv]\nfolds = 3",
        "[cv]\nfolds = 3\nparams = 2",
        "cv.params",
        "unknown key 'params'",
    ),
    ('scoring = "r2"', 'scoring = "r_2"', "cv.scoring", "did you mean"),
    ('how = "left"', 'how = "lft"', "joins[3].how", "how must be"),
    ('via = "products"', 'via = "brands"', "joins[2].via", "names no earlier join"),
    ('table = "brands"', 'table = "brand"', "joins[2].table", "Did you mean 'brands'"),
    (
        'plan = "factorized"',
        'plan = "factorized"\nparams = { fit_intercpt = false }',
        "estimator.params.fit_intercpt",
        "Did you mean 'fit_intercept'",
    ),
    (
        'plan = "factorized"',
        'plan = "factorized"\nparams = { solver = "magic" }',
        "estimator.params.solver",
        "'solver' parameter",
    ),
    ('column = "y"', 'column = "z"', "target.column", "'z' not found"),
    ("[target]", "[targets]", "targets", "unknown key 'targets'"),
    (
        'numeric = ["age"]',
        'numeric = ["age", "customer_id"]',
        "tables.customers.numeric",
        "listed as numeric",
    ),
]


@pytest.mark.parametrize("old,new,key,text", BAD_SPECS)
def test_fit_spec_errors_are_one_located_line(star, capsys, old, new, key, text):
    spec = variant(star, old, new)
    code, out, err = run(["fit", spec, "--no-save"], capsys)
    assert code == 2
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("ilargi: error:")]
    assert len(lines) == 1, err
    assert "bad.toml:" in lines[0] and key in lines[0] and text in lines[0]
    # The line number points at the offending key (or its section).
    line_no = int(lines[0].split("bad.toml:")[1].split(":")[0])
    source_line = spec.read_text().splitlines()[line_no - 1]
    first = new.splitlines()[-1].split("=")[0].strip(" [")
    assert first.split(".")[0].split(" ")[0] in source_line or source_line.startswith(
        "["
    )


def test_fit_toml_syntax_error_has_the_line(star, capsys):
    spec = variant(star, 'column = "y"', 'column = = "y"')
    code, _, err = run(["fit", spec], capsys)
    assert code == 2
    line_no = spec.read_text().splitlines().index('column = = "y"') + 1
    assert f"bad.toml:{line_no}: TOML syntax error" in err
    assert "Traceback" not in err


def test_fit_missing_spec_and_bad_key_types(tmp_path, star, capsys):
    code, _, err = run(["fit", tmp_path / "nope.toml"], capsys)
    assert code == 2 and "spec file not found" in err
    spec = variant(star, 'numeric = ["quantity"]', "numeric = 3")
    code, _, err = run(["fit", spec], capsys)
    assert code == 2 and "tables.sales.numeric" in err and "expected a string" in err


def test_fit_incompatible_key_types(tmp_path, star, capsys):
    # products keyed by string ids while sales holds integers: located at the join.
    products = pd.read_csv(tmp_path / "data" / "products.csv")
    products["product_id"] = "P" + products["product_id"].astype(str)
    products.to_csv(tmp_path / "data" / "products.csv", index=False)
    code, _, err = run(["fit", star], capsys)
    assert code == 2
    assert "joins[1]" in err and "incompatible" in err


def test_find_line():
    text = textwrap.dedent(
        """\
        base = "a"
        [tables.a]
        path = "a.csv"
        [[joins]]
        table = "b"
        [[joins]]
        table = "c"
        on = "k"
        [estimator]
        params = { C = 1 }
        """
    )
    assert find_line(text, ("base",)) == 1
    assert find_line(text, ("tables", "a", "path")) == 3
    assert find_line(text, ("tables", "a", "numeric")) == 2  # the section header
    assert find_line(text, ("joins", 2, "on")) == 8
    assert find_line(text, ("joins", 1)) == 4
    assert find_line(text, ("estimator", "params", "C")) == 10
    assert find_line(text, ("nothing",)) is None


def test_example_specs_are_valid():
    specs = sorted(EXAMPLES.glob("*.toml"))
    assert len(specs) >= 2
    for path in specs:
        spec = load_spec(path)
        assert spec.base in spec.tables
        spec.make_estimator(plan="factorized")


def test_spec_error_str():
    e = SpecError("bad", path="s.toml", key=("joins", 2, "on"), line=7)
    assert str(e) == "s.toml:7: joins[2].on: bad"


# ---------------------------------------------------------------- calibrate
def test_calibrate_without_planner(monkeypatch, capsys):
    monkeypatch.setattr(cli, "import_planner", lambda: None)
    code, _, err = run(["calibrate"], capsys)
    assert code == 2
    assert "planner" in err and "pip install" in err


def test_calibrate_delegates(monkeypatch, tmp_path, capsys):
    calls = []

    def calibrate(
        records_path=None,
        *,
        budget_seconds=600,
        hamlet_path=None,
        progress=True,
        model_path=None,
    ):
        calls.append((records_path, budget_seconds, hamlet_path, progress, model_path))
        from ilargi_sklearn.planner import CalibrationResult

        model = tmp_path / "model.cbm"
        return CalibrationResult(
            model_path=model,
            installed=True,
            reason="install='always'",
            destination=model,
            records_path=Path(records_path),
            current_model="analytical",
            base_records="none",
            n_base_records=0,
            n_records=3,
            n_new_records=3,
            n_new_workloads=1,
            n_folds=0,
        )

    fake = types.SimpleNamespace(calibrate=calibrate, AutoPlan=object)
    monkeypatch.setattr(cli, "import_planner", lambda: fake)
    rec = tmp_path / "r.jsonl"
    code, out, _ = run(
        [
            "calibrate",
            "--budget",
            "30",
            "--records",
            rec,
            "--hamlet",
            "H",
            "-q",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    assert calls == [(str(rec), 30.0, "H", False, None)]
    assert json.loads(out)["model_path"] == str(tmp_path / "model.cbm")


# ---------------------------------------------------------------- bench
FAKE_BENCH = """\
import json, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
if "--fail" in args:
    sys.exit(3)
recs = [
    {{"benchmark": "{name}", "dataset": "d", "operator": "matmul", "plan": p,
      "seconds": s, "quick": "--quick" in args}}
    for p, s in (("factorized", 0.5), ("materialized", 1.5))
]
with open(out, "a") as fh:
    for r in recs:
        fh.write(json.dumps(r) + "\\n")
print("ran", " ".join(args))
"""


def fake_benchmarks(folder: Path) -> Path:
    folder.mkdir()
    for name, script in cli.BENCH_SCRIPTS.items():
        (folder / script).write_text(FAKE_BENCH.format(name=name))
    return folder


def test_bench_runs_the_scripts(tmp_path, capsys):
    bdir = fake_benchmarks(tmp_path / "benchmarks")
    out_dir = tmp_path / "results"
    code, out, err = run(
        ["bench", "--benchmarks-dir", bdir, "--out", out_dir, "--json", "-q"], capsys
    )
    assert code == 0, err
    doc = json.loads(out)
    assert [r["status"] for r in doc["runs"]] == ["ok", "ok"]
    for name in cli.BENCH_SCRIPTS:
        rows = [
            json.loads(x) for x in (out_dir / f"{name}.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 2 and all(r["quick"] for r in rows)
        if HAS_MPL:
            assert (out_dir / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert cli.bench_speedups(rows) == [
        ("d matmul", "materialized", pytest.approx(3.0))
    ]


def test_bench_failure_and_missing(tmp_path, capsys):
    bdir = fake_benchmarks(tmp_path / "benchmarks")
    (bdir / cli.BENCH_SCRIPTS["estimators"]).unlink()
    code, out, err = run(
        [
            "bench",
            "--benchmarks-dir",
            bdir,
            "--out",
            tmp_path / "o",
            "--script-args=--fail",
            "-q",
        ],
        capsys,
    )
    assert code == 1
    assert "exited with code 3" in err and "bench_estimators.py is missing" in err


def test_bench_outside_a_checkout(tmp_path, capsys):
    code, _, err = run(["bench", "--benchmarks-dir", tmp_path / "nowhere"], capsys)
    assert code == 2
    assert "source checkout" in err
