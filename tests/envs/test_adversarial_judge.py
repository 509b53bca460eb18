"""The bug-fix reward against an agent that wants 1.0 without fixing the bug (issue 28, classes 1 and 10).

Each attack is what a model could write through its tools: code appended to the task's module
that runs when the hidden tests import it, with the bug left in. A forged reward shows as a score
above the untouched module's. The judge must also fail loudly (`JudgeUnavailable`) where it cannot
run at all, and only there: an agent that breaks its own code scores 0, it cannot make its episode
an error. Runs in both modes: the judge's design (results decided on the host) does not rest on
bubblewrap.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from arl.envs.bugfix import BugFixEnv, JudgeUnavailable, assistant_message, generate_task, solution_calls
from arl.envs.bugfix import judge as judge_module
from arl.sandbox.sandbox import SandboxLimits, bwrap_problem
from tests.envs.backend_params import CONTAINERS

pytestmark = pytest.mark.anyio
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unavailable: {bwrap_problem()}")
MODES = ["none", pytest.param("auto", marks=needs_bwrap), *CONTAINERS]
SEED = 3
REPO = Path(__file__).resolve().parents[2]


def _submit_with(isolation: str, code: str) -> tuple[float, float]:
    """(score of the untouched module, score with ``code`` appended to it through a bash call)."""
    env = BugFixEnv(isolation=isolation, limits=SandboxLimits(wall_s=20.0, cpu_s=10.0))
    task = generate_task(SEED)
    try:
        env.reset(seed=SEED)
        untouched = env.step(assistant_message("submit", {}))[1]
        env.reset(seed=SEED)
        heredoc = f"cat >> {task.filename} <<'ARL_EOF'\n{textwrap.dedent(code)}\nARL_EOF"
        _, _, _, _, info = env.step(assistant_message("bash", {"command": heredoc}))
        assert info["action_valid"]
        assert "ARL_EOF" not in (env.sandbox.workdir / task.filename).read_text()
        return untouched, env.step(assistant_message("submit", {}))[1]
    finally:
        env.close()


@pytest.mark.parametrize("isolation", MODES)
def test_runner_reporting_cannot_be_called_from_the_code_under_test(isolation):
    """The old runner's own reporting closure (and its nonce) were on the call stack of the import."""
    untouched, cheated = _submit_with(isolation, """
        import os as _os, re as _re, sys as _sys
        try:  # the hidden tests' names, from the test file the runner was given
            _names = _re.findall(r"^def (test_\\w+)", open(_sys.argv[1]).read(), _re.M)
        except OSError:
            _names = []
        _frame = _sys._getframe()
        while _frame is not None and _names:
            _emit, _nonce, _report = (_frame.f_locals.get(k) for k in ("emit", "nonce", "report"))
            if callable(_emit):  # the runner's own reporting call
                for _name in _names:
                    _emit(_name, True)
                _os._exit(0)
            if isinstance(_nonce, str) and hasattr(_report, "write"):  # or its nonce and stream
                _report.write("".join(f'{_nonce} ["{n}", true, ""]\\n' for n in _names))
                _report.flush()
                _os._exit(0)
            _frame = _frame.f_back
    """)
    assert untouched < 1.0
    assert cheated <= untouched


@pytest.mark.parametrize("isolation", MODES)
def test_a_result_that_equals_everything_does_not_pass(isolation):
    """``assert f(x) == expected`` in the judged process trusts the result's own ``__eq__``."""
    untouched, cheated = _submit_with(isolation, """
        class _Yes(int):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = int.__hash__
        def _yes(*args, **kwargs): return _Yes(0)
        for _name in [n for n, v in list(globals().items()) if callable(v) and not n.startswith("_")]:
            globals()[_name] = _yes
    """)
    assert cheated == 0.0 <= untouched < 1.0


@pytest.mark.parametrize("isolation", MODES)
def test_hidden_expectations_are_not_readable_at_evaluation(isolation):
    """The old evaluation bound the hidden test file (asserts with the expected values) into the
    sandbox: the module could read it at import and answer from it."""
    untouched, cheated = _submit_with(isolation, """
        import ast as _ast, glob as _glob, sys as _sys
        _answers = {}
        for _path in _glob.glob("/tmp/arl-*/**/*.py", recursive=True) + [p for p in _sys.argv if p.endswith(".py")]:
            try:
                _tree = _ast.parse(open(_path).read())
            except Exception:
                continue
            for _node in _ast.walk(_tree):
                try:  # `assert f(1, 2) == 3`: remember f(1, 2) -> 3
                    _call = _node.left
                    _key = (_call.func.id, repr(tuple(_ast.literal_eval(a) for a in _call.args)))
                    _answers[_key] = _ast.literal_eval(_node.comparators[0])
                except Exception:
                    pass
        def _wrap(_name, _fn):
            def _answer(*args):
                _key = (_name, repr(args))
                return _answers[_key] if _key in _answers else _fn(*args)
            return _answer
        for _name in [n for n, v in list(globals().items()) if callable(v) and not n.startswith("_")]:
            globals()[_name] = _wrap(_name, globals()[_name])
    """)
    assert cheated <= untouched < 1.0


