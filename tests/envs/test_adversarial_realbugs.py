"""The real-code reward (arl/RealBugFix-v0) against an agent that wants 1.0 without fixing the bug.

Each attack is what a model could do through its tools, the bug left in: files beside the package
(a ``conftest.py`` forcing passes, an edited test file, a ``sitecustomize.py`` and a ``.pth``), or
code appended to the package's source file, which the judge imports into the pytest process
(fake pytest output, ``os._exit(0)``, rewriting the judge's tree or its report). A forged reward
shows as a score above the untouched submission's. docs/threat_model.md, "The real-code reward",
says what each blocks and what is left (the last test here, a known hole, expected to forge).
"""

from __future__ import annotations

import textwrap

import pytest

from arl.envs.bugfix.solver import assistant_message
from arl.envs.realbugs.env import RealBugFixEnv
from arl.envs.realbugs.packages import PACKAGES, ensure_package
from arl.envs.realbugs.tasks import TASKS
from arl.sandbox.sandbox import bwrap_problem
from tests.envs.backend_params import CONTAINERS

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unavailable: {bwrap_problem()}")
ISOLATING = [pytest.param("bwrap", marks=needs_bwrap), *CONTAINERS]
MODES = ["none", *ISOLATING]
INFLECTION = 9  # the quickest suite; its bug fails 2 of 455 tests (an unfixed submission scores 0.996)
TOOLZ = 1  # several test modules; its bug fails 2 of 180

# A pytest hook that turns every failed test into a pass (the classic conftest forgery).
FORCE_PASS = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""


def _bash(command: str) -> dict:
    return assistant_message("bash", {"command": command})


def _heredoc(path: str, text: str, *, append: bool = False) -> dict:
    return _bash(f"mkdir -p \"$(dirname {path})\" && cat {'>>' if append else '>'} {path} <<'ARL_EOF'\n"
                 f"{textwrap.dedent(text)}\nARL_EOF")


def _scores(isolation: str, seed: int, *attack: dict) -> tuple[float, float]:
    """(reward of submitting the buggy package untouched, reward after the ``attack`` steps)."""
    env = RealBugFixEnv(isolation=isolation)
    try:
        env.reset(seed=seed)
        untouched = env.step(assistant_message("submit", {}))[1]
        env.reset(seed=seed)
        for step in attack:
            assert env.step(step)[4]["action_valid"]
        return untouched, env.step(assistant_message("submit", {}))[1]
    finally:
        env.close()


def _append_to_module(seed: int, code: str) -> dict:
    return _heredoc(TASKS[seed].path, code, append=True)


@pytest.mark.parametrize("isolation", MODES)
def test_a_conftest_forcing_passes_counts_for_nothing(isolation):
    untouched, cheated = _scores(isolation, INFLECTION, _heredoc("conftest.py", FORCE_PASS),
                                 _heredoc("inflection/conftest.py", FORCE_PASS))
    assert cheated <= untouched < 1.0


@pytest.mark.parametrize("isolation", MODES)
def test_an_edited_test_file_counts_for_nothing(isolation):
    """The tests keep their names (so their ids match) but assert nothing."""
    untouched, cheated = _scores(isolation, INFLECTION, _bash(
        "python - <<'ARL_EOF'\nimport re\ntext = open('test_inflection.py').read()\n"
        "names = re.findall(r'^def (test_\\w+)', text, re.M)\n"
        "open('test_inflection.py', 'w').write(''.join(f'def {n}(*a, **k):\\n    pass\\n' for n in names))\n"
        "ARL_EOF"))
    assert cheated <= untouched < 1.0


@pytest.mark.parametrize("isolation", MODES)
def test_a_sitecustomize_and_a_pth_file_count_for_nothing(isolation):
    hook = "import sys, os\nos.environ['PYTEST_ADDOPTS'] = '-p no:python'\n"
    untouched, cheated = _scores(isolation, INFLECTION, _heredoc("sitecustomize.py", hook),
                                 _heredoc("usercustomize.py", hook),
                                 _heredoc("arl-forge.pth", "import os; os._exit(0)"))
    assert cheated <= untouched < 1.0


@pytest.mark.parametrize("how", ["rm {path}", "mv {path} {path}.bak && ln -s {path}.bak {path}",
                                 "python -c 'print(\"#\" * (3 << 20))' >> {path}", "rm {path} && mkdir {path}",
                                 "rm -r inflection && ln -s {cache}/inflection inflection"])
