"""The bugs of ``arl/RealBugFix-v0``: one-token mutations at named lines of real packages.

    task = TASKS[3]        # RealBug(package='inflection', path='inflection/__init__.py', line=..., ...)
    task.apply(text)       # the buggy file;  task.fix -> (buggy line, original line)

`candidates` lists every mutation of a source file in file order, one token each, of the kinds
real bugs have: a comparison flipped or made (non-)strict (``<`` / ``<=``, ``==`` / ``!=``), an
operator swapped (``+`` / ``-``, ``and`` / ``or``), an off-by-one constant (``0``, ``1``, ``2``
plus one), a boolean constant negated. Only lines that stay unique in their file are kept, so the
known fix is one ``str_replace`` of the buggy line with the original. The build
(`arl.envs.realbugs.build --select`) took every n-th candidate of each source file (`STRIDES`),
interleaved file by file (the first ``limit`` of them, as ``tasks.json`` records) and kept the
mutations the package's own tests catch; the kept list is `TASKS` (``tasks.json`` beside this
module: data, checked in). Each task's check, re-run by the build and cached: the pristine suite
passes in full (the oracle: reverting the mutation gives the pristine file back, byte for byte)
and at least one test fails on the buggy file.
"""

from __future__ import annotations

import io
import json
import keyword
import tokenize
from pathlib import Path

import attrs

SWAPS: dict[str, tuple[str, str]] = {
    "<": ("<=", "comparison"), "<=": ("<", "comparison"), ">": (">=", "comparison"), ">=": (">", "comparison"),
    "==": ("!=", "negated comparison"), "!=": ("==", "negated comparison"),
    "+": ("-", "operator"), "-": ("+", "operator"), "and": ("or", "operator"), "or": ("and", "operator"),
    "True": ("False", "constant"), "False": ("True", "constant"),
    "0": ("1", "off by one"), "1": ("2", "off by one"), "2": ("3", "off by one"),
}
STRIDES: dict[str, int] = {"inflection": 1, "more-itertools": 3, "toolz": 2}  # every n-th candidate
TASKS_FILE = Path(__file__).with_name("tasks.json")


@attrs.frozen
class RealBug:
    """One mutation: in ``path`` of ``package``, line ``line`` (1-based) reads ``buggy`` for ``original``."""

    package: str
    path: str
    line: int
    original: str
    buggy: str
    kind: str

    @property
    def name(self) -> str:
        """``package:path:line:column`` of the changed token: unique (one line may have several)."""
        column = next(i for i, (a, b) in enumerate(zip(self.original, self.buggy, strict=False)) if a != b)
        return f"{self.package}:{self.path}:{self.line}:{column}"

    @property
    def fix(self) -> tuple[str, str]:
        return self.buggy, self.original

    def apply(self, text: str) -> str:
        """``text`` (the pristine file) with the bug; ValueError if the line is not as recorded."""
        lines = text.splitlines(keepends=True)
        if not 0 < self.line <= len(lines) or lines[self.line - 1].rstrip("\n") != self.original:
            raise ValueError(f"{self.name}: the line is not {self.original!r}")
        lines[self.line - 1] = self.buggy + lines[self.line - 1][len(self.original):]
        return "".join(lines)


def candidates(package: str, path: str, text: str) -> list[RealBug]:
    """Every one-token mutation of ``text`` in `SWAPS` whose buggy line occurs once in the buggy
    file, as a substring too (the known fix is then one unambiguous ``str_replace``).

    >>> [(b.line, b.buggy.strip(), b.kind) for b in candidates("p", "m.py", "def f(a):\\n    return a < 1\\n")]
    [(2, 'return a <= 1', 'comparison'), (2, 'return a < 2', 'off by one')]
    """
    lines = text.splitlines()
    found: list[RealBug] = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        kind_ok = token.type == tokenize.OP or (token.type == tokenize.NAME and keyword.iskeyword(token.string)) \
            or token.type == tokenize.NUMBER
        if not kind_ok or token.string not in SWAPS or token.start[0] != token.end[0]:
            continue
        row, col = token.start
        line = lines[row - 1]
        new, kind = SWAPS[token.string]
        buggy = line[:col] + new + line[token.end[1]:]
        # unique as text (str_replace matches substrings: "    if n:" is inside "        if n:")
        if any(buggy in other for other in lines) or sum(line in other for other in lines) != 1:
            continue
        found.append(RealBug(package, path, row, line, buggy, kind))
    return found


def load_tasks(path: Path = TASKS_FILE) -> tuple[RealBug, ...]:
    """The kept tasks, in order (a task's index is the env's seed modulo their number)."""
    return tuple(RealBug(**row) for row in json.loads(path.read_text())["tasks"])


TASKS: tuple[RealBug, ...] = load_tasks() if TASKS_FILE.exists() else ()

__all__ = ["STRIDES", "SWAPS", "TASKS", "TASKS_FILE", "RealBug", "candidates", "load_tasks"]
