"""The ``editor`` tool: view, create, str_replace, insert (the str_replace_editor of SWE-agent and
Anthropic's tool use, minus undo), acting on a sandbox's work dir from the host side.

Every outcome is text for the agent; `EditorError` carries the refusals (``edit`` turns it into
the tool's output). Paths are resolved by `Sandbox.host_path`: relative to the work dir or
absolute under it, symlinks that lead out refused, so the host never writes through a link the
agent planted. Files are read as UTF-8, at most `MAX_FILE_BYTES`.
"""

from __future__ import annotations

import os
import reprlib
from pathlib import Path
from typing import Any

from arl.sandbox.hostfs import display_name, encodable
from arl.sandbox.sandbox import Sandbox

COMMANDS = ("view", "create", "str_replace", "insert")
MAX_FILE_BYTES = 1 << 20
SNIPPET_LINES = 4  # context lines around an edit in the reply
MAX_LISTING = 200  # entries of a directory view
MAX_SCANNED = 10_000  # directory entries a view looks at (a flooded work dir lists in ms, not s)

SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "editor",
        "description": (
            "view: a file with line numbers (view_range [first, last], -1 = end) or a directory; "
            "create: a new file (file_text); str_replace: replace the one occurrence of old_str with "
            "new_str; insert: new_str after line insert_line (0 = top)."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "enum": list(COMMANDS)},
                "path": {"type": "string"},
                "file_text": {"type": "string"},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
                "insert_line": {"type": "integer"},
                "view_range": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["command", "path"],
            "additionalProperties": False,
        },
    },
}


class EditorError(Exception):
    """A refused editor command; its message goes to the agent."""


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def _read(host: Path, path: str) -> str:
    if not host.is_file():
        raise EditorError(f"{path} is not a file")
    if host.stat().st_size > MAX_FILE_BYTES:
        raise EditorError(f"{path} is larger than {MAX_FILE_BYTES} bytes; use bash (head, sed -n) to read parts")
    try:
        return host.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise EditorError(f"{path} is not a UTF-8 text file") from None


def _arg(args: dict[str, Any], name: str, kind: type, required: bool = True) -> Any:
    value = args.get(name)
    if value is None:
        if required:
            raise EditorError(f"missing required argument {name!r}")
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise EditorError(f"argument {name!r} must be a {kind.__name__}")
    return value


def edit(sandbox: Sandbox, args: dict[str, Any]) -> str:
    """Run one editor command; returns the text for the agent (EditorError for refusals).

    The file system's own refusals are the agent's faults too (a path under a file, a name
    too long, a symlink loop, a tree too deep): they become EditorError, never an exception
    out of the env's step. Replies are always encodable text (`hostfs.encodable`)."""
    path = args.get("path")
    try:
        return encodable(_edit(sandbox, args))
    except EditorError:
        raise
    except OSError as exc:  # ENOTDIR, EEXIST, ENAMETOOLONG, ELOOP, EACCES, ENOSPC, ...
        raise EditorError(f"{_shown(path)}: {exc.strerror or type(exc).__name__}") from None
    except ValueError as exc:  # a NUL byte, text that cannot be encoded
        raise EditorError(f"{_shown(path)}: {encodable(str(exc))[:200]}") from None
    except RuntimeError:  # pathlib's "Symlink loop from <host path>" (the host path is not the agent's)
        raise EditorError(f"{_shown(path)}: too many levels of symbolic links") from None


def _shown(path: Any) -> str:
    return encodable(reprlib.repr(path)) if isinstance(path, str) else "path"


