"""Bubblewrap for `arl.sandbox.sandbox`: the command line that isolates a command, and the sandbox's uid.

Why a module of its own: what a sandboxed command may see and which uid it runs as is decided
entirely by the argv built here, so the isolation policy can be read (and audited) in one place;
`Sandbox` only starts, feeds, reads, limits and times commands.

`bwrap_argv`, in order: new namespaces (`_base_argv`); the system (``/usr``, the ``/bin`` and
``/lib*`` links, the few ``/etc`` files programs read) read-only; ``/proc``, ``/dev`` and a fresh
``/tmp`` of a bounded size; the ``read_only`` paths at their own paths, with ``hide`` paths under
them replaced by empty dirs; the symlinks through which this interpreter was reached
(`python_links`: a venv that is a link to another folder); the work dir read-write at
`SANDBOX_CWD`; a cleared environment; the seccomp filter (`arl.sandbox.seccomp`: no kernel keyring,
io_uring, bpf, mounts or new namespaces, no file locks or change watches through which sandboxes
could signal each other); and, as
root, the drop to the sandbox's uid.

The uid, as root: a user namespace would keep kernel uid 0, which RLIMIT_NPROC exempts, so bwrap
stays in the init user namespace and the command drops (`setpriv_argv`) to a uid of its own
(`fresh_uid`). No other process has that uid, so the process limit counts the sandbox's processes
alone, and `reap_uid` can find (and kill) every process a command left behind: bwrap can return
(killed, and now and then after an ordinary exit) while the kernel still tears its PID namespace
down. A pull-mode agent's own sandboxes take their uids from a block the trainer gave it
(`fresh_uid_block`, `arl.sandbox.uid_delegation`), so its tool commands never run as the agent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import functools
import glob
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from arl.sandbox import uid_delegation
from arl.sandbox.seccomp import filter_fd, sandbox_filter

SANDBOX_CWD = "/workspace"  # where the work dir appears inside bwrap (fixed: outputs do not name temp dirs)
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
        "localtime", "python3*")
_PROBE_UID = 65534  # nobody: the uid drop bwrap_problem tries
# Pull-mode agents' blocks of tool uids: in [2**25, 2**26), apart from every sandbox's own uid
# (`fresh_uid`: below 2**25), so an agent's uid never falls into another agent's block.
TOOL_UID_BASE, TOOL_UID_BLOCK = 1 << 25, 256
_blocks_held: set[int] = set()  # the blocks this process has given out and not yet released
# the uids this process's live sandboxes hold -> the free list of the block it came from (None: a
# uid drawn at random, registered in the host's registry)
_uids_held: dict[int, collections.deque[int] | None] = {}
_block_free: dict[range, collections.deque[int]] = {}  # per delegated block: its uids not held
# The host-wide registry of held blocks and sandbox uids, so that two trainer processes on one host
# never hold the same: one POSIX record lock (`fcntl.lockf`) per held range, at the byte offsets of
# its uids, in the first of these files that can be opened. The kernel drops a process's locks
# when it exits (even by SIGKILL): nothing to clean up. Record locks do not conflict within one
# process, hence the sets above; and closing any fd of the file drops them all: only
# `_registry_fd` opens it.
UID_REGISTRY_PATHS = ["/run/arl-uids.lock", "/tmp/arl-uids.lock"]
_log = logging.getLogger(__name__)


class UidBlockExhausted(RuntimeError):
    """Every uid of this process's block of tool uids is held by a live sandbox: close one first."""


