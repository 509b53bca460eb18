"""Push-mode agents that try to read, signal or outlive each other and the trainer (issue 28, class
3; docs/threat_model.md, "Push-mode agents"). Under ``isolation="uid"`` (root) each agent is its own
uid: a sibling's and the trainer's /proc/<pid>/environ are closed to it, it cannot signal them, and
a daemon it leaves behind dies with its episode. The agents are /usr/bin/python3 scripts in a
directory others can read: what a uid of its own can run. No network: the runner never calls the
client, the agents call no one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from arl.agents import process
from arl.agents.process import PushModeRunner, choose_isolation, unreachable_paths

pytestmark = pytest.mark.anyio

SYSTEM_PYTHON = "/usr/bin/python3"
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON),
                                reason="uid isolation needs root, setpriv and a system python")

AGENT = textwrap.dedent('''
    import json, os, sys, time
    role, shared = sys.argv[1], sys.argv[2]

    def can_read(path):
        try:
            with open(path, "rb") as f:
                return 1.0 if f.read(64) is not None else 0.0
        except PermissionError:
            return 0.0

    m = {"home_is_workdir": float(os.environ["HOME"] == os.path.dirname(os.environ["ARL_RESULT_PATH"])),
         "uid_is_root": float(os.getuid() == 0)}
    if role == "victim":
        with open(os.path.join(shared, "victim.pid.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(shared, "victim.pid.tmp"), os.path.join(shared, "victim.pid"))
        time.sleep(4)
    elif role == "attacker":
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(shared, "victim.pid")) and time.time() < deadline:
            time.sleep(0.05)
        victim = int(open(os.path.join(shared, "victim.pid")).read())
        m["sibling_environ_read"] = can_read(f"/proc/{victim}/environ")
        m["trainer_environ_read"] = can_read(f"/proc/{os.getppid()}/environ")
        try:
            os.kill(victim, 0)
            m["sibling_signal"] = 1.0
        except PermissionError:
            m["sibling_signal"] = 0.0
    elif role == "daemon":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(os.path.join(shared, "daemon.pid.tmp"), "w") as f:
                    f.write(str(os.getpid()))
                os.replace(os.path.join(shared, "daemon.pid.tmp"), os.path.join(shared, "daemon.pid"))
                time.sleep(120)
            os._exit(0)
        # the daemon is left behind only once it runs: on a loaded machine the agent could otherwise
        # finish (and its episode kill the daemon) before the daemon wrote its pid
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(shared, "daemon.pid")) and time.time() < deadline:
            time.sleep(0.05)
    with open(os.environ["ARL_RESULT_PATH"], "w") as f:
        json.dump({"score": 1.0, "success": True, "metrics": m}, f)
''')


class _Client:  # the HTTP client a runner is given; PushModeRunner only reads these two fields
    def __init__(self, token: str) -> None:
        self.base_url, self.api_key = "http://127.0.0.1:9/v1", token


@pytest.fixture
def agent_dir():
    """A directory others can enter, with the agent script (pytest's tmp_path is closed to others)."""
    d = Path(tempfile.mkdtemp(prefix="arl-test-push-"))
    os.chmod(d, 0o755)
    (d / "agent.py").write_text(AGENT)
    os.chmod(d / "agent.py", 0o644)
    shared = d / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # where the agents meet, as /tmp would let them
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _runner(agent_dir: Path, role: str, token: str, isolation: str = "uid") -> PushModeRunner:
    return PushModeRunner(_Client(token), [SYSTEM_PYTHON, str(agent_dir / "agent.py"), role, str(agent_dir / "shared")],
                          timeout_s=60, isolation=isolation, cwd=str(agent_dir))


@needs_root
async def test_an_agent_cannot_read_or_signal_its_sibling_or_the_trainer(agent_dir):
    victim, attacker = _runner(agent_dir, "victim", "tok-victim"), _runner(agent_dir, "attacker", "tok-attacker")
    assert victim.isolation == attacker.isolation == "uid"
    v, a = await asyncio.gather(victim.run_job(1), attacker.run_job(2))
    assert v.status == a.status == "Finished", (v.error, a.error)
    assert a.metrics["sibling_environ_read"] == 0.0  # the sibling's bearer token stays its own
    assert a.metrics["trainer_environ_read"] == 0.0  # and the trainer's secrets the trainer's
    assert a.metrics["sibling_signal"] == 0.0
    assert a.metrics["uid_is_root"] == 0.0 and a.metrics["home_is_workdir"] == 1.0
    assert a.metrics["isolated_uid"] == v.metrics["isolated_uid"] == 1.0


@needs_root
async def test_without_isolation_the_same_attack_succeeds(agent_dir):
    """The control: the attack above is real, so the test above can fail."""
    victim, attacker = (_runner(agent_dir, "victim", "t1", "none"), _runner(agent_dir, "attacker", "t2", "none"))
    v, a = await asyncio.gather(victim.run_job(1), attacker.run_job(2))
    assert a.metrics["sibling_environ_read"] == 1.0 and a.metrics["sibling_signal"] == 1.0
    assert a.metrics["isolated_uid"] == 0.0


@needs_root
async def test_a_daemon_the_agent_leaves_behind_dies_with_its_episode(agent_dir):
    result = await _runner(agent_dir, "daemon", "tok").run_job(3)
    assert result.status == "Finished", result.error
    pid = int((agent_dir / "shared" / "daemon.pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"the agent's daemon {pid} outlived its episode")


def test_auto_falls_back_to_none_and_says_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert choose_isolation("auto", [sys.executable]) == (
        "none", "the trainer is not root, so it cannot give each agent a uid of its own")
    with pytest.raises(ValueError, match="not root"):
        choose_isolation("uid", [sys.executable])
    assert choose_isolation("none", [sys.executable]) == ("none", None)
    with pytest.raises(ValueError, match="isolation='chroot' is not one of"):
        choose_isolation("chroot", [sys.executable])


def test_an_interpreter_behind_a_closed_directory_is_found(tmp_path):
    closed = tmp_path / "home"
    (closed / "bin").mkdir(parents=True)
    exe = closed / "bin" / "tool"
    exe.write_text("#!/bin/sh\necho hi\n")
    exe.chmod(0o755)
    closed.chmod(0o700)  # as /root is where pyenv's Python lives on this machine
    link_dir = Path(tempfile.mkdtemp(prefix="arl-test-link-"))
    try:
        os.chmod(link_dir, 0o755)
        (link_dir / "python").symlink_to(exe)  # a venv's bin/python: a link to the real interpreter
        problems = unreachable_paths([str(link_dir / "python")])
        assert len(problems) == 1 and str(closed) in problems[0] and "closed to others" in problems[0]
        assert unreachable_paths(["/bin/sh", "-c", "true"]) == []
        assert "not found" in unreachable_paths(["no-such-program-arl"])[0]
    finally:
        shutil.rmtree(link_dir)
        closed.chmod(0o755)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o755


def test_the_fallback_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(process, "_said", set())
    with caplog.at_level("WARNING", logger="arl.agents.process"):
        for _ in range(3):
            PushModeRunner(_Client("t"), [sys.executable, "-c", "pass"], timeout_s=5)
    assert sum("not isolated" in r.message for r in caplog.records) == 1
