"""The ``ilargi`` command line: demo, fit from a TOML spec, calibrate, bench."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest
from _cli_data import SPEC, run, variant, write_star
from _helpers import dense

from ilargi_sklearn import planner
from ilargi_sklearn.cli import SpecError, _bench, _console, _demo, load_spec
from ilargi_sklearn.cli._console import Console, Progress
from ilargi_sklearn.cli._cv import strategy_of
from ilargi_sklearn.cli._demo import merge_and_encode
from ilargi_sklearn.cli._toml import find_line

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HAS_MPL = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    # On a shared machine, spinning BLAS threads make the tiny fits of these tests
    # 10x slower; one thread changes no result.
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


# ---------------------------------------------------------------- data


@pytest.fixture
def star(tmp_path):
    write_star(tmp_path / "data")
    spec = tmp_path / "star.toml"
    spec.write_text(SPEC)
    return spec


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
    T = dense(data.dataset)
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
    """One small demo run with --json."""
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
    for task in ("regressor", "classifier"):
        plans = report["plans"][task]
        assert plans["n_fits"] == 2
        assert sum(plans["chosen"].values()) == 2
        assert all(v > 0 for v in plans["predicted_seconds"].values())
        assert {strategy_of(p) for p in plans["predicted_seconds"]} == {
            "factorized",
            "materialized",
        }


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed")
def test_demo_writes_the_chart(demo_json):
    report, chart, _ = demo_json
    assert report["chart"] == str(chart.resolve())
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_without_matplotlib(monkeypatch, tmp_path, capsys):
    """The fallback without matplotlib (a hint); -q."""

    def no_pyplot():
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(_demo, "import_pyplot", no_pyplot)
    chart = tmp_path / "c.png"
    code, out, err = run(
        ["demo", "--n-rows", "1000", "--cv", "2", "--chart", chart, "-q"], capsys
    )
    assert code == 0
    assert "-> chose" in out  # the planner's decisions
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


def test_fit_auto_with_planner(star, capsys):
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


@pytest.mark.parametrize(
    "name, cls, scoring",
    [
        ('"ridge"\nparams = { alpha = 2.0 }', "FactorizedRidge", "r2"),
        ('"Lasso"\nparams = { alpha = 0.01 }', "FactorizedLasso", "r2"),
        ('"elastic_net"\nparams = { alpha = 0.01 }', "FactorizedElasticNet", "r2"),
        (
            '"FactorizedTruncatedSVD"\nparams = { n_components = 2 }',
            "FactorizedTruncatedSVD",
            None,
        ),
        ('"pca"\nparams = { n_components = 2 }', "FactorizedPCA", None),
    ],
)
def test_fit_the_rest_of_the_family_by_name(star, capsys, name, cls, scoring):
    """The family's estimators are available by name in a spec; the decompositions
    are cross-validated by their own score (PCA's log-likelihood) or skip it."""
    spec = variant(star, '"FactorizedLinearRegression"', name, "family.toml")
    if scoring is None:
        spec = variant(spec, 'scoring = "r2"\n', "", "family.toml")
    code, out, err = run(["fit", spec, "--json", "--no-save"], capsys)
    assert code == 0, err
    if cls == "FactorizedTruncatedSVD":
        # No score method: the spec's cross-validation has nothing to score.
        assert "skipping cross-validation" in err
        return
    doc = json.loads(out)
    assert doc["estimator"]["name"] == cls
    if scoring == "r2":
        assert doc["cv"]["mean"] > 0.5


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

    monkeypatch.setattr(planner, "calibrate", calibrate)
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
    for name, script in _bench.BENCH_SCRIPTS.items():
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
    for name in _bench.BENCH_SCRIPTS:
        rows = [
            json.loads(x) for x in (out_dir / f"{name}.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 2 and all(r["quick"] for r in rows)
        if HAS_MPL:
            assert (out_dir / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert _bench.bench_speedups(rows) == [
        ("d matmul", "materialized", pytest.approx(3.0))
    ]


def test_bench_failure_and_missing(tmp_path, capsys):
    bdir = fake_benchmarks(tmp_path / "benchmarks")
    (bdir / _bench.BENCH_SCRIPTS["estimators"]).unlink()
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


# ---------------------------------------------------------------- joins that
# change the rows, scoring new rows
PROMOS = """
[tables.promos]
path = "data/promos.csv"
key = "product_id"
numeric = ["discount"]

[[joins]]
table = "promos"
on = "product_id"
how = "inner"
"""


def _with_promos(star: Path) -> Path:
    """Products with 0-3 promotions each: an inner, one-to-many join."""
    rng = np.random.default_rng(5)
    product = np.repeat(np.arange(30), rng.integers(0, 4, 30))
    pd.DataFrame(
        {"product_id": product, "discount": rng.uniform(0, 1, len(product))}
    ).to_csv(star.parent / "data" / "promos.csv", index=False)
    return variant(star, "\n[target]", PROMOS + "\n[target]", "promos.toml")


def test_fit_aligns_the_target_through_inner_and_one_to_many_joins(star, capsys):
    spec = _with_promos(star)
    code, out, err = run(["fit", spec, "--json", "--no-save", "--cv", "3"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    d = star.parent / "data"
    sales = pd.read_csv(d / "sales.csv").dropna(subset=["y"])
    merged = sales.merge(pd.read_csv(d / "promos.csv"), on="product_id", how="inner")
    assert doc["dataset"]["n_rows"] == len(merged) != len(sales)
    assert doc["dataset"]["n_base_rows"] == len(sales)
    # Rows of one base row share a fold: no fold tests on a row it trained on.
    assert doc["cv"]["splitter"] == "GroupKFold"
    ds, y, _ = load_spec(spec).build()
    # Row for row the merged target (inner joins keep the base order, matches in
    # the joined table's order, as pandas.merge does).
    np.testing.assert_array_equal(y, merged["y"].to_numpy())
    promos = [j for j in doc["joins"] if j["join"] == "promos"][0]
    assert promos["how"] == "inner" and promos["matched"] < promos["rows"]


def test_predict_scores_new_rows_with_the_training_encoding(star, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, _, err = run(["fit", star, "--out", out_dir, "--cv", "0"], capsys)
    assert code == 0, err
    d = star.parent / "data"
    new = pd.read_csv(d / "sales.csv").drop(columns="y").iloc[:25]
    new.to_csv(tmp_path / "new.csv", index=False)
    # Products with a category the training data never had.
    products = pd.read_csv(d / "products.csv")
    products.loc[products["product_id"] == new["product_id"].iloc[0], "category"] = "zz"
    products.to_csv(tmp_path / "products_new.csv", index=False)
    dest = tmp_path / "scores.csv"
    code, out, err = run(
        [
            "predict",
            out_dir / "star.joblib",
            "--table",
            f"sales={tmp_path / 'new.csv'}",
            "--table",
            f"products={tmp_path / 'products_new.csv'}",
            "--out",
            dest,
        ],
        capsys,
    )
    assert code == 0, err
    assert "categories the training data did not have" in err and "'zz'" in err
    assert "scored 25 rows" in out
    got = pd.read_csv(dest)
    assert list(got.columns[:4]) == [
        "base_row",
        "product_id",
        "customer_id",
        "prediction",
    ]
    np.testing.assert_array_equal(got["base_row"], np.arange(25))
    np.testing.assert_array_equal(got["customer_id"], new["customer_id"])
    model = joblib.load(out_dir / "star.joblib")
    from ilargi_sklearn.multisource import DatasetSchema

    schema = DatasetSchema.of(model)
    spec = load_spec(star).with_tables(
        {
            "sales": str(tmp_path / "new.csv"),
            "products": str(tmp_path / "products_new.csv"),
        }
    )
    ds, _, _ = spec.build(schema=schema, handle_unknown="ignore")
    np.testing.assert_allclose(got["prediction"], model.predict(ds), rtol=1e-12)
    # Unknown categories can be refused.
    code, _, err = run(
        [
            "predict",
            out_dir / "star.joblib",
            "--spec",
            star,
            "--table",
            f"products={tmp_path / 'products_new.csv'}",
            "--handle-unknown",
            "error",
            "--out",
            tmp_path / "x.csv",
        ],
        capsys,
    )
    # The data, not the command line: exit code 1, the flag in the CLI's spelling.
    assert code == 1 and "categories the training data did not have" in err
    assert "--handle-unknown warn or --handle-unknown ignore" in err
    assert "handle_unknown=" not in err


def test_predict_classifier_writes_probabilities_as_parquet(star, tmp_path, capsys):
    pytest.importorskip("pyarrow")
    spec = variant(
        star,
        'name = "FactorizedLinearRegression"',
        'name = "FactorizedLogisticRegression"',
    )
    spec = variant(spec, 'column = "y"', 'column = "y"\nthreshold = 30.0', "clf.toml")
    spec = variant(spec, 'scoring = "r2"', 'scoring = "roc_auc"', "clf.toml")
    code, _, err = run(["fit", spec, "--out", tmp_path, "--cv", "0"], capsys)
    assert code == 0, err
    dest = tmp_path / "p.parquet"
    code, out, err = run(
        [
            "predict",
            tmp_path / "clf.joblib",
            "--out",
            dest,
            "--keep",
            "quantity",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    doc = json.loads(out)
    got = pd.read_parquet(dest)
    assert doc["columns"] == [
        "base_row",
        "quantity",
        "prediction",
        "proba_0",
        "proba_1",
    ]
    assert len(got) == 400  # the spec's own tables: every row, targets or not
    np.testing.assert_allclose(got["proba_0"] + got["proba_1"], 1.0)
    assert set(got["prediction"]) <= {0, 1}


def test_predict_errors(star, tmp_path, capsys):
    code, _, err = run(["predict", tmp_path / "none.joblib"], capsys)
    assert code == 2 and "not found" in err
    joblib.dump(object(), tmp_path / "obj.joblib")
    code, _, err = run(["predict", tmp_path / "obj.joblib", "--spec", star], capsys)
    assert code == 2 and "holds a object, not a fitted model" in err
    code, _, err = run(["fit", star, "--out", tmp_path / "fit", "--cv", "0"], capsys)
    model = joblib.load(tmp_path / "fit" / "star.joblib")
    del model.dataset_schema_
    joblib.dump(model, tmp_path / "old.joblib")
    code, _, err = run(["predict", tmp_path / "old.joblib", "--spec", star], capsys)
    assert code == 2 and "without a dataset schema" in err
    code, _, err = run(["fit", star, "--out", tmp_path, "--cv", "0"], capsys)
    code, _, err = run(
        ["predict", tmp_path / "star.joblib", "--table", "nosuch=x.csv"], capsys
    )
    assert code == 2 and "tables ['nosuch'] are not defined in the spec" in err
    code, _, err = run(["predict", tmp_path / "star.joblib", "--table", "x"], capsys)
    assert code == 2 and "NAME=PATH" in err


def test_fit_prints_match_rates_and_spec_options(star, tmp_path, capsys):
    d = star.parent / "data"
    # Customer ids with padding: nothing matches, the error names the fix.
    sales = pd.read_csv(d / "sales.csv")
    sales["customer_id"] = " " + sales["customer_id"]
    sales.to_csv(d / "sales_padded.csv", index=False)
    spec = variant(star, 'path = "data/sales.csv"', 'path = "data/sales_padded.csv"')
    code, _, err = run(["fit", spec, "--no-save", "--cv", "0"], capsys)
    assert code == 2 and "joins[3]" in err
    assert "matched 0 of 399 rows" in err and "whitespace" in err
    assert "min_match = 0.1" in err
    ok = variant(spec, 'how = "left"\n', 'how = "left"\nmin_match = 0\n', "ok.toml")
    code, out, err = run(["fit", ok, "--no-save", "--cv", "0"], capsys)
    assert code == 0, err
    assert "join customers (left): matched 0 of 399 rows (0%)" in out
    code, out, err = run(["fit", star, "--no-save", "--cv", "0"], capsys)
    assert "join products (left): matched 399 of 399 rows (100%)" in out
    assert "join customers (left): matched" in out


def test_format_fraction_keeps_the_digits_that_matter():
    from ilargi_sklearn.multisource._builder import format_fraction

    assert format_fraction(1.0) == "100%" and format_fraction(0.0) == "0%"
    assert format_fraction(0.99999) == "99.999%"
    assert format_fraction(0.5) == "50.0%" and format_fraction(1e-5) == "0.001%"


def test_fit_spec_cast_and_row_number(star, tmp_path, capsys):
    d = star.parent / "data"
    # One unknown product makes the sales' product ids text.
    sales = pd.read_csv(d / "sales.csv")
    sales["product_id"] = sales["product_id"].astype(str)
    sales.loc[7, "product_id"] = "unknown"
    sales.to_csv(d / "sales_text.csv", index=False)
    spec = variant(star, 'path = "data/sales.csv"', 'path = "data/sales_text.csv"')
    code, _, err = run(["fit", spec, "--no-save", "--cv", "0"], capsys)
    assert code == 2 and "joins[1]" in err and "incompatible dtypes" in err
    assert 'cast = { COLUMN = "string" }' in err
    cast = variant(
        spec,
        'categorical = ["category"]',
        'categorical = ["category"]\ncast = { product_id = "string" }',
        "cast.toml",
    )
    code, out, err = run(["fit", cast, "--json", "--no-save", "--cv", "0"], capsys)
    assert code == 0, err
    products = [j for j in json.loads(out)["joins"] if j["join"] == "products"][0]
    assert (products["matched"], products["rows"]) == (398, 399)
    # Casting text that is not numbers to "int" names the values.
    bad = variant(
        spec,
        'numeric = ["quantity"]',
        'numeric = ["quantity"]\ncast = { product_id = "int" }',
        "bad_cast.toml",
    )
    code, _, err = run(["fit", bad, "--no-save"], capsys)
    assert code == 2 and "tables.sales.cast.product_id" in err
    assert "['unknown'] are not numbers" in err
    typo = variant(cast, '"string" }', '"text" }', "typo.toml")
    code, _, err = run(["fit", typo, "--no-save"], capsys)
    assert code == 2 and "cast of column 'product_id' must be one of" in err
    # brands joined by 1-based row number instead of its key.
    products = pd.read_csv(d / "products.csv")
    products["brand_row"] = products["brand_id"] + 1
    products.to_csv(d / "products.csv", index=False)
    rows = variant(
        star, 'on = "brand_id"', 'left_on = "brand_row"\nrow_number = 1', "rows.toml"
    )
    ds_rows, y_rows, _ = load_spec(rows).build()
    ds_keys, y_keys, _ = load_spec(star).build()
    np.testing.assert_array_equal(
        ds_rows.materialize().toarray(), ds_keys.materialize().toarray()
    )
    wrong = variant(rows, "row_number = 1", 'row_number = 1\non = "x"', "wrong.toml")
    code, _, err = run(["fit", wrong, "--no-save"], capsys)
    assert code == 2 and "joins[2]" in err and "not both" in err
    wrong = variant(rows, 'left_on = "brand_row"\n', "", "wrong.toml")
    code, _, err = run(["fit", wrong, "--no-save"], capsys)
    assert code == 2 and "row_number joins left_on" in err


def test_spec_hints_estimator_names_and_duplicate_keys(star, capsys):
    spec = variant(
        star,
        'name = "FactorizedLinearRegression"',
        'name = "FactorizedLinearRegresion"',
    )
    code, _, err = run(["fit", spec], capsys)
    assert code == 2 and "Did you mean 'FactorizedLinearRegression'" in err
    spec = variant(star, 'numeric = ["price"]', 'numeric = ["price"]\nnumeric = ["x"]')
    code, _, err = run(["fit", spec], capsys)
    assert code == 2
    assert "key 'numeric' is given twice in [tables.products]" in err


@pytest.mark.skipif(not HAS_MPL, reason="needs matplotlib")
@pytest.mark.parametrize("spread", [1.5, 4.0, 300.0])
def test_bench_chart_tick_labels_do_not_overlap(spread):
    rows = []
    for k in range(12):
        ratio = spread ** (k / 11 - 0.5)
        for plan, seconds in (
            ("factorized", 1.0),
            ("materialized", ratio),
            ("materialized-cached", 0.8 * ratio),
        ):
            rows.append(
                {
                    "dataset": "synthetic",
                    "operator": "gram",
                    "grid": {"n_rows": 1e5, "tuple_ratio": k + 1},
                    "plan": plan,
                    "seconds": seconds,
                }
            )
    fig = _bench._bench_figure(rows, "bench")
    fig.canvas.draw()
    ax = fig.axes[0]
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        boxes = [t.get_window_extent() for t in labels if t.get_text()]
        assert boxes
        for a, b in zip(boxes, boxes[1:]):
            assert not a.overlaps(b)
    _console.import_pyplot().close(fig)


def test_fit_malformed_csv_row_is_an_error_with_file_and_line(star, capsys):
    path = star.parent / "data" / "customers.csv"
    lines = path.read_text().splitlines()
    lines[4] += ",99"  # line 5: one field too many
    path.write_text("\n".join(lines) + "\n")
    code, _, err = run(["fit", star, "--no-save"], capsys)
    assert code == 2 and "tables.customers.path" in err
    assert "customers.csv: line 5 has 3 fields, the header has 2" in err


def test_fit_says_when_it_compiles_kernels_first(star, monkeypatch, capsys):
    """The note comes when a kernel compiles (numba's compile event), and only
    then: not when every kernel loads from the cache, nor under --quiet."""
    from ilargi_sklearn._backend import _launcher
    from ilargi_sklearn.linear_model import FactorizedLinearRegression

    fit = FactorizedLinearRegression.fit

    def compiling_fit(self, *args, **kwargs):
        _launcher._compiling("cross", None)  # as numba's listener does
        return fit(self, *args, **kwargs)

    code, _, err = run(["fit", star, "--no-save", "--cv", "0"], capsys)
    assert code == 0, err
    assert "numba kernels" not in err
    monkeypatch.setattr(FactorizedLinearRegression, "fit", compiling_fit)
    monkeypatch.setitem(_launcher._state, "compile_notice", False)
    code, _, err = run(["fit", star, "--no-save", "--cv", "2"], capsys)
    assert code == 0, err
    assert err.count("note: compiling numba kernels for this machine") == 1
    code, _, err = run(["fit", star, "--no-save", "--cv", "0", "-q"], capsys)
    assert code == 0 and "numba kernels" not in err
