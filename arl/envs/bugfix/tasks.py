"""Generated bug-fix tasks: every seed is a small Python module with one seeded bug.

    task = generate_task(7)
    task.files          # {"gridtools.py": <module with the bug>}
    task.issue          # one line: what goes wrong, e.g. "`clip(5, 0, 3)` returns 5; expected 3."
    task.fix            # (buggy line, fixed line): the known fix, unique in its file
    task.tests          # hidden test file (plain asserts; pytest runs it too)
    task.cases          # the same tests as data (`TestCase`): what the judge runs and compares

A task is a module of three functions drawn from `FAMILIES` (name variants, argument names and
order shuffled by the seed); one of them, the target, gets one mutation of a kind real bugs
have: a wrong comparison (``<`` for ``<=``), a wrong operator (``+`` for ``-``), an off-by-one
constant, swapped arguments, a wrong constant. The hidden tests are asserts on inputs drawn from
the seed, with the expected values computed by the correct code: several for the target, two for
each other function. Generation keeps only mutations that fail at least one hidden test (an
equivalent mutant is no task), that compile, and whose buggy line is unique in the module, so
the scripted solver's ``str_replace(buggy line -> fixed line)`` always applies; which of those
the task uses is the seed's choice. Everything is a pure function of the seed: the same seed
gives the same task on every machine.

Bodies use bounded ``for`` loops only, so no mutant can loop forever; generation runs the
mutants in-process (our own code) to check them.
"""

from __future__ import annotations

import functools
import io
import random
import tokenize
from collections.abc import Callable
from typing import Any

import attrs

# -- function families --------------------------------------------------------------------------


@attrs.frozen
class Family:
    """One kind of function: its source (``{name}`` for the function's name), how to draw
    arguments, edge cases every task tests, and mutations tokens alone cannot express."""

    names: tuple[str, ...]
    source: str
    draw: Callable[[random.Random], tuple[Any, ...]]
    edge_cases: tuple[tuple[Any, ...], ...] = ()
    mutations: tuple[tuple[str, str, str], ...] = ()  # (correct line, buggy line, kind), stripped


def _ints(rng: random.Random, lo: int = -9, hi: int = 9, n: tuple[int, int] = (0, 8)) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


