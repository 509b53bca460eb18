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
  namespace, in which the process limit counts only the sandbox's own processes.
- ``"none"``: the fallback when bwrap is absent or cannot start (no user namespaces). Commands
  run as plain subprocesses in their own process group, in the work dir, with the same limits.
  What is lost (also listed, for the instance in force, in ``Sandbox.lost``):

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
                                wall-time kill of its process group
  ============================  ==================================================================

Limits, in both modes (bash ``ulimit`` in front of the command, so they bind the command and
everything it starts, and it cannot raise them): CPU seconds, address space, file size, process
count, no core files. Wall time is enforced here by killing the process group; output is read
while the command runs, the first ``output_bytes`` kept, up to ``drain_bytes`` more read and
dropped (counted), and a command that writes beyond that is killed.

A command's own faults are results, never exceptions: `CommandResult.status` is "ok" (it ended
by itself; look at ``exit_code``), "timeout" (wall or CPU limit), "output_limit", "killed" (a
fatal signal: the file-size limit's SIGXFSZ, SIGKILL, SIGSEGV, ...) or "error" (it could not be
started, or bwrap / the limits wrapper failed before it did). Exit codes follow the shell:
128 + N for a command killed by signal N.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import logging
import math
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

log = logging.getLogger(__name__)

ISOLATIONS = ("auto", "bwrap", "none")
COMMAND_STATUSES = ("ok", "timeout", "output_limit", "killed", "error")
SANDBOX_CWD = "/workspace"  # where the work dir appears inside bwrap (fixed: outputs do not name temp dirs)
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
        "localtime", "python3*")
_FATAL_SIGNALS = {signal.SIGKILL, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS}
_CHUNK = 1 << 16
_GRACE_S = 1.0  # after a command ends or is killed: how long its pipes may stay open
_LOST_WITHOUT_BWRAP = ("network namespace", "host file system protection", "PID namespace", "hidden files")


class SandboxUnavailable(RuntimeError):
    """``isolation="bwrap"`` was asked for and bubblewrap cannot start here."""


@attrs.frozen
class SandboxLimits:
    """Limits of one command (defaults: one command of a bug-fix episode)."""

    wall_s: float = 10.0  # killed (process group) after this many seconds
    cpu_s: float = 10.0  # RLIMIT_CPU, rounded up to whole seconds
    memory_bytes: int = 512 * 2**20  # RLIMIT_AS
    output_bytes: int = 16_384  # stdout + stderr kept
    file_size_bytes: int = 64 * 2**20  # RLIMIT_FSIZE: largest file a command may write
    max_procs: int = 64  # RLIMIT_NPROC
    drain_bytes: int = 8 * 2**20  # output read (and dropped) past output_bytes before the command is killed


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


def limits_prefix(limits: SandboxLimits, nproc_base: int = 0) -> list[str]:
    """``bash -c 'ulimit ...; exec "$@"'``: argv that sets the limits and execs the rest.

    bash counts ``-v`` and ``-f`` in KiB; ``ulimit`` sets soft and hard limits together (the CPU
    limit's hard one a second above), so the command cannot raise them again.
    """
    cpu = max(1, math.ceil(limits.cpu_s))
    script = (  # CPU: SIGXCPU at the soft limit (a "timeout"), SIGKILL a second later
        f"ulimit -S -t {cpu} && ulimit -H -t {cpu + 1} && ulimit -c 0 -v {max(1, limits.memory_bytes // 1024)} "
        f"-f {max(1, math.ceil(limits.file_size_bytes / 1024))} -u {nproc_base + limits.max_procs} "
        '&& exec "$@"'
    )
    return ["bash", "-c", script, "arl-limits"]