def _edit(sandbox: Sandbox, args: dict[str, Any]) -> str:
    allowed = set(SCHEMA["function"]["parameters"]["properties"])
    extra = sorted(set(args) - allowed)
    if extra:
        raise EditorError(f"unexpected argument(s): {', '.join(extra)}")
    command = _arg(args, "command", str)
    if command not in COMMANDS:
        raise EditorError(f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
    path = _arg(args, "path", str)
    try:
        host = sandbox.host_path(path)
    except ValueError as exc:
        raise EditorError(str(exc)) from None
    if command == "view":
        return _view(sandbox, host, path, args.get("view_range"))
    if command == "create":
        text = _arg(args, "file_text", str)
        if host.exists():
            raise EditorError(f"{path} already exists; `create` does not overwrite (use str_replace)")
        sandbox.write_file(host.relative_to(sandbox.workdir.resolve()), text)
        return f"Created {path} ({len(text.splitlines())} lines)."
    if command == "str_replace":
        old, new = _arg(args, "old_str", str), _arg(args, "new_str", str, required=False) or ""
        text = _read(host, path)
        count = text.count(old) if old else 0
        if count != 1:
            where = "did not appear verbatim" if count == 0 else f"appears {count} times (make it unique)"
            raise EditorError(f"no replacement was made: old_str {where} in {path}")
        start_line = text[: text.index(old)].count("\n")
        text = text.replace(old, new, 1)
        sandbox.write_file(host.relative_to(sandbox.workdir.resolve()), text)
        return f"Edited {path}. The changed region:\n" + _snippet(text, start_line, new.count("\n") + 1)
    # insert
    new = _arg(args, "new_str", str)
    after = _arg(args, "insert_line", int)
    lines = _read(host, path).splitlines(keepends=True)
    if not 0 <= after <= len(lines):
        raise EditorError(f"insert_line {after} is outside 0..{len(lines)} for {path}")
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    text = "".join(lines[:after]) + new + ("" if new.endswith("\n") else "\n") + "".join(lines[after:])
    sandbox.write_file(host.relative_to(sandbox.workdir.resolve()), text)
    return f"Inserted into {path}. The changed region:\n" + _snippet(text, after, new.count("\n") + 1)


def _listing(top: Path, limit: int) -> tuple[list[tuple[str, bool]], int]:
    """The first ``limit`` entries two levels under ``top`` (dot names left out, name order), and
    how many more there are (-1: more than `MAX_SCANNED` were scanned, the rest not counted): a
    directory of 100k entries costs a bounded scan, not a walk of the whole tree."""
    found: list[tuple[str, bool]] = []
    scanned = 0

    def entries(directory: Path) -> list[os.DirEntry[str]]:
        nonlocal scanned
        out = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    scanned += 1
                    if scanned > MAX_SCANNED:
                        break
                    if not entry.name.startswith("."):
                        out.append(entry)
        except OSError:
            pass
        return sorted(out, key=lambda e: e.name)

    for entry in entries(top):
        is_dir = entry.is_dir(follow_symlinks=False)
        found.append((entry.name, is_dir))
        if is_dir:
            found += [(os.path.join(entry.name, sub.name), sub.is_dir(follow_symlinks=False))
                      for sub in entries(top / entry.name)]
    found.sort(key=lambda item: item[0].split(os.sep))  # pathlib's order: by path parts
    more = len(found) - limit if len(found) > limit else 0
    return found[:limit], (-1 if scanned > MAX_SCANNED else more)


def _snippet(text: str, first_line: int, count: int) -> str:
    lines = text.splitlines()
    lo, hi = max(0, first_line - SNIPPET_LINES), min(len(lines), first_line + count + SNIPPET_LINES)
    return _numbered(lines[lo:hi], lo + 1)


def _view(sandbox: Sandbox, host: Path, path: str, view_range: Any) -> str:
    if host.is_dir():
        if view_range is not None:
            raise EditorError("view_range applies to files, not directories")
        root = sandbox.workdir.resolve()
        shown, more = _listing(host, MAX_LISTING)
        prefix = host.relative_to(root).parts
        names = [display_name(os.path.join(*prefix, rel)) + ("/" if is_dir else "") for rel, is_dir in shown]
        tail = ("\n[... more entries, not counted ...]" if more < 0
                else f"\n[... {more} more entries ...]" if more else "")
        return f"Files in {path} (two levels deep):\n" + "\n".join(names) + tail
    lines = _read(host, path).splitlines()
    first, last = 1, len(lines)
    if view_range is not None:
        if (not isinstance(view_range, list) or len(view_range) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)):
            raise EditorError("view_range must be a list of two integers [first, last]")
        first, last = view_range[0], (len(lines) if view_range[1] == -1 else view_range[1])
        if not 1 <= first <= max(1, len(lines)) or last < first or last > len(lines):
            raise EditorError(f"view_range {view_range} is outside 1..{len(lines)} for {path}")
    return _numbered(lines[first - 1:last], first)


__all__ = ["COMMANDS", "SCHEMA", "EditorError", "edit"]