@pytest.mark.parametrize("isolation", MODES)
def test_printed_results_cannot_pass_a_test(isolation):
    """Lines written straight to every fd (the runner's READY and result format included)."""
    untouched, cheated = _submit_with(isolation, """
        import os as _os
        for _fd in range(1, 20):
            try:
                _os.write(_fd, b'arl-judge-ready\\n["value", true]\\n["value", 0]\\n')
            except OSError:
                pass
        _os._exit(0)
    """)
    assert cheated == 0.0 <= untouched < 1.0


@pytest.mark.parametrize("isolation", MODES)
def test_the_agent_cannot_turn_its_zero_into_a_judge_error(isolation):
    """Killing the runner, breaking the interpreter's state, leaving processes: a 0, not an error."""
    untouched, cheated = _submit_with(isolation, """
        import os as _os, signal as _signal, sys as _sys
        _sys.modules.clear()
        _os.kill(_os.getpid(), _signal.SIGKILL)
    """)
    assert cheated == 0.0 <= untouched < 1.0


def test_a_judge_that_cannot_start_ends_the_episode_as_an_error(monkeypatch):
    """No interpreter in the sandbox: the correct fix must not score a silent 0."""
    monkeypatch.setattr(judge_module, "interpreter", lambda: "/nonexistent/python3")
    env = BugFixEnv(isolation="none")
    env.reset(seed=SEED)
    for name, arguments in solution_calls(generate_task(SEED))[:-1]:
        env.step(assistant_message(name, arguments))
    with pytest.raises(JudgeUnavailable, match="could not start"):
        env.step(assistant_message("submit", {}))
    assert env.done and env.sandbox is not None and env.sandbox.closed
    env.close()


def test_correct_fix_scores_one_through_a_symlinked_venv(tmp_path):
    """The checkout's ``.venv`` a symlink to a venv elsewhere (issue 28, class 10): the sandbox must
    find the interpreter where it really lives, and the scripted fix of seed 3 must score 1.0."""
    real_prefix = Path(sys.prefix).resolve()
    assert real_prefix != Path(sys.base_prefix).resolve(), "precondition: the tests run from a venv"
    link = tmp_path / "checkout" / ".venv"
    link.parent.mkdir()
    link.symlink_to(real_prefix, target_is_directory=True)
    script = textwrap.dedent(f"""
        import sys
        assert sys.prefix == {str(link)!r}, sys.prefix  # the unresolved path, as in the report
        from arl.envs.bugfix import BugFixEnv, assistant_message, generate_task, solution_calls
        env = BugFixEnv()
        env.reset(seed={SEED})
        for name, arguments in solution_calls(generate_task({SEED})):
            _, reward, _, _, info = env.step(assistant_message(name, arguments))
        print(env.sandbox.isolation if env.sandbox else "", reward, info["tests_passed"], info["tests_total"])
        env.close()
    """)
    done = subprocess.run([str(link / "bin" / "python"), "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    _isolation, reward, passed, total = done.stdout.split()
    assert (float(reward), passed) == (1.0, total), done.stdout


@pytest.mark.parametrize("cases_per_process", [1, 4, 11])
async def test_forged_lines_fail_in_every_process_layout(tmp_path, cases_per_process):
    """With several cases per runner process, lines the code writes itself (here: one "pass" per
    case, in the runner's format, on the runner's own report fd) must still not count."""
    task = generate_task(SEED)
    (tmp_path / task.filename).write_text(task.source)
    untouched = (await judge_module.judge(task, tmp_path, cases_per_process=cases_per_process)).score
    (tmp_path / task.filename).write_text(task.source + textwrap.dedent("""
        import json as _json, os as _os
        for _fd in range(3, 20):
            try:
                _os.write(_fd, b"".join(_json.dumps(["value", v]).encode() + b"\\n" for v in (True, 0, 3, -4) * 4))
            except OSError:
                pass
    """))
    verdict = await judge_module.judge(task, tmp_path, cases_per_process=cases_per_process)
    assert verdict.score <= untouched < 1.0, verdict
    (tmp_path / task.filename).write_text(task.fixed_source)
    assert (await judge_module.judge(task, tmp_path, cases_per_process=cases_per_process)).score == 1.0
