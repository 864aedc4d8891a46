"""Sphinx configuration of the dask-pmix docs (built by scripts/docs.sh, warnings as errors)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "python"))

project = "dask-pmix"
author = "the dask-pmix authors"
copyright = "the dask-pmix authors"
release = (ROOT / "python" / "dask_pmix" / "VERSION").read_text().strip()
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxcontrib.openapi",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_generated", "gen"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # links to #sections of other pages are checked too

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = True

html_theme = "pydata_sphinx_theme"
html_title = f"dask-pmix {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    # The build machine and users' clusters may have no internet: no external icons or analytics.
    "icon_links": [],
}
html_show_sourcelink = False
# Nothing in the built pages is fetched from elsewhere.
html_use_opensearch = ""

# External links are not fetched (the build machine has no internet); internal links and anchors
# are checked by the build itself (warnings are errors).
linkcheck_ignore = [r"https?://.*"]