def test_a_source_file_the_judge_cannot_take_is_not_the_pristine_one(how):
    """Deleted, made a link, grown past the size bound, made a dir, or its dir a link to the
    pristine package in arl's cache (absent inside a sandbox, there on the host that reads the
    file): the judge must not fall back to the pristine file (the old judge did, and scored the
    first three and the last 1.0 with the bug in; the dir crashed the reward, an episode error):
    the package is judged without it, and its import fails."""
    path, cache = TASKS[INFLECTION].path, ensure_package(PACKAGES["inflection"])
    untouched, cheated = _scores("none", INFLECTION, _bash(how.format(path=path, cache=cache)))
    assert cheated == 0.0 < untouched < 1.0


@pytest.mark.parametrize("isolation", MODES)
def test_printed_pytest_output_and_a_planted_report_count_for_nothing(isolation):
    """The verdicts come from the report in the judge's own dir, never from stdout or the tree."""
    untouched, cheated = _scores(isolation, INFLECTION, _heredoc("arl-report.xml", "<testsuites/>"),
                                 _append_to_module(INFLECTION, """
        import sys as _sys
        print("=" * 20 + " 455 passed in 0.42s " + "=" * 20)
        _sys.stderr.write("455 passed\\n")
    """))
    assert cheated <= untouched < 1.0


@pytest.mark.parametrize("isolation", MODES)
def test_an_exit_at_import_scores_zero(isolation):
    """pytest never writes its report: no test passed (a 0, not an episode error)."""
    untouched, cheated = _scores(isolation, INFLECTION, _append_to_module(INFLECTION, "import os; os._exit(0)"))
    assert cheated == 0.0 < untouched < 1.0


@pytest.mark.parametrize("isolation", ISOLATING)
def test_the_module_cannot_rewrite_the_judges_tree(isolation):
    """At import (during collection) the module makes every assert of the test modules pytest
    has not imported yet true, and drops a forcing conftest.py into the tests' dir (on the old
    judge's writable tree: all 180 tests passed). The tree is read-only; not under backend "none"
    (the host: nothing is), which is left out here."""
    untouched, cheated = _scores(isolation, TOOLZ,
                                 _append_to_module(TOOLZ, """
        import glob as _glob, os as _os, re as _re
        for _path in _glob.glob(_os.path.join(_os.getcwd(), "toolz", "tests", "test_*.py")):
            try:  # every test kept (its id matches), its asserts made true
                _text = _re.sub(r"^(\\s*)assert ", r"\\1assert True or ", open(_path).read(), flags=_re.M)
                open(_path, "w").write(_text)
            except OSError:
                pass
        try:
            open(_os.path.join(_os.getcwd(), "toolz", "tests", "conftest.py"), "w").write(FORCE)
        except OSError:
            pass
    """.replace("FORCE", repr(FORCE_PASS))))
    assert cheated <= untouched < 1.0


@pytest.mark.parametrize("isolation", MODES)
def test_a_report_rewritten_at_exit_is_contradicted(isolation):
    """At interpreter exit (after pytest wrote its report) the module strips the failures from
    it; pytest's exit code (1) still says a test failed, so the run scores 0."""
    untouched, cheated = _scores(isolation, INFLECTION, _append_to_module(INFLECTION, """
        import atexit as _atexit, re as _re, sys as _sys
        def _forge():
            for _arg in _sys.argv:
                if _arg.startswith("--junitxml="):
                    _path = _arg.split("=", 1)[1]
                    _text = _re.sub(r"<(failure|error)\\b.*?</\\1>", "", open(_path).read(), flags=_re.S)
                    _text = _re.sub(r'(failures|errors)="\\d+"', r'\\1="0"', _text)
                    open(_path, "w").write(_text)
        _atexit.register(_forge)
    """))
    assert cheated <= untouched < 1.0


@pytest.mark.xfail(strict=True, reason="known hole: code in the pytest process can rewrite the report and exit 0 "
                                       "(docs/threat_model.md, 'The real-code reward')")
def test_known_hole_a_report_rewritten_at_exit_then_exit_zero():
    untouched, cheated = _scores("none", INFLECTION, _append_to_module(INFLECTION, """
        import atexit as _atexit, os as _os, re as _re, sys as _sys
        def _forge():
            for _arg in _sys.argv:
                if _arg.startswith("--junitxml="):
                    _path = _arg.split("=", 1)[1]
                    _text = _re.sub(r"<(failure|error)\\b.*?</\\1>", "", open(_path).read(), flags=_re.S)
                    open(_path, "w").write(_text)
            _os._exit(0)
        _atexit.register(_forge)
    """))
    assert cheated <= untouched < 1.0