FAMILIES: dict[str, Family] = {
    "clamp": Family(
        names=("clamp", "clip", "bound"),
        source=(
            "def {name}(value, low, high):\n"
            "    if value < low:\n"
            "        return low\n"
            "    if value > high:\n"
            "        return high\n"
            "    return value\n"
        ),
        draw=lambda rng: (rng.randint(-8, 8), rng.randint(-6, 0), rng.randint(1, 6)),
        edge_cases=((-20, -3, 3), (20, -3, 3), (1, -3, 3)),
        mutations=(("if value < low:", "if value < high:", "wrong variable"),
                   ("if value > high:", "if value > low:", "wrong variable")),
    ),
    "count_between": Family(
        names=("count_between", "count_in_range", "tally_range"),
        source=(
            "def {name}(items, low, high):\n"
            "    count = 0\n"
            "    for item in items:\n"
            "        if low <= item <= high:\n"
            "            count += 1\n"
            "    return count\n"
        ),
        draw=lambda rng: (_ints(rng), rng.randint(-5, 0), rng.randint(0, 5)),
        edge_cases=(([1, 2, 3, 4, 5], 2, 4), ([0, 0, 7], 0, 0)),
    ),
    "running_total": Family(
        names=("running_total", "prefix_sums", "cumulative_sum"),
        source=(
            "def {name}(values, start=0):\n"
            "    totals = []\n"
            "    total = start\n"
            "    for value in values:\n"
            "        total += value\n"
            "        totals.append(total)\n"
            "    return totals\n"
        ),
        draw=lambda rng: (_ints(rng, n=(1, 7)), rng.randint(0, 3)),
        edge_cases=(([1, 2, 3], 0), ([5], 10)),
        mutations=(("total = start", "total = 0", "ignored argument"),),
    ),
    "window_sums": Family(
        names=("window_sums", "sliding_sums", "moving_totals"),
        source=(
            "def {name}(values, size):\n"
            "    sums = []\n"
            "    for start in range(len(values) - size + 1):\n"
            "        sums.append(sum(values[start:start + size]))\n"
            "    return sums\n"
        ),
        draw=lambda rng: (_ints(rng, n=(3, 8)), rng.randint(1, 3)),
        edge_cases=(([1, 2, 3, 4], 2), ([4, 5, 6], 3)),
    ),
    "find_last": Family(
        names=("find_last", "last_index", "rindex_of"),
        source=(
            "def {name}(items, target):\n"
            "    for index in range(len(items) - 1, -1, -1):\n"
            "        if items[index] == target:\n"
            "            return index\n"
            "    return -1\n"
        ),
        draw=lambda rng: (_ints(rng, 0, 4, (1, 8)), rng.randint(0, 4)),
        edge_cases=(([3, 1, 3], 3), ([2], 2), ([1, 2], 5)),
    ),
    "chunked": Family(
        names=("chunked", "batches", "split_every"),
        source=(
            "def {name}(items, size):\n"
            "    chunks = []\n"
            "    for begin in range(0, len(items), size):\n"
            "        chunks.append(items[begin:begin + size])\n"
            "    return chunks\n"
        ),
        draw=lambda rng: (_ints(rng, n=(1, 9)), rng.randint(1, 4)),
        edge_cases=(([1, 2, 3, 4, 5], 2), ([1, 2, 3], 3)),
    ),
    "weighted_sum": Family(
        names=("weighted_sum", "dot", "inner_product"),
        source=(
            "def {name}(values, weights):\n"
            "    total = 0\n"
            "    for value, weight in zip(values, weights):\n"
            "        total += value * weight\n"
            "    return total\n"
        ),
        draw=lambda rng: ((n := rng.randint(1, 5)) and [rng.randint(-5, 5) for _ in range(n)],
                          [rng.randint(-5, 5) for _ in range(n)]),
        edge_cases=(([1, 2, 3], [4, 5, 6]), ([2], [3])),
    ),
    "int_power": Family(
        names=("int_power", "power", "repeat_multiply"),
        source=(
            "def {name}(base, exponent):\n"
            "    result = 1\n"
            "    for _ in range(exponent):\n"
            "        result *= base\n"
            "    return result\n"
        ),
        draw=lambda rng: (rng.randint(-4, 5), rng.randint(0, 5)),
        edge_cases=((2, 10), (3, 0), (5, 1)),
        mutations=(("result = 1", "result = base", "wrong initial value"),),
    ),
    "largest_gap": Family(
        names=("largest_gap", "max_gap", "widest_step"),
        source=(
            "def {name}(values):\n"
            "    ordered = sorted(values)\n"
            "    best = 0\n"
            "    for i in range(1, len(ordered)):\n"
            "        best = max(best, ordered[i] - ordered[i - 1])\n"
            "    return best\n"
        ),
        draw=lambda rng: (_ints(rng, -20, 20, (2, 7)),),
        edge_cases=(([1, 10, 3],), ([5, 5],), ([-4, 4],)),
        mutations=(("best = max(best, ordered[i] - ordered[i - 1])",
                    "best = max(best, ordered[i - 1] - ordered[i])", "swapped operands"),),
    ),
    "safe_divide": Family(
        names=("safe_divide", "ratio_or", "divide_or_default"),
        source=(
            "def {name}(numerator, denominator, default):\n"
            "    if denominator == 0:\n"
            "        return default\n"
            "    return numerator // denominator\n"
        ),
        draw=lambda rng: (rng.randint(-30, 30), rng.choice([0, 1, 2, 3, 4, 5, -3]), rng.randint(-1, 1)),
        edge_cases=((17, 5, 0), (9, 0, -1), (20, 4, 0)),
        mutations=(("return numerator // denominator", "return denominator // numerator", "swapped arguments"),
                   ("return default", "return 0", "ignored argument")),
    ),
    "is_non_decreasing": Family(
        names=("is_non_decreasing", "is_sorted", "in_order"),
        source=(
            "def {name}(values):\n"
            "    for i in range(len(values) - 1):\n"
            "        if values[i] > values[i + 1]:\n"
            "            return False\n"
            "    return True\n"
        ),
        draw=lambda rng: (sorted(_ints(rng, 0, 5, (2, 6))) if rng.random() < 0.5 else _ints(rng, 0, 5, (2, 6)),),
        edge_cases=(([1, 2, 2, 3],), ([3, 1],), ([1, 2, 3, 0],)),
    ),
}

