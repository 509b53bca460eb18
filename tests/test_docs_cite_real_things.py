"""Every file path and every ``arl.`` name the docs and the code's comments cite exists.

Docs drift when code moves: a page that names ``arl/envs/bwrap.py`` after the sandbox moved to
``arl/sandbox/``, or ``tests/envs/test_games.py`` after the test was renamed, sends a reader to
nothing. This test reads

- README.md, docs/*.md, benchmarks/README.md and benchmarks/HISTORY.md (all their text), and
- the comments and docstrings of arl/**/*.py (``#`` comments, and every string that stands alone
  as a statement: module, class and function docstrings, attribute doc-strings)

and checks three kinds of citation:

1. **A repository path**: a run of path characters that starts with one of the repository's
   top-level directories (`TOP_DIRS`, e.g. ``arl/rollout/step.py``, ``tests/train/``,
   ``configs/*.yaml``) and ends either in a file extension or in ``/``. It must exist, relative
   to the repository root (a ``*``, a ``<placeholder>``, ``{a,b}`` or the
   placeholder words NAME, N and ID must match at least one file). The
   start must not follow a path character, so ``~/.cache/arl/models/x.json`` or
   ``/work/arl/x.py`` are not read as ``arl/...``. Words without an extension and without a
   trailing slash (gymnasium ids like ``arl/Sokoban-v0``) are not paths.
2. **A dotted name** ``arl.x.y.z`` (not after a path character, so ``runs/x/arl.log`` is not
   one): the longest importable module prefix is imported and the rest resolved with
   ``getattr`` (an attrs/dataclass field or an annotated class attribute counts). A module that
   cannot be imported here only for want of an optional dependency (verl) is checked statically:
   the file exists and defines the name.
3. **A Markdown link** in the .md files (``[text](target)``, not a URL): the target exists
   relative to the linking file, and a ``#anchor`` into a .md file names one of its headings
   (GitHub's slugs); a ``docs/x.md §N`` citation names a numbered section of that page.
4. **A package listing** in the .md files: a list item that starts with ```rollout/`:`` names
   files of ``arl/rollout/``; each backticked file name (``name.py``) or ``name/`` in it must be there.

Things that legitimately do not exist in a checkout (files a run or a benchmark writes, gitignored)
are in `ALLOWED`, each with its reason. Nothing is imported beyond arl's own modules (no torch
model, no engine), so the test takes a few seconds.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import importlib.util
import io
import re
import sys
import tokenize
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The repository's top-level directories whose paths the docs cite (configs/ is a symlink to
# arl/configs/). A path is read only when it starts with one of these.
TOP_DIRS = ("arl", "tests", "benchmarks", "configs", "docs", "scripts", "notebooks", ".ci")

# Citations that are right although nothing in a checkout matches them, each with its reason.
# Patterns are fnmatch globs over the citation as written (paths without a trailing #anchor).
ALLOWED: dict[str, str] = {
    # benchmarks write their results under benchmarks/results/; these are gitignored
    # (.gitignore: benchmarks/results/*.tmp, benchmarks/results/*-quick.png)
    "benchmarks/results/*.tmp": "a benchmark's partial result, written while it runs (gitignored)",
    "benchmarks/results/*-quick.png": "the --quick runs' plots (gitignored)",
    # the docs say where a benchmark would write a result that no committed run has written
    "benchmarks/results/*-quick.json": "a --quick run's result, written only when one is run",
    # a file the reader writes: "--config configs/my_gpu.yaml" in an example command
    "configs/my_gpu.yaml": "the reader's own config, in an example command line",
    # a run's own files, written in its run directory: `arl.log` is a file name, not a module
    "arl.log": "the log file a run writes in its run directory (runs/<name>/arl.log)",
}

PATH_RE = re.compile(
    r"(?<![\w./~$<>{}-])"  # not inside a longer path, a ~/ or $VAR/ path, or a placeholder
    r"((?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w./*<>{}-]*)"
)
NAME_RE = re.compile(r"(?<![\w./-])(arl(?:\.[A-Za-z_]\w*)+)")
LINK_RE = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
SECTION_RE = re.compile(r"((?:docs/)?[\w-]+\.md)(?:'s)?\s*§\s*(\d+(?:\.\d+)*)")
EXTENSION_RE = re.compile(r"\.[A-Za-z][\w]{0,7}$")


def doc_files() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "benchmarks" / "README.md",
        ROOT / "benchmarks" / "HISTORY.md",
    ]


def code_files() -> list[Path]:
    return sorted(p for p in (ROOT / "arl").rglob("*.py") if "__pycache__" not in p.parts)


def comment_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every stand-alone string statement of a Python file."""
    source = path.read_text()
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.append((node.lineno, node.value.value))
    return found


