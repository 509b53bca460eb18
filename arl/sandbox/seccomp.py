"""A seccomp filter for sandboxed commands: no kernel keyrings.

Why: a process inherits its parent's session keyring across fork, exec and a uid change, so a
sandboxed command of a trainer started from a login session (pam_keyinit, ssh, ``keyctl
session``) could read keys the trainer holds and leave data there for a later episode (one
episode stores the hidden tests at its evaluation, a later one of the same seed reads them).
Joining a fresh session keyring needs a syscall between bwrap and the command, which bwrap cannot
make; refusing the three keyring syscalls (``add_key``, ``request_key``, ``keyctl``) with ENOSYS,
as a kernel without keyrings would, takes a 10-instruction filter that bwrap installs itself
(``--seccomp FD``) and costs nothing measurable per command.

The filter is classic BPF (what ``seccomp_export_bpf`` writes): for the native architecture and
its 32-bit compat one (x86_64 and i386, aarch64 and arm), the keyring calls get ENOSYS (x32 calls
on x86_64 too, via the 0x40000000 bit), every other call is allowed.
"""

from __future__ import annotations

import os
import platform
import struct

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _AND_K, _RET_K = 0x20, 0x15, 0x54, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_ENOSYS = 38
_X32_BIT = 0x40000000

# machine -> [(AUDIT_ARCH_*, (add_key, request_key, keyctl))]: the native ABI first
_KEYRING_CALLS: dict[str, list[tuple[int, tuple[int, int, int]]]] = {
    "x86_64": [(0xC000003E, (248, 249, 250)), (0x40000003, (286, 287, 288))],
    "aarch64": [(0xC00000B7, (217, 218, 219)), (0x40000028, (309, 310, 311))],
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def no_keyring_filter(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (default: this one), None where its syscall numbers are
    not known here (the sandbox then lists "session keyring" as lost).

    >>> len(no_keyring_filter("x86_64")) // 8  # instructions
    18
    """
    arches = _KEYRING_CALLS.get(machine or platform.machine())
    if arches is None:
        return None
    prog = [_insn(_LD_W_ABS, 4)]  # seccomp_data.arch
    for arch, calls in arches:
        block = [_insn(_LD_W_ABS, 0), _insn(_AND_K, ~_X32_BIT & 0xFFFFFFFF)]  # seccomp_data.nr
        for i, nr in enumerate(calls):
            block.append(_insn(_JEQ_K, nr, jt=len(calls) - i, jf=0))  # -> the ERRNO return below
        block += [_insn(_RET_K, _ALLOW), _insn(_RET_K, _ERRNO | _ENOSYS)]
        prog.append(_insn(_JEQ_K, arch, jt=0, jf=len(block)))  # another architecture: next block
        prog += block
    prog.append(_insn(_RET_K, _ALLOW))
    return b"".join(prog)


def filter_fd(program: bytes) -> int:
    """A readable fd holding ``program`` from its start, for one bwrap (which reads it to EOF):
    a pipe, whose write end is closed here. The caller closes the fd once bwrap has started."""
    read, write = os.pipe()
    try:
        os.write(write, program)  # far below a pipe's 64 KiB buffer: never blocks
    finally:
        os.close(write)
    return read


__all__ = ["filter_fd", "no_keyring_filter"]
