"""Sandbox: limits, escape attempts (each a typed outcome, the caller unharmed), the fallback.

Escape tests run under bubblewrap (skipped where it cannot start); limits are kept small so the
file stays fast. The network test talks only to a listener it starts on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
from pathlib import Path

import attrs
import pytest

from arl.sandbox import bwrap as bwrap_module
from arl.sandbox import capped_output as capped_output_module
from arl.sandbox import rlimits as rlimits_module
from arl.sandbox import sandbox as sandbox_module
from arl.sandbox.bwrap import uid_processes
from arl.sandbox.sandbox import CommandResult, Sandbox, SandboxLimits, SandboxUnavailable, bwrap_problem

pytestmark = pytest.mark.anyio

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unavailable: {bwrap_problem()}")
FAST = SandboxLimits(wall_s=15.0, cpu_s=10.0, max_procs=32)  # generous: CI machines may be loaded
MODES = ["none", pytest.param("bwrap", marks=needs_bwrap)]


async def _listener() -> tuple[asyncio.AbstractServer, int, list[bytes]]:
    """A TCP server on 127.0.0.1 outside the sandbox that records what connects to it."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


# -- basics, in both modes ----------------------------------------------------------------------


@pytest.mark.parametrize("isolation", MODES)
async def test_run_basics(isolation):
    async with Sandbox(FAST, isolation=isolation, python=True) as sb:
        assert sb.isolation == isolation
        result = await sb.run("echo out; echo err >&2; pwd; exit 3")
        assert (result.status, result.exit_code, result.truncated) == ("ok", 3, False)
        assert result.stdout == f"out\n{sb.cwd}\n" and result.stderr == "err\n"
        result = await sb.run("python -c 'import sys; print(sys.stdin.read()[::-1])'", stdin="abc")
        assert result.ok and result.stdout == "cba\n"
        sb.write_file("pkg/mod.py", "X = 41\n")
        result = await sb.run("python -c 'import pkg.mod; print(pkg.mod.X + 1)' && echo new > made.txt")
        assert result.stdout == "42\n" and (sb.workdir / "made.txt").read_text() == "new\n"
        workdir = sb.workdir
    assert not workdir.exists() and sb.closed
    assert (await sb.run("true")).status == "error"  # closed: a typed result, no exception


@pytest.mark.parametrize("isolation", MODES)
async def test_limits_in_both_modes(isolation, tmp_path):
    limits = SandboxLimits(wall_s=20.0, cpu_s=10.0, output_bytes=1000, drain_bytes=100_000,
                           file_size_bytes=1 << 20, max_procs=32)
    async with Sandbox(limits, isolation=isolation) as sb:
        sleeper = await sb.run("sleep 30", limits=attrs.evolve(limits, wall_s=1.0))
        assert sleeper.status == "timeout" and sleeper.wall_s < 10
        flood = await sb.run("yes")
        assert flood.status == "output_limit" and flood.truncated and len(flood.stdout) == 1000
        big = await sb.run("head -c 5000 /dev/zero | tr '\\0' x")  # more than kept, less than the kill
        assert big.status == "ok" and big.truncated and big.output_bytes == 5000 and len(big.stdout) == 1000
        huge = await sb.run("head -c 1G /dev/zero > big.bin")  # a 1 GB write against a 1 MiB file limit
        assert huge.status == "killed" and huge.signal == signal.SIGXFSZ
        assert (sb.workdir / "big.bin").stat().st_size <= 1 << 20


async def test_fallback_is_said_plainly(monkeypatch, caplog):
    reason = f"no bwrap in this test {secrets.token_hex(4)}"
    monkeypatch.setattr(sandbox_module, "bwrap_problem", lambda: reason)
    with caplog.at_level(logging.WARNING, logger="arl.sandbox.sandbox"):
        async with Sandbox(FAST) as sb:
            assert sb.isolation == "none"
            assert {"network namespace", "host file system protection"} <= set(sb.lost)
            assert (await sb.run("echo ok")).stdout == "ok\n"
    assert any(reason in r.getMessage() for r in caplog.records)
    with pytest.raises(SandboxUnavailable):
        Sandbox(isolation="bwrap")
    with pytest.raises(ValueError):
        Sandbox(isolation="docker")


async def test_fallback_reaches_the_network_as_documented():
    """Mode "none" loses the network namespace: the loss the docstring states, shown."""
    server, port, seen = await _listener()
    async with server, Sandbox(FAST, isolation="none") as sb:
        result = await sb.run(f"echo hello > /dev/tcp/127.0.0.1/{port}")
        assert result.ok
        for _ in range(50):
            if seen:
                break
            await asyncio.sleep(0.02)
    assert seen == [b"hello\n"]


