"""Sphinx configuration: builds offline; numpydoc renders the API reference."""

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

templates_path = []
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []
# Offline build: no intersphinx inventories are fetched.

_SKIPPED = {"get_metadata_routing", "set_output"}


def _skip_sklearn_plumbing(app, what, name, obj, skip, options):
    """Leave out scikit-learn's generated metadata-routing methods (their docstrings
    refer to scikit-learn's own glossary)."""
    if name in _SKIPPED or (name.startswith("set_") and name.endswith("_request")):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_sklearn_plumbing)
