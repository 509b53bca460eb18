"""The sandbox against an episode that wants to carry state to another or outgrow its limits (issue 28,
classes 2 and 6).

- Keyrings: a process keeps its session keyring across fork, exec and a uid change, so an episode
  could read the trainer's keys and leave data (a copy of the hidden tests) for a later episode.
  The attack is played in a child interpreter that first joins a session keyring of its own, as a
  trainer started from a login session (pam_keyinit, ssh) has one.
- Whole-sandbox limits: several processes each under the address-space limit, many files each
  under the file-size limit, a large file in /tmp: each must hit the sandbox's bound.

Preconditions are asserted or skipped with the reason: bubblewrap for the keyring and /tmp, root
and a writable cgroup hierarchy for memory, root's tmpfs mount for the work dir (where those are
missing, `Sandbox.lost` must say so, which is checked before the skip). Sizes are small: at most
~320 MiB of memory, ~48 MiB of files, a few seconds each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from arl.sandbox.backends import open_sandbox
from arl.sandbox.cgroups import cgroup_problem
from arl.sandbox.sandbox import Sandbox, SandboxLimits, bwrap_problem
from tests.envs.backend_params import CONTAINERS

pytestmark = pytest.mark.anyio

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unavailable: {bwrap_problem()}")
ROOT = os.geteuid() == 0
MiB = 2**20
# the same attacks against the container backend (issue 48): "auto" is bwrap where it starts
BACKENDS = ["auto", *CONTAINERS]

KEY_TOOL = textwrap.dedent("""
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    SESSION = ctypes.c_int(-3)  # KEY_SPEC_SESSION_KEYRING
    what, desc = sys.argv[1], sys.argv[2].encode()
    if what == "write":
        data = sys.argv[3].encode()
        print("wrote" if libc.syscall(248, b"user", desc, data, len(data), SESSION) > 0 else "refused")
    else:
        key = libc.syscall(250, 10, SESSION, b"user", desc, 0)  # KEYCTL_SEARCH
        buf = ctypes.create_string_buffer(256)
        n = libc.syscall(250, 11, ctypes.c_long(key), buf, 256) if key > 0 else -1  # KEYCTL_READ
        print(buf.raw[:n].decode() if n > 0 else "none")
""")


@needs_bwrap
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_keyring_shared_with_the_trainer_or_a_later_episode(tmp_path, backend):
    tool = tmp_path / "keys.py"
    tool.write_text(KEY_TOOL)
    tool.chmod(0o644)
    tmp_path.chmod(0o755)
    script = textwrap.dedent(f"""
        import asyncio, ctypes, subprocess, sys
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        if libc.syscall(250, 1, b"arl-test-login-session") < 0:  # KEYCTL_JOIN_SESSION_KEYRING
            print("SKIP the kernel refuses keyrings here"); sys.exit(0)
        tool = {str(tool)!r}
        host = lambda *a: subprocess.run([sys.executable, tool, *a], capture_output=True, text=True).stdout.strip()
        assert host("write", "trainer-secret", "s3cret") == "wrote"
        assert host("read", "trainer-secret") == "s3cret"  # precondition: the keyring is shared with children
        from arl.sandbox.backends import open_sandbox
        async def main():
            async with open_sandbox(backend={backend!r}, python=True, read_only=[tool]) as episode:
                assert "session keyring" not in episode.lost
                stolen = (await episode.run(f"python {{tool}} read trainer-secret")).stdout.strip()
                left = (await episode.run(f"python {{tool}} write arl-leak hidden-tests")).stdout.strip()
            async with open_sandbox(backend={backend!r}, python=True, read_only=[tool]) as later:
                found = (await later.run(f"python {{tool}} read arl-leak")).stdout.strip()
            print(stolen, left, found, host("read", "arl-leak"))
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    if done.stdout.startswith("SKIP"):
        pytest.skip(done.stdout[5:].strip())
    stolen, left, found, on_host = done.stdout.split()
    assert stolen == "none", "an episode read the trainer's key"
    assert left == "refused" and found == "none" and on_host == "none", "an episode left a key for a later one"


async def _assert_bounded_or_said(sb: Sandbox, lost: str, precondition: str | None) -> None:
    if precondition is not None:
        assert lost in sb.lost, f"the bound is missing ({precondition}) but Sandbox.lost does not say so"
        pytest.skip(precondition)
    assert lost not in sb.lost


@pytest.mark.parametrize("backend", BACKENDS)
async def test_memory_binds_the_sandbox_as_a_whole(backend):
    """Four processes of 80 MiB each, under the 256 MiB address-space limit; 160 MiB for the sandbox."""
    limits = SandboxLimits(wall_s=30.0, cpu_s=20.0, memory_bytes=256 * MiB, total_memory_bytes=160 * MiB)
    async with open_sandbox(limits, backend=backend, python=True) as sb:
        await _assert_bounded_or_said(sb, "whole-sandbox memory limit", None if backend != "auto" or ROOT and cgroup_problem() is None
                                      else f"not root or no writable cgroups: {cgroup_problem()}")
        hold = "python -S -c 'import time; b = b\"x\" * (80 << 20); time.sleep(2); print(\"held\")'"
        result = await sb.run(f"for i in 1 2 3 4; do {hold} & done; wait")
        alone = await sb.run(hold)
    assert alone.ok and alone.stdout == "held\n", alone  # one process under both limits runs
    assert result.stdout.count("held") < 4, "four processes held 320 MiB in a 160 MiB sandbox"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_disk_binds_the_work_dir_as_a_whole(backend):
    """24 files of 2 MiB, each under the 4 MiB file-size limit; 16 MiB for the work dir."""
    limits = SandboxLimits(wall_s=30.0, file_size_bytes=4 * MiB, disk_bytes=16 * MiB)
    async with open_sandbox(limits, backend=backend) as sb:
        await _assert_bounded_or_said(sb, "work dir size limit", None if ROOT else "not root: no tmpfs mount")
        result = await sb.run("for i in $(seq 24); do head -c 2M /dev/zero > f$i || exit 7; done")
        written = sum(p.stat().st_size for p in sb.workdir.iterdir())
        assert result.exit_code == 7 and "No space left" in result.stderr, result
        assert written <= 16 * MiB, f"{written / MiB:.0f} MiB written into a 16 MiB work dir"
        assert (await sb.run("rm f*; head -c 2M /dev/zero > g && echo ok")).stdout == "ok\n"
    assert not sb.workdir.exists()


@needs_bwrap
@pytest.mark.parametrize("backend", BACKENDS)
async def test_tmp_has_a_size(backend):
    limits = SandboxLimits(wall_s=30.0, file_size_bytes=64 * MiB, tmp_bytes=8 * MiB)
    async with open_sandbox(limits, backend=backend) as sb:
        result = await sb.run("head -c 32M /dev/zero > /tmp/big; s=$?; du -k /tmp/big | cut -f1; exit $s")
    assert result.exit_code != 0 and "No space left" in result.stderr, result
    assert int(result.stdout.strip()) <= 8 * 1024
