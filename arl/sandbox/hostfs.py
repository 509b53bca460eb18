"""Host-side work on a tree the agent controls: remove it, hash it, show its names as text.

A sandbox's work dir holds whatever the agent's commands left there: directories thousands of
levels deep, 100k files, names that are not UTF-8, files without permissions, symlink loops.
The host still has to remove it, hash it once per step (GiGPO's state key) and list it to the
agent, without raising and without taking seconds. So nothing here recurses with the tree's
depth or builds its paths by joining (a deep tree's paths pass ``PATH_MAX``): directories are
opened relative to their parent's fd, and every walk that runs per step has a stated budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat

# The per-step state digest reads at most this much of a tree (the bound says what one step may
# cost on the host: a few tens of ms, not the 3-4 s a 100k-file tree took). A tree beyond it
# hashes to one fixed key, `OVER_BUDGET`: GiGPO then groups all such states together, which is
# right for a work dir the agent flooded, and the agent learns nothing from the key.
MAX_DIGEST_ENTRIES = 5000  # directory entries looked at (files, dirs, links, ...)
MAX_DIGEST_BYTES = 16 * 2**20  # file content read, in all
MAX_DIGEST_FILE_BYTES = 2**20  # content read per file (its head)
MAX_DIGEST_DEPTH = 32  # directory levels below the root
OVER_BUDGET = "over-budget"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Budget(Exception):
    """The tree is larger than the digest's budget."""


def tree_digest(
    root: str | os.PathLike[str], *, skip: frozenset[str] = frozenset({"__pycache__"}),
    max_entries: int = MAX_DIGEST_ENTRIES, max_bytes: int = MAX_DIGEST_BYTES,
    max_depth: int = MAX_DIGEST_DEPTH,
) -> str:
    """A hex digest of the regular files under ``root`` (relative names and the head of each
    file's content, in name order; symlinks and directories named in ``skip`` are left out), or
    `OVER_BUDGET` when the tree exceeds the budget. Files that cannot be read count by name."""
    digest = hashlib.sha256()
    left = {"entries": max_entries, "bytes": max_bytes}

    def walk(fd: int, prefix: bytes, depth: int) -> None:
        with os.scandir(fd) as it:
            entries = []
            for entry in it:
                left["entries"] -= 1
                if left["entries"] < 0:
                    raise _Budget
                entries.append(entry)
        for entry in sorted(entries, key=lambda e: e.name):
            name = os.fsencode(entry.name)
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                if entry.name in skip:
                    continue
                if depth >= max_depth:
                    raise _Budget
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    digest.update(prefix + name + b"/\0unreadable\0")
                    continue
                try:
                    walk(child, prefix + name + b"/", depth + 1)
                finally:
                    os.close(child)
            elif stat.S_ISREG(mode):
                digest.update(prefix + name + b"\0" + _head(fd, entry.name, left) + b"\0")

    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return hashlib.sha256(b"").hexdigest()
    try:
        walk(top, b"", 0)
    except _Budget:
        return OVER_BUDGET
    finally:
        os.close(top)
    return digest.hexdigest()


def _head(dir_fd: int, name: str, left: dict[str, int]) -> bytes:
    if left["bytes"] <= 0:
        raise _Budget
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat must not block the walk
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return b"\0unreadable"
    try:
        data = os.read(fd, min(MAX_DIGEST_FILE_BYTES, left["bytes"]))
    except OSError:
        data = b"\0unreadable"
    finally:
        os.close(fd)
    left["bytes"] -= len(data)
    return data


def remove_tree(root: str | os.PathLike[str]) -> None:
    """Remove ``root`` and everything under it, however deep, whatever its permissions (as far
    as this user may). Iterative, one directory fd open at a time: a tree deeper than the
    recursion limit or ``PATH_MAX`` goes too. Never raises; what cannot be removed stays."""
    root = os.fspath(root)
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(root)  # not a directory (or already gone)
        return
    pending = [_clear(fd)]  # per level: the subdirectories still to remove
    names: list[str] = []  # the path from root to the current directory
    try:
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                child = _open_dir(name, fd)
                if child is None:
                    continue
                os.close(fd)
                fd = child
                names.append(name)
                pending.append(_clear(fd))
                continue
            pending.pop()
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS & ~os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = parent
            with contextlib.suppress(OSError):
                os.rmdir(names.pop(), dir_fd=fd)
    except OSError:
        pass  # ".." could not be opened: fall through; what is left stays
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(root)


def _clear(fd: int) -> list[str]:
    """Unlink every non-directory in the directory ``fd``; return its subdirectories' names."""
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o700)  # the agent may have taken write or search permission away
    dirs = []
    try:
        with os.scandir(fd) as it:
            entries = list(it)
    except OSError:
        return []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
        except OSError:
            continue
    return dirs


def _open_dir(name: str, parent: int) -> int | None:
    for attempt in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except PermissionError:
            if attempt:
                return None
            with contextlib.suppress(OSError):
                os.chmod(name, 0o700, dir_fd=parent)
        except OSError:
            return None
    return None


def encodable(text: str) -> str:
    """``text`` with every character UTF-8 cannot encode (lone surrogates: a file name that is
    not UTF-8 decodes to them) written as a backslash escape, so a reply can always be sent."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def display_name(name: str | bytes | os.PathLike[str]) -> str:
    """A file name as text for the agent: its bytes as UTF-8, others as ``\\xNN`` escapes."""
    raw = os.fsencode(name)
    return raw.decode("utf-8", "backslashreplace")


__all__ = ["MAX_DIGEST_BYTES", "MAX_DIGEST_DEPTH", "MAX_DIGEST_ENTRIES", "MAX_DIGEST_FILE_BYTES", "OVER_BUDGET",
           "display_name", "encodable", "remove_tree", "tree_digest"]
