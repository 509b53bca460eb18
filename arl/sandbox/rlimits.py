"""The limits of one sandboxed command, and the ``ulimit`` wrapper that imposes them.

Why a module of its own: the limits are the same in both isolation modes (bubblewrap or none),
so they belong to neither `arl.sandbox.bwrap` nor the process handling of `arl.sandbox.sandbox`; here
they can be read next to the one place that turns them into kernel resource limits.

The kernel enforces CPU seconds, address space, file size, process count and (no) core files
through ``bash``'s ``ulimit`` in front of the command, so they bind the command and everything it
starts, and it cannot raise them. Wall time and output are enforced by `Sandbox.run` (a kill of
the process group; `arl.sandbox.capped_output`).

Those rlimits bind one process (or one file) each. The three ``*_bytes`` limits below them bind
the sandbox as a whole, where the machine allows (`Sandbox.lost` says where it does not):
``total_memory_bytes`` all its processes together (a cgroup, `arl.sandbox.cgroups`),
``tmp_bytes`` its ``/tmp`` (a tmpfs of that size, per command) and ``disk_bytes`` its work dir
(a tmpfs of that size, as root). The sandbox takes those two of them from the limits it was made
with; a command's own limits change only ``tmp_bytes`` and the per-process ones.
"""

from __future__ import annotations

import math

import attrs

OOM_VICTIM_ADJ = 1000  # oom_score_adj of a sandboxed command: the OOM killer's first choice


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
    total_memory_bytes: int = 2**30  # all the sandbox's processes together, tmpfs pages included (cgroup)
    tmp_bytes: int = 64 * 2**20  # size of the fresh /tmp (a tmpfs)
    disk_bytes: int = 128 * 2**20  # all files of the work dir together (a tmpfs, as root)


def limits_prefix(limits: SandboxLimits, nproc_base: int = 0, *, oom_victim: bool = False) -> list[str]:
    """``bash -c 'ulimit ...; exec "$@"'``: argv that sets the limits and execs the rest.

    ``oom_victim``: first raise the process's ``oom_score_adj`` to `OOM_VICTIM_ADJ` (inherited by
    everything it starts; any process may raise its own, none but a privileged one lower it), so
    that where a command shares a memory cgroup with the process that started it (a pull-mode
    agent's tool commands: `arl.sandbox.sandbox.Sandbox.run`), the kernel's OOM killer picks the
    command, not its starter. Best effort: a ``/proc`` that refuses the write leaves the score as is.

    bash counts ``-v`` and ``-f`` in KiB; ``ulimit`` sets soft and hard limits together (the CPU
    limit's hard one a second above), so the command cannot raise them again. ``nproc_base``:
    processes the uid has already (RLIMIT_NPROC counts all of a uid's processes, not only the
    command's), added to ``max_procs``.

    >>> limits = SandboxLimits(cpu_s=1.5, memory_bytes=2**20, file_size_bytes=1000, max_procs=8)
    >>> limits_prefix(limits, nproc_base=2)[2]  # CPU rounded up, file size rounded up to 1 KiB
    'ulimit -S -t 2 && ulimit -H -t 3 && ulimit -c 0 -v 1024 -f 1 -u 10 && exec "$@"'
    """
    cpu = max(1, math.ceil(limits.cpu_s))
    victim = f"{{ echo {OOM_VICTIM_ADJ} > /proc/self/oom_score_adj; }} 2>/dev/null; " if oom_victim else ""
    script = victim + (  # CPU: SIGXCPU at the soft limit (a "timeout"), SIGKILL a second later
        f"ulimit -S -t {cpu} && ulimit -H -t {cpu + 1} && ulimit -c 0 -v {max(1, limits.memory_bytes // 1024)} "
        f"-f {max(1, math.ceil(limits.file_size_bytes / 1024))} -u {nproc_base + limits.max_procs} "
        '&& exec "$@"'
    )
    return ["bash", "-c", script, "arl-limits"]


__all__ = ["OOM_VICTIM_ADJ", "SandboxLimits", "limits_prefix"]
