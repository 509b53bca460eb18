"""BugFixEnv: fix a generated bug with a shell, a file editor and submit (``arl/BugFix-v0``).

    env = gymnasium.make("arl/BugFix-v0").unwrapped
    observation, info = env.reset(seed=3)          # the issue and the repository's files
    messages, reward, terminated, truncated, info = env.step(assistant_message)

The interface is `ToolEnv`'s (``tools``, ``instructions``, ``max_steps``; ``step`` takes the
assistant message with its ``tool_calls`` and returns the reply messages), so arl's tool-calling
runner plays it. Tools: ``bash(command)``, ``editor(command, path, ...)`` (`arl.envs.bugfix.editor`)
and ``submit()``. Each step runs the message's calls in order (a submit ends the episode and the
calls after it are not run). Every fault of the agent is a tool output, never an exception:
malformed JSON, an unknown tool or argument, a refused editor command, a command that times out
or floods its output (shown truncated with a ``[... N characters truncated ...]`` marker).

Reward: 0 per step; at ``submit()`` or at the step limit, the fraction of the task's hidden tests
that pass, run inside the sandbox after the agent's last action (`arl.envs.bugfix.run_tests`).
The tests exist only during that one command: written to a fresh host dir, bound read-only,
removed afterwards; with bwrap the arl package is hidden from every command too, so the task
generator cannot be read back. A sandbox is made at reset and closed when the episode ends (and
at the next reset or close).

Sync and async: gymnasium's ``step`` is synchronous and runs the sandbox commands to completion
(in a private event loop; from inside a running loop, in a worker thread, blocking the caller).
Agent runners await ``astep`` instead, so that one episode's ``sleep 10`` does not stall every
other episode sharing the event loop (commands take 5 ms to the wall limit, 10 s by default).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import reprlib
import secrets
import shutil
import string
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from arl.envs.bugfix import editor
from arl.envs.bugfix.tasks import BugFixTask, generate_task
from arl.envs.sandbox import CommandResult, Sandbox, SandboxLimits

RUNNER = Path(__file__).with_name("run_tests.py")
ARL_PACKAGE = Path(__file__).resolve().parents[2]  # hidden inside the sandbox: it holds the task generator
TOOL_NAMES = ("bash", "editor", "submit")
MAX_ARGUMENT_CHARS = 1 << 17
EVAL_LIMITS = SandboxLimits(wall_s=20.0, cpu_s=20.0, output_bytes=1 << 20)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the repository root (no network).",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
                "additionalProperties": False,
            },
        },
    },
    editor.SCHEMA,
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Submit your fix (ends the episode).",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]


def truncate(text: str, limit: int) -> str:
    """``text`` as it is, or its head and tail around a ``[... N characters truncated ...]`` line.

    >>> truncate("abcdefghij", 4)
    'ab\\n[... 6 characters truncated ...]\\nij'
    """
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters truncated ...]\n{text[len(text) - tail:]}"


def format_result(result: CommandResult, limit: int) -> str:
    """A command's output as the agent sees it: stdout, stderr, then how it ended."""
    text = result.stdout
    if result.stderr:
        text += ("" if not text or text.endswith("\n") else "\n") + result.stderr
    if result.truncated:  # the sandbox kept only the head: show (part of) it and count the rest
        dropped = result.output_bytes - len(text[:limit].encode())
        text = f"{text[:limit]}\n[... {dropped} characters truncated ...]"
    else:
        text = truncate(text, limit)
    ending = {
        "ok": f"[exit code {result.exit_code}]",
        "timeout": "[killed: time limit]",
        "output_limit": "[killed: too much output]",
        "killed": f"[killed by signal {result.signal}]",
        "error": f"[could not run: {result.error}]",
    }[result.status]
    return f"{text}{'' if text.endswith(chr(10)) else chr(10)}{ending}" if text else ending


class _BadCall(Exception):
    """A tool call that cannot run; the message goes to the agent."""


