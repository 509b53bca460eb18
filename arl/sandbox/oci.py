"""The OCI container backend of the sandbox: podman or docker, from a local image only, never pulled.

    async with OciSandbox(SandboxLimits(wall_s=5), runtime="podman", python=True) as sb:
        result = await sb.run("python -c 'print(1 + 1)'")   # the same CommandResult as under bwrap

Why a module of its own: `arl.sandbox.bwrap` holds the isolation policy of bubblewrap, this one
that of a container, each as the argv it builds, so each can be read (and audited) in one place;
`OciSandbox` keeps `Sandbox`'s commands, limits, statuses and error policy and changes only how a
command is started (``<runtime> exec`` into one long-lived container per sandbox).

The image (`build_image`): arl builds it itself, offline, with ``<runtime> import`` of a rootfs
it assembles: the directory skeleton, the ``/bin`` and ``/lib*`` links as on the host and the few
``/etc`` files programs read (`arl.sandbox.bwrap`'s list), copied. The system (``/usr``) and the
task's needs (this interpreter's prefixes with ``python=True``, the ``read_only`` paths) are bound
read-only at run time, as under bubblewrap, so the image is a few hundred KB and built in well under a
second; its tag is the digest of its content (`IMAGE_REPO`), so a changed host gets a new one. A
container is only ever created from an image that ``image inspect`` finds, with ``--pull never``.

A container (`OciSandbox.start`, lazily on the first command): ``--network none`` (its own
loopback only); a read-only root; the work dir bound read-write at `SANDBOX_CWD`; a fresh
``/tmp`` of ``tmp_bytes``; ``hide`` paths covered by an empty read-only tmpfs; memory
(``total_memory_bytes``, no swap), process (``max_procs``) and CPU (``cpus``) limits on its
cgroup; an init that reaps orphans (podman's ``--init``, catatonit; docker's tini, the host's
``docker-init`` as the container's command, see `docker_init`); every
capability dropped, ``no-new-privileges``, the runtime's default seccomp profile with the refusals
of bubblewrap's filter (`seccomp_profile`, `arl.sandbox.seccomp`: the keyring calls, since the
uid's user keyring outlives a sandbox and its uid is drawn again later, io_uring, mounts and new
namespaces, file locks and change watches; where no default profile file is found, ``lost`` says
"session keyring" and "syscall filter"); as root, every
process as the sandbox's own uid
(`arl.sandbox.bwrap.fresh_uid`, the same uid on the host), so `reap_uid` finds what a command left
behind, as under bubblewrap. Each command is ``<runtime> exec --user <uid> -w /workspace`` with the
`arl.sandbox.rlimits` wrapper in front, as in the other backends, and its environment in an
unnamed file (`env_file`): ``--env K=V`` would show every value to every user of the host in the
client's ``/proc/<pid>/cmdline``.

Ownership: every container carries the label `LABEL` and `OWNER_LABEL` = this process's boot id,
pid and start time; `reap_orphans` (run when a process first starts a container, and for its
own containers at exit) removes every container of a process that is gone, so a trainer killed
with SIGKILL leaves nothing running past the next start.

What this host needs (`oci_problem` says what is missing): the runtime's client, run as root (a
rootless runtime maps uids, and `reap_uid` cannot find a command's processes: refused, not half
supported; `rootless_problem` also names the host conditions that fail rootless), and an OCI runtime that starts a container here. Where the default one (podman's
crun) cannot (a cgroup v1/v2 hybrid host), ``runc`` is tried (`OCI_RUNTIMES`). Docker also needs
its daemon running (Debian's ``docker.io``; where no init system starts it, scripts/dockerd.sh)
and its init, tini, under ``/usr``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import glob
import hashlib
import io
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from arl.sandbox.bwrap import _ETC, _ROOT_LINKS, SANDBOX_CWD, fresh_uid, python_links, python_paths
from arl.sandbox.rlimits import SandboxLimits, limits_prefix
from arl.sandbox.sandbox import Sandbox, SandboxUnavailable, _cleanup
from arl.sandbox.seccomp import oci_profile

RUNTIMES = ("podman", "docker")
IMAGE_REPO = "localhost/arl-sandbox"  # + ":" + the first 16 hex digits of the rootfs tarball's sha256
LABEL = "arl.sandbox"  # every container arl starts carries it ("1")
OWNER_LABEL = "arl.owner"  # "<boot id>:<pid>:<start time>" of the process that started it
OCI_RUNTIMES = (None, "runc")  # the runtime's default OCI runtime, then runc (see the module docstring)
PROBE_TIMEOUT_S = 60.0  # one probe or image build: a runtime that hangs past this is unusable
INIT_UID = 65534  # nobody: the uid of a container's init (commands run as the sandbox's own uid)
NOFILE = 1024  # RLIMIT_NOFILE of a container's processes (the runtime must be told one it may set)
_DOCKER_ERRORS = ("Error response from daemon: ", "Error: No such container", "OCI runtime exec failed: ")
_CONTAINER_CMD = ("/usr/bin/sleep", "infinity")  # the container's init: holds it up between commands
_log = logging.getLogger(__name__)
_started: dict[str, set[str]] = {}  # runtime -> names of this process's live containers (removed at exit)


def _run(argv: Sequence[str], timeout: float = PROBE_TIMEOUT_S, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout, check=False)


def _first_line(data: bytes) -> str:
    """The runtime's error out of its stderr: the last line that is not the client's usage hint
    (docker ends a failed ``run`` with "Run 'docker run --help' for more information")."""
    lines = [line for line in data.decode(errors="replace").strip().splitlines()
             if line.strip() and not line.startswith(("Run '", "See '"))]
    return lines[-1] if lines else ""


def _rm(runtime: str, *names: str) -> list[str]:
    """The argv that removes containers at once (podman's ``-t 0``: no grace period; docker's
    ``rm -f`` kills with SIGKILL and has no ``-t``)."""
    return [runtime, "rm", "-f", *(["-t", "0"] if runtime == "podman" else []), *names]


def _run_prefix(runtime: str, oci: str | None) -> list[str]:
    """``<runtime> run`` with the OCI runtime ``oci`` (None: the default): a global flag of
    podman's, a ``run`` flag of docker's (whose daemon knows the runtimes by name)."""
    if oci is None:
        return [runtime, "run"]
    return [runtime, "--runtime", oci, "run"] if runtime == "podman" else [runtime, "run", "--runtime", oci]


def docker_init() -> str | None:
    """The init of a docker container (tini, Debian's ``docker-init``) at a path under ``/usr``,
    which every container binds from the host, or None. Docker's ``--init`` cannot serve: it binds
    the binary at ``/sbin/docker-init``, which in arl's image is a link into the bound ``/usr``,
    so the container fails with 'stat /sbin/docker-init: no such file or directory'; arl runs
    the host's binary as the container's command instead."""
    for name in ("docker-init", "tini-static", "tini"):
        path = shutil.which(name, path="/usr/bin:/usr/sbin:/usr/libexec/docker")
        if path is not None:
            return path
    return None


def _init_args(runtime: str) -> tuple[list[str], list[str]]:
    """(``run`` flags, command prefix) that make an init, which reaps orphans, the container's
    pid 1: podman's ``--init`` (catatonit), docker's `docker_init` as the command."""
    if runtime == "docker":
        return [], [str(docker_init()), "--"]
    return ["--init"], []


def rootfs_tar() -> bytes:
    """The image's rootfs as a tar (see the module docstring): deterministic for one host (fixed
    owners and times), so its digest names the image."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        for name in ("usr", "etc", "proc", "sys", "dev", "tmp", "root", "home", "run", "var", "var/tmp",
                     SANDBOX_CWD.lstrip("/")):
            add_dir(name, 0o1777 if name in ("tmp", "var/tmp") else 0o755)
        for link in _ROOT_LINKS:
            if os.path.islink(link):
                info = tarfile.TarInfo(link.lstrip("/"))
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(link)
                tar.addfile(info)
            elif os.path.isdir(link):
                add_dir(link.lstrip("/"))  # a real directory on this host: bound read-only at run time
        for pattern in _ETC:
            for path in sorted(glob.glob(f"/etc/{pattern}")):
                tar.add(path, arcname=path.lstrip("/"), recursive=True, filter=_plain)
    return buf.getvalue()


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Root-owned, timeless, no devices: what the image may hold of a host file."""
    if info.isdev() or info.isfifo():
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def image_tag(tar: bytes) -> str:
    return f"{IMAGE_REPO}:{hashlib.sha256(tar).hexdigest()[:16]}"


def image_exists(runtime: str, image: str) -> bool:
    """Whether ``image`` is in the runtime's local store (``image inspect``; never a registry)."""
    try:
        return _run([runtime, "image", "inspect", image]).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def build_image(runtime: str = "podman") -> str:
    """arl's default image for ``runtime``, built offline if it is not there yet (``import`` of
    `rootfs_tar`); returns its tag. Raises `SandboxUnavailable` when the runtime cannot import."""
    tar = rootfs_tar()
    tag = image_tag(tar)
    if image_exists(runtime, tag):
        return tag
    try:
        done = _run([runtime, "import", "--change", f"LABEL {LABEL}=1", "-", tag], stdin=tar)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"{runtime} import failed: {exc}") from exc
    if done.returncode != 0:
        raise SandboxUnavailable(f"{runtime} import of arl's sandbox image failed: {_first_line(done.stderr)}")
    return tag