def python_paths() -> tuple[Path, ...]:
    """The paths this interpreter needs (its environment and its base installation)."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent}
    return tuple(sorted(p.resolve() for p in paths))


def _bwrap_base(root: bool) -> list[str]:
    """bwrap options every sandbox shares: namespaces and the read-only system."""
    argv = ["bwrap", "--die-with-parent", "--new-session"]
    # As root a user namespace would keep kernel uid 0 (exempt from RLIMIT_NPROC): stay in the
    # init namespace and let setpriv drop to an unprivileged uid inside (see `Sandbox`).
    argv += (["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
             if root else ["--unshare-all"])
    argv += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for path in _ROOT_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for pattern in _ETC:
        for path in sorted(glob.glob(f"/etc/{pattern}")):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    return argv


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap starts here (probed once per process), else why it does not."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        return "running as root needs setpriv (util-linux) to drop to an unprivileged uid"
    argv = _bwrap_base(root) + (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if root else [])
    try:
        probe = subprocess.run([*argv, "true"], capture_output=True, timeout=30, env={})
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not start: {exc}"
    if probe.returncode != 0:
        return f"bwrap could not start: {probe.stderr.decode(errors='replace').strip()}"
    return None


@functools.cache
def _warn_fallback(reason: str) -> None:
    log.warning("sandbox isolation 'none' (%s): commands can reach the network and write the host's files "
                "as this user; see arl.envs.sandbox for what is lost", reason)


def _user_processes() -> int:
    """Processes of this uid now: in mode "none" RLIMIT_NPROC counts all of them, not only ours."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += entry.stat().st_uid == uid
    return count


def _setup_error(stderr: str) -> str | None:
    """bwrap's or the limits wrapper's own failure (the command never ran), from its stderr."""
    first = stderr.split("\n", 1)[0]
    return first if first.startswith(("bwrap: ", "arl-limits: ")) else None


def _signal_of(returncode: int) -> int | None:
    """The fatal signal a return code reports (negative: subprocess; 128 + N: the shell, bwrap)."""
    if returncode < 0:
        return -returncode
    if returncode > 128 and returncode - 128 in _FATAL_SIGNALS:
        return returncode - 128
    return None


