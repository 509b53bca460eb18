"""Whole-sandbox limits through cgroups: the memory and the tasks of all a sandbox's processes together.

Why: the rlimits of `arl.sandbox.rlimits` bind one process each (RLIMIT_AS: a few processes under it
hold several times as much; RLIMIT_NPROC: a uid's processes, not their threads' memory). A cgroup
binds the sandbox as a whole: ``memory.max`` (v2) / ``memory.limit_in_bytes`` (v1) over every
process of it and the tmpfs pages they write (``/tmp``, a tmpfs work dir), ``pids.max`` over its
tasks. The kernel's OOM killer then kills inside the sandbox only (the command ends "oom":
`Cgroup.oom_kills` tells the kill apart).

Where: a child of this process's own cgroup, in the v2 hierarchy when it has the memory and pids
controllers (and they can be enabled for children), else in the v1 ``memory`` and ``pids``
hierarchies (hybrid machines), else nowhere: `cgroup_problem` says why, and the sandbox lists
"whole-sandbox memory limit" in `Sandbox.lost`. Writing there needs root (or a delegated
subtree), so in practice this applies to sandboxes run as root.

How a command joins: `Cgroup.join_prefix`, a ``sh`` that writes its own pid into ``cgroup.procs``
and execs bwrap (or the command): every process of the command is born inside, none can fork
before the move.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shlex
import signal
import time
from pathlib import Path

import attrs

PIDS_SLACK = 16  # pids.max above max_procs: bwrap's own processes (3 per command) and the wrappers


def _mounts() -> dict[str, Path]:
    """{"v2": mount point, "memory": ..., "pids": ...} of the cgroup hierarchies mounted here."""
    found: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if " - " not in line:
                continue
            mount_root, point = fields[3], fields[4]
            fstype, _, options = line.split(" - ", 1)[1].split()[:3]
            if mount_root != "/":
                continue  # a bind of part of a hierarchy: our own cgroup may lie outside it
            if fstype == "cgroup2":
                found.setdefault("v2", Path(point))
            elif fstype == "cgroup":
                for name in ("memory", "pids"):
                    if name in options.split(","):
                        found.setdefault(name, Path(point))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy ("v2", "memory", "pids")."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                paths["v2"] = path
            for name in ("memory", "pids"):
                if name in controllers.split(","):
                    paths[name] = path
    return paths


def _bases() -> tuple[int, dict[str, Path]] | str:
    """(version, {controller: the dir to make children in}) or why there is none."""
    mounts, own = _mounts(), _own_paths()
    if "v2" in mounts and "v2" in own:
        base = mounts["v2"] / own["v2"].lstrip("/")
        with contextlib.suppress(OSError):
            available = (base / "cgroup.controllers").read_text().split()
            if {"memory", "pids"} <= set(available):
                enabled = (base / "cgroup.subtree_control").read_text().split()
                if not {"memory", "pids"} <= set(enabled):
                    (base / "cgroup.subtree_control").write_text("+memory +pids")
                return 2, {"v2": base}
    if "memory" in mounts and "pids" in mounts:
        return 1, {name: mounts[name] / own.get(name, "/").lstrip("/") for name in ("memory", "pids")}
    return "no cgroup hierarchy with the memory and pids controllers is writable here"


@attrs.define
class Cgroup:
    """One sandbox's cgroup (v2: one dir; v1: one in the memory and one in the pids hierarchy)."""

    version: int
    dirs: tuple[Path, ...]

    @classmethod
    def create(cls, memory_bytes: int, max_procs: int) -> Cgroup:
        """A fresh cgroup under this process's own, limited to ``memory_bytes`` (no swap) and
        ``max_procs + PIDS_SLACK`` tasks. Raises OSError where that cannot be done."""
        found = _bases()
        if isinstance(found, str):
            raise OSError(found)
        version, bases = found
        name = f"arl-sandbox-{secrets.token_hex(6)}"
        group = cls(version, tuple(base / name for base in bases.values()))
        try:
            for path in group.dirs:
                path.mkdir()
            memory, pids = (group.dirs[0], group.dirs[0]) if version == 2 else group.dirs
            if version == 2:
                (memory / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (memory / "memory.swap.max").write_text("0")
            else:
                (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):  # swap accounting may be off: then there is no swap to bound
                    (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (pids / "pids.max").write_text(str(max_procs + PIDS_SLACK))
        except OSError:
            group.remove()
            raise
        return group

    def join_prefix(self) -> list[str]:
        """argv prefix: the rest runs inside this cgroup (a failure to join is a setup error)."""
        joins = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.dirs)
        script = f'{{ {joins}; }} 2>/dev/null || {{ echo "arl-cgroup: cannot join the cgroup" >&2; exit 1; }}; exec "$@"'
        return ["sh", "-c", script, "arl-cgroup"]

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in (self.dirs[-1] / "cgroup.procs").read_text().split()]
        return []

    def oom_kills(self) -> int | None:
        """How many of its processes the OOM killer has killed (v2: ``oom_kill`` in
        ``memory.events``; v1: in ``memory.oom_control``, Linux 4.13+), None where unreadable."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.dirs[0] / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return None

    def kill(self) -> None:
        """SIGKILL every process inside (v2: ``cgroup.kill``, one pass no fork escapes; v1: by the
        pids listed, again until none is left or a second has passed)."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")
                return
        deadline = time.monotonic() + 1.0
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and remove the dirs (a dir still busy after a second stays; never raises)."""
        self.kill()
        for path in self.dirs:
            deadline = time.monotonic() + 1.0
            while path.exists():
                try:
                    path.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)


@functools.cache
def cgroup_problem() -> str | None:
    """None when a sandbox cgroup can be made here (probed once per process), else why not."""
    try:
        Cgroup.create(64 * 2**20, 1).remove()
    except OSError as exc:
        return f"cgroups: {exc}"
    return None


__all__ = ["PIDS_SLACK", "Cgroup", "cgroup_problem"]
