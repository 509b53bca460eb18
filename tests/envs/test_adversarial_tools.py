"""Tool calls an agent can make to break the host side (issue 28, classes 7 and 8): every one must
come back as a tool reply, the reply always encodable, ``close()`` must remove whatever the agent
left in the work dir, and the per-step state digest must be bounded and off the event loop.
Before, each of these raised out of ``env.step`` (or ``close``), or took seconds on the loop."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest

from arl.envs.bugfix.env import BugFixEnv
from arl.envs.tools import ToolEnv
from arl.sandbox import hostfs

DEPTH = 3000  # deeper than the recursion limit (rmtree, rglob) and than PATH_MAX (4096 bytes)


def call(name, arguments, *, raw=False, call_id="c1"):
    function = {"name": name, "arguments": arguments if raw else json.dumps(arguments)}
    return {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": function}]}


def deep_dirs(root: str, depth: int = DEPTH) -> None:
    """``root/d/d/.../d``, made relative to each parent's fd (no path is ever that long)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("x")
    finally:
        os.close(fd)


def encodable(messages) -> bool:
    json.dumps(messages, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
    return True


@pytest.fixture
def env():
    env = BugFixEnv(isolation="none", max_steps=50)  # host-side faults: the isolation does not matter
    env.reset(seed=0)
    yield env
    env.close()


def step_text(env, action) -> str:
    messages, reward, terminated, truncated, info = env.step(action)
    assert encodable(messages)
    assert reward == 0.0 and not terminated and not truncated
    assert info["action_valid"] is False, messages
    return messages[0]["content"]


@pytest.mark.parametrize("action, expected", [
    (call("bash", {"command": "echo a\0b"}), "NUL"),
    (call("bash", '{"command": "echo \\ud800"}', raw=True), "surrogate"),
    (call("editor", {"command": "view", "path": "a\0b"}), "NUL"),
    (call("editor", '{"command": "view", "path": "\\udcff"}', raw=True), "surrogate"),
    (call("editor", '{"command": "create", "path": "new.py", "file_text": "\\ud800"}', raw=True), "surrogate"),
    (call("editor", {"command": "create", "path": "sequtils.py/x.py", "file_text": "x"}), "sequtils.py/x.py"),
    (call("editor", {"command": "view", "path": "sequtils.py/x.py"}), "not a file"),
    (call("editor", {"command": "create", "path": "a" * 300, "file_text": "x"}), "too long"),
    (call("editor", {"command": "create", "path": "/".join(["b" * 200] * 30), "file_text": "x"}), "too long"),
    (call("editor", {"command": "view", "path": "c" * 5000}), "too long"),
    (call("bash", {"command": ["nested"] * 3}), "bash takes one string"),
    (call("editor", {"command": "view", "path": ".", "view_range": [[[[[[[[[[1]]]]]]]]]]}), "deeper"),
    (json.dumps({"tool_calls": "[" * 50_000}), "tool_calls must be a list"),
    ("[" * 100_000, "no tool call"),
], ids=["bash-nul", "bash-surrogate", "path-nul", "path-surrogate", "text-surrogate", "under-file",
        "view-under-file", "long-name", "long-path", "long-view", "bash-list", "deep-args", "deep-calls",
        "deep-json-action"])
def test_malformed_tool_calls_are_tool_replies(env, action, expected):
    assert expected in step_text(env, action)


def test_symlink_loop_is_a_tool_reply(env):
    os.symlink("loop_b", env.sandbox.workdir / "loop_a")
    os.symlink("loop_a", env.sandbox.workdir / "loop_b")
    for arguments in ({"command": "view", "path": "loop_a"},
                      {"command": "create", "path": "loop_a/x.py", "file_text": "x"},
                      {"command": "str_replace", "path": "loop_b", "old_str": "a", "new_str": "b"}):
        text = step_text(env, call("editor", arguments))
        assert "symbolic links" in text or "not a file" in text
        assert str(env.sandbox.workdir) not in text  # the host's path is not the agent's business


def test_deep_directory_steps_and_close_removes_it(env):
    workdir = env.sandbox.workdir
    deep_dirs(str(workdir))
    messages, *_, info = env.step(call("editor", {"command": "view", "path": "."}))
    assert "d/" in messages[0]["content"] and encodable(messages)
    assert info["raw_obs"] == "repo:" + hostfs.OVER_BUDGET  # deeper than MAX_DIGEST_DEPTH
    messages, *_ = env.step(call("editor", {"command": "view", "path": "/".join(["d"] * 40)}))
    assert "Files in d/d/" in messages[0]["content"]
    text = step_text(env, call("editor", {"command": "view", "path": "/".join(["d"] * 2500)}))  # > PATH_MAX
    assert "too long" in text
    env.close()  # before: RecursionError, and the work dir stayed on disk
    assert not workdir.exists()


def test_remove_tree_takes_deep_trees_and_taken_permissions(tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    deep_dirs(str(root), 1500)
    (root / "locked").mkdir()
    (root / "locked" / "f").write_text("x")
    os.chmod(root / "locked", 0)
    os.symlink("/", root / "to_root")  # a link out: removed, never followed
    hostfs.remove_tree(root)
    assert not root.exists()
    assert os.path.isdir("/usr")


def test_non_utf8_file_name_is_shown_encodable(env):
    (env.sandbox.workdir / os.fsdecode(b"bad\xff\xfe.py")).write_text("x = 1\n")
    messages, *_ = env.step(call("editor", {"command": "view", "path": "."}))
    assert encodable(messages)
    assert "bad\\xff\\xfe.py" in messages[0]["content"]
    messages, *_ = env.step(call("bash", {"command": "ls"}))
    assert encodable(messages)


def test_tool_call_id_with_a_lone_surrogate_is_answered_encodable(env):
    messages, *_ = env.step(call("bash", {"command": "true"}, call_id="\ud800"))
    assert encodable(messages)
    game = ToolEnv("arl/FrozenLake-v0")
    game.reset(seed=0)
    messages, *_ = game.step(call("move", {"direction": "\udcff\0"}, call_id="\udcff"))
    assert encodable(messages) and messages[0]["role"] == "tool"


def test_state_digest_is_bounded_on_a_flooded_work_dir(env):
    flood = env.sandbox.workdir / "flood"
    flood.mkdir()
    for i in range(hostfs.MAX_DIGEST_ENTRIES + 10):
        (flood / f"f{i}").touch()
    start = time.monotonic()
    assert env.state_text() == "repo:" + hostfs.OVER_BUDGET
    assert time.monotonic() - start < 2.0  # a budgeted scan (before: every file opened and read)
    # the same tree under the budget hashes its contents: equal edits meet, different ones part
    small = hostfs.tree_digest(env.sandbox.workdir, max_entries=10**6)
    assert small != hostfs.OVER_BUDGET
    (flood / "f0").write_text("changed")
    assert hostfs.tree_digest(env.sandbox.workdir, max_entries=10**6) != small


def test_state_digest_and_editor_run_off_the_event_loop(env):
    threads = []
    original = env.state_text

    def recording():
        threads.append(threading.current_thread())
        return original()

    env.state_text = recording

    async def main():
        await env.astep(call("editor", {"command": "view", "path": "."}))
        return threading.current_thread()

    loop_thread = asyncio.run(main())
    assert threads and all(t is not loop_thread for t in threads)


def test_digest_of_a_tree_with_fifo_and_unreadable_files_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "secret").write_text("x")
    os.chmod(tmp_path / "secret", 0)
    os.symlink("/etc/passwd", tmp_path / "link")
    assert len(hostfs.tree_digest(tmp_path)) == 64


def test_work_dir_removal_runs_off_the_event_loop(env, monkeypatch):
    """A flooded work dir takes seconds to remove: the end of an episode (submit) and
    `Sandbox.close` remove it in a worker thread, not on the loop every episode shares."""
    import arl.sandbox.sandbox as sandbox_module
    from arl.sandbox.sandbox import Sandbox

    threads = []
    real = sandbox_module.remove_tree

    def recording(path):
        threads.append(threading.current_thread())
        real(path)

    monkeypatch.setattr(sandbox_module, "remove_tree", recording)

    async def main():
        workdir = env.sandbox.workdir
        messages, reward, terminated, *_ = await env.astep(call("submit", {}))
        assert terminated and not workdir.exists()
        box = Sandbox(isolation="none")
        (box.workdir / "f").write_text("x")
        await box.close()
        assert not box.workdir.exists()
        return threading.current_thread()

    loop_thread = asyncio.run(main())
    assert len(threads) >= 2 and all(t is not loop_thread for t in threads)  # the judge's own sandbox too
