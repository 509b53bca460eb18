#!/usr/bin/env python3
"""The arl package's import graph, checked against its layers (stdlib only; nothing is imported).

    python scripts/import_graph.py          # the graph on stdout; exit 1 on a cycle or an upward import
    python scripts/import_graph.py --quiet  # only the problems (stderr)

Every ``import`` statement under ``arl/`` is read with `ast` and classed by when it runs:

    ->  module level: when the importing module is first imported
    ~>  function level: when the function first runs (a lazy import)
    :>  under ``if TYPE_CHECKING:``: never at run time, but the code still depends on it

Imports by string (`importlib.import_module`, a runner named "package.module:factory") are not
seen. The graph's nodes are the layer units: each subpackage of arl (``arl.rollout``, all its
modules together) and each top-level module (``arl.config``). Two checks fail the run:

- a cycle between modules over module-level and TYPE_CHECKING imports. A function-level import
  is left out of this check, since deferring an import is how a module may depend on one that
  imports it; it is not left out of the next check.
- an upward import: a unit importing a unit of its own tier or of a higher one in `LAYERS`, unless
  the edge is a function-level one listed in `ALLOWED_UPWARD` with its reason. A unit missing from
  `LAYERS` is an error too, so a new package gets its place in the order when it is added.

The package facade ``arl/__init__.py`` is not a unit: it sits above everything, resolving the
public names on first access, and every ``arl.*`` import runs it anyway.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "arl"

# The layer order, lowest first, as the code holds it. A unit imports only units of lower tiers;
# the units of one tier do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("arl.config", "arl._renamed"),  # the config records: plain data; the shims that keep renamed names working
    ("arl.sandbox",),  # commands without network under limits: the bug-fix env, its tools and pull mode use it
    ("arl.algo", "arl.envs"),  # pure math; the games
    ("arl.models",),  # the zoo: the tiny tokenizer is trained on the games' prompts
    ("arl.engine", "arl.plan"),  # engines load zoo models; the memory planner reads zoo shapes
    ("arl.intercept", "arl.agents"),  # the chat proxy over an engine; agent code on the games
    ("arl.rollout",),  # managers run games, agents and the proxy against an engine
    ("arl.train",),  # the trainer drives rollouts
    ("arl.viz",),  # HTML views of samples and run dirs: reads records and metrics.jsonl, drives nothing
    ("arl.integrations",),  # other frameworks driving arl's rollouts
    ("arl.cli",),  # the command line, over everything
]

# (importer unit, imported unit) -> why this function-level upward import is acceptable. Empty:
# the code has none today; a module-level or TYPE_CHECKING upward import is never allowed.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

MODULE, FUNCTION, TYPING = "->", "~>", ":>"


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    """``arl.rollout.proxy`` -> ``arl.rollout``; a top-level module is its own unit."""
    return ".".join(module.split(".")[:2])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[str, str, int, tuple[str, ...]]]:
    """(imported module, kind, line, imported names) for each import of an arl module in ``tree``."""

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        return ".".join(here + ([node.module] if node.module else []))

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[str, str, int, tuple[str, ...]]]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, kind, node.lineno, ()
        elif isinstance(node, ast.ImportFrom):
            yield resolve(node), kind, node.lineno, tuple(alias.name for alias in node.names)
        if isinstance(node, ast.If) and kind == MODULE and _is_type_checking(node.test):
            for child in node.body:
                yield from walk(child, TYPING)
            for child in node.orelse:
                yield from walk(child, kind)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            kind = FUNCTION  # a class body runs at import time: it stays at its level
        for child in ast.iter_child_nodes(node):
            yield from walk(child, kind)

    for target, kind, line, names in walk(tree, MODULE):
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            yield target, kind, line, names


def scan(package_dir: Path) -> tuple[set[str], list[tuple[str, str, str, str]]]:
    """The package's modules, and its import edges (importer, imported, kind, "path:line")."""
    base = package_dir.parent
    files = {module_name(p, base): p for p in sorted(package_dir.rglob("*.py")) if "__pycache__" not in p.parts}
    edges = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for target, kind, line, names in imports_of(tree, module, path.name == "__init__.py"):
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, the module mod
            for imported in [f"{target}.{n}" for n in names if f"{target}.{n}" in files] or [target]:
                edges.append((module, imported, kind, f"{path.relative_to(base)}:{line}"))
    return set(files), edges


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one node (Tarjan's algorithm, iterative): each one a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def check(modules: set[str], edges: list[tuple[str, str, str, str]]) -> tuple[dict, list[str]]:
    """The unit graph (unit -> unit -> kind -> places) and the problems found."""
    problems: list[str] = []

    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst, kind, _ in edges:
        if kind != FUNCTION and src != dst and dst in modules:
            graph[src].add(dst)
    for component in strongly_connected(graph):
        inside = [f"{src} {kind} {dst} ({where})" for src, dst, kind, where in edges
                  if kind != FUNCTION and src in component and dst in component and src != dst]
        problems.append("cycle between modules " + ", ".join(component) + ":\n    " + "\n    ".join(inside))

    units: dict[str, dict[str, dict[str, list[str]]]] = {
        unit_of(m): defaultdict(lambda: defaultdict(list)) for m in modules if m != PACKAGE}
    for src, dst, kind, where in edges:
        if src != PACKAGE and dst != PACKAGE and unit_of(src) != unit_of(dst):
            units[unit_of(src)][unit_of(dst)][kind].append(where)

    tier = {unit: i for i, group in enumerate(LAYERS) for unit in group}
    problems += [f"{unit} has no place in LAYERS (scripts/import_graph.py): add it" for unit in sorted(units)
                 if unit not in tier]
    used = set()
    for src in sorted(units):
        for dst, kinds in sorted(units[src].items()):
            if src not in tier or dst not in tier or tier[dst] < tier[src]:
                continue
            for kind, places in sorted(kinds.items()):
                if kind == FUNCTION and (src, dst) in ALLOWED_UPWARD:
                    used.add((src, dst))
                    continue
                where = "its own tier" if tier[dst] == tier[src] else "a higher tier"
                problems.append(f"upward import {src} {kind} {dst} ({where}): " + ", ".join(places))
    problems += [f"ALLOWED_UPWARD lists {src} {FUNCTION} {dst}, which no longer occurs: remove it"
                 for src, dst in sorted(set(ALLOWED_UPWARD) - used)]
    return units, problems


def render(units: dict) -> str:
    lines = [f"{MODULE} module level   {FUNCTION} function level (lazy)   {TYPING} TYPE_CHECKING only",
             "layers, lowest first: " + " < ".join("/".join(u.removeprefix(PACKAGE + ".") for u in group)
                                                   for group in LAYERS)]
    for src in sorted(units):
        lines.append(src)
        for dst, kinds in sorted(units[src].items()):
            marks = " ".join(mark for mark in (MODULE, FUNCTION, TYPING) if mark in kinds)
            note = f"  (allowed: {ALLOWED_UPWARD[src, dst]})" if (src, dst) in ALLOWED_UPWARD else ""
            lines.append(f"  {marks:<8} {dst}{note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="arl's import graph, checked against its layers")
    parser.add_argument("--package-dir", type=Path, default=ROOT / PACKAGE, help="default: the arl package")
    parser.add_argument("--quiet", action="store_true", help="print only the problems")
    args = parser.parse_args(argv)
    units, problems = check(*scan(args.package_dir))
    if not args.quiet:
        print(render(units))
    for problem in problems:
        print("ERROR: " + problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
