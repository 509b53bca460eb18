"""Start a program as one uid that may run commands as the uids of a block, and as no others.

Why (docs/threat_model.md, "Pull-mode agents"): a pull-mode agent runs its model's tool commands
itself, inside its own sandbox, where bubblewrap does not nest; a command that runs as the agent's
uid can ptrace it, signal it and read its ``/proc/<pid>/environ``. Only another uid keeps it out,
and an agent without privileges cannot switch uids. This program, started as root in the agent's
sandbox (`arl.sandbox.sandbox.Sandbox.spawn` with ``tool_uids``), puts itself in a user namespace of
its own whose only uids are the agent's and the block's, drops to the agent's uid there and keeps
the few capabilities (`DELEGATED_CAPS`) that running a command as a block uid takes: switching to
it (``setpriv``), giving it the sandbox's work dir, reading and removing what it wrote, killing
its leftovers. Capabilities in a user namespace act only on that namespace's uids, so the agent
gains power over the block's uids and nothing else: root's files and processes, other episodes'
uids and processes stay as closed to it as before, and ``setuid(0)`` fails (uid 0 has no mapping
there). Then it adds the full syscall filter (`arl.sandbox.seccomp`), from which bwrap's had left out
``unshare`` for it. The agent learns its block from `TOOL_UIDS_ENV`; `arl.sandbox.bwrap.fresh_uid` then draws
each of its sandboxes' uids from it.

What it costs the agent: inside that namespace the files of unmapped uids (root's ``/usr``, ...)
show as owned by ``nobody`` (65534); their permissions are unchanged.

Run as ``python -I -S uid_delegation.py UID FIRST COUNT PROGRAM [ARG...]``: standard library only,
because it runs before any site-packages are set up. Its own errors go to stderr as one line that
starts with ``arl-delegate:`` and it exits 1; the program never starts then.
"""

from __future__ import annotations

import ctypes
import os
import sys

TOOL_UIDS_ENV = "ARL_TOOL_UIDS"  # "FIRST:COUNT": the block of uids a process may run commands as
# capability numbers (linux/capability.h): what running a command as a block uid takes
CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 0, 1, 3, 5, 6, 7, 8
DELEGATED_CAPS = (
    CAP_SETUID, CAP_SETGID,  # setpriv to a block uid (its group, no supplementary groups)
    CAP_SETPCAP,  # setpriv's empty bounding set for the command
    CAP_CHOWN,  # the work dir (and the files written into it) given to that uid
    CAP_DAC_OVERRIDE, CAP_FOWNER,  # reading, editing and removing what the command left there
    CAP_KILL,  # killing the command's process group past its wall time, and its leftovers
)
_CLONE_NEWUSER = 0x10000000
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE = 38, 24, 47, 2
_CAPABILITY_VERSION_3 = 0x20080522
PROGRAM = os.path.realpath(__file__)  # what `delegate_argv` runs: readable where the process is started


def format_uids(uids: range) -> str:
    """`TOOL_UIDS_ENV`'s value for ``uids`` (a step-1 range)."""
    return f"{uids.start}:{len(uids)}"


def delegated_uids(environ: dict[str, str] | None = None) -> range | None:
    """The block of uids this process was given for its commands (`TOOL_UIDS_ENV`), or None.
    A malformed value raises ValueError: running the commands as the agent's uid instead would
    silently lose what the block is for."""
    value = (os.environ if environ is None else environ).get(TOOL_UIDS_ENV)
    if value is None:
        return None
    first, _, count = value.partition(":")
    if not (first.isdigit() and count.isdigit() and int(count) > 0):
        raise ValueError(f"{TOOL_UIDS_ENV}={value!r} is not FIRST:COUNT")
    return range(int(first), int(first) + int(count))


def delegate_argv(python: str, uid: int, uids: range) -> list[str]:
    """argv prefix that runs the rest as ``uid`` with power over the uids of ``uids`` (as root;
    ``python``: an interpreter that root can run there, this module's file readable)."""
    return [python, "-I", "-S", PROGRAM, str(uid), str(uids.start), str(len(uids))]


