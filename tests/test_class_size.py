"""Small classes: no class of the agent has more than MAX_METHODS methods (issue 33, point 6).

A class that holds more has more than one thing to say: split it into parts whose names say
what they hold (a module each where that reads better). Counted: the functions defined in the
class body itself (methods, properties, class and static methods; not nested classes' or inner
functions). The pure core, the loop, the protocol and the composition root (`app.py`,
`assembly.py`) are checked by `tests/test_architecture.py`; this test checks every other module
of `agent/`, so that together they hold for all of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent"
MAX_METHODS = 20
CHECKED_ELSEWHERE = ("core/", "loop/", "protocol/", "app.py", "assembly.py")
"""Paths below `agent/` whose classes `tests/test_architecture.py` checks."""


def methods_per_class(path: Path) -> dict[str, int]:
    """Each class of the module (nested ones by their dotted name) and its methods."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                counts[name] = sum(
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in child.body
                )
                visit(child, f"{name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, f"{prefix}{child.name}.<locals>.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return counts


def test_the_counter_counts_methods_of_every_class(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "class A:\n"
        "    def a(self): ...\n"
        "    @property\n"
        "    def b(self): ...\n"
        "    async def c(self): ...\n"
        "    x = 1\n"
        "    class B:\n"
        "        def d(self): ...\n"
        "def f():\n"
        "    class C:\n"
        "        def e(self):\n"
        "            def inner(): ...\n",
        encoding="utf-8",
    )
    assert methods_per_class(source) == {"A": 3, "A.B": 1, "f.<locals>.C": 1}


def test_no_class_of_the_agent_has_more_than_twenty_methods() -> None:
    modules = [
        path
        for path in sorted(AGENT.rglob("*.py"))
        if not path.relative_to(AGENT).as_posix().startswith(CHECKED_ELSEWHERE)
    ]
    assert len(modules) > 50  # the walk found the agent
    large = [
        f"{path.relative_to(ROOT)}: {name} has {count} methods"
        for path in modules
        for name, count in methods_per_class(path).items()
        if count > MAX_METHODS
    ]
    assert not large, f"over {MAX_METHODS} methods (split them):\n" + "\n".join(large)