# -- escape attempts under bubblewrap --------------------------------------------------------------


@needs_bwrap
async def test_no_network():
    server, port, seen = await _listener()
    async with server, Sandbox(FAST, python=True) as sb:
        # bwrap loses no isolation; only the whole-sandbox bounds depend on the machine (root, cgroups)
        assert set(sb.lost) <= {"whole-sandbox memory limit", "work dir size limit"}
        bash = await sb.run(f"echo hello > /dev/tcp/127.0.0.1/{port}")
        py = await sb.run(f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"")
        outside = await sb.run("python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\"")
        ifaces = await sb.run("ls /sys/class/net 2>/dev/null || cat /proc/net/dev")
    for result in (bash, py, outside):
        assert result.status == "ok" and result.exit_code != 0
    assert "Connection refused" in py.stderr and "unreachable" in outside.stderr.lower()
    assert "eth0" not in ifaces.stdout
    assert seen == []


@needs_bwrap
async def test_no_writes_outside_the_workdir(tmp_path):
    target = tmp_path / "open"
    target.mkdir()
    target.chmod(0o777)  # permissions would allow it: only the sandbox stands in the way
    home_file = Path.home() / f"arl-escape-{secrets.token_hex(4)}"
    async with Sandbox(FAST) as sb:
        results = [await sb.run(f"echo pwned > {p}") for p in (target / "x", home_file, "/usr/pwned", "/etc/pwned")]
        tmp = await sb.run("echo scratch > /tmp/scratch && cat /tmp/scratch")
    assert all(r.status == "ok" and r.exit_code != 0 for r in results), results
    assert not (target / "x").exists() and not home_file.exists()
    assert not Path("/usr/pwned").exists() and not Path("/etc/pwned").exists()
    assert tmp.stdout == "scratch\n"  # a private /tmp works


@needs_bwrap
async def test_the_etc_files_programs_read_are_readable_after_the_uid_drop():
    """bwrap made /etc 0700 (root's) around the bound /etc files, so as root, after the drop to the
    sandbox's uid, /etc/passwd could not be read (git: "unable to access '/etc/gitconfig'")."""
    async with Sandbox(FAST, python=True) as sb:
        result = await sb.run("python -c 'import pwd; print(pwd.getpwuid(0).pw_name)' && head -c 5 /etc/passwd")
        denied = await sb.run("touch /etc/new")
    assert result.ok and result.stdout == "root\nroot:", result
    assert denied.exit_code != 0


@needs_bwrap
async def test_fork_bomb_is_bounded():
    limits = SandboxLimits(wall_s=3.0, cpu_s=3.0, max_procs=16)
    async with Sandbox(limits) as sb:
        result = await sb.run(":(){ :|:& };:")
        assert result.status in ("ok", "timeout", "killed")
        if sb.uid is not None:  # as root: run() returned only once every process of the sandbox's uid was gone
            assert uid_processes(sb.uid) == 0
        assert (await sb.run("echo alive")).stdout == "alive\n"  # the sandbox (and we) carry on


@needs_bwrap
async def test_infinite_loop_hits_the_cpu_limit():
    async with Sandbox(SandboxLimits(wall_s=20.0, cpu_s=1.0)) as sb:
        result = await sb.run("while :; do :; done")
    assert result.status == "timeout" and result.signal in (signal.SIGXCPU, signal.SIGKILL)
    assert result.wall_s < 20


@needs_bwrap
async def test_background_processes_die_with_the_command():
    async with Sandbox(FAST) as sb:
        marker = secrets.token_hex(6)
        result = await sb.run(f"setsid sleep 600 {marker} >/dev/null 2>&1 & echo started")
        assert result.stdout == "started\n"
        await asyncio.sleep(0.2)
        alive = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).find(marker) >= 0]
        assert alive == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _running(marker: str) -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit() and marker in _cmdline(p)]


@pytest.mark.parametrize("isolation", MODES)
async def test_a_cancelled_run_kills_its_command(isolation):
    async with Sandbox(FAST, isolation=isolation) as sb:
        marker = f"arl-cancel-{secrets.token_hex(6)}"
        task = asyncio.ensure_future(sb.run(f"touch started && exec -a {marker} sleep 600"))
        for _ in range(200):  # bounded: until the command runs
            if (sb.workdir / "started").exists() and _running(marker):
                break
            await asyncio.sleep(0.025)
        assert _running(marker)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):  # the kill is sent at once; the kernel may take a moment to remove it
            if not _running(marker):
                break
            await asyncio.sleep(0.02)
        assert _running(marker) == []


