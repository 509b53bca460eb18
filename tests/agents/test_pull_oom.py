"""A pull-mode tool command that runs its agent's memory cgroup out (issue 47 §B; docs/threat_model.md,
"Pull-mode agents"). The agent and the commands its own `Sandbox` runs share the agent's cgroup
(bubblewrap does not nest, and the agent cannot make cgroups), so the OOM killer chooses between
them: by size alone it would pick the agent (here it holds a ballast larger than the command gets
to be) and the episode would end as an agent error. Every command `Sandbox.run` starts raises its
``oom_score_adj`` to 1000, so the command is the one killed, and its result says "oom".
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap

import anyio
import pytest

from arl.agents.pull import PullModeRunner
from arl.sandbox.cgroups import cgroup_problem
from arl.sandbox.sandbox import Sandbox, SandboxLimits, _host_oom_kills

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

SYSTEM_PYTHON = "/usr/bin/python3"  # what any tool uid can run
LIMIT_MIB, BALLAST_MIB = 128, 72


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "memory cgroups need root"
    if (problem := cgroup_problem()) is not None:
        return problem
    if _host_oom_kills() is None:
        return "the kernel counts no OOM kills (/proc/vmstat has no oom_kill: Linux < 4.13)"
    if not os.path.exists(SYSTEM_PYTHON) or shutil.which("setpriv") is None:
        return "the test needs /usr/bin/python3 and setpriv"
    return None


needs_memory_cgroup = pytest.mark.skipif(_why_not() is not None, reason=f"no memory cgroup here: {_why_not()}")

AGENT = textwrap.dedent(f'''
    import asyncio, os
    from arl.agents.pipe_transport import end_session
    from arl.sandbox.sandbox import Sandbox, SandboxLimits

    ballast = b"x" * ({BALLAST_MIB} << 20)  # touched: the agent is the largest process of its cgroup
    HOG = "a = []\\nwhile True: a.append(b'y' * (1 << 20))"

    async def main():
        async with Sandbox(SandboxLimits(wall_s=60, cpu_s=60, memory_bytes=1 << 30)) as sandbox:
            sandbox.write_file("hog.py", HOG)
            result = await asyncio.wait_for(sandbox.run("{SYSTEM_PYTHON} hog.py"), 60)
        end_session({{"score": 1.0, "error": f"{{result.status}} {{result.exit_code}} {{result.stderr[-300:]}}",
                     "metrics": {{"tool_oom": float(result.status == "oom"), "tool_signal": float(result.signal or 0),
                                 "ballast_mib": float(len(ballast) >> 20)}}}})

    asyncio.run(main())
''')


async def never_called(method: str, path: str, body: bytes):
    raise AssertionError("the agent makes no model call")


@needs_memory_cgroup
async def test_a_tool_command_past_the_agents_memory_is_the_one_oom_killed():
    limits = SandboxLimits(wall_s=90, cpu_s=90, memory_bytes=2 << 30, max_procs=1024,
                           total_memory_bytes=LIMIT_MIB << 20)
    runner = PullModeRunner(never_called, [sys.executable, "-c", AGENT], timeout_s=90, limits=limits)
    with anyio.fail_after(100):
        result = await runner.run_job(0)
    assert result.status == "Finished" and result.exit_reason != "agent_error", result.error
    assert result.metrics["tool_oom"] == 1.0 and result.metrics["tool_signal"] == 9.0, result.error
    assert result.metrics["ballast_mib"] == BALLAST_MIB  # the agent, larger, survived


@needs_memory_cgroup
async def test_a_sandbox_command_past_its_cgroup_reads_oom():
    limits = SandboxLimits(wall_s=30, cpu_s=30, memory_bytes=1 << 30, total_memory_bytes=64 << 20)
    with anyio.fail_after(60):
        async with Sandbox(limits) as sandbox:
            assert sandbox.cgroup is not None
            hog = await sandbox.run(f"{SYSTEM_PYTHON} -c 'a = []\nwhile True: a.append(bytes(1 << 20) + b\"y\")'")
            adj = await sandbox.run("cat /proc/self/oom_score_adj")
    assert hog.status == "oom" and hog.signal == 9 and hog.exit_code == 137, hog
    assert adj.stdout.strip() == "1000"


async def test_spawned_processes_keep_their_oom_score():
    """The agent itself (`Sandbox.spawn`) is not made a victim: only the commands `run` starts."""
    with anyio.fail_after(30):
        async with Sandbox() as sandbox:
            proc = await sandbox.spawn(["cat", "/proc/self/oom_score_adj"], env={})
            out, _ = await proc.communicate(b"")
    with open("/proc/self/oom_score_adj") as f:
        assert out.decode().strip() == f.read().strip()
