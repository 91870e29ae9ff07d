"""The layout's rules, read from the code's own imports (``docs/reference/layout.md``).

* Layers import downwards only: each part of the package may import the parts listed before it
  in ``LAYERS``, never one after it (lazy imports and ``TYPE_CHECKING`` imports count too: a
  type-only arrow up is still an arrow up).
* Only the parts above the App import ``app.py``.
* No module imports another module's ``_private`` name, or reads or writes a ``_private``
  attribute that only another eventlanes module defines.
* No module over 600 lines, no function over 80 lines unless a ``# long:`` comment on the
  line above its ``def`` says why.

Each rule is a function over the source tree, so the tests below also show each one failing
on a tree that breaks it.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import eventlanes

PACKAGE = Path(eventlanes.__file__).parent

#: Bottom up. A part is a top-level module or package of eventlanes, or a sub-package (or
#: module) of ``processing``, which orders its own rooms.
LAYERS: tuple[str, ...] = (
    # values: no I/O, no state
    "errors", "hashing", "observe", "signals", "segments", "callables", "names", "columnar",
    "tracing", "events", "lineage", "policies", "windows",
    # databases, the schema, reading old shapes
    "db", "schema", "upcasting",
    # the log and the positions in it
    "store", "tokens",
    # defining and running processors, bottom up
    "processing.options", "processing.handlers", "processing.segment", "processing.tables",
    "processing.runtime", "processing.handling", "processing.processor",
    "processing.republisher", "processing.executors", "processing.aggregating",
    "processing.windowing", "processing.running", "processing",
    # the edges, what an app defines, this process as a node, operations, the App and its
    # face, what stands on them
    "kafka", "lakehouse", "registry", "node", "admin", "app",
    "loader", "__init__", "spark", "dashboard", "testing", "cli",
    # python -m eventlanes: the command
    "__main__",
)  # fmt: skip

#: who may import app.py: the parts that stand on the App
ABOVE_APP = frozenset({"loader", "spark", "dashboard", "testing", "cli", "__init__"})

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


@dataclass(frozen=True)
class Import:
    path: Path  # the importing file
    line: int
    module: str  # absolute module imported from, e.g. eventlanes.tokens.claims
    name: str  # the name imported (a module of a package, or a name in the module)


def module_of(path: Path, root: Path) -> tuple[list[str], bool]:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return (parts[:-1] if is_package else parts), is_package


def imports(root: Path) -> Iterator[Import]:
    for path in sorted(root.rglob("*.py")):
        parts, is_package = module_of(path, root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = parts if is_package else parts[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    yield Import(path, node.lineno, module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(path, node.lineno, alias.name, "")


def part_of(module: str, root: Path) -> str | None:
    """The layer a module of the package belongs to (None: not eventlanes)."""
    parts = module.split(".")
    if parts[0] != root.name:
        return None
    if len(parts) == 1:
        return "__init__"
    if parts[1] == "processing" and len(parts) > 2:
        return f"processing.{parts[2]}"
    return parts[1]


def target_part(imp: Import, root: Path) -> str | None:
    """The layer imported: ``from eventlanes.processing import running`` imports running."""
    module = imp.module
    candidate = f"{module}.{imp.name}" if imp.name else module
    as_path = root.parent.joinpath(*candidate.split("."))
    if as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists():
        module = candidate
    return part_of(module, root)


def arrows_up(root: Path) -> list[str]:
    rank = {part: i for i, part in enumerate(LAYERS)}
    found = []
    for imp in imports(root):
        mine = part_of(".".join(module_of(imp.path, root)[0]), root)
        theirs = target_part(imp, root)
        if theirs is None or theirs == mine:
            continue
        where = f"{imp.path.relative_to(root)}:{imp.line}"
        if mine not in rank or theirs not in rank:
            found.append(f"{where}: {mine} -> {theirs}: a part not in LAYERS (add it there)")
        elif rank[theirs] > rank[mine]:
            found.append(f"{where}: {mine} imports {theirs}, a layer above it")
        elif theirs == "app" and mine not in ABOVE_APP:
            found.append(f"{where}: {mine} imports app.py (only {sorted(ABOVE_APP)} may)")
    return found


def private_imports(root: Path) -> list[str]:
    found = []
    for imp in imports(root):
        if part_of(imp.module, root) is None:
            continue
        names = [imp.name] if imp.name else imp.module.split(".")
        for name in names:
            if name.startswith("_") and not name.startswith("__"):
                found.append(f"{imp.path.relative_to(root)}:{imp.line}: imports {name}")
    return found


def _private_attributes_defined(tree: ast.AST) -> set[str]:
    """Private attributes a module defines: ``self._x = ...``, methods and class attributes
    named ``_x``, and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    value = node.value
                    if isinstance(value, ast.Tuple | ast.List):
                        names.update(
                            e.value
                            for e in value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        )
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_attributes(root: Path) -> list[str]:
    """``other._x`` where ``_x`` is defined by another eventlanes module only (a third-party
    private such as ``os._exit`` is not ours to judge here)."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(root.rglob("*.py"))}
    defined = {path: _private_attributes_defined(tree) for path, tree in trees.items()}
    everywhere = set().union(*defined.values())
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or name.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if name in everywhere and name not in defined[path]:
                where = f"{path.relative_to(root)}:{node.lineno}"
                found.append(f"{where}: {ast.unparse(node)} (defined elsewhere)")
    return found


def oversized(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        rel = path.relative_to(root)
        if len(lines) > MAX_MODULE_LINES:
            found.append(f"{rel}: {len(lines)} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            why = lines[start - 2].strip() if start >= 2 else ""
            if length > MAX_FUNCTION_LINES and not why.startswith("# long:"):
                found.append(
                    f"{rel}:{node.lineno}: {node.name} is {length} lines (at most "
                    f"{MAX_FUNCTION_LINES}, or a '# long:' comment above it saying why)"
                )
    return found


RULES = {
    "arrows_up": arrows_up,
    "private_imports": private_imports,
    "private_attributes": private_attributes,
    "oversized": oversized,
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_package_keeps_the_layout_rules(rule: str) -> None:
    broken = RULES[rule](PACKAGE)
    assert not broken, f"{rule}:\n" + "\n".join(broken)


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {part_of(".".join(module_of(p, PACKAGE)[0]), PACKAGE) for p in PACKAGE.rglob("*.py")}
    assert parts <= set(LAYERS), sorted(parts - set(LAYERS))


# -- each rule fails on a tree that breaks it ----------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    copy = tmp_path / "eventlanes"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "static"))
    return copy


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_an_arrow_up_is_found(tree: Path) -> None:
    _append(tree / "tokens" / "claims.py", "\nfrom ..admin import views  # noqa\n")
    assert [line for line in arrows_up(tree) if "tokens imports admin" in line]


def test_a_lazy_arrow_up_is_found(tree: Path) -> None:
    _append(tree / "processing" / "segment.py", "\ndef _f():\n    from .running import loops\n")
    found = arrows_up(tree)
    assert [line for line in found if "processing.segment imports processing.running" in line]


def test_app_imported_from_below_is_found(tree: Path) -> None:
    _append(tree / "admin" / "views.py", "\nfrom ..app import App  # noqa\n")
    assert [line for line in arrows_up(tree) if "admin imports app" in line]


def test_a_private_import_is_found(tree: Path) -> None:
    _append(tree / "admin" / "views.py", "\nfrom ..events import _path  # noqa\n")
    assert any("imports _path" in line for line in private_imports(tree))


def test_a_private_attribute_of_another_module_is_found(tree: Path) -> None:
    _append(tree / "admin" / "views.py", "\ndef _f(event):\n    return event._recorded_at\n")
    assert any("event._recorded_at" in line for line in private_attributes(tree))


def test_a_long_function_and_module_are_found(tree: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    _append(tree / "hashing.py", f"\n\ndef _long():\n{body}")
    _append(tree / "names.py", "\n" * MAX_MODULE_LINES)
    found = oversized(tree)
    assert any("_long is" in line for line in found)
    assert any(line.startswith("names.py:") and "lines (at most" in line for line in found)
    _append(tree / "hashing.py", "")  # a reason makes the long function acceptable
    text = (
        (tree / "hashing.py")
        .read_text()
        .replace("\n\ndef _long", "\n\n# long: one straight list\ndef _long")
    )
    (tree / "hashing.py").write_text(text)
    assert not any("_long is" in line for line in oversized(tree))


def test_the_public_names_load_on_first_use_and_all_resolve() -> None:
    """``import eventlanes`` (and ``from eventlanes import signals``, the command's first
    import) loads none of the library's heavy parts, so the command can install its signal
    handling first; every public name, and ``from eventlanes import *``, still resolves,
    each to what its home module defines."""
    import subprocess
    import sys

    probe = (
        "import sys, eventlanes as el; from eventlanes import signals; "
        "heavy = sorted(m for m in ('click', 'rich', 'psycopg', 'pyarrow', 'pyspark', "
        "'eventlanes.app', 'eventlanes.cli.base') if m in sys.modules); print(heavy); "
        "ns = {}; exec('from eventlanes import *', ns); "
        "print(sorted(set(el.__all__) - set(ns)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split("\n")  # fmt: skip
    assert out[:2] == ["[]", "[]"], out
    import importlib

    for name in eventlanes.__all__:
        home = importlib.import_module(eventlanes._HOMES[name], "eventlanes")
        assert getattr(eventlanes, name) is getattr(home, name), name
