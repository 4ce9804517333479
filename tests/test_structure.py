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


def _classes() -> list[tuple[str, ast.ClassDef]]:
    return [(str(p.relative_to(SRC)), node) for p in _modules()
            for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ClassDef)]


def _base_name(b: ast.expr) -> str | None:
    if isinstance(b, ast.Name):
        return b.id
    if isinstance(b, ast.Attribute):
        return b.attr
    if isinstance(b, ast.Subscript):  # Generic[T], Protocol[T]
        return _base_name(b.value)
    return None


def test_no_class_inherits_from_more_than_one_class_of_ours() -> None:
    """Parts are composed, not stacked as mixins that share state."""
    ours = {node.name for _, node in _classes()}
    bad = []
    for path, node in _classes():
        mine = [n for n in (_base_name(b) for b in node.bases) if n in ours]
        if len(mine) > 1:
            bad.append(f"{path}: {node.name}({', '.join(mine)})")
    assert not bad, "classes with several bases of ours:\n" + "\n".join(bad)


def _instance_attributes(node: ast.ClassDef) -> set[str]:
    """``self.x = ...`` anywhere in the class, and the fields a dataclass body declares."""
    names: set[str] = set()
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(
            n, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for e in ast.walk(t):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    names.add(e.attr)
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and \
                "ClassVar" not in ast.unparse(stmt.annotation):
            names.add(stmt.target.id)
    return names


def test_no_class_holds_more_than_20_instance_attributes() -> None:
    over = [f"{p}: {node.name} has {len(a)}" for p, node in _classes()
            if len(a := _instance_attributes(node)) > 20]
    assert not over, "\n".join(over)


def test_findings_are_made_in_at_most_two_modules() -> None:
    """A Finding is built in one place per framework (``finding_for``), not wherever needed."""
    makers = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _base_name(node.func) == "Finding":
                makers.add(str(path.relative_to(SRC)))
    assert len(makers) <= 2, sorted(makers)


_HANDLED = ("raise", "log.", "logger.", "internal_error(", "print_exc(")


def test_every_broad_except_logs_reraises_or_reports() -> None:
    """An error swallowed in silence would let a bug of ours pass for a fact about the run: a
    handler of ``Exception`` logs it, re-raises it, hands it to ``internal_error`` or passes the
    error itself on (a report that names it)."""
    bad = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ExceptHandler):
                continue
            caught = {e.id for e in ast.walk(node.type) if isinstance(e, ast.Name)} if node.type else {"bare"}
            if not caught & {"Exception", "BaseException", "bare"}:
                continue
            body = ast.unparse(ast.Module(body=node.body, type_ignores=[]))
            uses_error = node.name is not None and any(
                isinstance(e, ast.Name) and e.id == node.name for s in node.body for e in ast.walk(s))
            if not uses_error and not any(h in body for h in _HANDLED):
                bad.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bad, "broad excepts that swallow silently:\n" + "\n".join(bad)