def python_paths() -> tuple[Path, ...]:
    """The paths this interpreter needs (its environment and its base installation), resolved:
    a venv that is a symlink (``.venv -> /elsewhere/venv``) is bound where it really lives."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent}
    return tuple(sorted(p.resolve() for p in paths))


def python_links() -> tuple[tuple[str, str], ...]:
    """(target, link) for each of this interpreter's prefixes reached through a symlink, so that the
    unresolved paths (a venv script's ``#!/checkout/.venv/bin/python``) work inside too."""
    links = {}
    for prefix in (sys.prefix, sys.base_prefix):
        path, real = os.path.abspath(prefix), os.path.realpath(prefix)
        if path != real:
            links[path] = real
    return tuple((real, path) for path, real in sorted(links.items()))


@functools.cache
def _registry_fd() -> int | None:
    """The registry file (`UID_REGISTRY_PATHS`), opened once per process; None (said once) where
    none can be opened: then only this process's own holdings are kept apart."""
    for path in UID_REGISTRY_PATHS:
        with contextlib.suppress(OSError):
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    _log.warning("no uid registry (%s): another trainer process on this host may draw the same sandbox uids "
                 "or tool uid blocks", ", ".join(UID_REGISTRY_PATHS))
    return None


def _register(first: int, count: int) -> bool:
    """Hold uids [first, first + count) in the host's registry; False when another process does."""
    fd = _registry_fd()
    if fd is None:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, count, first, os.SEEK_SET)
    except OSError:
        return False
    return True


def _unregister(first: int, count: int) -> None:
    fd = _registry_fd()
    if fd is not None:
        with contextlib.suppress(OSError):
            fcntl.lockf(fd, fcntl.LOCK_UN, count, first, os.SEEK_SET)


def fresh_uid() -> int:
    """A uid for one sandbox, far above any real account's (2**24 <= uid < 2**25), held by no
    other live sandbox of this process nor (through the registry, `UID_REGISTRY_PATHS`) of another
    process on the host. In a process given a block of uids (a pull-mode agent:
    `arl.sandbox.uid_delegation.delegated_uids`), a uid of that block instead, the only ones it may
    switch to: the one released longest ago among those no live sandbox holds, `UidBlockExhausted`
    when every one is held. `release_uid` when the sandbox is closed."""
    block = uid_delegation.delegated_uids()
    if block is not None:
        free = _block_free.setdefault(block, collections.deque(u for u in block if u not in _uids_held))
        if not free:
            raise UidBlockExhausted(f"all {len(block)} uids of this process's tool uid block "
                                    f"{block.start}..{block.stop - 1} are held by live sandboxes: close one first")
        uid = free.popleft()
        _uids_held[uid] = free
        return uid
    while True:
        uid = (1 << 24) + secrets.randbelow(1 << 24)
        if uid not in _uids_held and _register(uid, 1):
            _uids_held[uid] = None
            return uid


def release_uid(uid: int) -> None:
    """A sandbox's uid back (its processes gone): `fresh_uid` may hand it out again."""
    if uid not in _uids_held:
        return
    free = _uids_held.pop(uid)
    if free is None:
        _unregister(uid, 1)
    else:
        free.append(uid)


def fresh_uid_block() -> range:
    """`TOOL_UID_BLOCK` uids for one pull-mode agent's tool commands, none of them a `fresh_uid`
    of a sandbox nor in another block this process or (through the registry) another process on
    the host holds; `release_uid_block` when it is done."""
    while True:
        first = TOOL_UID_BASE + TOOL_UID_BLOCK * secrets.randbelow(TOOL_UID_BASE // TOOL_UID_BLOCK)
        if first not in _blocks_held and _register(first, TOOL_UID_BLOCK):
            _blocks_held.add(first)
            return range(first, first + TOOL_UID_BLOCK)


def release_uid_block(uids: range) -> None:
    if uids.start in _blocks_held:
        _blocks_held.discard(uids.start)
        _unregister(uids.start, len(uids))


def setpriv_argv(uid: int) -> list[str]:
    """argv prefix that runs the rest as ``uid`` (its own group, no supplementary groups) with no
    capabilities left and none to gain.

    >>> setpriv_argv(7)[:3]
    ['setpriv', '--reuid=7', '--regid=7']
    """
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]