@functools.cache
def _boot_id() -> str:
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()
    return "unknown"


def _start_time(pid: int) -> str | None:
    """A process's start time (``/proc/<pid>/stat`` field 22): with the pid, who it is."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner() -> str:
    """This process, as `OWNER_LABEL` names it."""
    return f"{_boot_id()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(label: str) -> bool:
    """Whether the process a container's `OWNER_LABEL` names is still running (same boot, same pid
    and start time: a reused pid is another process)."""
    boot, _, rest = label.partition(":")
    pid, _, start = rest.partition(":")
    if boot != _boot_id() or not pid.isdigit():
        return False
    return _start_time(int(pid)) == start


def reap_orphans(runtime: str) -> list[str]:
    """Remove every arl container (label `LABEL`) whose owner process is gone; returns their names."""
    label = ('{{.Label "' if runtime == "docker" else '{{index .Labels "') + OWNER_LABEL + '"}}'  # docker's is a string
    try:
        listed = _run([runtime, "ps", "-a", "--filter", f"label={LABEL}=1", "--format", "{{.Names}} " + label])
    except (OSError, subprocess.TimeoutExpired):
        return []
    orphans = []
    for line in listed.stdout.decode(errors="replace").splitlines():
        name, _, label = line.strip().partition(" ")
        if name and not owner_alive(label.strip()):
            orphans.append(name)
    if orphans:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _run(_rm(runtime, *orphans))
        _log.warning("removed %d orphaned sandbox container(s) of %s: %s", len(orphans), runtime, " ".join(orphans))
    return orphans


@atexit.register
def _remove_own_containers() -> None:
    for runtime, names in _started.items():
        if names:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                _run(_rm(runtime, *sorted(names)))
            names.clear()


def subordinate_ids(text: str, user: str, uid: int) -> list[range]:
    """The ranges ``/etc/subuid`` (or ``/etc/subgid``) text gives ``user`` (by name or uid).

    >>> subordinate_ids("arl:100000:65536\\nbob:165536:65536\\n1001:300000:10\\n", "arl", 1001)
    [range(100000, 165536), range(300000, 300010)]
    """
    found = []
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (user, str(uid)) and parts[1].isdigit() and parts[2].isdigit():
            found.append(range(int(parts[1]), int(parts[1]) + int(parts[2])))
    return found


def rootless_conditions(*, user: str, uid: int, subuid: str, subgid: str, idmap_tools: bool,
                        cgroup_v2_only: bool, delegated: frozenset[str] | None) -> list[str]:
    """The host conditions under which a rootless podman cannot give arl's sandboxes what the
    backend promises, each with its fix; [] where the host has them all. Measured on a cgroup
    v1/v2 hybrid host with podman 4.3 (docs/threat_model.md): crun refuses the host ("cgroups in
    hybrid mode not supported"), runc starts a rootless container but warns "Resource limits are
    not supported and ignored on cgroups V1 rootless systems" and ignores ``--memory``,
    ``--pids-limit`` (60 processes ran under a limit of 32) and ``--cpus``. ``delegated``: the
    cgroup controllers of the user's own v2 cgroup (None: not read).

    >>> rootless_conditions(user="a", uid=1001, subuid="", subgid="", idmap_tools=True,
    ...                     cgroup_v2_only=True, delegated=frozenset({"memory", "pids", "cpu"}))[0][:42]
    'user a has no subordinate uids in /etc/sub'
    """
    found = []
    if not subordinate_ids(subuid, user, uid) or not subordinate_ids(subgid, user, uid):
        found.append(f"user {user} has no subordinate uids in /etc/subuid or gids in /etc/subgid, so a rootless "
                     f"runtime cannot map a container's users (usermod --add-subuids 100000-165535 "
                     f"--add-subgids 100000-165535 {user})")
    if not idmap_tools:
        found.append("newuidmap/newgidmap are not installed setuid (apt-get install uidmap)")
    if not cgroup_v2_only:
        found.append("this host's cgroups are v1 or a v1/v2 hybrid (/sys/fs/cgroup is not one cgroup2 mount), on "
                     "which podman ignores a rootless container's --memory, --pids-limit and --cpus ('Resource "
                     "limits are not supported and ignored on cgroups V1 rootless systems'), so the sandbox's "
                     "whole-sandbox limits would not hold (a cgroup v2 host: systemd.unified_cgroup_hierarchy=1)")
    elif delegated is not None and not {"memory", "pids", "cpu"} <= delegated:
        missing = ", ".join(sorted({"memory", "pids", "cpu"} - delegated))
        found.append(f"the user's cgroup has no {missing} controller delegated to it, so a rootless container's "
                     "limits cannot be set (systemd: Delegate=memory pids cpu for user@.service)")
    return found


def rootless_problem(runtime: str) -> str:
    """Why ``runtime`` is refused for a process that is not root: for podman, each failing host
    condition of `rootless_conditions`, read from this host; then what no host changes: each
    sandbox runs as a uid of its own (`fresh_uid`, 2**24 and above), outside any user's
    subordinate range (in a rootless container such a uid fails: runc's 'setgroups: invalid
    argument'), and its leftovers are found by that uid on the host, which a rootless runtime
    maps to another. Docker as a non-root user reaches root's daemon only through its socket
    (group ``docker``: root on the host in all but name)."""
    import pwd

    uid = os.geteuid()
    if runtime == "docker":
        return (f"docker as a non-root user (uid {uid}) is not rootless: it drives root's daemon through its socket "
                "(group docker is root-equivalent), and the backend needs root itself (each sandbox's work dir "
                "is chowned to a uid of its own); run arl as root")
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)

    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    from arl.sandbox.cgroups import _mounts, _own_paths

    mounts = _mounts()
    v2_only = mounts.get("v2") == Path("/sys/fs/cgroup") and "memory" not in mounts and "pids" not in mounts
    delegated = None
    if v2_only:
        controllers = read(f"/sys/fs/cgroup{_own_paths().get('v2', '/')}/cgroup.controllers")
        delegated = frozenset(controllers.split()) if controllers else None
    def setuid(tool: str) -> bool:
        path = shutil.which(tool)
        try:
            return path is not None and bool(os.stat(path).st_mode & 0o4000)
        except OSError:
            return False

    tools = setuid("newuidmap") and setuid("newgidmap")
    found = rootless_conditions(user=user, uid=uid, subuid=read("/etc/subuid"), subgid=read("/etc/subgid"),
                                idmap_tools=tools, cgroup_v2_only=v2_only, delegated=delegated)
    host = ("; on this host: " + "; ".join(found)) if found else ""
    return (f"{runtime} runs rootless here (uid {uid}), which the backend refuses{host}; and on any host: each sandbox "
            "runs as a uid of its own (2**24 and above), outside every subordinate range, and its leftovers are "
            "found by that uid on the host, which a rootless runtime maps to another; run arl as root")


def _problem(runtime: str) -> tuple[str | None, str | None, str | None]:
    """(why ``runtime`` cannot run arl's sandboxes here or None, the OCI runtime that works, the image)."""
    if runtime not in RUNTIMES:
        return f"unknown container runtime {runtime!r} (one of {RUNTIMES})", None, None
    if shutil.which(runtime) is None:
        return f"{runtime} is not installed (Debian: apt-get install {runtime if runtime == 'podman' else 'docker.io'})", None, None
    if os.geteuid() != 0:
        return rootless_problem(runtime), None, None
    try:
        info = _run([runtime, "info"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{runtime} info failed: {exc}", None, None
    if info.returncode != 0:
        fix = (" (start its daemon as root: scripts/dockerd.sh, which runs dockerd --iptables=false "
               "--bridge=none, as no container needs a network)" if runtime == "docker" else "")
        return f"{runtime} cannot reach its engine: {_first_line(info.stderr)}{fix}", None, None
    if runtime == "docker" and docker_init() is None:
        return "docker's init (docker-init, Debian's tini) is not under /usr (apt-get install tini)", None, None
    try:
        image = build_image(runtime)
    except SandboxUnavailable as exc:
        return str(exc), None, None
    errors = []
    for oci in OCI_RUNTIMES:
        flags, init = _init_args(runtime)
        argv = [*_run_prefix(runtime, oci), "--rm", "--pull", "never", *flags, "--network", "none",
                *_ulimit_args(SandboxLimits()), "-v", "/usr:/usr:ro", image, *init, "/usr/bin/true"]
        try:
            done = _run(argv)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"{oci or 'default'}: {exc}")
            continue
        if done.returncode == 0:
            return None, oci, image
        errors.append(f"{oci or 'default'}: {_first_line(done.stderr)}")
    return f"{runtime} cannot start a container here ({'; '.join(errors)})", None, None


@functools.cache
def _probe(runtime: str) -> tuple[str | None, str | None, str | None]:
    return _problem(runtime)


def oci_problem(runtime: str = "podman") -> str | None:
    """Why ``runtime`` cannot run arl's sandboxes here, or None (probed once per process: builds
    arl's image if it is missing and starts one container)."""
    return _probe(runtime)[0]


# The default seccomp profile the refusals are added to. Docker's own is compiled into its daemon,
# not a file; containers-common's (podman's default, Debian's golang-github-containers-common, which
# podman brings) derives from the same Moby profile and is docker's base too where it is installed.
DEFAULT_SECCOMP = {"podman": "/usr/share/containers/seccomp.json", "docker": "/usr/share/containers/seccomp.json"}


@functools.cache
def seccomp_profile(runtime: str) -> str | None:
    """A seccomp profile file: ``runtime``'s default with the refusals of bwrap's filter
    (`arl.sandbox.seccomp.oci_profile`), written once per host next to the temp files; None where
    the default profile is not found."""
    source = DEFAULT_SECCOMP.get(runtime)
    if source is None or not os.path.isfile(source):
        return None
    import json

    try:
        with open(source) as f:
            data = json.dumps(oci_profile(json.load(f)), sort_keys=True).encode()
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    path = Path(tempfile.gettempdir()) / f"arl-seccomp-{hashlib.sha256(data).hexdigest()[:16]}.json"
    if not path.is_file():
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_bytes(data)
        scratch.chmod(0o644)
        os.replace(scratch, path)
    return str(path)


def env_file(env: Mapping[str, str]) -> int:
    """A readable fd of an unnamed 0600 file (``O_TMPFILE``, gone when the last fd closes) holding
    ``env`` in ``--env-file`` form, one ``KEY=VALUE`` a line, read from its start: for
    ``<runtime> exec --env-file /dev/fd/N``, so that the values appear in no process's argv (which
    every user of the host may read in ``/proc/<pid>/cmdline``) and in no file a name reaches.
    The caller closes it once the runtime has started. A line holds a value exactly as given, so a
    key that is not a plain name or a value with a line break or NUL is refused (ValueError).

    >>> fd = env_file({"A": "x y=z"}); os.read(fd, 100); os.close(fd)
    b'A=x y=z\\n'
    """
    lines = []
    for key, value in env.items():
        if not key or key.startswith("#") or any(c in key for c in "=\0") or key != "".join(key.split()):
            raise ValueError(f"environment variable name {key!r} cannot be passed to a container")
        if any(c in value for c in "\n\r\0"):
            raise ValueError(f"the value of {key} holds a line break or NUL, which --env-file cannot carry")
        lines.append(f"{key}={value}\n")
    with tempfile.TemporaryFile(mode="w+b") as f:
        f.write("".join(lines).encode())
        f.flush()
        fd = os.open(f"/proc/self/fd/{f.fileno()}", os.O_RDONLY | os.O_CLOEXEC)
    return fd


def _ulimit_args(limits: SandboxLimits) -> list[str]:
    nproc = max(4096, limits.max_procs)
    return ["--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", f"nproc={nproc}:{nproc}"]


class OciSandbox(Sandbox):
    """A `Sandbox` whose commands run in one container of ``runtime`` (see the module docstring).

    Same arguments as `Sandbox` (``read_only``, ``python``, ``hide``, ``env``) plus ``cpus`` (the
    container's CPU limit) and ``image`` (default: arl's, built offline). Raises
    `SandboxUnavailable` (with the reason) where ``runtime`` cannot run here."""

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),  # noqa: B008 (frozen: one shared default is safe)
        *,
        runtime: str = "podman",
        read_only: Sequence[str | Path] = (),
        python: bool = False,
        hide: Sequence[str | Path] = (),
        env: Mapping[str, str] | None = None,
        cpus: float = 1.0,
        image: str | None = None,
    ) -> None:
        problem, oci, default_image = _probe(runtime)
        if problem is not None:
            raise SandboxUnavailable(problem)
        self.runtime, self._oci, self.cpus = runtime, oci, float(cpus)
        self.image: str = image or str(default_image)
        if image is not None and not image_exists(runtime, image):
            raise SandboxUnavailable(f"image {image!r} is not in {runtime}'s local store (arl never pulls: "
                                     f"build or load it first)")
        self.isolation = runtime
        self.limits = limits
        self.read_only = tuple(
            dict.fromkeys(Path(p).resolve(strict=True) for p in [*read_only, *(python_paths() if python else ())]))
        self.hide = tuple(Path(p).resolve() for p in hide)
        self.uid = fresh_uid()
        self.workdir = Path(tempfile.mkdtemp(prefix="arl-sandbox-"))
        from arl.sandbox.sandbox import _mount_tmpfs, _tmpfs_works

        self.workdir_mounted = _tmpfs_works() and _mount_tmpfs(self.workdir, limits.disk_bytes)
        self.cgroup = None  # the container's own cgroup holds the whole-sandbox limits
        self._seccomp = None  # bwrap's filter; a container gets `seccomp_profile` instead
        self._profile = seccomp_profile(runtime)
        self._links = python_links() if python else ()
        self.lost = (*(() if self._profile else ("session keyring", "syscall filter")),
                     *(() if self.workdir_mounted else ("work dir size limit",)))
        os.chown(self.workdir, self.uid, self.uid)
        self.cwd = SANDBOX_CWD
        bin_dir = f"{Path(sys.prefix).resolve()}/bin:" if python else ""
        self.env = {"PATH": bin_dir + "/usr/local/bin:/usr/bin:/bin", "HOME": self.cwd, "TMPDIR": "/tmp",
                    "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **dict(env or {})}
        self._procs: set[asyncio.subprocess.Process] = set()
        self._starting = 0
        self._reaping = False
        self.container: str | None = None
        self._start_lock = asyncio.Lock()
        self._name = f"arl-{os.getpid()}-{secrets.token_hex(6)}"
        self._finalizer = weakref.finalize(self, _remove_container, runtime, self._name, str(self.workdir),
                                           self.workdir_mounted, self.uid)

    def run_argv(self) -> list[str]:
        """The ``<runtime> run`` argv that creates this sandbox's container (the isolation policy)."""
        limits = self.limits
        flags, init = _init_args(self.runtime)  # an init that reaps: orphans would stay zombies, holding the pids limit
        argv = [*_run_prefix(self.runtime, self._oci), "-d", "--pull", "never", *flags,
                "--name", self._name, "--label", f"{LABEL}=1", "--label", f"{OWNER_LABEL}={owner()}",
                "--network", "none", "--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges",
                *(["--security-opt", f"seccomp={self._profile}"] if self._profile else []),
                "--user", f"{INIT_UID}:{INIT_UID}",  # not the commands' uid: `reap_uid` must not kill the init
                "--memory", str(limits.total_memory_bytes), "--memory-swap", str(limits.total_memory_bytes),
                "--pids-limit", str(limits.max_procs), "--cpus", f"{self.cpus:g}", *_ulimit_args(limits),
                "--tmpfs", f"/tmp:rw,nosuid,nodev,size={max(4096, limits.tmp_bytes)},mode=1777",
                "-v", f"{self.workdir}:{SANDBOX_CWD}:rw", "-v", "/usr:/usr:ro", "-w", SANDBOX_CWD]
        for link in _ROOT_LINKS:
            if os.path.isdir(link) and not os.path.islink(link):
                argv += ["-v", f"{link}:{link}:ro"]
        for path in self.read_only:
            if path != Path("/usr") and not path.is_relative_to("/usr"):
                argv += ["-v", f"{path}:{path}:ro"]
        for real, link in self._links:
            argv += ["-v", f"{real}:{link}:ro"]
        for path in self.hide:
            if any(path.is_relative_to(p) for p in (*self.read_only, Path("/usr"))):
                argv += ["--tmpfs", f"{path}:ro,size=4096"]
        return [*argv, self.image, *init, *_CONTAINER_CMD]

    async def start(self) -> OciSandbox:
        """Create the container (once; removing orphaned ones of this runtime first, once per process)."""
        async with self._start_lock:
            if self.closed:
                from arl.sandbox.sandbox import SandboxDied

                raise SandboxDied(f"{self!r} is closed")
            if self.container is not None:
                return self
            if self.runtime not in _started:
                _started[self.runtime] = set()
                await asyncio.to_thread(reap_orphans, self.runtime)
            done = await asyncio.to_thread(_run, self.run_argv())
            if done.returncode != 0:  # a container created but not started stays (docker's and podman's)
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    await asyncio.to_thread(_run, _rm(self.runtime, self._name))
                raise SandboxUnavailable(f"{self.runtime} could not start the sandbox's container: "
                                         f"{_first_line(done.stderr)}")
            _started[self.runtime].add(self._name)
            self.container = self._name
        return self

    async def alive(self) -> bool:
        if self.closed or self.container is None:
            return not self.closed
        try:
            done = await asyncio.to_thread(_run, [self.runtime, "inspect", "-f", "{{.State.Running}}", self._name])
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0 and done.stdout.strip() == b"true"

    async def _command(self, argv: list[str], env: dict[str, str], limits: SandboxLimits,
                       read_only: Sequence[str | Path], tool_uids: range | None,
                       oom_victim: bool) -> tuple[list[str], dict[str, Any], int | None]:
        if tool_uids is not None:
            raise ValueError(f"tool uids for a spawned agent need the bwrap backend, not {self.runtime!r}")
        missing = [str(p) for p in read_only
                   if not any(Path(p).resolve().is_relative_to(q) for q in (*self.read_only, Path("/usr")))]
        if missing:  # a container's mounts are fixed when it starts
            raise ValueError(f"the {self.runtime} sandbox cannot bind {missing} for one command: "
                             "pass them as read_only when the sandbox is made")
        await self.start()
        fd = env_file(env)  # the values never on the command line (world-readable in /proc/*/cmdline)
        full = [self.runtime, "exec", "-i", "--user", f"{self.uid}:{self.uid}", "-w", SANDBOX_CWD,
                "--env-file", f"/dev/fd/{fd}", self._name, *limits_prefix(limits, oom_victim=oom_victim), *argv]
        return full, {"pass_fds": (fd,)}, fd

    def _setup_error(self, stderr: str, exit_code: int | None) -> str | None:
        first = stderr.split("\n", 1)[0]
        if exit_code in (125, 126, 127, 255) and first.startswith("Error: "):  # the client's or runtime's own failure
            return first
        if exit_code in (1, 126, 127) and first.startswith(_DOCKER_ERRORS):  # docker's: the command never ran
            return first
        return super()._setup_error(stderr, exit_code)

    def _oom_kills(self) -> int | None:
        from arl.sandbox.sandbox import _host_oom_kills

        return _host_oom_kills()

    def command_line(self, command: str) -> str:
        import shlex

        flags = [f"--env={key}" for key in self.env]  # the values from the caller's environment, never shown
        return shlex.join([self.runtime, "exec", "-i", "--user", f"{self.uid}:{self.uid}", "-w", SANDBOX_CWD,
                           *flags, self._name, *limits_prefix(self.limits, oom_victim=True), "bash", "-c", command])

    def __repr__(self) -> str:
        return f"OciSandbox(runtime={self.runtime!r}, container={self._name!r}, workdir={str(self.workdir)!r})"


def _remove_container(runtime: str, name: str, workdir: str, mounted: bool, uid: int) -> None:
    """Close an `OciSandbox`: its container removed (its processes with it), then as `_cleanup`."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        _run(_rm(runtime, name))
    _started.get(runtime, set()).discard(name)
    _cleanup(workdir, mounted, None, uid)


__all__ = ["IMAGE_REPO", "LABEL", "OWNER_LABEL", "RUNTIMES", "OciSandbox", "build_image", "docker_init", "image_exists",
           "oci_problem", "owner", "owner_alive", "reap_orphans", "rootfs_tar", "rootless_conditions", "rootless_problem",
           "subordinate_ids"]
