"""Sphinx configuration: builds offline; numpydoc renders the API reference.

The planner's API page (``generated/api_planner.rst``) is written here, at
configuration time, from ``ilargi_sklearn.planner.__all__`` when the planner is
importable, and as a short note otherwise, so that the build has no warning either
way. Charts are drawn at build time by matplotlib's ``plot`` directive from numbers
written in the pages; no image is committed.
"""

import importlib
import re
from pathlib import Path

import ilargi_sklearn

project = "ilargi_sklearn"
author = "ilargi_sklearn developers"
copyright = "2026, ilargi_sklearn developers"
release = ilargi_sklearn.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "matplotlib.sphinxext.plot_directive",
]

autosummary_generate = True
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
autodoc_default_options = {"members": True, "inherited-members": False}
plot_include_source = False
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 100)]

templates_path = ["_templates"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []
# Offline build: no intersphinx inventories are fetched.

_SKIPPED = {"get_metadata_routing", "set_output"}


def _planner_page() -> str:
    title = "Planner (``ilargi_sklearn.planner``)"
    head = f"{title}\n{'=' * len(title)}\n\n"
    try:
        planner = importlib.import_module("ilargi_sklearn.planner")
        # AutoPlan is documented with the estimators (it is exported at top level).
        names = [n for n in planner.__all__ if n != "AutoPlan"]
    except (ImportError, AttributeError) as exc:
        return head + (
            "The planner is not installed in the environment this documentation was "
            f"built in ({type(exc).__name__}: {exc}); see :doc:`../guide/planner`.\n"
        )
    items = "\n".join(f"   {name}" for name in names)
    return head + (
        "See :doc:`../guide/planner` and :doc:`../calibration`.\n\n"
        ".. currentmodule:: ilargi_sklearn.planner\n\n"
        ".. autosummary::\n   :toctree: .\n   :nosignatures:\n\n" + items + "\n"
    )


def _write_planner_page() -> None:
    page = Path(__file__).resolve().parent / "generated" / "api_planner.rst"
    page.parent.mkdir(exist_ok=True)
    text = _planner_page()
    if not page.is_file() or page.read_text() != text:
        page.write_text(text)


_write_planner_page()


def _skip_sklearn_plumbing(app, what, name, obj, skip, options):
    """Leave out methods inherited from scikit-learn (``score``, ``get_params``,
    metadata routing): their docstrings refer to scikit-learn's own glossary and
    labels, which this offline build cannot resolve."""
    if name in _SKIPPED or (name.startswith("set_") and name.endswith("_request")):
        return True
    module = getattr(obj, "__module__", None) or ""
    if what == "class" and module.split(".")[0] == "sklearn":
        return True
    return None


_SHAPE = re.compile(r"of shape \(([^)]*)\)")
_TRAILING_UNDERSCORE = re.compile(r"(?<![`\w])([A-Za-z]\w*_)(?![`\w])")


def _quote_shapes(app, what, name, obj, options, lines):
    """``of shape (n_features_in_,)`` would be read as a reStructuredText link
    (``name_``); quote such names inside shapes."""
    for i, line in enumerate(lines):
        if "of shape (" in line:
            lines[i] = _SHAPE.sub(
                lambda m: (
                    "of shape (" + _TRAILING_UNDERSCORE.sub(r"``\1``", m.group(1)) + ")"
                ),
                line,
            )


def setup(app):
    app.connect("autodoc-skip-member", _skip_sklearn_plumbing)
    app.connect("autodoc-process-docstring", _quote_shapes)
