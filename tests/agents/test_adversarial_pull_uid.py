"""A pull-mode tool command that attacks its own agent (issue 28, class 4; docs/threat_model.md,
"Pull-mode agents"). The agent runs in the bwrap sandbox, where its own `Sandbox` falls back to
isolation "none" (bubblewrap does not nest) and runs the model's command itself. The command —
what a model's ``bash`` tool call would run — reads the agent's ``/proc/<pid>/environ`` (which
holds a secret), sends it SIGUSR1, and tries to ptrace-attach and to open its ``/proc/<pid>/mem``.
With ``tool_isolation="uid"`` each fails; the control without it shows the attack is real.

The attack is a /usr/bin/python3 script (what any uid can run); the agent reports what happened
through its end frame. No network: the agents make no model call.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import textwrap

import pytest

from arl.agents.pull import PullModeRunner, choose_tool_isolation
from arl.sandbox.bwrap import (
    TOOL_UID_BLOCK,
    delegation_problem,
    fresh_uid_block,
    release_uid_block,
    uid_processes,
)
from arl.sandbox.sandbox import Sandbox
from arl.sandbox.uid_delegation import TOOL_UIDS_ENV, format_uids

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

SYSTEM_PYTHON = "/usr/bin/python3"
SECRET = "arl-test-secret-4f1c"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "tool uids need root"
    if not os.path.exists(SYSTEM_PYTHON) or shutil.which("setpriv") is None:
        return "the attack needs /usr/bin/python3 and setpriv"
    return delegation_problem()


needs_tool_uids = pytest.mark.skipif(_why_not() is not None, reason=f"no tool uids here: {_why_not()}")

ATTACK = textwrap.dedent('''
    import ctypes, json, os, signal, sys
    pid, found = int(sys.argv[1]), {"command_uid": float(os.getuid())}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            found["secret_read"] = float(b"ARL_TEST_SECRET=" in f.read())
    except OSError:
        found["secret_read"] = 0.0
    for name, sig in (("signal_sent", signal.SIGUSR1), ("sigcont_sent", signal.SIGCONT)):
        try:  # SIGCONT: the kernel lets it through within a session whatever the uids
            os.kill(pid, sig)
            found[name] = 1.0
        except OSError:
            found[name] = 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    found["ptrace_attached"] = float(libc.ptrace(16, pid, None, None) == 0)  # PTRACE_ATTACH
    if found["ptrace_attached"]:
        os.waitpid(pid, 0x40000000)  # __WALL: until it stops, then let it go
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    try:
        open(f"/proc/{pid}/mem", "rb").close()
        found["mem_opened"] = 1.0
    except OSError:
        found["mem_opened"] = 0.0
    print(json.dumps(found))
''')

# The agent: its env's sandbox (as BugFixEnv makes one) runs the attack as the model's command.
AGENT = textwrap.dedent('''
    import asyncio, json, os, signal, sys
    from arl.agents.pipe_transport import end_session
    from arl.sandbox.sandbox import Sandbox

    received = []
    signal.signal(signal.SIGUSR1, lambda *_: received.append(1))

    async def main():
        async with Sandbox(python=True) as sandbox:
            sandbox.write_file("attack.py", ATTACK)
            result = await asyncio.wait_for(sandbox.run(f"/usr/bin/python3 attack.py {os.getpid()}"), 60)
        lines = result.stdout.strip().splitlines()
        found = json.loads(lines[-1]) if lines else {}
        found.update(agent_uid=float(os.getuid()), signal_received=float(bool(received)),
                     tool_sandbox_none=float(sandbox.isolation == "none"))
        end_session({"score": 1.0, "metrics": found, "error": result.stderr[-2000:] or None})

    asyncio.run(main())
''')


async def never_called(method: str, path: str, body: bytes):
    raise AssertionError("the agent makes no model call")


def _attacked_agent(tool_isolation: str) -> PullModeRunner:
    return PullModeRunner(never_called, [sys.executable, "-c", f"ATTACK = {ATTACK!r}\n" + AGENT], timeout_s=90,
                          env_extra={"ARL_TEST_SECRET": SECRET}, tool_isolation=tool_isolation)


@needs_tool_uids
async def test_a_tool_command_cannot_read_signal_or_ptrace_its_agent():
    runner = _attacked_agent("uid")
    assert runner.tool_isolation == "uid"
    result = await runner.run_job(0)
    m = result.metrics
    assert result.status == "Finished", result.error
    assert runner.isolation == "bwrap" and m["tool_sandbox_none"] == 1.0  # the case class 4 is about
    assert m["command_uid"] != m["agent_uid"]
    assert m["secret_read"] == 0.0  # (a) the agent's environment stays its own
    assert m["signal_sent"] == m["signal_received"] == m["sigcont_sent"] == 0.0  # (b) no signal reaches it
    assert m["ptrace_attached"] == m["mem_opened"] == 0.0  # (c) nor does a debugger
    assert m["isolated_uid"] == 1.0


@needs_tool_uids
async def test_without_tool_uids_the_same_attack_succeeds():
    """The control: the attack above is real, so the test above can fail."""
    runner = _attacked_agent("none")
    result = await runner.run_job(0)
    m = result.metrics
    assert result.status == "Finished", result.error
    assert m["command_uid"] == m["agent_uid"]
    assert m["secret_read"] == 1.0
    assert m["signal_sent"] == m["signal_received"] == m["sigcont_sent"] == 1.0
    if _yama_scope() in (None, 0):  # Yama's scope 1 lets only ancestors attach: (c) fails without uids too
        assert m["ptrace_attached"] == m["mem_opened"] == 1.0
    assert m["isolated_uid"] == 0.0


def _yama_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read())
    except OSError:
        return None


# The agent's delegated powers stop at its block: it cannot become root or another episode's uid,
# nor use its capabilities on root's files or processes.
LIMITS_AGENT = textwrap.dedent('''
    import os, subprocess, sys
    from arl.agents.pipe_transport import end_session
    from arl.sandbox.uid_delegation import delegated_uids

    def refused(call):
        try:
            call()
            return 0.0
        except OSError:
            return 1.0

    block = delegated_uids()
    outside = block.stop  # no mapping: not the agent's uid (below 2**25), not the block

    def switches(uid):
        return subprocess.run(["setpriv", "--clear-groups", f"--reuid={uid}", f"--regid={uid}", "true"]).returncode == 0

    found = {
        "setuid_root_refused": refused(lambda: os.setresuid(0, 0, 0)),
        "setuid_outside_refused": float(not switches(outside)),
        "setuid_block_works": float(switches(block[5])),
        "root_file_refused": refused(lambda: open(os.path.join(sys.argv[1], "root_only")).read()),
        "others_file_read": 1.0 - refused(lambda: open(os.path.join(sys.argv[1], "readable")).read()),
        # bwrap, the sandbox's pid 1; signal 0 checks the permission alone (SIGCONT would pass: the
        # kernel lets it through within a session, whatever the uids)
        "signal_root_refused": refused(lambda: os.kill(1, 0)),
    }
    end_session({"score": 1.0, "metrics": found})
''')


@needs_tool_uids
async def test_the_agent_can_switch_to_its_block_and_to_nothing_else(tmp_path, monkeypatch):
    shown = tmp_path / "shown"  # a root-owned 0600 file the agent's sandbox shows (a PYTHONPATH entry)
    shown.mkdir()
    (shown / "root_only").write_text("no")
    os.chmod(shown / "root_only", 0o600)
    (shown / "readable").write_text("yes")  # the control: the directory is reachable
    os.chmod(shown / "readable", 0o644)
    monkeypatch.setenv("PYTHONPATH", str(shown))
    runner = PullModeRunner(never_called, [sys.executable, "-c", LIMITS_AGENT, str(shown)], timeout_s=90,
                            tool_isolation="uid")
    result = await runner.run_job(0)
    assert result.status == "Finished", result.error
    assert result.metrics == {"setuid_root_refused": 1.0, "setuid_outside_refused": 1.0, "setuid_block_works": 1.0,
                              "root_file_refused": 1.0, "others_file_read": 1.0, "signal_root_refused": 1.0,
                              "isolated_uid": 1.0}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="switching uids needs root and setpriv")
async def test_a_sandbox_given_tool_uids_runs_none_commands_as_one_and_reaps_it(monkeypatch):
    """Under isolation "none" (an agent whose own sandbox is "none": this test process plays it,
    as root, which may switch anyway) the commands run as a block uid, cannot read this process's
    environment, and a daemon they leave dies with the command."""
    block = fresh_uid_block()
    monkeypatch.setenv(TOOL_UIDS_ENV, format_uids(block))
    monkeypatch.setenv("ARL_TEST_SECRET", SECRET)
    try:
        async with Sandbox(isolation="none") as sandbox:
            assert sandbox.uid in block and "process limit" not in sandbox.lost
            daemon = "(setsid sleep 60 >/dev/null 2>&1 &)"
            result = await sandbox.run(f"id -u; cat /proc/{os.getpid()}/environ; {daemon}")
            assert result.stdout.split()[0] == str(sandbox.uid), result
            assert "Permission denied" in result.stderr and SECRET not in result.stdout
            assert uid_processes(sandbox.uid) == 0  # the daemon was killed with its uid
    finally:
        release_uid_block(block)


def test_auto_falls_back_to_none_and_says_why_once(monkeypatch, caplog):
    from arl.agents import pull

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert choose_tool_isolation("auto", "auto", ["true"]) == (
        "none", "the trainer is not root, so it cannot give an agent's tool commands a uid other than the agent's")
    with pytest.raises(ValueError, match="tool_isolation='uid': the trainer is not root"):
        choose_tool_isolation("uid", "auto", ["true"])
    assert choose_tool_isolation("none", "auto", ["true"]) == ("none", None)
    with pytest.raises(ValueError, match="tool_isolation='chroot' is not one of"):
        choose_tool_isolation("chroot", "auto", ["true"])
    pull._warn_no_tool_uids.cache_clear()
    with caplog.at_level(logging.WARNING, logger="arl.agents.pull"):
        for _ in range(3):
            PullModeRunner(never_called, ["true"], timeout_s=5)
    assert sum("no uids for their tool commands" in r.message for r in caplog.records) == 1


def test_unreachable_paths_or_a_foreign_sandbox_leave_no_tool_uids(monkeypatch):
    from arl.agents import pull

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    # sandbox "none": the agent runs on the host, so its tool commands need its interpreter readable
    monkeypatch.setattr(pull, "unreachable_paths", lambda command: ["/root/py: /root is closed to others"])
    isolation, why = choose_tool_isolation("auto", "none", ["/root/py"])
    assert isolation == "none" and "/root is closed to others" in why
    with pytest.raises(ValueError, match="closed to others"):
        choose_tool_isolation("uid", "none", ["/root/py"])
    # a sandbox factory of one's own cannot be asked to set the uids up
    assert "factory" in choose_tool_isolation("auto", lambda: None, ["true"])[1]


def test_blocks_are_apart_from_sandbox_uids_and_from_each_other():
    blocks = [fresh_uid_block() for _ in range(50)]
    try:
        assert len({b.start for b in blocks}) == 50 and all(len(b) == TOOL_UID_BLOCK for b in blocks)
        assert all(b.start >= 1 << 25 for b in blocks)  # every sandbox's own uid is below 2**25
    finally:
        for b in blocks:
            release_uid_block(b)
