"""Two sandboxes that run at once, colluding (issue 47, item B): can one pass a bit to the other?

Two episodes of one group run side by side; if the one whose judged code sees the hidden tests can
signal a sibling's command, the hidden tests leak. Neither shares a writable file with the other,
but both open the same inodes read-only (the system, the venv, the task's read-only files) and the
same device nodes, and every kernel object hung on an inode is shared with it. Each channel is
played here as the attack would be: a sender in sandbox A sets the bit (holds a lock, opens a
file, makes an IPC object), a receiver in sandbox B looks for it within a bounded time, and B must
see the same thing whether or not A sent: nothing passes.

- ``flock``, ``posix`` (``F_SETLK`` read lock, seen by ``F_GETLK``), ``ofd`` (the same with open
  file description locks), ``devnull`` (a write lock on ``/dev/null``, which every sandbox may
  open for writing): a lock lives on the inode; closed by the seccomp filter refusing lock calls.
- ``inotify``, ``dnotify`` (``fcntl(F_NOTIFY)`` on the directory), ``fanotify``: a watch fires
  when the sibling opens or reads the watched file; closed by refusing the watch calls.
- ``sysv`` (a message queue by key), ``mqueue`` (a POSIX queue by name), ``shm`` (a file in
  ``/dev/shm``), ``abstract`` (an abstract unix socket): held already, by the IPC namespace,
  a ``/dev`` of each sandbox's own and the network namespace.

Under bwrap, before the filter refused locks and watches, the first seven carried the bit (the
fanotify case where the kernel lets an unprivileged uid watch an inode). A positive control runs
each channel with isolation ``none`` (both on the host, as the same user), where every one must
carry it: the probes can see a channel where nothing closes it.
"""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest

from arl.sandbox.backends import backend_problem, open_sandbox
from tests.envs.backend_params import CONTAINERS

pytestmark = pytest.mark.anyio

BACKENDS = [pytest.param("bwrap", marks=pytest.mark.skipif(
    backend_problem("bwrap") is not None, reason=f"bwrap unavailable: {backend_problem('bwrap')}")),
    *CONTAINERS]
LOCKS = ("flock", "posix", "ofd", "devnull")
WATCHES = ("inotify", "dnotify", "fanotify")
NAMESPACED = ("sysv", "mqueue", "shm", "abstract")
WAIT_S = 2.0  # how long a watching receiver waits for the sibling's event

CHANNEL = textwrap.dedent("""
    import ctypes, errno, fcntl, os, select, signal, socket, struct, sys, time
    role, channel, shared, token = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    libc = ctypes.CDLL(None, use_errno=True)
    librt = ctypes.CDLL("librt.so.1", use_errno=True)
    KEY, NAME, SHM = int(token, 16) & 0x7FFFFFFF, f"/arl-{token}".encode(), f"/dev/shm/arl-{token}"

    def say(*words):
        print(*words, flush=True)

    def lock(cmd, kind, fd):
        arg = struct.pack("hhqqi4x", kind, 0, 0, 0, 0)  # struct flock: type, whence, start, len, pid
        return struct.unpack("hhqqi4x", fcntl.fcntl(fd, cmd, arg))[0]

    def send():
        if channel == "flock":
            fcntl.flock(os.open(shared, os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)
        elif channel in ("posix", "ofd"):
            lock(fcntl.F_SETLK if channel == "posix" else 37, fcntl.F_RDLCK, os.open(shared, os.O_RDONLY))
        elif channel == "devnull":
            lock(fcntl.F_SETLK, fcntl.F_WRLCK, os.open("/dev/null", os.O_RDWR))
        elif channel in ("inotify", "dnotify", "fanotify"):
            with open(shared, "rb") as f:
                f.read()
        elif channel == "sysv":
            queue = libc.msgget(KEY, 0o1666)  # IPC_CREAT | 0666
            if queue < 0:
                raise OSError(ctypes.get_errno(), "msgget")
            made.append(lambda: libc.msgctl(queue, 0, None))  # IPC_RMID
        elif channel == "mqueue":
            if librt.mq_open(NAME, os.O_CREAT | os.O_RDWR, 0o666, None) < 0:
                raise OSError(ctypes.get_errno(), "mq_open")
            made.append(lambda: librt.mq_unlink(NAME))
        elif channel == "shm":
            open(SHM, "w").close()
            made.append(lambda: os.unlink(SHM))
        elif channel == "abstract":
            s = socket.socket(socket.AF_UNIX)
            s.bind(b"\\0arl-" + token.encode())
            s.listen()
            globals()["held"] = s

    def receive():
        if channel == "flock":
            try:
                fcntl.flock(os.open(shared, os.O_RDONLY), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
        elif channel in ("posix", "ofd"):
            cmd = fcntl.F_GETLK if channel == "posix" else 36
            return lock(cmd, fcntl.F_WRLCK, os.open(shared, os.O_RDONLY)) != fcntl.F_UNLCK
        elif channel == "devnull":
            try:
                lock(fcntl.F_SETLK, fcntl.F_WRLCK, os.open("/dev/null", os.O_RDWR))
            except (BlockingIOError, PermissionError):
                return True
        elif channel == "sysv":
            return libc.msgget(KEY, 0) >= 0
        elif channel == "mqueue":
            return librt.mq_open(NAME, os.O_RDONLY, 0, None) >= 0
        elif channel == "shm":
            return os.path.exists(SHM)
        elif channel == "abstract":
            try:
                socket.socket(socket.AF_UNIX).connect(b"\\0arl-" + token.encode())
                return True
            except OSError:
                return False
        return False

    def watch():
        if channel == "inotify":
            fd = libc.inotify_init1(0)
            if fd < 0 or libc.inotify_add_watch(fd, shared.encode(), 0x20 | 0x1) < 0:  # IN_OPEN | IN_ACCESS
                raise OSError(ctypes.get_errno(), "inotify")
            return lambda timeout: bool(select.select([fd], [], [], timeout)[0])
        if channel == "dnotify":
            fired = []
            signal.signal(signal.SIGIO, lambda *_: fired.append(1))
            fcntl.fcntl(os.open(os.path.dirname(shared), os.O_RDONLY), 1026, 1 | 0x80000000)  # F_NOTIFY: DN_ACCESS | DN_MULTISHOT

            def wait(timeout):
                end = time.monotonic() + timeout
                while not fired and time.monotonic() < end:
                    time.sleep(0.01)
                return bool(fired)
            return wait
        if channel == "fanotify":  # unprivileged: FAN_REPORT_FID, an inode mark
            fd = libc.fanotify_init(0x200, os.O_RDONLY)
            if fd < 0 or libc.fanotify_mark(fd, 1, ctypes.c_uint64(0x20 | 0x1), -100, shared.encode()) < 0:
                raise OSError(ctypes.get_errno(), "fanotify")
            return lambda timeout: bool(select.select([fd], [], [], timeout)[0])

    made = []  # what the sender made, removed when the test lets go (on the host it would outlive it)
    try:
        if role == "send":
            send()
            say("ready")
        elif role == "watch":
            wait = watch()
            say("ready")
            say("seen" if wait(float(sys.argv[5])) else "unseen")
        else:
            say("seen" if receive() else "unseen")
    except OSError as exc:  # a refused call: this end cannot use the channel
        say("ready" if role != "receive" else "unseen", "refused", errno.errorcode.get(exc.errno, exc.errno))
        if role == "watch":
            say("unseen")
    if role == "send":
        sys.stdin.read()  # hold the bit until the test lets go
        for remove in made:
            remove()
""")


