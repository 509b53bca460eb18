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

Reward: 0 per step; at ``submit()`` or at the step limit, the env's reward spec (``reward_spec``,
`arl.envs.reward_spec`) scores the live sandbox, by default the fraction of the task's hidden tests
that pass after the agent's last action (`arl.envs.bugfix.judge.HiddenTestsSpec`: each test in its
own sandboxed process of a fresh sandbox, the pass/fail decided on the host, the judged code never
sees an expected value). A spec that cannot decide (past its timeout, a dead sandbox, a judge that
cannot start) raises its `arl.envs.reward_spec.RewardError` instead of scoring 0, and a sandbox
that dies mid-episode raises `SandboxDied`: the runner ends the episode as ``env_error``, masked
from the loss. With bwrap the arl package is hidden from every command, so the task generator
cannot be read back. A sandbox is made at reset, started at the first step, and stopped after the
reward (`arl.envs.reward_spec.ScoredSandbox`; at the next reset or close if the episode never
ends). The last step's ``info["final_files"]`` holds the files the tests read, for `rescore_episode`.

A heavy-tailed test time (``test_latency``, off by default): ``{alpha, scale_s, cap_s}``
(`arl.envs.latency.ParetoLatency`; a config's ``rollout.manager.env_kwargs.test_latency``) models
a test suite whose slow test waits, as one waiting on a slow fixture or service does: the task's
first hidden test sleeps, in its sandboxed process, min(cap_s, scale_s x Pareto(alpha)) seconds
before its call, drawn from the task's seed (`arl.envs.bugfix.judge.latency_key`), so every run
and every member of a group waits the same for a task, and half the tasks wait more than
``scale_s * 2 ** (1 / alpha)``. It changes how long the reward takes, never what it is; a bad
value raises ValueError, and so does giving it beside a ``reward_spec`` of your own.

Sync and async: gymnasium's ``step`` is synchronous and runs the sandbox commands to completion
(in a private event loop; from inside a running loop, in a worker thread, blocking the caller).
Agent runners await ``astep`` instead, so that one episode's ``sleep 10`` does not stall every
other episode sharing the event loop (commands take 5 ms to the wall limit, 10 s by default).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import reprlib
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from arl.envs.bugfix import editor
from arl.envs.bugfix.judge import HiddenTestsSpec
from arl.envs.bugfix.tasks import BugFixTask, generate_task
from arl.envs.latency import ParetoLatency
from arl.envs.reward_spec import RewardSpec, ScoredSandbox
from arl.sandbox.backends import open_sandbox
from arl.sandbox.hostfs import encodable, tree_digest
from arl.sandbox.sandbox import CommandResult, Sandbox, SandboxDied, SandboxLimits

RUNNER = Path(__file__).with_name("run_tests.py")
ARL_PACKAGE = Path(__file__).resolve().parents[2]  # hidden inside the sandbox: it holds the task generator
TOOL_NAMES = ("bash", "editor", "submit")
MAX_ARGUMENT_CHARS = 1 << 17
MAX_ARGUMENT_DEPTH = 8  # the tools take flat objects (view_range is the deepest: a list of ints)
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
        "oom": "[killed: out of memory]",
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
    _check_text(arguments)
    return name, arguments


def _check_text(arguments: dict[str, Any]) -> None:
    """Refuse argument text no tool can take: a NUL byte (no path or command line holds one) or
    a lone surrogate (not encodable, so not a file's text or a name). Walked without recursion,
    to `MAX_ARGUMENT_DEPTH` levels (a dict handed in directly has no JSON size limit)."""
    stack: list[tuple[Any, int]] = [(arguments, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if "\0" in value:
                raise _BadCall("arguments must not contain NUL characters")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _BadCall("arguments must be valid Unicode (no lone surrogates)") from None
        elif isinstance(value, dict | list):
            if depth >= MAX_ARGUMENT_DEPTH:
                raise _BadCall(f"arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels")
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)


def _run_sync(coroutine: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # inside a loop: a loop of our own, in a thread
        return pool.submit(asyncio.run, coroutine).result()


def _is_reply(message: Any) -> bool:
    if not isinstance(message, dict) or not all(isinstance(value, str) for value in message.values()):
        return False
    keys = {"role", "tool_call_id", "content"} if message.get("role") == "tool" else {"role", "content"}
    return message.get("role") in ("tool", "user") and message.keys() == keys


class Observations(spaces.Space):
    """What the env observes: the issue (``text``) at reset, then each step's reply messages, a list
    of ``{"role": "tool", "tool_call_id": ..., "content": ...}`` and ``{"role": "user", "content":
    ...}`` dicts of strings. No gymnasium space holds both kinds, and `spaces.Dict` needs one key set."""

    def __init__(self, text: spaces.Text) -> None:
        super().__init__()
        self.text = text

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return self.text.contains(x)
        return isinstance(x, list) and all(_is_reply(message) for message in x)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return self.text.sample(mask, probability)

    def seed(self, seed: int | None = None) -> int | list[int] | dict[str, int]:
        return self.text.seed(seed)


# Pull mode runs this env inside the agent's own sandbox, where bubblewrap cannot nest: the tool
# sandbox is "none", so the model's commands read arl's source (the task generator: the hidden
# tests rebuilt), and reach the agent process that reports the score. Refused, not warned about:
# a reward the model can read or write trains reward hacking. (`arl.rollout.runners` refuses the
# combination before any agent starts; this is the same rule for agent programs started otherwise.)
PULL_MODE_REFUSAL = (
    "arl/BugFix-v0 in pull mode has no hidden tests: the env runs inside the agent's sandbox, its "
    "tool sandbox falls back to isolation 'none' there, and the model's commands can read arl's task "
    "generator and the agent process that reports the score. Run BugFix in push mode "
    "(rollout.proxy.runner: push, or arl.agents.bugfix:bugfix_runner), or pass "
    "allow_unhidden_tests=True to test the mechanics only (its rewards are not to be trained on)."
)


class HiddenTestsUnavailable(RuntimeError):
    """The env cannot keep its tests hidden from the agent here (see `PULL_MODE_REFUSAL`)."""


class BugFixEnv(gym.Env):
    """One generated bug-fix task per seed (`arl.envs.bugfix.tasks`) in a fresh sandbox."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}  # an fps as the games declare: gymnasium's checker asks

    def __init__(
        self, *, max_steps: int = 20, limits: SandboxLimits | None = None, isolation: str | None = None,
        output_chars: int = 4000, render_mode: str | None = None, allow_unhidden_tests: bool = False,
        reward_spec: RewardSpec | None = None, test_latency: ParetoLatency | Mapping[str, Any] | None = None,
    ) -> None:
        self.max_steps = max_steps
        if test_latency is not None and reward_spec is not None:
            raise ValueError("test_latency sets the default reward's (HiddenTestsSpec) slow test; with a reward_spec "
                             "of your own, pass HiddenTestsSpec(test_latency=...) as it, or leave test_latency out")
        # the reward (arl.envs.reward_spec); not ``spec``, which is gymnasium's EnvSpec
        self.reward_spec = reward_spec if reward_spec is not None else HiddenTestsSpec(test_latency=test_latency)
        self.allow_unhidden_tests = bool(allow_unhidden_tests)  # see PULL_MODE_REFUSAL
        self.limits = limits or SandboxLimits()
        self.isolation = isolation
        self.output_chars = output_chars
        self.render_mode = render_mode
        self.tools = TOOLS
        # Text both ways (printable ASCII as the nominal charset): the observation is the issue,
        # the action an assistant message (a dict, or its JSON); step returns reply messages.
        self.observation_space = Observations(spaces.Text(max_length=1 << 16, min_length=0, charset=string.printable))
        self.action_space = spaces.Text(max_length=MAX_ARGUMENT_CHARS, min_length=0, charset=string.printable)
        self.task: BugFixTask | None = None
        self.sandbox: Sandbox | None = None
        self.episode: ScoredSandbox | None = None  # the sandbox and its reward, in arl's order
        self.started = False
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
        self.task = self._load_task(task_seed)
        # the sandbox backend (arl.sandbox.backends): None is the configured one (rollout.sandbox.backend)
        self.sandbox = open_sandbox(self.limits, backend=self.isolation, python=True, hide=[ARL_PACKAGE])
        if self.sandbox.isolation == "none" and os.environ.get("ARL_TRANSPORT") == "pipe" and not self.allow_unhidden_tests:
            self.close()
            raise HiddenTestsUnavailable(PULL_MODE_REFUSAL)
        self._write_task()
        self.episode = ScoredSandbox(self.sandbox, self.reward_spec, self.task)
        self.elapsed_steps, self.done, self.last_eval, self.started = 0, False, {}, False
        observation = self._observation()
        return observation, {"raw_obs": self.state_text(), "task_seed": task_seed,
                             "isolation": self.sandbox.isolation}

    def _load_task(self, seed: int) -> Any:
        """Seed's task (a subclass with other tasks overrides this and `_write_task`)."""
        return generate_task(seed)

    def _final_files(self) -> dict[str, str]:
        """The work dir's files the reward reads (`final_sources`), as text: the last step's
        ``info["final_files"]``, what `rescore_episode` scores again (a subclass whose reward reads
        other files overrides this)."""
        assert self.sandbox is not None
        return final_sources(self.sandbox.workdir)

    def _write_task(self) -> None:
        """Put the task's files into the fresh sandbox's work dir."""
        assert self.sandbox is not None and self.task is not None
        for name, text in self.task.files.items():
            self.sandbox.write_file(name, text)

    def step(self, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        return _run_sync(self.astep(action))

    async def astep(self, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """``step`` for callers inside an event loop (the sandbox commands are awaited)."""
        if self.done or self.sandbox is None:
            body = "Error: the episode is over; call reset()."
            return [{"role": "user", "content": body}], 0.0, True, False, self._info(None, False, body, 0)
        self.elapsed_steps += 1
        if not self.started and self.episode is not None:
            await self.episode.start()  # start -> agent -> reward -> stop (arl.envs.reward_spec.ScoredSandbox)
            self.started = True
        message = action if isinstance(action, dict) else None
        if isinstance(action, str):  # the action space is text: an assistant message as JSON
            try:
                message = json.loads(action)
            except (ValueError, RecursionError):
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
                replies.append({"role": "tool", "tool_call_id": encodable(call_id), "content": encodable(text)})
            else:
                unanswered.append(text)
        if errors and not calls:
            unanswered.append(f"Error: {errors[0]}.")
        terminated = submitted
        truncated = not submitted and self.elapsed_steps >= self.max_steps
        reward = 0.0
        # The state digest reads the work dir: in a worker thread, so that a flooded one (bounded
        # by `hostfs.MAX_DIGEST_ENTRIES`) stalls no other episode on the event loop. Taken before
        # the reward, which stops the sandbox (the judge reads the work dir and leaves it as it is).
        raw_obs = await asyncio.to_thread(self.state_text)
        final_files: dict[str, str] | None = None
        if terminated or truncated:
            final_files = await asyncio.to_thread(self._final_files)
            reward = await self._evaluate()
            ending = (f"Episode over ({'submitted' if submitted else 'step limit'}): "
                      f"{self.last_eval['passed']}/{self.last_eval['total']} hidden tests pass.")
            unanswered.append(ending)
        if unanswered:
            replies.append({"role": "user", "content": encodable("\n".join(unanswered))})
        info = self._info(first_action, not errors, errors[0] if errors else None,
                          len(calls) if isinstance(calls, list) else 0, raw_obs)
        if final_files is not None:
            info["final_files"] = final_files  # what `rescore_episode` scores again under a changed spec
        return replies, reward, terminated, truncated, info

    def _info(self, action: str | None, valid: bool, error: str | None, num_calls: int,
              raw_obs: str | None = None) -> dict[str, Any]:
        return {
            "action": action, "action_valid": valid, "action_effective": action is not None, "error": error,
            "num_tool_calls": num_calls, "elapsed_steps": self.elapsed_steps,
            "success": bool(self.last_eval.get("success", False)),
            "raw_obs": self.state_text() if raw_obs is None else raw_obs,
            **{f"tests_{k}": v for k, v in self.last_eval.items() if k in ("passed", "total")},
            **({"reward_extra": self.last_eval["extra"]} if self.last_eval.get("extra") else {}),
        }

    async def _run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        assert self.sandbox is not None
        if name == "bash":
            command = arguments.get("command")
            if set(arguments) != {"command"} or not isinstance(command, str):
                raise _BadCall('bash takes one string argument, like {"command": "ls"}')
            result = await self.sandbox.run(command)
            if result.status == "error" and not await self.sandbox.alive():  # the sandbox's fault, not the agent's
                self.done = True
                if self.episode is not None:
                    await self.episode.abort()
                raise SandboxDied(f"the episode's sandbox {self.sandbox!r} died mid-episode ({result.error}): the "
                                  "episode ends without a reward; check the host's OOM and container logs, or raise "
                                  "the sandbox's memory limit")
            return format_result(result, self.output_chars)
        try:
            # host-side file work (up to MAX_FILE_BYTES, a bounded listing) off the event loop
            return truncate(await asyncio.to_thread(editor.edit, self.sandbox, arguments), self.output_chars)
        except editor.EditorError as exc:
            raise _BadCall(str(exc)) from None

    # -- evaluation --------------------------------------------------------------------------------
    async def _evaluate(self) -> float:
        """The episode's reward: ``self.reward_spec`` on the live sandbox, then the sandbox stopped
        (`arl.envs.reward_spec.ScoredSandbox.finish`; by default the hidden tests,
        `arl.envs.bugfix.judge.HiddenTestsSpec`). A spec that cannot decide (its timeout, a dead
        sandbox, a judge that cannot start) ends the episode and raises its
        `arl.envs.reward_spec.RewardError`: no reward is better than a silent 0."""
        assert self.episode is not None
        self.done = True
        result = await self.episode.finish()
        self.last_eval = {"passed": result.passed, "total": result.total, "success": result.success, "status": "ok",
                          "extra": result.metrics}
        return float(result.score)

    # -- state, lifetime ---------------------------------------------------------------------------
    def state_text(self) -> str:
        """The repository's state (GiGPO's anchor): a digest of its files, so equal edits meet."""
        if self.sandbox is None or self.sandbox.closed:
            return ""
        # Bounded (`arl.sandbox.hostfs`: at most MAX_DIGEST_ENTRIES entries, MAX_DIGEST_BYTES read,
        # MAX_DIGEST_DEPTH levels); a work dir beyond that is the one state "repo:over-budget".
        return f"repo:{tree_digest(self.sandbox.workdir)[:16]}"

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


def final_sources(workdir: Path) -> dict[str, str]:
    """The work dir's files the hidden tests read (`arl.envs.bugfix.judge.copy_sources`: the
    top-level ``*.py`` files, bounded), as text: stored with the episode's last step
    (``info["final_files"]``) so that a changed spec can score it again (`rescore_episode`)."""
    import tempfile

    from arl.envs.bugfix.judge import copy_sources

    with tempfile.TemporaryDirectory(prefix="arl-final-") as into:
        return {name: (Path(into) / name).read_bytes().decode("utf-8", "surrogateescape")
                for name in copy_sources(workdir, Path(into))}


async def rescore_episode(seed: int, files: dict[str, str], spec: RewardSpec | None = None, *,
                          limits: SandboxLimits | None = None, isolation: str | None = None, task: Any = None) -> Any:
    """Score a stored BugFix episode again without replaying it: task ``seed``'s final ``files``
    (`final_sources`, stored as ``info["final_files"]``) written into a fresh sandbox and scored by
    ``spec`` (None: the current `HiddenTestsSpec`). ``task``: the spec's task record (None: BugFix's
    task of ``seed``; `arl.envs.realbugs.env.rescore_episode` passes its own). Returns its
    `arl.envs.reward_spec.RewardResult`; a spec that cannot decide raises its
    `arl.envs.reward_spec.RewardError`."""
    from arl.envs.reward_spec import rescore_files

    sandbox = open_sandbox(limits or SandboxLimits(), backend=isolation, python=True, hide=[ARL_PACKAGE])
    data = {name: text.encode("utf-8", "surrogateescape") for name, text in files.items()}
    return await rescore_files(spec if spec is not None else HiddenTestsSpec(),
                               generate_task(int(seed)) if task is None else task, data, sandbox)


__all__ = ["EVAL_LIMITS", "PULL_MODE_REFUSAL", "TOOLS", "BugFixEnv", "HiddenTestsUnavailable", "final_sources", "format_result", "rescore_episode",
           "truncate"]