@needs_bwrap
async def test_reaping_leaves_a_running_process_of_the_sandbox_alone():
    """The uid is shared by all of a sandbox's processes: a command that ends while a spawned one
    runs must not take it down; `kill` then leaves no process of the uid."""
    async with Sandbox(FAST) as sb:
        agent = await sb.spawn(["sleep", "600"], env={})
        assert (await sb.run("sleep 30 & echo left")).stdout == "left\n"
        assert agent.returncode is None
        await sb.kill()
        assert agent.returncode is not None
        if sb.uid is not None:
            assert uid_processes(sb.uid) == 0


@needs_bwrap
async def test_leftovers_past_the_bound_are_logged_not_raised(monkeypatch, caplog):
    async with Sandbox(FAST) as sb:
        if sb.uid is None:
            pytest.skip("the uid is reaped only as root")
        uid = sb.uid
        real = bwrap_module.uid_processes
        monkeypatch.setattr(bwrap_module, "uid_processes", lambda u: 1 if u == uid else real(u))  # one never dies
        sb.reap_s = 0.2
        with caplog.at_level(logging.WARNING, logger="arl.sandbox.sandbox"):
            result = await sb.run("echo done")
    assert result.ok and result.stdout == "done\n"
    assert any(f"sandbox uid {uid}: 1 process(es) still listed" in r.getMessage() for r in caplog.records)


@needs_bwrap
async def test_memory_limit_and_read_only_binds(tmp_path):
    shared = tmp_path / "shared"
    (shared / "secret").mkdir(parents=True)
    (shared / "data.txt").write_text("visible\n")
    (shared / "secret" / "key.txt").write_text("hidden\n")
    for p in (tmp_path, shared, shared / "secret"):
        p.chmod(0o755)
    for p in (shared / "data.txt", shared / "secret" / "key.txt"):
        p.chmod(0o644)
    async with Sandbox(SandboxLimits(memory_bytes=256 * 2**20), python=True, read_only=[shared],
                       hide=[shared / "secret"]) as sb:
        memory = await sb.run("python -c 'x = bytearray(1 << 30)'")
        read = await sb.run(f"cat {shared}/data.txt; cat {shared}/secret/key.txt; echo x > {shared}/new")
        once = await sb.run(f"cat {tmp_path}/other.txt", read_only=[])
    assert memory.status == "ok" and memory.exit_code == 1 and "MemoryError" in memory.stderr
    assert read.stdout == "visible\n" and "No such file" in read.stderr and "Read-only" in read.stderr
    assert once.exit_code != 0


@needs_bwrap
async def test_spawn_a_long_running_process():
    async with Sandbox(FAST, python=True) as sb:
        proc = await sb.spawn(["python", "-c", "import sys\nfor line in sys.stdin: print(line.upper(), end='', flush=True)"],
                              env={"EXTRA": "1"})
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"ping\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"PING\n"
        await sb.kill()
        assert await asyncio.wait_for(proc.wait(), 10) != 0


@needs_bwrap
async def test_host_side_paths_do_not_follow_planted_links():
    async with Sandbox(FAST) as sb:
        await sb.run("ln -s /etc/passwd link && ln -s .. up && mkdir d")
        for bad in ("link", "up/x", "/etc/passwd", "../x"):
            with pytest.raises(ValueError):
                sb.write_file(bad, "x")
        assert sb.host_path("d/f.txt") == sb.workdir.resolve() / "d" / "f.txt"
        assert sb.host_path(f"{sb.cwd}/d") == sb.workdir.resolve() / "d"


def test_doctests():
    import doctest

    for module in (bwrap_module, capped_output_module, rlimits_module):
        failures, tried = doctest.testmod(module)
        assert failures == 0 and tried > 0, module.__name__


def test_result_is_typed():
    with pytest.raises(ValueError):
        CommandResult("exploded", None, "", "", False, 0.0)


def test_benchmark_quick(tmp_path):
    """benchmarks/sandbox.py runs at its smoke size and prints its table."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "sandbox.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "sandbox.py"), "--quick", "--repeats", "3",
                           "--out", str(out)], capture_output=True, text=True, timeout=240, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "|---|" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows} >= {"plain", "none"} and all(r["median_ms"] > 0 for r in rows)


@needs_bwrap
async def test_sandbox_failures_are_errors_not_command_results(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    async with Sandbox(FAST) as sb:
        gone.rmdir()  # a per-command bind whose source vanished: bwrap itself fails
        result = await sb.run("echo never", read_only=[gone])
    assert result.status == "error" and result.error.startswith("bwrap: ") and result.stdout == ""
    with pytest.raises(FileNotFoundError):
        Sandbox(read_only=[tmp_path / "missing"])