def _fail(message: str) -> None:
    sys.stderr.write(f"arl-delegate: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def _enter_namespace(uid: int, uids: range) -> None:
    """Put this process in a new user namespace that maps exactly ``uid`` and ``uids`` (each to
    itself). Only a process outside the namespace may write a map of more than its own uid: a
    child that stays outside (as root) writes it, once the parent is inside."""
    libc = ctypes.CDLL(None, use_errno=True)
    inside_r, inside_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(inside_w)
        if os.read(inside_r, 1) != b"x":  # the parent could not unshare: it says why
            os._exit(1)
        lines = f"{uid} {uid} 1\n{uids.start} {uids.start} {len(uids)}\n"
        try:
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{os.getppid()}/{name}", "w") as f:
                    f.write(lines)
        except OSError as exc:
            _fail(f"cannot write the user namespace's {name}: {exc}")
        os._exit(0)
    os.close(inside_r)
    if libc.unshare(_CLONE_NEWUSER) != 0:
        _fail(f"cannot make a user namespace: {os.strerror(ctypes.get_errno())}")
    os.write(inside_w, b"x")
    os.close(inside_w)
    _, status = os.waitpid(child, 0)
    if status != 0:
        os._exit(1)  # the child said why


def _keep_delegated_caps(libc: ctypes.CDLL) -> None:
    """Keep `DELEGATED_CAPS` (permitted, effective, inheritable and ambient: ambient ones survive
    the exec of a program without file capabilities) and drop every other from the bounding set."""
    mask = sum(1 << cap for cap in DELEGATED_CAPS)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)(Data(mask, mask, mask), Data(0, 0, 0))  # all of DELEGATED_CAPS are below 32
    if libc.capset(ctypes.byref(Header(_CAPABILITY_VERSION_3, 0)), data) != 0:
        _fail(f"capset: {os.strerror(ctypes.get_errno())}")
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if cap not in DELEGATED_CAPS and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            _fail(f"cannot drop capability {cap} from the bounding set: {os.strerror(ctypes.get_errno())}")
    for cap in DELEGATED_CAPS:
        if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0:
            _fail(f"cannot keep capability {cap}: {os.strerror(ctypes.get_errno())}")


def _filter_fully() -> None:
    """Where bwrap's filter left ``unshare`` to this program (`arl.sandbox.seccomp.sandbox_filter`
    with ``namespaces``), add the full one now that the namespace is made: the agent and its tool
    commands make no namespace of their own. `arl.sandbox.seccomp` is loaded from beside this
    file (standard library only; ``-I`` puts no directory on ``sys.path``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_arl_seccomp", os.path.join(os.path.dirname(PROGRAM), "seccomp.py"))
    if spec is None or spec.loader is None:
        _fail("cannot find seccomp.py beside this program")
    seccomp = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(seccomp)
        program = seccomp.sandbox_filter()
        if program is not None:
            seccomp.install(program)
    except (OSError, ImportError, ValueError) as exc:
        _fail(f"cannot install the syscall filter: {exc}")


def main(argv: list[str]) -> None:
    if len(argv) < 4 or not all(a.isdigit() for a in argv[:3]):
        _fail("usage: uid_delegation.py UID FIRST COUNT PROGRAM [ARG...]")
    uid, first, count = (int(a) for a in argv[:3])
    uids = range(first, first + count)
    if count < 1 or uid in uids:
        _fail(f"the block {first}:{count} must be non-empty and not hold the uid {uid}")
    if os.geteuid() != 0:
        _fail("must start as root")
    _enter_namespace(uid, uids)
    libc = ctypes.CDLL(None, use_errno=True)
    try:  # in the namespace: the capabilities to switch are still all there (uid 0 is unmapped,
        # so no "leaving root" clears them)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        _fail(f"cannot switch to uid {uid}: {exc}")
    _keep_delegated_caps(libc)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # no setuid binary gives more back
        _fail(f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    _filter_fully()
    try:
        os.execvp(argv[3], argv[3:])
    except OSError as exc:
        _fail(f"cannot run {argv[3]!r}: {exc}")


if __name__ == "__main__":
    main(sys.argv[1:])