MODULE_NAMES = ("listtools", "numeric", "sequtils", "helpers", "mathbits", "collections_ext", "datatools",
                "arrayops", "calc", "toolkit")
N_TARGET_TESTS = 7
N_OTHER_TESTS = 2

# Token mutations: replaced token -> (replacement, kind).
_OPERATOR_MUTATIONS: dict[str, tuple[str, str]] = {
    "<": ("<=", "wrong comparison"), "<=": ("<", "wrong comparison"), ">": (">=", "wrong comparison"),
    ">=": (">", "wrong comparison"), "==": ("!=", "wrong comparison"), "!=": ("==", "wrong comparison"),
    "+": ("-", "wrong operator"), "-": ("+", "wrong operator"), "*": ("+", "wrong operator"),
    "//": ("%", "wrong operator"), "+=": ("-=", "wrong operator"), "*=": ("+=", "wrong operator"),
}


# -- the task -----------------------------------------------------------------------------------


@attrs.frozen
class TestCase:
    """One hidden test as data: ``function(*args)`` must return ``value`` (outcome "value") or
    raise an exception named ``value`` (outcome "raises"). The judge (`arl.envs.bugfix.judge`)
    sends only ``function`` and ``args`` into the sandbox; ``outcome`` and ``value`` stay on the host."""

    __test__ = False  # not a pytest class
    name: str
    function: str
    args: tuple[Any, ...] = attrs.field(eq=False, hash=False)  # may hold lists
    outcome: str
    value: Any = attrs.field(eq=False, hash=False)


@attrs.frozen
class BugFixTask:
    """One generated task (see the module docstring)."""

    seed: int
    module: str  # module name (the file is f"{module}.py")
    source: str  # the module with the bug: what the agent gets
    fixed_source: str  # the module without it
    function: str  # the function with the bug
    bug_kind: str
    fix: tuple[str, str]  # (buggy line, fixed line), each unique in its file, with indentation
    issue: str  # one line
    tests: str  # the hidden test file
    test_names: tuple[str, ...]
    cases: tuple[TestCase, ...] = attrs.field(default=(), eq=False, hash=False)  # the tests as data, same order

    @property
    def filename(self) -> str:
        return f"{self.module}.py"

    @property
    def test_filename(self) -> str:
        return f"test_{self.module}.py"

    @property
    def files(self) -> dict[str, str]:
        """What the agent's work dir starts with."""
        return {self.filename: self.source}


def _mutants(lines: list[str], family: Family) -> list[tuple[int, str, str]]:
    """Every single-token (and the family's own) mutation of the body: (line index, line, kind)."""
    out: list[tuple[int, str, str]] = []
    for index, line in enumerate(lines[1:], start=1):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        tokens = list(tokenize.generate_tokens(io.StringIO(stripped).readline))
        for tok in tokens:
            col0, col1 = tok.start[1], tok.end[1]
            if tok.type == tokenize.OP and tok.string in _OPERATOR_MUTATIONS:
                new, kind = _OPERATOR_MUTATIONS[tok.string]
                out.append((index, indent + stripped[:col0] + new + stripped[col1:], kind))
            elif tok.type == tokenize.NUMBER:
                for delta in (1, -1):
                    new = str(int(tok.string) + delta)
                    out.append((index, indent + stripped[:col0] + new + stripped[col1:], "off-by-one"))
        for correct, buggy, kind in family.mutations:
            if stripped.rstrip("\n") == correct:
                out.append((index, indent + buggy + "\n", kind))
    return out


