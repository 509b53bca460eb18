"""Sandbox: one episode's commands in a throw-away work dir, without network, under limits.

    async with Sandbox(SandboxLimits(wall_s=5), python=True) as sb:
        result = await sb.run("python -c 'print(1 + 1)'")   # CommandResult(status="ok", stdout="2\\n", ...)

Isolation (``Sandbox.isolation`` says which is in force):

- ``"bwrap"`` (bubblewrap, Debian package ``bubblewrap``): new mount, PID, network, IPC and UTS
  namespaces (the network namespace holds only its own loopback); the system (``/usr``, the
  ``/bin`` and ``/lib*`` links, the few ``/etc`` files programs read) and the ``read_only`` paths
  bound read-only; a fresh ``/tmp``; the work dir bound read-write at ``/workspace``, the only
  writable host path. The sandbox dies with its caller (``--die-with-parent``) and every process
  of a command dies with it (the PID namespace ends with the command). Run as root, bwrap keeps
  the init user namespace and the command drops to a fresh unprivileged uid (``setpriv``), because
  the kernel exempts uid 0 from the process-count limit; as any other user, bwrap makes a user
  namespace, in which the process limit counts only the sandbox's own processes. As root, `run`
  and `kill` return only once no process of the sandbox's uid is left: the kernel may still be
  tearing a command's PID namespace down when bwrap has returned (seen after kills and after
  ordinary exits alike), so leftovers are killed and waited for (at most ``Sandbox.reap_s``, 5 s;
  any still listed then are logged as a warning). A seccomp filter (`arl.sandbox.seccomp`) refuses
  what a command has no business calling: the kernel keyrings (a session keyring survives fork,
  exec and the uid drop and would carry keys between the trainer and episodes), io_uring, bpf,
  perf, userfaultfd, mounts and new namespaces, and the kernel objects through which two sandboxes
  could signal each other on the files both see (file locks, inotify/fanotify/dnotify watches). With ``python=True`` the
  interpreter's real prefixes are bound (a venv that is a symlink to another folder included) and
  ``PATH`` names the real one. The command lines are built in `arl.sandbox.bwrap`.
- ``"none"``: the fallback when bwrap is absent or cannot start (no user namespaces). Commands
  run as plain subprocesses in their own process group, in the work dir, with the same limits,
  as the calling user; in a process given a block of tool uids (a pull-mode agent:
  `arl.sandbox.uid_delegation`), as a uid of that block instead (``setpriv``; the sandbox's own, as
  under bwrap as root, its leftovers killed by uid), so they cannot ptrace, signal or read the
  environment of the process that runs them. What is lost (also listed, for the instance in
  force, in ``Sandbox.lost``):

  ============================  ==================================================================
  lost without bwrap            consequence
  ============================  ==================================================================
  network namespace             commands reach the network and the host's loopback services
  host file system protection   commands read and write whatever the calling user may
  PID namespace                 a process that leaves the process group (``setsid``) outlives
                                the command, and with it the wall-time limit
  hidden files                  the task generator's source is readable (hidden tests can be
                                rebuilt); private directories of the host are visible
  process limit (as root)       uid 0 ignores RLIMIT_NPROC: a fork bomb is stopped only by the
                                wall-time kill of its process group (unless a cgroup binds it)
  session keyring               commands share the caller's keyring (keys read, keys left behind)
  /tmp size limit               ``/tmp`` is the host's
  syscall filter                io_uring, bpf, new namespaces, file locks and change watches on
                                shared files are as the host allows the caller
  ============================  ==================================================================

Limits, in both modes (bash ``ulimit`` in front of the command, so they bind the command and
everything it starts, and it cannot raise them): CPU seconds, address space, file size, process
count, no core files (`arl.sandbox.rlimits`). Those bind each process (or file) alone; the sandbox as
a whole is bound, where the machine allows, by a cgroup (`arl.sandbox.cgroups`: memory of all its
processes and their tmpfs pages, task count; needs root and a writable memory + pids hierarchy, v2
or v1), a ``/tmp`` of ``tmp_bytes`` (bwrap) and a work dir that is a tmpfs of ``disk_bytes``
(mounted by the host, as root). Where a bound cannot be had, ``Sandbox.lost`` says so:
"whole-sandbox memory limit" (then only RLIMIT_AS per process: ``max_procs`` processes may hold
``max_procs * memory_bytes``), "work dir size limit" (then only RLIMIT_FSIZE per file: the work dir
is on the host disk, unbounded in total). Wall time is enforced here by killing the process
group; output is read while the command runs (`arl.sandbox.capped_output`), the first
``output_bytes`` kept, up to ``drain_bytes`` more read and dropped (counted), and a command that
writes beyond that is killed.

A command's own faults are results, never exceptions: `CommandResult.status` is "ok" (it ended
by itself; look at ``exit_code``), "timeout" (wall or CPU limit), "output_limit", "killed" (a
fatal signal: the file-size limit's SIGXFSZ, SIGKILL, SIGSEGV, ...), "oom" (SIGKILLed by the kernel's
OOM killer: the sandbox's memory, or the memory cgroup it shares, ran out; ``signal`` is SIGKILL)
or "error" (it could not be started, or bwrap / the limits wrapper failed before it did). Exit
codes follow the shell: 128 + N for a command killed by signal N.

OOM: every command `run` starts raises its ``oom_score_adj`` to 1000 (`arl.sandbox.rlimits.OOM_VICTIM_ADJ`)
and `spawn`'s long-running processes keep theirs, so where both share one memory cgroup (a
pull-mode agent and the tool commands its own sandboxes run: bubblewrap does not nest and the
agent cannot make cgroups, so they share the agent's) the OOM killer kills the command, never the
agent (docs/threat_model.md). A SIGKILL is told apart as "oom" by an OOM-kill counter that rose
while the command ran: the sandbox's own cgroup's (``memory.events`` / ``memory.oom_control``)
where it has one, else the kernel's (``oom_kill`` in ``/proc/vmstat``), which counts every OOM
kill on the host: a command SIGKILLed otherwise (by hand, or past RLIMIT_CPU's hard limit) while
another process of the host is OOM-killed would read "oom" too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shlex
import signal
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from arl.sandbox.bwrap import (
    SANDBOX_CWD,
    bwrap_argv,
    bwrap_problem,
    fresh_uid,
    python_links,
    python_paths,
    reap_uid,
    release_uid,
    setpriv_argv,
    uid_processes,
)
from arl.sandbox.capped_output import CappedOutput
from arl.sandbox.cgroups import Cgroup, cgroup_problem
from arl.sandbox.hostfs import remove_tree
from arl.sandbox.rlimits import SandboxLimits, limits_prefix
from arl.sandbox.seccomp import filter_fd, sandbox_filter
from arl.sandbox.uid_delegation import PROGRAM, TOOL_UIDS_ENV, delegate_argv, delegated_uids, format_uids

log = logging.getLogger(__name__)

ISOLATIONS = ("auto", "bwrap", "none")
COMMAND_STATUSES = ("ok", "timeout", "output_limit", "killed", "oom", "error")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_FATAL_SIGNALS = {signal.SIGKILL, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS}
_GRACE_S = 1.0  # after a command ends or is killed: how long its pipes may stay open
_LOST_WITHOUT_BWRAP = ("network namespace", "host file system protection", "PID namespace", "hidden files",
                       "session keyring", "/tmp size limit", "syscall filter")
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2


class SandboxUnavailable(RuntimeError):
    """The backend asked for (``isolation="bwrap"``, ``"podman"``, ``"docker"``) cannot start here."""


class SandboxDied(RuntimeError):
    """`Sandbox.exec` on a sandbox that is no longer there (closed, or its container gone): the
    sandbox's fault, never the command's, so it is raised rather than returned as a result."""


@attrs.frozen
class IsolationWarning:
    """What a sandbox does not isolate (`Sandbox.isolation_warning`): for the caller to show, log or
    record; the library only logs it once per kind (backend "none" is never silent)."""

    backend: str  # the backend in force ("none", "bwrap", "podman", ...)
    lost: tuple[str, ...]  # the names of `Sandbox.lost`
    message: str


@attrs.frozen
class CommandResult:
    """What one command did. ``truncated``: more output was written than ``output_bytes``."""

    status: str = attrs.field(validator=attrs.validators.in_(COMMAND_STATUSES))
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    wall_s: float
    output_bytes: int = 0  # stdout + stderr bytes read (all of them unless status is output_limit)
    signal: int | None = None  # the fatal signal, when the command died of one
    error: str | None = None  # why it could not start (status "error": the sandbox's own failure)

    @property
    def ok(self) -> bool:
        """It ended by itself with exit code 0."""
        return self.status == "ok" and self.exit_code == 0


@functools.cache
def _warn_fallback(reason: str) -> None:
    log.warning("sandbox isolation 'none' (%s): commands can reach the network and write the host's files "
                "as this user; see arl.sandbox.sandbox for what is lost", reason)


def _setup_error(stderr: str, exit_code: int | None) -> str | None:
    """bwrap's, the uid drop's or the limits wrapper's own failure (the command never ran), from
    its stderr and exit code."""
    first = stderr.split("\n", 1)[0]
    if exit_code == 1 and first.startswith(("bwrap: ", "arl-limits: ", "arl-delegate: ")):
        return first
    return first if exit_code == 127 and first.startswith("setpriv: ") else None


def _signal_of(returncode: int) -> int | None:
    """The fatal signal a return code reports (negative: subprocess; 128 + N: the shell, bwrap)."""
    if returncode < 0:
        return -returncode
    if returncode > 128 and returncode - 128 in _FATAL_SIGNALS:
        return returncode - 128
    return None


class Sandbox:
    """A throw-away work dir and the means to run commands in it (see the module docstring).

    ``read_only``: more host paths visible (read-only, at the same path); ``python=True`` adds
    this interpreter's (`python_paths`) and puts its ``bin`` first on PATH; ``hide``: paths under
    those that appear empty inside (e.g. a package whose source would give a task away);
    ``env``: extra environment variables for every command.
    """

    reap_s: float = 5.0  # as root under bwrap: how long `run` / `kill` wait for the uid's leftovers

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),  # noqa: B008 (frozen: one shared default is safe)
        *,
        isolation: str = "auto",
        read_only: Sequence[str | Path] = (),
        python: bool = False,
        hide: Sequence[str | Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r} (a container backend: "
                             "arl.sandbox.backends.open_sandbox)")
        problem = None if isolation == "none" else bwrap_problem()
        if isolation == "bwrap" and problem is not None:
            raise SandboxUnavailable(problem)
        self.isolation: str = "bwrap" if isolation != "none" and problem is None else "none"
        if isolation == "auto" and problem is not None:
            _warn_fallback(problem)
        self.limits = limits
        self.read_only: tuple[Path, ...] = tuple(
            dict.fromkeys(Path(p).resolve(strict=True) for p in [*read_only, *(python_paths() if python else ())]))
        self.hide: tuple[Path, ...] = tuple(Path(p).resolve() for p in hide)
        root = os.geteuid() == 0
        # A fresh uid per sandbox: as root under bwrap (its process count is the sandbox's alone),
        # and under "none" in a process given tool uids (a pull-mode agent: its commands then
        # cannot ptrace, signal or read the environment of the agent; docs/threat_model.md).
        delegated = delegated_uids() is not None
        self.uid: int | None = (fresh_uid() if (root and self.isolation == "bwrap")
                                or (delegated and self.isolation == "none") else None)
        self.workdir: Path = Path(tempfile.mkdtemp(prefix="arl-sandbox-"))
        # Whole-sandbox bounds (see arl.sandbox.rlimits): a work dir of bounded size, a cgroup.
        self.workdir_mounted = root and _tmpfs_works() and _mount_tmpfs(self.workdir, limits.disk_bytes)
        self.cgroup: Cgroup | None = None
        if root and cgroup_problem() is None:
            with contextlib.suppress(OSError):
                self.cgroup = Cgroup.create(limits.total_memory_bytes, limits.max_procs)
        self._seccomp = sandbox_filter() if self.isolation == "bwrap" else None
        self._links = python_links() if python and self.isolation == "bwrap" else ()
        lost = list(_LOST_WITHOUT_BWRAP) if self.isolation != "bwrap" else []
        if self.isolation == "bwrap" and self._seccomp is None:
            lost += ["session keyring", "syscall filter"]
        if root and self.isolation != "bwrap" and self.cgroup is None and self.uid is None:
            lost.append("process limit")
        if self.cgroup is None:
            lost.append("whole-sandbox memory limit")  # RLIMIT_AS binds each process alone
        if not self.workdir_mounted:
            lost.append("work dir size limit")  # RLIMIT_FSIZE binds each file alone, not their number
        self.lost: tuple[str, ...] = tuple(lost)
        if self.uid is not None:
            os.chown(self.workdir, self.uid, self.uid)
        self.cwd: str = SANDBOX_CWD if self.isolation == "bwrap" else str(self.workdir)
        # The real prefix: a venv reached through a symlink is bound (and found) where it lives.
        bin_dir = f"{Path(sys.prefix).resolve()}/bin:" if python else ""
        self.env: dict[str, str] = {
            "PATH": bin_dir + SYSTEM_PATH, "HOME": self.cwd, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", **dict(env or {}),
        }
        self._procs: set[asyncio.subprocess.Process] = set()
        self._starting = 0  # `_start` calls between their reap check and `_procs`: they will use the uid
        self._reaping = False  # the uid's leftovers are being killed: no command starts meanwhile
        self._finalizer = weakref.finalize(self, _cleanup, str(self.workdir), self.workdir_mounted, self.cgroup,
                                           self.uid)

    # -- the backend interface (arl.sandbox.backends): start / exec / stop ------------------------
    async def start(self) -> Sandbox:
        """Make the sandbox ready for commands (bwrap and "none": nothing to do, each command is a
        sandbox of its own; a container backend starts its container). Idempotent."""
        if self.closed:
            raise SandboxDied(f"{self!r} is closed")
        return self

    async def alive(self) -> bool:
        """Whether commands can still run in it (not closed; its container still running)."""
        return not self.closed

    async def exec(
        self, argv: Sequence[str], *, timeout: float | None = None, workdir: str | None = None,
        env: Mapping[str, str] | None = None, stdin: str | None = None,
    ) -> CommandResult:
        """Run ``argv`` (no shell) in the sandbox, in ``workdir`` (default: the work dir, `cwd`),
        with ``env`` added to the sandbox's environment, killed after ``timeout`` seconds (default:
        the limits' ``wall_s``). The error policy, the same for every backend: whatever the
        command does is a `CommandResult` (a timeout, a missing program, a crash, status "error"
        when it could not be started); a sandbox that is gone raises `SandboxDied`."""
        if not argv:
            raise ValueError("argv must not be empty")
        if not await self.alive():
            raise SandboxDied(f"{self!r} is gone: start a new one")
        limits = self.limits if timeout is None else attrs.evolve(self.limits, wall_s=float(timeout))
        command = "exec " + shlex.join([str(a) for a in argv])
        if workdir is not None:
            command = f"cd {shlex.quote(str(workdir))} && {command}"
        result = await self.run(command, limits=limits, stdin=stdin, env=env)
        # a container removed under a command: its client reports an error, or its processes SIGKILLed
        if result.status in ("error", "killed", "oom") and not await self.alive():
            raise SandboxDied(f"{self!r} died while running {argv[0]!r}: {result.error or result.status}")
        return result

    async def stop(self) -> None:
        """`close`, shielded: a caller cancelled meanwhile still gets every process killed and the
        work dir (the container) removed before the cancellation goes on: shielded from an anyio
        cancel scope, and from a task's ``cancel()``, which is raised once the sandbox is gone."""
        import anyio  # here: the sandbox is asyncio otherwise, and `stop` must hold under both

        task = asyncio.ensure_future(self.close())
        cancelled = False
        with anyio.CancelScope(shield=True):
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        task.result()

    @property
    def isolation_warning(self) -> IsolationWarning | None:
        """What this sandbox does not isolate, as a record (None when nothing is lost)."""
        if not self.lost:
            return None
        if self.isolation == "none":
            message = ("sandbox backend 'none': commands run on the host as "
                       f"{f'uid {self.uid}' if self.uid is not None else 'the calling user'}, not isolated: "
                       + ", ".join(self.lost))
        else:
            message = f"sandbox backend {self.isolation!r} lacks here: " + ", ".join(self.lost)
        return IsolationWarning(self.isolation, self.lost, message)

    # -- commands --------------------------------------------------------------------------------
    async def run(
        self, command: str, *, limits: SandboxLimits | None = None, stdin: str | None = None,
        read_only: Sequence[str | Path] = (), env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """``bash -c command`` in the work dir; ``read_only`` binds more paths for this command only;
        ``env`` adds to the sandbox's environment for this command. Cancelling it kills the command."""
        limits = limits or self.limits
        start = time.monotonic()
        oom_before = self._oom_kills()
        try:
            proc = await self._start(["bash", "-c", command], {**self.env, **(env or {})}, limits, read_only,
                                     stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                                     oom_victim=True)
        except OSError as exc:
            return CommandResult("error", None, "", "", False, time.monotonic() - start, error=str(exc))
        output = CappedOutput(limits.output_bytes, limits.drain_bytes)
        readers = [asyncio.ensure_future(output.read("stdout", proc.stdout)),
                   asyncio.ensure_future(output.read("stderr", proc.stderr))]
        feeder = asyncio.ensure_future(_feed(proc, stdin)) if stdin is not None else None
        waiter = asyncio.ensure_future(proc.wait())
        over = asyncio.ensure_future(output.over.wait())
        status = "ok"
        try:
            await asyncio.wait({waiter, over}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                status = "output_limit" if output.over.is_set() else "timeout"
                self._kill(proc)
            # The pipes close when every process holding them is gone. In mode "none" a grandchild
            # that left the process group may hold them: do not wait on it.
            _, pending = await asyncio.wait({waiter, *readers}, timeout=_GRACE_S)
            if pending:
                self._kill(proc)
                proc._transport.close()  # type: ignore[attr-defined]  # closes our ends of the pipes
        finally:
            for task in (over, feeder, waiter, *readers):
                if task is not None and not task.done():
                    task.cancel()
            self._kill(proc)  # ended, unless run() itself was cancelled: then it must not outlive it
            self._procs.discard(proc)
        returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        fatal = _signal_of(returncode)
        exit_code = 128 + fatal if fatal is not None else returncode
        if status == "ok" and fatal is not None:
            status = "timeout" if fatal == signal.SIGXCPU else "killed"
            if fatal == signal.SIGKILL and oom_before is not None and (self._oom_kills() or 0) > oom_before:
                status = "oom"
        if output.over.is_set():
            status = "output_limit"
        stderr = output.text("stderr")
        error = self._setup_error(stderr, exit_code) if status == "ok" else None
        result = CommandResult(
            "error" if error else status, exit_code, output.text("stdout"), stderr, output.truncated,
            time.monotonic() - start, output_bytes=output.seen, signal=fatal, error=error,
        )
        await self._reap()
        return result

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], limits: SandboxLimits | None = None,
        tool_uids: range | None = None,
    ) -> asyncio.subprocess.Process:
        """A long-running process (an agent) in the sandbox: pipes for stdin/stdout/stderr, its
        own process group, the CPU/memory/file/process limits (wall time is the caller's).

        ``tool_uids`` (as root; `arl.sandbox.bwrap.fresh_uid_block`): the uids the process's own
        sandboxes run their commands as, never its own. Under bwrap it runs as the sandbox's uid in
        a user namespace that maps only that uid and these, with the capabilities to switch to them
        (`arl.sandbox.uid_delegation`); under "none" it stays root, which can switch anyway. Either
        way `TOOL_UIDS_ENV` in its environment names them."""
        extra: tuple[Path, ...] = ()
        if tool_uids is not None:
            if os.geteuid() != 0:
                raise ValueError("only root can give a process uids of its own for its commands")
            env = {**env, TOOL_UIDS_ENV: format_uids(tool_uids)}
            extra = (*python_paths(), Path(PROGRAM).parent)  # what the drop runs, as root, in there
        return await self._start(list(argv), {**self.env, **env}, limits or self.limits, extra,
                                 stdin=asyncio.subprocess.PIPE, tool_uids=tool_uids)

    async def _start(self, argv: list[str], env: dict[str, str], limits: SandboxLimits,
                     read_only: Sequence[str | Path], *, stdin: int,
                     tool_uids: range | None = None, oom_victim: bool = False) -> asyncio.subprocess.Process:
        if self._finalizer is not None and not self._finalizer.alive:
            raise OSError("the sandbox is closed")
        full, kwargs, seccomp_fd = await self._command(argv, env, limits, read_only, tool_uids, oom_victim)
        while self._reaping:  # a process started now would be killed with the uid's leftovers
            await asyncio.sleep(0.005)
        self._starting += 1  # from here on `_reap` leaves the uid alone (no await since the check)
        try:
            proc = await asyncio.create_subprocess_exec(
                *full, stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True, **kwargs,
            )
        finally:
            self._starting -= 1
            if seccomp_fd is not None:
                os.close(seccomp_fd)  # bwrap (the runtime's client) has its own copy, or never started
        self._procs.add(proc)
        return proc

    async def _command(self, argv: list[str], env: dict[str, str], limits: SandboxLimits,
                       read_only: Sequence[str | Path], tool_uids: range | None,
                       oom_victim: bool) -> tuple[list[str], dict[str, Any], int | None]:
        """(the host argv that runs ``argv`` in this sandbox, its subprocess keywords, the fd it
        passes (bwrap's seccomp program; a container's env file) or None, closed once it started):
        bubblewrap's, or the plain one of isolation "none"."""
        seccomp_fd = None
        if self._seccomp is not None:  # the delegation program makes its user namespace, then filters fully
            seccomp_fd = filter_fd(self._seccomp if tool_uids is None else sandbox_filter(namespaces=True))
        if self.isolation == "bwrap":
            drop = (delegate_argv(os.path.realpath(sys.executable), self.uid, tool_uids)
                    if tool_uids is not None and self.uid is not None else None)
            full = (self._bwrap_argv(env, read_only, limits, seccomp_fd, drop)
                    + limits_prefix(limits, oom_victim=oom_victim) + argv)
            kwargs: dict[str, Any] = {"env": {}, "pass_fds": () if seccomp_fd is None else (seccomp_fd,)}
        else:
            full = self._none_argv(limits, oom_victim) + argv
            kwargs = {"env": env, "cwd": self.workdir}
        if self.cgroup is not None:
            full = self.cgroup.join_prefix() + full
        return full, kwargs, seccomp_fd

    def _setup_error(self, stderr: str, exit_code: int | None) -> str | None:
        """The backend's own failure (the command never ran), from its stderr and exit code."""
        return _setup_error(stderr, exit_code)

    def _bwrap_argv(self, env: Mapping[str, str], read_only: Sequence[str | Path], limits: SandboxLimits,
                    seccomp_fd: int | None, drop: Sequence[str] | None = None) -> list[str]:
        return bwrap_argv(self.workdir, env, read_only=self.read_only, hide=self.hide, uid=self.uid,
                          also_read_only=[Path(p).resolve() for p in read_only], links=self._links,
                          tmp_bytes=limits.tmp_bytes, seccomp_fd=seccomp_fd, drop=drop)

    def _none_argv(self, limits: SandboxLimits, oom_victim: bool = False) -> list[str]:
        """Isolation "none": the uid drop (when the sandbox has a uid), then the limits. Dropped,
        the process limit counts the sandbox's uid alone; otherwise the caller's processes too."""
        if self.uid is not None:
            return setpriv_argv(self.uid) + limits_prefix(limits, oom_victim=oom_victim)
        return limits_prefix(limits, uid_processes(os.getuid()) if os.geteuid() != 0 else 0, oom_victim=oom_victim)

    def _oom_kills(self) -> int | None:
        """The OOM kills counted so far where this sandbox's commands live: its cgroup's, else the
        kernel's (all of the host's); None where neither can be read."""
        if self.cgroup is not None and (kills := self.cgroup.oom_kills()) is not None:
            return kills
        return _host_oom_kills()

    async def _reap(self) -> None:
        """With a uid of its own (as root under bwrap; under "none" in a process given tool uids):
        return once no process of the sandbox's uid is left (`reap_uid`:
        killed, then waited for, at most `reap_s`; what is left then is logged, never raised).

        bwrap can return while the kernel still tears the command's PID namespace down (after a
        kill, and now and then after an ordinary exit): without this, a fork bomb's processes
        could still be listed, and counted against the next command's process limit.
        Skipped while another command or spawned process of this sandbox runs or starts: it has
        the same uid, and would be killed too (the last one to end reaps).
        """
        if self.uid is None or self._procs or self._starting or self._reaping:
            return
        self._reaping = True
        try:
            left = await reap_uid(self.uid, self.reap_s)
        except OSError as exc:  # setpriv could not start (e.g. out of processes): say so, carry on
            log.warning("sandbox uid %d: could not kill its leftover processes: %s", self.uid, exc)
            return
        finally:
            self._reaping = False
        if left:
            log.warning("sandbox uid %d: %d process(es) still listed %.1f s after its command ended",
                        self.uid, left, self.reap_s)

    def command_line(self, command: str) -> str:
        """The full host command line `run` would start (for logs and debugging)."""
        argv = (self._bwrap_argv(self.env, (), self.limits, 3 if self._seccomp is not None else None)
                + limits_prefix(self.limits, oom_victim=True) if self.isolation == "bwrap"
                else self._none_argv(self.limits, oom_victim=True))
        argv = (self.cgroup.join_prefix() if self.cgroup is not None else []) + argv
        return shlex.join([*argv, "bash", "-c", command])

    # -- files, from the host side ---------------------------------------------------------------
    def host_path(self, path: str | Path) -> Path:
        """The host path of ``path`` as commands see it (relative to the work dir, or absolute
        under it). Symlinks are resolved on the host: a path that leaves the work dir is refused
        (ValueError), so the host side never follows a link the agent planted to a host file."""
        path = Path(path)
        if path.is_absolute():
            try:
                path = path.relative_to(self.cwd)
            except ValueError:
                raise ValueError(f"{str(path)!r} is outside the work dir {self.cwd}") from None
        host = (self.workdir / path).resolve()
        if not host.is_relative_to(self.workdir.resolve()):
            raise ValueError(f"{str(path)!r} leads outside the work dir")
        return host

    def write_file(self, path: str | Path, data: str | bytes) -> Path:
        """Write a file (and its missing parent dirs) into the work dir, owned by the sandbox user."""
        host = self.host_path(path)
        fresh = [p for p in reversed(host.parents) if not p.exists()]
        host.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            data = data.encode()
        host.write_bytes(data)
        if self.uid is not None:
            for p in (*fresh, host):
                os.chown(p, self.uid, self.uid)
        return host

    # -- lifetime --------------------------------------------------------------------------------
    def _kill(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    async def kill(self) -> None:
        """Kill every process this sandbox started (each one's process group; with a uid of its
        own, every process of that uid, waited for as in `run`)."""
        procs, self._procs = list(self._procs), set()
        for proc in procs:
            self._kill(proc)
        for proc in procs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), timeout=5.0)
        await self._reap()

    async def close(self) -> None:
        """Kill what runs and remove the work dir (safe to call twice)."""
        await self.kill()
        # the work dir may hold whatever the agent left (100k files: seconds): removed in a worker
        # thread, off the event loop; the thread finishes it even if this call is cancelled
        await asyncio.to_thread(self._finalizer)

    def close_sync(self) -> None:
        """`close` for synchronous callers: kill process groups, remove the work dir."""
        for proc in list(self._procs):
            self._kill(proc)
        self._procs.clear()
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Sandbox(isolation={self.isolation!r}, workdir={str(self.workdir)!r})"


