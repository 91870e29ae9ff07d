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
    # internal: type aliases and the runtime's parts, which the API reference leaves out
    (r"py:.*", r"(Runtime|Initial|KeyFunction|OrderKey|OnBad|Record|Fold|Handler|Events)"),
    (r"py:class", r"eventlanes\.processing\.(tables\.states\.StateTable"
                  r"|tables\.dead_letters\.DeadLetterStore|aggregating\.declarative\.Declaration"
                  r"|tables\.windows\.WindowTable)"),
    (r"py:class", r"eventlanes\.windows\.spec\.Windowing"),
    (r"py:class", r"(abc|contextlib)\..*|dict\[.*"),
    # docstrings naming internal modules and constants
    (r"py:mod", r"(pushdown|eventlanes\.db\.placeholders|eventlanes\.schema)"),
    (r"py:data", r"(RETIRED|eventlanes\.store\.arrow\.FIELDS)"),
    (r"py:.*", r"(collections\.abc|typing|datetime|enum|pathlib|threading|os|types)\..*"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Sequence|Mapping|Literal|TypeAlias|Self)"),
    (r"py:.*", r"(pyspark|pyarrow|psycopg|psycopg_pool|sqlite3|confluent_kafka|prometheus_client"
               r"|click|rich|starlette|logging|asyncio|concurrent|pytest|_pytest)(\..*)?"),
    (r"py:class", r"(str|int|float|bool|bytes|dict|list|tuple|set|frozenset|object|type|None"
                  r"|Exception|BaseException|RuntimeError|ValueError|TimeoutError"
                  r"|StrEnum|NamedTuple|timedelta|Path)"),
]

def _lookup(name: str) -> object | None:
    """The object a dotted name means: the longest importable module, then attributes."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except (ImportError, ValueError, TypeError):
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _public_name(app, env, node, contnode):  # noqa: ANN001, ANN202 - Sphinx's signature
    """Resolve a reference by the name users write (``eventlanes.SchemaError``, or a bare
    ``VersionError`` in a docstring) to where the object is documented: its defining module."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    here = node.get("py:module") or ""
    for name in (target, f"eventlanes.{target}", f"{here}.{target}" if here else target):
        obj = _lookup(name)
        if obj is None:
            continue
        canonical = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        if canonical != target:
            py = env.get_domain("py")
            found = py.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], canonical,
                                    node, contnode)  # fmt: skip
            if found is not None:
                return found
    return None


def setup(app):  # noqa: ANN001, ANN201 - Sphinx's hook
    app.connect("missing-reference", _public_name)


html_theme = "furo"
html_title = f"eventlanes {release}"
html_static_path = ["_static"]
html_css_files = ["eventlanes.css"]
html_show_sourcelink = False
html_copy_source = False