def _parse_call(call: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(call, dict):
        raise _BadCall("each tool call must be an object")
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict):
        raise _BadCall("a tool call needs a 'function' object")
    name = function.get("name")
    if name not in TOOL_NAMES:
        raise _BadCall(f"unknown tool {reprlib.repr(name)}; the tools are {', '.join(TOOL_NAMES)}")
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        if len(arguments) > MAX_ARGUMENT_CHARS:
            raise _BadCall(f"arguments longer than {MAX_ARGUMENT_CHARS} characters")
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise _BadCall("arguments are not valid JSON") from None
    if not isinstance(arguments, dict):
        raise _BadCall("arguments must be a JSON object")
    return name, arguments


def _run_sync(coroutine: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # inside a loop: a loop of our own, in a thread
        return pool.submit(asyncio.run, coroutine).result()


class BugFixEnv(gym.Env):
    """One generated bug-fix task per seed (`arl.envs.bugfix.tasks`) in a fresh sandbox."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self, *, max_steps: int = 20, limits: SandboxLimits | None = None, isolation: str = "auto",
        output_chars: int = 4000, render_mode: str | None = None,
    ) -> None:
        self.max_steps = max_steps
        self.limits = limits or SandboxLimits()
        self.isolation = isolation
        self.output_chars = output_chars
        self.render_mode = render_mode
        self.tools = TOOLS
        # Text both ways (printable ASCII as the nominal charset): the observation is the issue,
        # the action an assistant message (a dict, or its JSON); step returns reply messages.
        self.observation_space = spaces.Text(max_length=1 << 16, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=MAX_ARGUMENT_CHARS, min_length=0, charset=string.printable)
        self.task: BugFixTask | None = None
        self.sandbox: Sandbox | None = None
        self.elapsed_steps = 0
        self.done = False
        self.last_eval: dict[str, Any] = {}

    # -- text --------------------------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        return (
            "You are a software engineer fixing a bug in a small Python repository (the current "
            "directory). Tools: `bash` runs a command (no network), `editor` views and edits files, "
            "`submit` ends the episode. Hidden tests decide the reward: the fraction of them that pass "
            f"after your last action. You have {self.max_steps} turns; the last one submits."
        )

    def _observation(self) -> str:
        assert self.task is not None
        files = ", ".join(sorted(self.task.files))
        return f"Issue: {self.task.issue}\nRepository files: {files}"

    # -- gymnasium ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.close()
        task_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31))
        self.task = generate_task(task_seed)
        self.sandbox = Sandbox(self.limits, isolation=self.isolation, python=True, hide=[ARL_PACKAGE])
        for name, text in self.task.files.items():
            self.sandbox.write_file(name, text)
        self.elapsed_steps, self.done, self.last_eval = 0, False, {}
        observation = self._observation()
        return observation, {"raw_obs": self.state_text(), "task_seed": task_seed,
                             "isolation": self.sandbox.isolation}

    def step(self, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        return _run_sync(self.astep(action))

    async def astep(self, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """``step`` for callers inside an event loop (the sandbox commands are awaited)."""
        if self.done or self.sandbox is None:
            body = "Error: the episode is over; call reset()."
            return [{"role": "user", "content": body}], 0.0, True, False, self._info(None, False, body, 0)
        self.elapsed_steps += 1
        message = action if isinstance(action, dict) else None
        if isinstance(action, str):  # the action space is text: an assistant message as JSON
            try:
                message = json.loads(action)
            except ValueError:
                message = {"role": "assistant", "content": action}
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        replies: list[dict[str, Any]] = []
        errors: list[str] = []
        first_action: str | None = None
        submitted = False
        if not isinstance(message, dict):
            errors.append("the assistant message must be an object")
        elif not calls:
            errors.append(f"no tool call; call one of the tools ({', '.join(TOOL_NAMES)})")
        elif not isinstance(calls, list):
            errors.append("tool_calls must be a list")
            calls = []
        unanswered: list[str] = []
        for call in calls if isinstance(calls, list) else ():
            if submitted:
                text = "Error: not run: the episode ended at submit."
            else:
                try:
                    name, arguments = _parse_call(call)
                    first_action = first_action or name
                    if name == "submit":
                        submitted = True
                        text = "Submitted."
                    else:
                        text = await self._run_tool(name, arguments)
                except _BadCall as exc:
                    errors.append(str(exc))
                    text = f"Error: {exc}"
            call_id = call.get("id") if isinstance(call, dict) else None
            if isinstance(call_id, str):
                replies.append({"role": "tool", "tool_call_id": call_id, "content": text})
            else:
                unanswered.append(text)
        if errors and not calls:
            unanswered.append(f"Error: {errors[0]}.")
        terminated = submitted
        truncated = not submitted and self.elapsed_steps >= self.max_steps
        reward = 0.0
        if terminated or truncated:
            reward = await self._evaluate()
            ending = (f"Episode over ({'submitted' if submitted else 'step limit'}): "
                      f"{self.last_eval['passed']}/{self.last_eval['total']} hidden tests pass.")
            unanswered.append(ending)
        if unanswered:
            replies.append({"role": "user", "content": "\n".join(unanswered)})
        info = self._info(first_action, not errors, errors[0] if errors else None,
                          len(calls) if isinstance(calls, list) else 0)
        if terminated or truncated:
            self._close_sandbox()
        return replies, reward, terminated, truncated, info

    def _info(self, action: str | None, valid: bool, error: str | None, num_calls: int) -> dict[str, Any]:
        return {
            "action": action, "action_valid": valid, "action_effective": action is not None, "error": error,
            "num_tool_calls": num_calls, "elapsed_steps": self.elapsed_steps,
            "success": bool(self.last_eval.get("success", False)), "raw_obs": self.state_text(),
            **{f"tests_{k}": v for k, v in self.last_eval.items() if k in ("passed", "total")},
        }

    async def _run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        assert self.sandbox is not None
        if name == "bash":
            command = arguments.get("command")
            if set(arguments) != {"command"} or not isinstance(command, str):
                raise _BadCall('bash takes one string argument, like {"command": "ls"}')
            return format_result(await self.sandbox.run(command), self.output_chars)
        try:
            return truncate(editor.edit(self.sandbox, arguments), self.output_chars)
        except editor.EditorError as exc:
            raise _BadCall(str(exc)) from None

    # -- evaluation --------------------------------------------------------------------------------
    async def _evaluate(self) -> float:
        """Run the hidden tests in the sandbox; the fraction that pass."""
        assert self.sandbox is not None and self.task is not None
        task, sandbox = self.task, self.sandbox
        hidden = Path(tempfile.mkdtemp(prefix="arl-hidden-"))
        try:
            hidden.chmod(0o755)  # the sandbox's user reads it (bound read-only for this one command)
            (hidden / task.test_filename).write_text(task.tests)
            shutil.copyfile(RUNNER, hidden / RUNNER.name)
            for path in hidden.iterdir():
                path.chmod(0o644)
            nonce = secrets.token_hex(16)
            command = f"python -I -S -B {hidden / RUNNER.name} {hidden / task.test_filename} {sandbox.cwd}"
            result = await sandbox.run(command, limits=EVAL_LIMITS, stdin=nonce + "\n", read_only=[hidden])
        finally:
            shutil.rmtree(hidden, ignore_errors=True)
        passed = set()
        for line in result.stdout.splitlines():
            tag, _, payload = line.partition(" ")
            if tag == nonce:
                try:
                    name, ok, _detail = json.loads(payload)
                except ValueError:
                    continue
                if ok and name in task.test_names:
                    passed.add(name)
        total = len(task.test_names)
        self.last_eval = {"passed": len(passed), "total": total, "success": len(passed) == total,
                          "status": result.status}
        return len(passed) / total

    # -- state, lifetime ---------------------------------------------------------------------------
    def state_text(self) -> str:
        """The repository's state (GiGPO's anchor): a digest of its files, so equal edits meet."""
        if self.sandbox is None or self.sandbox.closed:
            return ""
        digest = hashlib.sha256()
        root = self.sandbox.workdir
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
                with open(path, "rb") as f:
                    digest.update(os.fsencode(path.relative_to(root)) + b"\0" + f.read(1 << 20) + b"\0")
        return f"repo:{digest.hexdigest()[:16]}"

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.task is None:
            return None
        return self._observation()

    def _close_sandbox(self) -> None:
        self.done = True
        if self.sandbox is not None:
            self.sandbox.close_sync()

    def close(self) -> None:
        self._close_sandbox()
        self.sandbox = None


__all__ = ["EVAL_LIMITS", "TOOLS", "BugFixEnv", "format_result", "truncate"]
