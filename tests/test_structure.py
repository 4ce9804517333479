"""The shape of the code, checked with ``ast``: imports point down the layers only, and no
class or function outgrows what one reader can hold (400 and 80 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "nanguard"

#: core <- adapters (torch, keras, datascan) <- integrations <- run engine, check engine <- cli
LAYERS = {"core": 0, "torch": 1, "keras": 1, "datascan": 1, "integrations": 2, "runner": 3, "checker": 3,
          "_run_outputs": 3, "cli": 4}
#: the package root (lazy public names), its entry point and the demos (code written as a user
#: would write it, importing the public package) stand outside the layers
OUTSIDE = {"__init__", "__main__", "_version", "demos"}


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py"))


def _part(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imported_parts(path: Path) -> list[tuple[int, str]]:
    """``(line, top-level part of nanguard)`` for every import of nanguard's own modules."""
    tree = ast.parse(path.read_text())
    pkg = path.relative_to(SRC).parent.parts
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg[: len(pkg) - node.level + 1]) if node.level > 1 else list(pkg)
                target = [*base, *(node.module.split(".") if node.module else [])]
                if not target:  # "from . import x" at the root
                    target = [a.name for a in node.names][:1]
            elif node.module and node.module.split(".")[0] == "nanguard":
                target = node.module.split(".")[1:] or [a.name for a in node.names][:1]
            else:
                continue
            if target:
                out.append((node.lineno, target[0]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "nanguard" and len(parts) > 1:
                    out.append((node.lineno, parts[1]))
    return out


def test_imports_point_down_the_layers() -> None:
    bad = []
    for path in _modules():
        part = _part(path)
        if part in OUTSIDE:
            continue
        mine = LAYERS[part]
        for line, target in _imported_parts(path):
            target = target.removesuffix(".py")
            if target in OUTSIDE and target != "_version" and not (part == "cli" and target == "demos"):
                bad.append(f"{path.relative_to(SRC)}:{line} imports nanguard.{target}")
                continue
            theirs = LAYERS.get(target)
            if theirs is None:
                continue
            if theirs > mine or (theirs == mine and target != part and mine == 1):
                bad.append(f"{path.relative_to(SRC)}:{line} ({part}) imports nanguard.{target}")
    assert not bad, "imports up (or across) the layers:\n" + "\n".join(bad)


def test_the_core_imports_no_framework() -> None:
    for path in (SRC / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for n in names:
                assert n.split(".")[0] not in ("torch", "tensorflow", "keras"), f"{path}: {n}"


def _sizes() -> list[tuple[str, str, int, int]]:
    out = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                limit = 400 if isinstance(node, ast.ClassDef) else 80
                out.append((str(path.relative_to(SRC)), node.name, n, limit))
    return out


@pytest.mark.parametrize("kind", ["class", "function"])
def test_no_class_over_400_lines_and_no_function_over_80(kind: str) -> None:
    limit = 400 if kind == "class" else 80
    over = [f"{p}: {name} is {n} lines" for p, name, n, lim in _sizes() if lim == limit and n > lim]
    assert not over, "\n".join(over)