class _Output:
    """stdout and stderr of one command, read concurrently under one shared byte budget."""

    def __init__(self, keep: int, drain: int) -> None:
        self.keep, self.limit = keep, keep + drain
        self.kept = 0
        self.seen = 0
        self.chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self.over = asyncio.Event()

    async def read(self, name: str, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        # Read to EOF even past the limit (the command is killed then): asyncio reports a process
        # as ended only once its pipes are closed, and a paused pipe never sees its EOF.
        while chunk := await stream.read(_CHUNK):
            if self.over.is_set():
                continue
            self.seen += len(chunk)
            room = self.keep - self.kept
            if room > 0:
                self.chunks[name].append(chunk[:room])
                self.kept += min(room, len(chunk))
            if self.seen > self.limit:
                self.over.set()

    def text(self, name: str) -> str:
        return b"".join(self.chunks[name]).decode("utf-8", errors="replace")


class Sandbox:
    """A throw-away work dir and the means to run commands in it (see the module docstring).

    ``read_only``: more host paths visible (read-only, at the same path); ``python=True`` adds
    this interpreter's (`python_paths`) and puts its ``bin`` first on PATH; ``hide``: paths under
    those that appear empty inside (e.g. a package whose source would give a task away);
    ``env``: extra environment variables for every command.
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),
        *,
        isolation: str = "auto",
        read_only: Sequence[str | Path] = (),
        python: bool = False,
        hide: Sequence[str | Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
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
        # A fresh uid per sandbox (as root, bwrap): its process count is the sandbox's alone.
        self.uid: int | None = (1 << 24) + secrets.randbelow(1 << 24) if root and self.isolation == "bwrap" else None
        self.lost: tuple[str, ...] = (
            () if self.isolation == "bwrap" else _LOST_WITHOUT_BWRAP + (("process limit",) if root else ()))
        self.workdir: Path = Path(tempfile.mkdtemp(prefix="arl-sandbox-"))
        if self.uid is not None:
            os.chown(self.workdir, self.uid, self.uid)
        self.cwd: str = SANDBOX_CWD if self.isolation == "bwrap" else str(self.workdir)
        bin_dir = f"{sys.prefix}/bin:" if python else ""
        self.env: dict[str, str] = {
            "PATH": bin_dir + SYSTEM_PATH, "HOME": self.cwd, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", **dict(env or {}),
        }
        self._procs: set[asyncio.subprocess.Process] = set()
        self._finalizer = weakref.finalize(self, _remove_tree, str(self.workdir))

    # -- commands --------------------------------------------------------------------------------
    async def run(
        self, command: str, *, limits: SandboxLimits | None = None, stdin: str | None = None,
        read_only: Sequence[str | Path] = (),
    ) -> CommandResult:
        """``bash -c command`` in the work dir; ``read_only`` binds more paths for this command only."""
        limits = limits or self.limits
        start = time.monotonic()
        try:
            proc = await self._start(["bash", "-c", command], self.env, limits, read_only,
                                     stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL)
        except OSError as exc:
            return CommandResult("error", None, "", "", False, time.monotonic() - start, error=str(exc))
        output = _Output(limits.output_bytes, limits.drain_bytes)
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
            self._procs.discard(proc)
        returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        fatal = _signal_of(returncode)
        exit_code = 128 + fatal if fatal is not None else returncode
        if status == "ok" and fatal is not None:
            status = "timeout" if fatal == signal.SIGXCPU else "killed"
        if output.over.is_set():
            status = "output_limit"
        stderr = output.text("stderr")
        error = _setup_error(stderr) if status == "ok" and exit_code == 1 else None
        return CommandResult(
            "error" if error else status, exit_code, output.text("stdout"), stderr, output.seen > output.kept,
            time.monotonic() - start, output_bytes=output.seen, signal=fatal, error=error,
        )

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], limits: SandboxLimits | None = None,
    ) -> asyncio.subprocess.Process:
        """A long-running process (an agent) in the sandbox: pipes for stdin/stdout/stderr, its
        own process group, the CPU/memory/file/process limits (wall time is the caller's)."""
        return await self._start(list(argv), {**self.env, **env}, limits or self.limits, (),
                                 stdin=asyncio.subprocess.PIPE)

    async def _start(self, argv: list[str], env: dict[str, str], limits: SandboxLimits,
                     read_only: Sequence[str | Path], *, stdin: int) -> asyncio.subprocess.Process:
        if self._finalizer is not None and not self._finalizer.alive:
            raise OSError("the sandbox is closed")
        if self.isolation == "bwrap":
            full = self._bwrap_argv(env, read_only) + limits_prefix(limits) + argv
            kwargs: dict[str, Any] = {"env": {}}
        else:
            full = limits_prefix(limits, _user_processes() if os.geteuid() != 0 else 0) + argv
            kwargs = {"env": env, "cwd": self.workdir}
        proc = await asyncio.create_subprocess_exec(
            *full, stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, **kwargs,
        )
        self._procs.add(proc)
        return proc

    def _bwrap_argv(self, env: Mapping[str, str], read_only: Sequence[str | Path]) -> list[str]:
        argv = _bwrap_base(self.uid is not None)
        made: set[Path] = {Path(p) for p in ("/", "/tmp", "/proc", "/dev", "/etc", *_ROOT_LINKS)}
        bound: list[Path] = [Path("/usr")]
        for path in (*self.read_only, *(Path(p).resolve() for p in read_only)):
            if any(path.is_relative_to(b) for b in bound):
                continue  # already visible
            # bwrap makes missing parents 0700 (unreadable after the uid drop): make them 0755 first
            for parent in reversed(path.parents):
                if parent not in made and not any(parent.is_relative_to(b) for b in bound):
                    made.add(parent)
                    argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", str(path), str(path)]
            bound.append(path)
        for path in self.hide:
            if any(path.is_relative_to(p) for p in self.read_only):
                argv += ["--tmpfs", str(path)]
        argv += ["--bind", str(self.workdir), SANDBOX_CWD, "--chdir", SANDBOX_CWD, "--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        if self.uid is not None:
            argv += ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        return argv

    def command_line(self, command: str) -> str:
        """The full host command line `run` would start (for logs and debugging)."""
        argv = (self._bwrap_argv(self.env, ()) if self.isolation == "bwrap" else []) + limits_prefix(self.limits)
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
        """Kill every process this sandbox started (each one's process group)."""
        procs, self._procs = list(self._procs), set()
        for proc in procs:
            self._kill(proc)
        for proc in procs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), timeout=5.0)

    async def close(self) -> None:
        """Kill what runs and remove the work dir (safe to call twice)."""
        await self.kill()
        self._finalizer()

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


def _remove_tree(path: str) -> None:
    """Remove a work dir even where the agent took its own permissions away."""

    def retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)

    shutil.rmtree(path, onerror=retry)


__all__ = ["COMMAND_STATUSES", "ISOLATIONS", "SANDBOX_CWD", "CommandResult", "Sandbox", "SandboxLimits",
           "SandboxUnavailable", "bwrap_problem", "limits_prefix", "python_paths"]
