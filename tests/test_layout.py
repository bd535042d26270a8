"""The shape of the house (docs/architecture.md, "The rooms"): read from
the source with `ast`, nothing imported.

- No import circles between modules of bot, memory, adapters and cli.
  Every import counts: those inside functions (still a dependency) and those
  under `if TYPE_CHECKING:` (they never run, but a circle through types is a
  circle of ideas all the same; the type moves to where both sides can import it).
- Arrows point down only: memory imports nothing from bot, adapters or cli;
  adapters nothing from memory or cli; bot nothing from adapters or cli. Only
  cli (the wiring) imports every layer.
- No module over 500 lines: past that a module is asking to be split.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "memory", "adapters", "cli")
MAX_LINES = 500

# Known breaches, each still real: once fixed, the test says to delete it, and
# from then on holds the line. None today.
KNOWN_CIRCLES: list[list[str]] = []
KNOWN_LONG: set[str] = set()

# layer -> the layers it must not import
FORBIDDEN = {
    "memory": {"bot", "adapters", "cli"},
    "adapters": {"memory", "cli"},
    "bot": {"adapters", "cli"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement: at the top, in functions, under `if TYPE_CHECKING:`."""
    return (child for child in ast.walk(node) if isinstance(child, (ast.Import, ast.ImportFrom)))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, at run time or for types only."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from memory import roles` imports the module memory.roles.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        found.update(target for target in targets if target in known and target != name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = source_files()
    known = set(files)
    return {name: imports_of(name, path, known) for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_checker_sees_circles_and_type_checking_imports() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import only_for_types\nelse:\n    import at_run_time\n"
        "def later():\n    import lazily\n"
    )
    assert sorted(alias.name for node in _imports(tree) for alias in node.names) == [
        "TYPE_CHECKING",
        "at_run_time",
        "lazily",
        "only_for_types",
    ]


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert [group for group in found if group not in KNOWN_CIRCLES] == []
    assert [group for group in KNOWN_CIRCLES if group not in found] == [], "fixed: delete from KNOWN_CIRCLES"


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{name} imports {target}"
        for name, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if target.split(".")[0] in FORBIDDEN.get(name.split(".")[0], set())
    ]
    assert upward == []


def test_no_module_over_500_lines() -> None:
    long = {
        name: lines
        for name, path in sorted(source_files().items())
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert {name: lines for name, lines in long.items() if name not in KNOWN_LONG} == {}
    assert sorted(KNOWN_LONG - set(long)) == [], "split now: delete from KNOWN_LONG"