async def _feed(proc: asyncio.subprocess.Process, data: str) -> None:
    """Write stdin and close it; a command that does not read it is not an error."""
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data.encode())
        await proc.stdin.drain()
        proc.stdin.close()


def _host_oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (``oom_kill`` in ``/proc/vmstat``; Linux 4.13+)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return None


@functools.cache
def _tmpfs_works() -> bool:
    """Whether this process may mount a tmpfs (root with CAP_SYS_ADMIN; probed once)."""
    probe = tempfile.mkdtemp(prefix="arl-mount-probe-")
    try:
        if not _mount_tmpfs(Path(probe), 1 << 20):
            return False
        _unmount(probe)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def _libc() -> Any:
    import ctypes  # here: only root's sandboxes mount

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _mount_tmpfs(path: Path, size: int) -> bool:
    """Mount a tmpfs of ``size`` bytes on ``path`` (the work dir: the bound on its disk use); False
    where that is not allowed."""
    options = f"size={max(4096, size)},mode=0755".encode()
    return _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) == 0


def _unmount(path: str) -> None:
    _libc().umount2(os.fsencode(path), _MNT_DETACH)


def _cleanup(path: str, mounted: bool, cgroup: Cgroup | None, uid: int | None = None) -> None:
    """Close a sandbox: its cgroup's processes killed and the cgroup removed, the work dir (and its
    tmpfs) removed, its uid given back (`release_uid`)."""
    if uid is not None:
        release_uid(uid)
    if cgroup is not None:
        cgroup.remove()
    if mounted:
        _unmount(path)  # lazily: the files go with the tmpfs, the (empty) mount point stays
    _remove_tree(path)


def _remove_tree(path: str) -> None:
    """Remove a work dir whatever the agent left in it: taken permissions, a tree deeper than the
    recursion limit or PATH_MAX (`arl.sandbox.hostfs.remove_tree`: iterative, never raises)."""
    remove_tree(path)


__all__ = ["COMMAND_STATUSES", "ISOLATIONS", "SANDBOX_CWD", "CommandResult", "IsolationWarning", "Sandbox",
           "SandboxDied", "SandboxLimits", "SandboxUnavailable", "bwrap_problem", "limits_prefix", "python_paths"]