def _base_argv(root: bool, tmp_bytes: int | None = None, seccomp_fd: int | None = None) -> list[str]:
    """bwrap options every sandbox shares: namespaces, the read-only system, a ``/tmp`` of at most
    ``tmp_bytes`` (its pages count as the sandbox's memory too) and the syscall filter's fd."""
    argv = ["bwrap", "--die-with-parent", "--new-session"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    # As root a user namespace would keep kernel uid 0 (exempt from RLIMIT_NPROC): stay in the
    # init namespace and let setpriv drop to an unprivileged uid inside (see the module docstring).
    argv += (["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
             if root else ["--unshare-all"])
    argv += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for path in _ROOT_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--perms", "0755", "--dir", "/etc"]  # bwrap's own would be 0700: unreadable after the uid drop
    for pattern in _ETC:
        for path in sorted(glob.glob(f"/etc/{pattern}")):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777"]
    if tmp_bytes is not None:
        argv += ["--size", str(max(4096, tmp_bytes))]
    return [*argv, "--tmpfs", "/tmp"]


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap starts here (probed once per process), else why it does not."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        return "running as root needs setpriv (util-linux) to drop to an unprivileged uid"
    program = sandbox_filter()
    fd = filter_fd(program) if program is not None else None  # the options every command uses
    argv = _base_argv(root, 1 << 20, fd) + (setpriv_argv(_PROBE_UID) if root else [])
    try:
        probe = subprocess.run([*argv, "true"], capture_output=True, timeout=30, env={},
                               pass_fds=() if fd is None else (fd,))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not start: {exc}"
    finally:
        if fd is not None:
            os.close(fd)
    if probe.returncode != 0:
        return f"bwrap could not start: {probe.stderr.decode(errors='replace').strip()}"
    return None


def bwrap_argv(
    workdir: Path, env: Mapping[str, str], *, read_only: Sequence[Path], hide: Sequence[Path],
    uid: int | None, also_read_only: Sequence[Path] = (), links: Sequence[tuple[str, str]] = (),
    tmp_bytes: int | None = None, seccomp_fd: int | None = None, drop: Sequence[str] | None = None,
) -> list[str]:
    """The bwrap argv a sandbox puts in front of a command (see the module docstring).

    ``read_only``: the sandbox's read-only paths (resolved), ``also_read_only``: more for this
    command only; ``hide``: paths shown as empty dirs where they lie under ``read_only``; ``uid``:
    the uid to drop to (as root), None to stay the calling user (bwrap's user namespace);
    ``links``: (target, link) symlinks to make (`python_links`), skipped where the link's place is
    already visible; ``tmp_bytes``: the size of ``/tmp``; ``seccomp_fd``: the syscall filter
    (`arl.sandbox.seccomp`), an fd the bwrap process inherits; ``drop``: the argv that drops to
    ``uid`` (default `setpriv_argv`; `arl.sandbox.uid_delegation.delegate_argv` for a pull-mode agent).
    """
    argv = _base_argv(uid is not None, tmp_bytes, seccomp_fd)
    made: set[Path] = {Path(p) for p in ("/", "/tmp", "/proc", "/dev", "/etc", *_ROOT_LINKS)}
    bound: list[Path] = [Path("/usr")]
    for path in (*read_only, *also_read_only):
        if any(path.is_relative_to(b) for b in bound):
            continue  # already visible
        # bwrap makes missing parents 0700 (unreadable after the uid drop): make them 0755 first
        for parent in reversed(path.parents):
            if parent not in made and not any(parent.is_relative_to(b) for b in bound):
                made.add(parent)
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", str(path), str(path)]
        bound.append(path)
    for path in hide:
        if any(path.is_relative_to(p) for p in read_only):
            argv += ["--tmpfs", str(path)]
    for target, link in links:
        place = Path(link)
        if place in made or any(place.is_relative_to(b) or b.is_relative_to(place) for b in bound):
            continue  # its place is a bound path (or holds one): the link would not fit there
        for parent in reversed(place.parents):
            if parent not in made and not any(parent.is_relative_to(b) for b in bound):
                made.add(parent)
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--symlink", target, link]
    argv += ["--bind", str(workdir), SANDBOX_CWD, "--chdir", SANDBOX_CWD, "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    if uid is not None:
        argv += setpriv_argv(uid) if drop is None else list(drop)
    return argv


@functools.cache
def delegation_problem() -> str | None:
    """None when, as root, a process in a sandbox can be given a block of tool uids
    (`arl.sandbox.uid_delegation`: it needs user namespaces; probed once per process, by running
    ``true`` as a block uid from a delegated uid in a sandbox), else why not."""
    problem = bwrap_problem()
    if problem is not None:
        return problem
    if os.geteuid() != 0:
        return "the trainer is not root"
    block = fresh_uid_block()
    workdir = tempfile.mkdtemp(prefix="arl-delegate-probe-")
    program = sandbox_filter(namespaces=True)
    fd = filter_fd(program) if program is not None else None
    try:
        python = os.path.realpath(sys.executable)
        shown = [*python_paths(), Path(uid_delegation.__file__).resolve().parent]
        argv = bwrap_argv(Path(workdir), {"PATH": "/usr/bin:/bin"}, read_only=shown, hide=(), uid=_PROBE_UID,
                          seccomp_fd=fd, drop=uid_delegation.delegate_argv(python, _PROBE_UID, block))
        probe = subprocess.run([*argv, *setpriv_argv(block[0]), "true"], capture_output=True, timeout=30, env={},
                               pass_fds=() if fd is None else (fd,))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"a sandboxed process cannot be given tool uids: {exc}"
    finally:
        if fd is not None:
            os.close(fd)
        os.rmdir(workdir)
        release_uid_block(block)
    if probe.returncode != 0:
        return f"a sandboxed process cannot be given tool uids: {probe.stderr.decode(errors='replace').strip()}"
    return None


# -- the processes of a uid ------------------------------------------------------------------------


def _process_uids() -> Iterator[int]:
    """The uid of every process the kernel lists now (zombies included), from ``/proc``.

    One ``stat`` per process on the host: about 5 us each (0.5 ms at 80 processes).
    """
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # the process ended between the listing and the stat
                yield entry.stat().st_uid


def uid_processes(uid: int) -> int:
    """How many processes of ``uid`` the kernel lists now (zombies included)."""
    return sum(u == uid for u in _process_uids())


async def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (needs root): ``kill(-1)`` sent as that uid.

    The kernel signals all of them in one pass that a fork cannot slip past, and by uid, not by
    a pid read earlier, so a pid reused by another process is never hit.
    """
    proc = await asyncio.create_subprocess_exec(
        *setpriv_argv(uid), "bash", "-c", "kill -KILL -1 2>/dev/null", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env={},
    )
    await proc.wait()


async def reap_uid(uid: int, bound_s: float) -> int:
    """Until no process of ``uid`` is left: kill them (`kill_uid`), then poll, for at most
    ``bound_s`` seconds. Returns how many are left (0: none; the common case costs one scan).

    Polls start 5 ms apart and back off to 100 ms: a killed process is gone within milliseconds,
    a torn-down PID namespace of many within tens of them.
    """
    left = uid_processes(uid)
    if left == 0:
        return 0
    await kill_uid(uid)
    deadline, delay = time.monotonic() + bound_s, 0.005
    while (left := uid_processes(uid)) and time.monotonic() < deadline:
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(2 * delay, 0.1)
    return left


async def reap_uids(uids: range, bound_s: float) -> int:
    """`reap_uid` for each uid of ``uids`` that has a process now (one scan finds them: a block of
    256 costs what one uid does). Returns how many processes are left."""
    present = sorted({u for u in _process_uids() if u in uids})
    return sum([await reap_uid(uid, bound_s) for uid in present])


__all__ = ["SANDBOX_CWD", "TOOL_UID_BLOCK", "UID_REGISTRY_PATHS", "UidBlockExhausted", "bwrap_argv", "bwrap_problem",
           "delegation_problem", "fresh_uid", "fresh_uid_block", "kill_uid", "python_links", "python_paths", "reap_uid",
           "reap_uids", "release_uid", "release_uid_block", "setpriv_argv", "uid_processes"]
