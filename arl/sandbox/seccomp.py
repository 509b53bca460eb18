"""The seccomp filter of a sandboxed command: the syscalls it has no business making, refused.

Why (docs/threat_model.md, "What a sandboxed command may not call"): the namespaces and the uid
drop keep a command's files, processes and network apart, but not the kernel itself, nor the
kernel objects that every sandbox reaches through the files they all see read-only. Refused here,
by family, each with the errno a kernel without it (or an unprivileged caller) gets, so programs
take the path they already have for that:

- **kernel keyrings** (``add_key``, ``request_key``, ``keyctl``): ENOSYS. A process inherits its
  parent's session keyring across fork, exec and a uid change, so a command could read the
  trainer's keys and leave data there for a later episode; joining a fresh keyring needs a call
  between bwrap and the command, which bwrap cannot make.
- **io_uring** (``io_uring_setup``, ``_enter``, ``_register``): ENOSYS, as with io_uring compiled
  out (liburing users, libuv and tokio then use epoll). The operations a ring runs are not
  syscalls, so no filter sees them, and it has been the kernel's most exploited interface.
- **kernel attack surface an unprivileged caller can reach** (``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``process_vm_readv``/``writev``): EPERM, what the kernel answers when its
  sysctls (``unprivileged_bpf_disabled``, ``perf_event_paranoid``, ``unprivileged_userfaultfd``)
  forbid them; userfaultfd stalls a kernel copy at will, the usual way to win a race.
- **privileged calls** (``kexec_*``, ``init_module``, ``finit_module``, ``delete_module``, the
  mount family with the new mount API, ``pivot_root``) and **new namespaces** (``unshare``,
  ``setns``, ``clone`` with a ``CLONE_NEW*`` flag): EPERM, what an unprivileged caller gets;
  ``clone3``, whose flags are out of the filter's sight in memory: ENOSYS, on which glibc falls
  back to ``clone``. In a user namespace of its own a command would hold every capability there,
  mounts and netfilter included: the door to most kernel exploits of recent years.
- **``personality``** other than the ones Docker's default profile allows (query, ``PER_LINUX``,
  ``PER_LINUX32``, ``UNAME26``): EPERM; ``ADDR_NO_RANDOMIZE`` would turn ASLR off.
- **file change notification** (``inotify_*``, ``fanotify_*``, and ``fcntl(F_NOTIFY)``): ENOSYS
  (EINVAL for ``F_NOTIFY``), as a kernel without them. A watch on a file every sandbox sees
  fires when a sibling sandbox opens or reads it: one episode signals another at will.
- **file locks** (``flock``; ``fcntl``'s ``F_GETLK``/``F_SETLK``/``F_SETLKW``, their ``64`` and
  ``OFD`` forms): ENOSYS and EINVAL, what a kernel built without file locking answers. A lock
  lives on the inode, and every sandbox opens the same inodes (the read-only system, the venv,
  ``/dev/null``): one sandbox takes a lock, another tests it, a bit per round. A filter cannot
  tell a shared file from a private one, so every lock is refused; sqlite then needs its
  lock-free mode for a private file (``file:x.db?vfs=unix-dotfile``, a lock directory in place
  of fcntl locks), and a program that insists on locks fails at once, never hangs.

``ptrace`` stays: a command can reach only its own uid's processes in its own PID namespace,
which are its own.

The filter is classic BPF (what ``seccomp_export_bpf`` writes), installed by bwrap itself
(``--seccomp FD``): for the native architecture and its 32-bit compat one on x86_64 (i386) the
calls above by number; the x32 ABI refused as a kernel without it refuses it (ENOSYS); any other
architecture (32-bit arm code on aarch64, whose numbers are not listed here) is killed. 138
instructions on x86_64 (68 on aarch64), a call passes at most ~45 of them (its cost per command:
docs/threat_model.md).

`sandbox_filter(namespaces=True)` leaves ``unshare`` to the one program that needs it, the tool
uid delegation of a pull-mode agent (`arl.sandbox.uid_delegation`), which installs the full filter
(`install`) once its user namespace is made and before the agent's code runs.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import struct
from typing import Any

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_ALLOW, _ERRNO, _KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_X32_BIT = 0x40000000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args: u64 each, low word first)

# the refused calls: family -> (errno, names)
REFUSED: dict[str, tuple[int, tuple[str, ...]]] = {
    "keyring": (errno.ENOSYS, ("add_key", "request_key", "keyctl")),
    "io_uring": (errno.ENOSYS, ("io_uring_setup", "io_uring_enter", "io_uring_register")),
    "kernel surface": (errno.EPERM, ("bpf", "perf_event_open", "userfaultfd", "process_vm_readv",
                                     "process_vm_writev")),
    "privileged": (errno.EPERM, ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module")),
    "mount": (errno.EPERM, ("mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen",
                            "fsconfig", "fsmount", "fspick", "mount_setattr")),
    "namespaces": (errno.EPERM, ("unshare", "setns")),
    "clone3": (errno.ENOSYS, ("clone3",)),
    "notify": (errno.ENOSYS, ("inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark")),
    "locks": (errno.ENOSYS, ("flock",)),
}
# fcntl commands refused (EINVAL): F_GETLK, F_SETLK, F_SETLKW, F_GETLK64, F_SETLK64, F_SETLKW64
# (the 32-bit ABIs), F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_NOTIFY
FCNTL_REFUSED = (5, 6, 7, 12, 13, 14, 36, 37, 38, 1026)
CLONE_NEW_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
PERSONALITY_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # as Docker's default profile

# syscall numbers (the kernel's uapi unistd_64.h / unistd_32.h / asm-generic/unistd.h)
_X86_64 = dict(add_key=248, request_key=249, keyctl=250, io_uring_setup=425, io_uring_enter=426,
               io_uring_register=427, bpf=321, perf_event_open=298, userfaultfd=323, process_vm_readv=310,
               process_vm_writev=311, kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313,
               delete_module=176, mount=165, umount2=166, pivot_root=155, move_mount=429, open_tree=428,
               fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, unshare=272, setns=308,
               clone3=435, inotify_init=253, inotify_init1=294, inotify_add_watch=254, fanotify_init=300,
               fanotify_mark=301, flock=73, fcntl=72, clone=56, personality=135)
_I386 = dict(add_key=286, request_key=287, keyctl=288, io_uring_setup=425, io_uring_enter=426,
             io_uring_register=427, bpf=357, perf_event_open=336, userfaultfd=374, process_vm_readv=347,
             process_vm_writev=348, kexec_load=283, init_module=128, finit_module=350, delete_module=129,
             mount=21, umount=22, umount2=52, pivot_root=217, move_mount=429, open_tree=428, fsopen=430,
             fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, unshare=310, setns=346, clone3=435,
             inotify_init=291, inotify_init1=332, inotify_add_watch=292, fanotify_init=338, fanotify_mark=339,
             flock=143, fcntl=55, fcntl64=221, clone=120, personality=136)
_AARCH64 = dict(add_key=217, request_key=218, keyctl=219, io_uring_setup=425, io_uring_enter=426,
                io_uring_register=427, bpf=280, perf_event_open=241, userfaultfd=282, process_vm_readv=270,
                process_vm_writev=271, kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273,
                delete_module=106, mount=40, umount2=39, pivot_root=41, move_mount=429, open_tree=428, fsopen=430,
                fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, unshare=97, setns=268, clone3=435,
                inotify_init1=26, inotify_add_watch=27, fanotify_init=262, fanotify_mark=263, flock=32, fcntl=25,
                clone=220, personality=92)
# machine -> [(AUDIT_ARCH_*, numbers, whether the x32 bit is refused)]: the native ABI first
ARCHES: dict[str, list[tuple[int, dict[str, int], bool]]] = {
    "x86_64": [(0xC000003E, _X86_64, True), (0x40000003, _I386, False)],
    "aarch64": [(0xC00000B7, _AARCH64, False)],
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


class _Program:
    """Classic BPF with forward jumps to labels (each resolved to an 8-bit offset)."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int, str | int, str | int]] = []  # (code, k, jt, jf)
        self.labels: dict[str, int] = {}

    def add(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.code.append((code, k, jt, jf))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def ret(self, name: str, value: int) -> None:
        self.label(name)
        self.add(_RET_K, value)

    def assemble(self) -> bytes:
        out = []
        for i, (code, k, jt, jf) in enumerate(self.code):
            offs = [self.labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
            if not all(0 <= o <= 255 for o in offs):
                raise ValueError(f"instruction {i}: a jump of {offs} does not fit classic BPF")
            out.append(_insn(code, k, *offs))
        return b"".join(out)


@functools.cache
def sandbox_filter(machine: str | None = None, *, namespaces: bool = False) -> bytes | None:
    """The compiled filter for ``machine`` (default: this one; see the module docstring), None
    where its syscall numbers are not known here (the sandbox then lists "syscall filter" as lost);
    built once per process.
    ``namespaces``: leave ``unshare`` allowed (for `arl.sandbox.uid_delegation` only).

    >>> len(sandbox_filter("x86_64")) // 8  # instructions
    138
    >>> sandbox_filter("riscv64") is None
    True
    """
    arches = ARCHES.get(machine or platform.machine())
    if arches is None:
        return None
    p = _Program()
    p.add(_LD_W_ABS, _ARCH)
    for a, (arch, numbers, x32) in enumerate(arches):
        p.add(_JEQ_K, arch, 0, f"arch{a + 1}")
        p.add(_LD_W_ABS, _NR)
        if x32:
            p.add(_JSET_K, _X32_BIT, f"{a}:{errno.ENOSYS}", 0)
        for errno_, names in REFUSED.values():
            for name in names:
                if name in numbers and not (namespaces and name == "unshare"):
                    p.add(_JEQ_K, numbers[name], f"{a}:{errno_}", 0)
        for name in ("fcntl", "fcntl64"):
            if name in numbers:
                p.add(_JEQ_K, numbers[name], f"{a}:fcntl", 0)
        p.add(_JEQ_K, numbers["clone"], f"{a}:clone", 0)
        p.add(_JEQ_K, numbers["personality"], f"{a}:personality", 0)
        p.add(_RET_K, _ALLOW)
        p.label(f"{a}:fcntl")
        p.add(_LD_W_ABS, _ARG0 + 8)  # cmd: the low word of args[1]
        for cmd in FCNTL_REFUSED:
            p.add(_JEQ_K, cmd, f"{a}:{errno.EINVAL}", 0)
        p.add(_RET_K, _ALLOW)
        p.label(f"{a}:clone")
        p.add(_LD_W_ABS, _ARG0)  # flags: the low word of args[0]
        p.add(_JSET_K, 0 if namespaces else CLONE_NEW_FLAGS, f"{a}:{errno.EPERM}", 0)
        p.add(_RET_K, _ALLOW)
        p.label(f"{a}:personality")
        p.add(_LD_W_ABS, _ARG0)
        for persona in PERSONALITY_ALLOWED:
            p.add(_JEQ_K, persona, f"{a}:allow", 0)
        # EPERM first: any other persona falls through to it
        for errno_ in (errno.EPERM, *sorted({e for e, _ in REFUSED.values()} | {errno.EINVAL} - {errno.EPERM})):
            p.ret(f"{a}:{errno_}", _ERRNO | errno_)
        p.ret(f"{a}:allow", _ALLOW)
        p.label(f"arch{a + 1}")
    p.add(_RET_K, _KILL_PROCESS)  # an ABI whose numbers are not listed
    return p.assemble()


FCNTL_ALLOWED = (0, 1, 2, 3, 4, 8, 9, 10, 11, 15, 16, 17, 1024, 1025, 1027, 1028, *range(1030, 1039))


def oci_profile(default: dict[str, Any]) -> dict[str, Any]:
    """A container runtime's seccomp profile (OCI JSON, ``default``: the runtime's own) with the
    refusals of `sandbox_filter`: each refused name taken out of every rule and refused with the
    errno above; ``fcntl`` (and ``fcntl64``) allowed only for the commands of `FCNTL_ALLOWED`,
    compared on the low 32 bits as the kernel reads them (`FCNTL_REFUSED`: EINVAL; a command not
    listed either: the profile's default, ENOSYS for podman's); ``clone`` only without a
    ``CLONE_NEW*`` flag (else the profile's default). Raises ValueError for a profile that is not
    one (no ``syscalls`` list).

    >>> rules = oci_profile({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
    ...     {"names": ["read", "flock", "fcntl"], "action": "SCMP_ACT_ALLOW"}]})["syscalls"]
    >>> rules[0]["names"], [r["errnoRet"] for r in rules if "flock" in r["names"]]
    (['read'], [38])
    """
    rules = default.get("syscalls")
    if not isinstance(rules, list):
        raise ValueError("a seccomp profile has a list of syscalls rules")
    special = ("fcntl", "fcntl64", "clone")
    refused = {name for _, names in REFUSED.values() for name in names}
    profile = {**default, "syscalls": []}
    for rule in rules:
        names = [n for n in rule.get("names", []) if n not in refused and n not in special]
        if names:
            profile["syscalls"].append({**rule, "names": names})

    def cond(index: int, value: int, mask: int = 0xFFFFFFFF) -> list[dict[str, Any]]:
        return [{"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}]

    for errno_, names in sorted(REFUSED.values()):
        profile["syscalls"].append({"names": list(names), "action": "SCMP_ACT_ERRNO", "errnoRet": errno_})
    for cmd in FCNTL_ALLOWED:
        profile["syscalls"].append({"names": ["fcntl", "fcntl64"], "action": "SCMP_ACT_ALLOW", "args": cond(1, cmd)})
    for cmd in FCNTL_REFUSED:
        profile["syscalls"].append({"names": ["fcntl", "fcntl64"], "action": "SCMP_ACT_ERRNO",
                                    "errnoRet": errno.EINVAL, "args": cond(1, cmd)})
    profile["syscalls"].append({"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                                "args": cond(0, 0, CLONE_NEW_FLAGS)})
    return profile


def no_keyring_filter(machine: str | None = None) -> bytes | None:
    """Deprecated name of `sandbox_filter` (the filter refused the keyring calls alone before)."""
    import warnings

    warnings.warn("arl.sandbox.seccomp.no_keyring_filter is deprecated: use arl.sandbox.seccomp.sandbox_filter",
                  DeprecationWarning, stacklevel=2)
    return sandbox_filter(machine)


def filter_fd(program: bytes) -> int:
    """A readable fd holding ``program`` from its start, for one bwrap (which reads it to EOF):
    a pipe, whose write end is closed here. The caller closes the fd once bwrap has started."""
    read, write = os.pipe()
    try:
        os.write(write, program)  # far below a pipe's 64 KiB buffer: never blocks
    finally:
        os.close(write)
    return read


def install(program: bytes) -> None:
    """Add ``program`` to this process's filters (and its future children's): ``prctl
    (PR_SET_SECCOMP)``; no_new_privs must be set already, or the caller must be privileged.
    Raises OSError when the kernel refuses."""
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    prog = SockFprog(len(program) // 8, program)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        code = ctypes.get_errno()
        raise OSError(code, f"cannot install the seccomp filter: {os.strerror(code)}")


__all__ = ["ARCHES", "FCNTL_ALLOWED", "FCNTL_REFUSED", "REFUSED", "filter_fd", "install", "oci_profile", "sandbox_filter"]