async def _line(proc: asyncio.subprocess.Process) -> str:
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    if not line:
        err = await proc.stderr.read()
        raise AssertionError(f"the channel process ended: {err.decode(errors='replace')[-2000:]}")
    return line.decode().strip()


async def _play(backend: str, tmp_path, channel: str, send: bool) -> str:
    """What the receiver in sandbox B saw ("seen" or "unseen", then "refused ERRNO" where a call
    of the channel was refused at either end), with (``send``) or without a sender in sandbox A."""
    tool, shared, token = tmp_path / "channel.py", tmp_path / "shared.txt", os.urandom(4).hex()
    tool.write_text(CHANNEL)
    shared.write_text("shared by every sandbox, read-only\n")
    for path in (tool, shared):
        path.chmod(0o644)
    tmp_path.chmod(0o755)
    argv = ["python", str(tool)]
    async with open_sandbox(backend=backend, python=True, read_only=[tmp_path]) as a, \
            open_sandbox(backend=backend, python=True, read_only=[tmp_path]) as b:
        if channel in WATCHES:  # B watches first, then A touches the file
            receiver = await b.spawn([*argv, "watch", channel, str(shared), token, str(WAIT_S)], env={})
            ready = await _line(receiver)
            assert ready.startswith("ready"), ready
            if send:
                done = await a.run(f"python {tool} send {channel} {shared} {token} </dev/null")
                assert done.exit_code == 0, done
            seen = await _line(receiver)
            receiver.stdin.close()
            await receiver.wait()
            return " ".join([seen, *ready.split()[1:]])
        sender = None
        if send:
            sender = await a.spawn([*argv, "send", channel, str(shared), token], env={})
            ready = await _line(sender)
            assert ready.startswith("ready"), ready
        try:
            result = await b.run(f"python {tool} receive {channel} {shared} {token}")
            assert result.exit_code == 0, result
            return result.stdout.strip()
        finally:
            if sender is not None:
                sender.stdin.close()
                await sender.wait()


@pytest.mark.parametrize("channel", [*LOCKS, *WATCHES, *NAMESPACED])
@pytest.mark.parametrize("backend", BACKENDS)
async def test_no_bit_passes_between_sibling_sandboxes(tmp_path, backend, channel):
    quiet = await _play(backend, tmp_path, channel, send=False)
    sent = await _play(backend, tmp_path, channel, send=True)
    assert sent.split()[0] == quiet.split()[0], f"{channel}: the sibling saw {sent!r} with the sender, {quiet!r} without"


@pytest.mark.parametrize("channel", [*LOCKS, *WATCHES, *NAMESPACED])
async def test_on_the_host_every_channel_carries_the_bit(tmp_path, channel):
    """The positive control: isolation "none" (both on the host) lets each probe see its sender."""
    quiet = await _play("none", tmp_path, channel, send=False)
    if "refused" in quiet:  # e.g. fanotify for a user without CAP_SYS_ADMIN on a kernel before 5.13
        pytest.skip(f"this host refuses {channel} to this user: {quiet}")
    if quiet.split()[0] == "seen" and channel == "devnull":  # /dev/null is the host's: any process may hold a lock
        pytest.skip("a process on this host already holds a lock on /dev/null (lslocks says which; seen here: "
                    "dockerd, with an OFD read lock on its stdin): the control cannot tell a sender from it")
    sent = await _play("none", tmp_path, channel, send=True)
    assert (quiet, sent) == ("unseen", "seen")
