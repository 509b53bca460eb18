"""A sandboxed command against the kernel (issue 47, item B): the calls it has no business making.

Each family is played from inside a sandbox as an attacker would, with ``ctypes`` and raw syscall
numbers, in the form that succeeds where nothing refuses it (an unprivileged io_uring, a user-mode
userfaultfd, a user-only perf counter, an unprivileged bpf map, reading a child's memory, a user
namespace and a tmpfs mounted in it, ASLR turned off). Under bwrap each must get the errno that
`arl.sandbox.seccomp` documents; under podman each must be refused (podman's default profile
answers ENOSYS where its default action decides). Before this filter, under bwrap, io_uring,
userfaultfd, perf, process_vm_readv, the user namespace (unshare and clone), the mount in it and
personality all succeeded; bpf, kexec and module loading were already refused by this host (its
``unprivileged_bpf_disabled`` sysctl; no capability), so their cases pass there without the filter.

A pull-mode agent whose sandbox may give it tool uids (`arl.sandbox.uid_delegation`) keeps
``unshare`` only until the delegation program has made its namespace: the agent itself is refused.
And what refusing file locks costs: sqlite's default mode fails at once, its lock-free one works.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import textwrap

import pytest

from arl.sandbox.backends import backend_problem, open_sandbox
from arl.sandbox.bwrap import delegation_problem, fresh_uid_block, release_uid_block
from arl.sandbox.seccomp import ARCHES
from tests.envs.backend_params import CONTAINERS

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(platform.machine() not in ARCHES,
                                                    reason=f"no syscall table for {platform.machine()}")]

BACKENDS = [pytest.param("bwrap", marks=pytest.mark.skipif(
    backend_problem("bwrap") is not None, reason=f"bwrap unavailable: {backend_problem('bwrap')}")),
    *CONTAINERS]

# family -> the errno under bwrap (arl.sandbox.seccomp.REFUSED)
EXPECTED = {"io_uring": "ENOSYS", "userfaultfd": "EPERM", "perf_event_open": "EPERM", "bpf": "EPERM",
            "process_vm_readv": "EPERM", "unshare": "EPERM", "clone_newuser": "EPERM", "mount_in_userns": "EPERM",
            "personality": "EPERM", "kexec_load": "EPERM", "finit_module": "EPERM"}

ATTACK = textwrap.dedent("""
    import ctypes, errno, json, os, struct, sys
    nr = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def call(name, *args):
        r = libc.syscall(ctypes.c_long(nr[name]), *args)
        return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")

    def io_uring():
        return call("io_uring_setup", 4, ctypes.create_string_buffer(120))

    def userfaultfd():
        return call("userfaultfd", 1)  # UFFD_USER_MODE_ONLY: allowed to anyone by default

    def perf_event_open():  # a software clock of this process, user mode only
        attr = ctypes.create_string_buffer(struct.pack("<IIQ", 1, 128, 1) + bytes(24)
                                           + struct.pack("<Q", (1 << 5) | (1 << 6)), 128)
        return call("perf_event_open", attr, 0, -1, -1, 0)

    def bpf():  # BPF_MAP_CREATE of a one-entry array
        attr = ctypes.create_string_buffer(struct.pack("<IIII", 2, 4, 4, 1), 72)
        return call("bpf", 0, attr, 72)

    def process_vm_readv():
        secret = ctypes.create_string_buffer(b"child-memory", 16)
        pid = os.fork()
        if pid == 0:
            import time
            time.sleep(5)
            os._exit(0)
        class Iov(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(16)
        local, remote = Iov(ctypes.addressof(buf), 16), Iov(ctypes.addressof(secret), 16)
        out = call("process_vm_readv", pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return out

    def unshare():
        return call("unshare", 0x10000000)  # CLONE_NEWUSER

    def clone_newuser():
        r = libc.syscall(ctypes.c_long(nr["clone"]), 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
        if r == 0:
            os._exit(0)
        if r < 0:
            return errno.errorcode.get(ctypes.get_errno(), "?")
        os.waitpid(r, 0)
        return "ok"

    def mount_in_userns():
        first = call("unshare", 0x10000000 | 0x20000)  # CLONE_NEWUSER | CLONE_NEWNS
        return first if first != "ok" else call("mount", b"none", b"/tmp", b"tmpfs", 0, None)

    def personality():
        return call("personality", 0x0040000)  # ADDR_NO_RANDOMIZE

    def kexec_load():
        return call("kexec_load", 0, 0, None, 0)

    def finit_module():
        return call("finit_module", os.open("/dev/null", os.O_RDONLY), b"", 0)

    for name in sys.argv[2:]:  # each in a child of its own: a namespace made stays there
        pid = os.fork()
        if pid == 0:
            print(name, globals()[name](), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
""")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_command_cannot_reach_the_kernel_surface(tmp_path, backend):
    tool = tmp_path / "attack.py"
    tool.write_text(ATTACK)
    tool.chmod(0o644)
    tmp_path.chmod(0o755)
    numbers = json.dumps(ARCHES[platform.machine()][0][1])
    async with open_sandbox(backend=backend, python=True, read_only=[tool]) as sb:
        result = await sb.run(f"python {tool} '{numbers}' {' '.join(EXPECTED)}")
    assert result.exit_code == 0, result
    got = dict(line.split() for line in result.stdout.splitlines())
    if backend == "bwrap":
        assert got == EXPECTED
    else:
        assert {name for name, answer in got.items() if answer == "ok"} == set(), got
        assert set(got) == set(EXPECTED)


@pytest.mark.skipif(delegation_problem() is not None, reason=f"no tool uids here: {delegation_problem()}")
async def test_an_agent_given_tool_uids_makes_no_namespace_of_its_own(tmp_path):
    tool = tmp_path / "attack.py"
    tool.write_text(ATTACK)
    tool.chmod(0o644)
    tmp_path.chmod(0o755)
    numbers = json.dumps(ARCHES[platform.machine()][0][1])
    block = fresh_uid_block()
    try:
        async with open_sandbox(backend="bwrap", python=True, read_only=[tool]) as sb:
            agent = await sb.spawn(["python", str(tool), numbers, "unshare", "mount_in_userns", "io_uring"],
                                   env={}, tool_uids=block)
            out, err = await asyncio.wait_for(agent.communicate(), 60)
    finally:
        release_uid_block(block)
    assert agent.returncode == 0, err.decode()[-2000:]
    assert dict(line.split() for line in out.decode().splitlines()) == {
        "unshare": "EPERM", "mount_in_userns": "EPERM", "io_uring": "ENOSYS"}
    assert os.geteuid() == 0  # delegation_problem() is None only as root


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sqlite_works_in_its_lock_free_mode_and_fails_at_once_without_it(backend):
    """What refusing file locks costs (docs/threat_model.md): sqlite's default mode takes fcntl
    locks and fails at once, never hangs; the documented recipe (``vfs=unix-dotfile``) works."""
    use = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1], uri=True, timeout=30); "
           "c.execute('create table t(x)'); c.execute('insert into t values (7)'); c.commit(); "
           "print(c.execute('select x from t').fetchall())")
    async with open_sandbox(backend=backend, python=True) as sb:
        recipe = await sb.run(f"python -c \"{use}\" 'file:a.db?vfs=unix-dotfile'")
        default = await sb.run(f"python -c \"{use}\" b.db")
    assert recipe.ok and recipe.stdout == "[(7,)]\n", recipe
    assert default.exit_code != 0 and "disk I/O error" in default.stderr, default
    assert default.wall_s < 20, "the default mode waited on a lock it can never get"