def sources() -> list[tuple[str, Path, list[tuple[int, str]]]]:
    """(kind, file, [(line, text)]) for every file whose citations are checked."""
    out = []
    for path in doc_files():
        out.append(("doc", path, list(enumerate(path.read_text().splitlines(), start=1))))
    for path in code_files():
        out.append(("code", path, comment_text(path)))
    return out


def allowed(citation: str) -> bool:
    return any(fnmatch.fnmatchcase(citation, pattern) for pattern in ALLOWED)


def path_citations(text: str) -> list[str]:
    """The repository paths cited in one text (see the module docstring, rule 1)."""
    found = []
    for match in PATH_RE.finditer(text):
        path = match.group(1).rstrip(".")
        if path.endswith("/") or EXTENSION_RE.search(path):
            found.append(path)
    return found


def path_exists(path: str, base: Path = ROOT) -> bool:
    pattern = re.sub(r"<[^>]*>|\{[^}]*\}|(?<![\w-])(?:NAME|N|ID)(?![\w-])", "*", path.rstrip("/"))
    if any(ch in pattern for ch in "*?["):
        return any(base.glob(pattern))
    target = base / pattern
    return target.is_dir() if path.endswith("/") else target.exists()


@cache
def _module(name: str) -> object | None:
    """The module `name`, None when it is not a module; raises ImportError for a missing extra."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None:
        return None
    return importlib.import_module(name)


def _has_attr(obj: object, attr: str) -> tuple[bool, object]:
    if hasattr(obj, attr):
        return True, getattr(obj, attr)
    if isinstance(obj, type):  # a field without a class attribute: attrs, dataclasses, annotations
        for klass in obj.__mro__:
            fields = getattr(klass, "__attrs_attrs__", None) or ()
            if any(f.name == attr for f in fields):
                return True, None
            if attr in getattr(klass, "__dataclass_fields__", {}) or attr in getattr(klass, "__annotations__", {}):
                return True, None
    return False, None


def _static_defines(module: str, names: list[str]) -> bool:
    """For a module that cannot be imported here: its file exists and defines names[0] (or, for a
    package, has a submodule of that name), and names[1] if given is an attribute of that class."""
    base = ROOT / Path(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not path.exists():
        return False
    if not names:
        return True
    if base.is_dir() and ((base / f"{names[0]}.py").exists() or (base / names[0]).is_dir()):
        return _static_defines(f"{module}.{names[0]}", names[1:])
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == names[0]:
            if len(names) == 1 or not isinstance(node, ast.ClassDef):
                return len(names) == 1
            return any(
                (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == names[1])
                or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == names[1])
                or (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == names[1] for t in n.targets))
                for n in node.body
            )
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == names[0] for t in targets) and len(names) == 1:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == names[0] for a in node.names
        ):
            return len(names) == 1
    return False


@cache
def name_exists(dotted: str) -> bool:
    """`arl.a.b.C.d`: import the longest module prefix, getattr the rest (rule 2)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            module = _module(module_name)
        except ImportError:  # a module on the way needs an optional extra (verl): read the files
            on_disk = max(
                (c for c in range(1, len(parts) + 1) if _static_defines(".".join(parts[:c]), [])), default=0
            )
            return on_disk > 0 and _static_defines(".".join(parts[:on_disk]), parts[on_disk:])
        if module is None:
            continue
        obj = module
        for attr in parts[cut:]:
            ok, obj = _has_attr(obj, attr)
            if not ok:
                return False
            if obj is None:  # a field: nothing further to resolve
                return attr == parts[-1]
        return True
    return False


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]|\[|\]\([^)]*\)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def headings(path: Path) -> tuple[list[str], list[str]]:
    """(anchors, section numbers) of a Markdown file's headings (outside code fences)."""
    anchors, numbers, fenced = [], [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#+\s+(.*)", line)):
            anchors.append(slug(m.group(1)))
            if n := re.match(r"(\d+(?:\.\d+)*)\.?\s", m.group(1)):
                numbers.append(n.group(1))
    return anchors, numbers


def problems_in(kind: str, path: Path, lines: list[tuple[int, str]]) -> list[str]:
    rel = path.relative_to(ROOT)
    bad = []
    for lineno, text in lines:
        where = f"{rel}:{lineno}"
        for cited in path_citations(text):
            if not allowed(cited) and not path_exists(cited):
                bad.append(f"{where}: path {cited} does not exist")
        for dotted in NAME_RE.findall(text):
            dotted = dotted.rstrip(".")
            if not allowed(dotted) and not name_exists(dotted):
                bad.append(f"{where}: name {dotted} does not resolve")
        for doc, number in SECTION_RE.findall(text):
            target = ROOT / doc if "/" in doc else (path.parent / doc if kind == "doc" else ROOT / "docs" / doc)
            if target.exists() and number not in headings(target)[1]:
                bad.append(f"{where}: {doc} has no section §{number}")
        if kind != "doc":
            continue
        for target in LINK_RE.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = path.parent / file_part if file_part else path
            if file_part and not path_exists(file_part, path.parent):
                bad.append(f"{where}: link {target} points to nothing")
            elif anchor and linked.suffix == ".md" and anchor not in headings(linked)[0]:
                bad.append(f"{where}: link {target}: {file_part or rel.name} has no heading #{anchor}")
    return bad


def listing_problems(path: Path) -> list[str]:
    """Rule 4: a Markdown list item that starts with a package of arl, "- `rollout/`: `records.py`
    (...), `base.py` ...", lists files of that package: every backticked ``name.py`` and ``name/``
    in the item (its continuation lines included) must be in ``arl/<package>/``."""
    bad, item, start = [], "", 0
    lines = path.read_text().splitlines()
    for lineno, line in enumerate([*lines, ""], start=1):
        if line.startswith("- ") or not line.strip() or not line.startswith(" "):
            if m := re.match(r"- `([\w/]+?)/`:", item):
                package = ROOT / "arl" / m.group(1)
                for name in re.findall(r"`([\w-]+\.(?:py|md|ya?ml|json|sh|ipynb|toml|cfg|txt)|[\w-]+/)`", item[m.end():]) if package.is_dir() else []:
                    if not (package / name).exists():
                        bad.append(f"{path.relative_to(ROOT)}:{start}: arl/{m.group(1)}/ has no {name}")
            item, start = (line, lineno) if line.startswith("- ") else ("", 0)
        elif item:
            item += " " + line.strip()
    return bad


def all_problems() -> list[str]:
    found = [p for kind, path, lines in sources() for p in problems_in(kind, path, lines)]
    return found + [p for path in doc_files() for p in listing_problems(path)]


def test_every_cited_path_and_name_exists() -> None:
    problems = all_problems()
    assert not problems, f"{len(problems)} stale citation(s):\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see `arl/rollout/step.py` and tests/train/.", ["arl/rollout/step.py", "tests/train/"]),
        ("gymnasium id arl/Sokoban-v0, cache ~/.cache/arl/models/x.json", []),
        ("runs/x/arl.log and /work/arl/x.py and $ARL_HOME/arl/y.py", []),
        ("benchmarks/results/learning-<name>.json", ["benchmarks/results/learning-<name>.json"]),
    ],
)
def test_what_counts_as_a_path(text: str, expected: list[str]) -> None:
    assert path_citations(text) == expected


def test_the_checker_catches_what_it_should() -> None:
    assert name_exists("arl.rollout.records.Sample")
    assert name_exists("arl.rollout.records.Sample.response_mask")  # an attrs field
    assert name_exists("arl.engine.SampledWith")
    assert not name_exists("arl.rollout.records.NoSuchThing")
    assert not name_exists("arl.no_such_module")
    assert path_exists("configs/*.yaml") and not path_exists("arl/envs/bwrap.py")
    assert problems_in("doc", ROOT / "docs" / "howto.md", [(1, "[x](architecture.md#no-such-heading)")])
    assert problems_in("code", ROOT / "arl" / "config.py", [(1, "docs/architecture.md §99")])
    assert not problems_in("code", ROOT / "arl" / "config.py", [(1, "docs/architecture.md §2")])


if __name__ == "__main__":  # python tests/test_docs_cite_real_things.py: the list, one per line
    found = all_problems()
    print("\n".join(found))
    print(f"{len(found)} stale citation(s)")
    sys.exit(1 if found else 0)