def _load(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<task>", "exec"), namespace)  # noqa: S102 -- our own generated code
    return namespace


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    """("value", result) or ("raises", exception type name); arguments are copied first."""
    try:
        return "value", fn(*_copy(args))
    except Exception as exc:  # noqa: BLE001 -- a mutant's crash is an outcome
        return "raises", type(exc).__name__


def _copy(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(list(a) if isinstance(a, list) else a for a in args)


def _fmt_call(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _cases(family: Family, rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    cases = list(family.edge_cases)
    while len(cases) < n:
        case = family.draw(rng)
        if case not in cases:
            cases.append(case)
    rng.shuffle(cases)
    return cases[:n] if n < len(cases) else cases


@functools.lru_cache(maxsize=1024)
def generate_task(seed: int) -> BugFixTask:
    """The task of ``seed`` (any int; deterministic)."""
    rng = random.Random(f"arl-bugfix-{seed}")
    keys = rng.sample(sorted(FAMILIES), 3)
    target_key = keys[0]
    names = {key: rng.choice(FAMILIES[key].names) for key in keys}
    order = rng.sample(keys, len(keys))
    module = rng.choice(MODULE_NAMES)
    blocks = {key: FAMILIES[key].source.format(name=names[key]) for key in keys}
    cases = {key: _cases(FAMILIES[key], rng, N_TARGET_TESTS if key == target_key else N_OTHER_TESTS)
             for key in keys}

    correct_source = "\n\n".join(blocks[key] for key in order)
    correct = _load(correct_source)
    expected = {key: [_call(correct[names[key]], c) for c in cases[key]] for key in keys}

    target_lines = blocks[target_key].splitlines(keepends=True)
    candidates = []
    for index, buggy_line, kind in _mutants(target_lines, FAMILIES[target_key]):
        buggy_block = "".join(target_lines[:index] + [buggy_line] + target_lines[index + 1:])
        source = "\n\n".join(buggy_block if key == target_key else blocks[key] for key in order)
        if source.count(buggy_line) != 1 or correct_source.count(target_lines[index]) != 1:
            continue  # the solver's str_replace must find exactly one place
        try:
            fn = _load(source)[names[target_key]]
        except SyntaxError:
            continue
        got = [_call(fn, c) for c in cases[target_key]]
        failing = [i for i, (g, e) in enumerate(zip(got, expected[target_key], strict=True)) if g != e]
        if failing:
            candidates.append((source, target_lines[index], buggy_line, kind, failing[0], got[failing[0]]))
    if not candidates:  # every family has non-equivalent mutants on its edge cases; see the tests
        raise AssertionError(f"seed {seed}: no mutant of {target_key} fails its tests")
    source, fixed_line, buggy_line, kind, first, got = rng.choice(candidates)

    fn_name = names[target_key]
    call = _fmt_call(fn_name, cases[target_key][first])
    outcome, value = expected[target_key][first]
    want = f"{value!r}" if outcome == "value" else f"a {value}"
    have = f"returns {got[1]!r}" if got[0] == "value" else f"raises {got[1]}"
    issue = f"In {module}.py, `{call}` {have}; expected {want}."

    tests, test_names = _test_file(module, keys, names, cases, expected)
    return BugFixTask(
        seed=seed, module=module, source=source, fixed_source=correct_source, function=fn_name, bug_kind=kind,
        fix=(buggy_line, fixed_line), issue=issue, tests=tests, test_names=tuple(test_names),
        cases=tuple(TestCase(f"test_{names[key]}_{i}", names[key], _copy(args), outcome, value)
                    for key in keys for i, (args, (outcome, value)) in enumerate(zip(cases[key], expected[key], strict=True))),
    )


def _test_file(module: str, keys: list[str], names: dict[str, str], cases: dict[str, list[tuple[Any, ...]]],
               expected: dict[str, list[tuple[str, Any]]]) -> tuple[str, list[str]]:
    """Plain-assert tests (pytest style) with the correct code's outputs as expectations."""
    lines = [f"from {module} import {', '.join(sorted(names[k] for k in keys))}", ""]
    test_names = []
    for key in keys:
        name = names[key]
        for i, (args, (outcome, value)) in enumerate(zip(cases[key], expected[key], strict=True)):
            test = f"test_{name}_{i}"
            test_names.append(test)
            lines += ["", f"def {test}():"]
            if outcome == "value":
                lines.append(f"    assert {_fmt_call(name, args)} == {value!r}")
            else:  # the correct code raises: the test expects the same exception type
                lines += ["    try:", f"        {_fmt_call(name, args)}", "    except Exception as exc:",
                          f"        assert type(exc).__name__ == {value!r}", "    else:",
                          "        raise AssertionError('no exception')"]
            lines.append("")
    return "\n".join(lines), test_names


__all__ = ["FAMILIES", "BugFixTask", "Family", "TestCase", "generate_task"]
