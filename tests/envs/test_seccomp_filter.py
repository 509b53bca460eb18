"""The sandbox's seccomp program, run here by a classic-BPF interpreter: what it answers for each
refused call on each ABI it knows, that everything else passes, and its syscall numbers against the
kernel headers where they are installed. Runs without bwrap (the adversarial suites run the filter
in the kernel: tests/envs/test_adversarial_syscalls.py, tests/envs/test_adversarial_channels.py)."""

from __future__ import annotations

import errno
import re
import struct
from pathlib import Path

import pytest

from arl.sandbox.seccomp import ARCHES, FCNTL_ALLOWED, FCNTL_REFUSED, REFUSED, oci_profile, sandbox_filter

ALLOW, KILL = 0x7FFF0000, 0x80000000


def run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """The filter's verdict for one call (struct seccomp_data, little-endian)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code in (0x15, 0x45):  # jeq / jset
            hit = acc == k if code == 0x15 else bool(acc & k)
            pc += jt if hit else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"opcode {code:#x} not expected")
        pc += 1


def verdict(value: int) -> str:
    return "allow" if value == ALLOW else "kill" if value == KILL else errno.errorcode[value & 0xFFFF]


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_every_refused_call_gets_its_errno_and_the_rest_pass(machine):
    program = sandbox_filter(machine)
    for arch, numbers, _ in ARCHES[machine]:
        for errno_, names in REFUSED.values():
            for name in names:
                if name in numbers:
                    assert verdict(run_bpf(program, numbers[name], arch)) == errno.errorcode[errno_], name
        refused = {numbers[n] for _, names in REFUSED.values() for n in names if n in numbers}
        special = {numbers[n] for n in ("fcntl", "fcntl64", "clone", "personality") if n in numbers}
        for nr in set(range(460)) - refused - special:
            assert run_bpf(program, nr, arch) == ALLOW, nr
        for fcntl in (numbers["fcntl"], numbers.get("fcntl64", numbers["fcntl"])):
            for cmd in FCNTL_REFUSED:  # high bits the kernel ignores do not get a command past
                assert verdict(run_bpf(program, fcntl, arch, (3, (7 << 32) | cmd))) == "EINVAL", cmd
            for cmd in FCNTL_ALLOWED:
                assert run_bpf(program, fcntl, arch, (3, cmd)) == ALLOW, cmd
        clone = numbers["clone"]
        assert run_bpf(program, clone, arch, (0x01200011,)) == ALLOW  # what fork() passes
        assert verdict(run_bpf(program, clone, arch, (0x10000011,))) == "EPERM"  # CLONE_NEWUSER
        assert verdict(run_bpf(program, clone, arch, (0x40000011,))) == "EPERM"  # CLONE_NEWNET
        personality = numbers["personality"]
        assert run_bpf(program, personality, arch, (0xFFFFFFFF,)) == ALLOW  # the query
        assert verdict(run_bpf(program, personality, arch, (0x0040000,))) == "EPERM"  # ADDR_NO_RANDOMIZE
    assert verdict(run_bpf(program, 1, 0x12345678)) == "kill"  # an ABI whose numbers are not listed


def test_x32_calls_are_refused_and_the_delegation_variant_leaves_only_unshare():
    program = sandbox_filter("x86_64")
    assert verdict(run_bpf(program, 0x40000000 | 39, 0xC000003E)) == "ENOSYS"  # x32 getpid
    loose = sandbox_filter("x86_64", namespaces=True)
    x86_64 = ARCHES["x86_64"][0][1]
    assert run_bpf(loose, x86_64["unshare"], 0xC000003E, (0x10000000,)) == ALLOW
    assert run_bpf(loose, x86_64["clone"], 0xC000003E, (0x10000011,)) == ALLOW
    assert verdict(run_bpf(loose, x86_64["setns"], 0xC000003E)) == "EPERM"
    assert verdict(run_bpf(loose, x86_64["flock"], 0xC000003E)) == "ENOSYS"


@pytest.mark.parametrize(("machine", "header", "abi"), [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", 0),
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_32.h", 1),
    ("aarch64", "/usr/include/asm-generic/unistd.h", 0),
])
def test_syscall_numbers_match_the_kernel_headers(machine, header, abi):
    if not Path(header).is_file():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    text = Path(header).read_text()
    found = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", text)}
    numbers = ARCHES[machine][abi][1]
    assert {name: found.get(name) for name in numbers} == numbers


def test_the_container_profile_refuses_the_same_calls():
    default = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "syscalls": [
        {"names": ["read", "flock", "fcntl", "clone", "unshare", "io_uring_setup"], "action": "SCMP_ACT_ALLOW"}]}
    rules = oci_profile(default)["syscalls"]
    allowed = {n for r in rules if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args") for n in r["names"]}
    assert allowed == {"read"}
    refused = {n: r["errnoRet"] for r in rules if r["action"] == "SCMP_ACT_ERRNO" and not r.get("args")
               for n in r["names"]}
    assert refused["flock"] == errno.ENOSYS and refused["unshare"] == errno.EPERM
    assert refused["io_uring_setup"] == errno.ENOSYS
    fcntl_refused = {r["args"][0]["valueTwo"] for r in rules if "fcntl" in r["names"] and r["action"] != "SCMP_ACT_ALLOW"}
    assert fcntl_refused == set(FCNTL_REFUSED)
    with pytest.raises(ValueError, match="syscalls"):
        oci_profile({"defaultAction": "SCMP_ACT_ALLOW"})


def test_the_old_name_still_gives_the_filter_with_a_warning():
    from arl.sandbox import seccomp

    with pytest.warns(DeprecationWarning, match="sandbox_filter"):
        assert seccomp.no_keyring_filter("x86_64") == sandbox_filter("x86_64")
