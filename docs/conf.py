"""Sphinx configuration of the eventlanes documentation (``make docs``; see about.md).

The build is offline and strict: no intersphinx inventories, fonts or scripts are fetched
(furo ships its own assets and uses system fonts; diagrams are SVG files in _static), and
``make docs`` runs with ``-W --keep-going -n``: a broken link, a missing reference or a
docstring that does not parse fails the build.
"""

from __future__ import annotations

import eventlanes

project = "eventlanes"
author = "the eventlanes authors"
copyright = "the eventlanes authors, Apache-2.0"  # noqa: A001 - Sphinx's name
release = eventlanes.__version__
version = release

extensions = [
    "myst_parser",  # the pages are Markdown (MyST), like the README
    "sphinx.ext.autodoc",  # the Python API from the docstrings
    "sphinx_click",  # the CLI reference from the click commands
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "examples", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked
suppress_warnings: list[str] = []

# The API reference: members in source order, signatures with their types, no inherited noise.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_mock_imports: list[str] = []
add_module_names = False

# -n (nitpicky): every reference must resolve. Names of other libraries and of the standard
# library are not linked (that would need intersphinx inventories from the network).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(collections\.abc|typing|datetime|enum|pathlib|threading|os|types)\..*"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Sequence|Mapping|Literal|TypeAlias|Self)"),
    (r"py:.*", r"(pyspark|pyarrow|psycopg|psycopg_pool|sqlite3|confluent_kafka|prometheus_client"
               r"|click|rich|starlette|logging|asyncio|concurrent|pytest|_pytest)(\..*)?"),
    (r"py:class", r"(str|int|float|bool|bytes|dict|list|tuple|set|frozenset|object|type|None"
                  r"|Exception|BaseException|RuntimeError|ValueError|TimeoutError"
                  r"|StrEnum|NamedTuple|timedelta|Path)"),
]

html_theme = "furo"
html_title = f"eventlanes {release}"
html_static_path = ["_static"]
html_css_files = ["eventlanes.css"]
html_show_sourcelink = False
html_copy_source = False
