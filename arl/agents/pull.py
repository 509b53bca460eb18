"""PullModeRunner: the agent is a process in a sandbox with no network; the trainer pulls its calls.

ROLL's pull mode, for agents that cannot open a connection to the trainer. The runner starts
``command`` in a sandbox (`arl.sandbox.sandbox.Sandbox`: bubblewrap, no network, a throw-away work
dir; see ``sandbox=``) and then serves it: it repeatedly reads the agent's next pending model
request from the process's stdout, answers it through ``respond`` — the episode's own handler,
the same `ChatHandler` / `MessageTracker` path every proxy episode takes
(`arl.intercept.exchange.responder`) — and writes the response to the process's stdin, until the
agent says the session ended (an end frame carrying its `EpisodeResult`), the process exits, or
``timeout_s`` passes. The agent keeps its stock `openai` client and swaps in a pipe transport
(`arl.agents.pipe_transport`, which also documents the frames)::

    client = openai.AsyncOpenAI(http_client=openai.DefaultAsyncHttpxClient(transport=AsyncPipeTransport()))
    ...
    end_session(result)

The process is started with ``ARL_TRANSPORT=pipe``, ``ARL_SEED``, ``ARL_MODEL``, a placeholder
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (the stock client wants both; the pipe needs neither:
it belongs to this episode), ``env_extra``, and the same minimal slice of the trainer's
environment as push mode (`INHERITED_ENV`, more by name with ``inherit_env``): no secrets.
Requests may overlap; each is answered as soon as the handler returns. Outcomes, all as data
(push mode's rules):

- an end frame with a valid result, then exit 0 -> that result (a process still running
  ``exit_grace_s`` after its end frame is killed; its result stands);
- past the timeout -> status "Timeout", exit reason "timeout";
- exit without an end frame, a non-zero exit, or a malformed result (push mode's rules,
  `EpisodeResult.from_bytes`: scores finite and bounded, the document's size and depth bounded)
  -> status "Failed", exit reason "agent_error", with the tail of the program's output (stderr,
  and stdout lines that were not frames) in ``error``;
- a malformed request frame -> an HTTP 400 (413 past `MAX_BODY`) response to the agent, which
  goes on; a header too broken to name its request is skipped (counted in ``stats``);
- the runner's task cancelled -> the sandbox (the process group) killed.

Tool commands (``tool_isolation``; docs/threat_model.md, "Pull-mode agents"): the agent runs its
model's commands itself, in sandboxes of its own inside its sandbox, where bubblewrap does not
nest. Under ``"uid"`` the runner gives each agent a block of uids other than its own
(`arl.sandbox.bwrap.fresh_uid_block`; under bwrap the agent gets the power to switch to exactly
those, `arl.sandbox.uid_delegation`), and every `arl.sandbox.sandbox.Sandbox` the agent makes runs its
commands as one of them: a command cannot ptrace, signal or read ``/proc/<pid>/environ`` of the
agent, and whatever is left under those uids dies with the episode (`reap_uids`). Commands the
agent starts other than through a `Sandbox` run as the agent. It needs root, and a sandbox in
which the agent can be given the uids (`delegation_problem`) or, under sandbox ``"none"``, the
agent's command (its interpreter) and arl's source readable by other uids (`unreachable_paths`).
``"auto"`` (the default) is ``"uid"`` where it can be and ``"none"`` otherwise, saying why once;
``"uid"`` where it cannot raises ValueError with the reason. Every result carries
``metrics["isolated_uid"]`` (1.0 or 0.0), set by the runner, whatever the agent reported.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from arl.agents import process
from arl.agents.pipe_transport import MAGIC, MAX_BODY, PIPE, TRANSPORT_ENV, header
from arl.agents.process import INHERITED_ENV, REAP_BOUND_S, STDERR_TAIL, agent_env, unreachable_paths
from arl.agents.runner import AgentRunner, EpisodeResult
from arl.sandbox.backends import BACKENDS, choose_backend, open_sandbox
from arl.sandbox.bwrap import bwrap_problem, delegation_problem, fresh_uid_block, reap_uids, release_uid_block
from arl.sandbox.sandbox import SandboxLimits

# (method, path, body) -> (HTTP status, JSON body): the episode's handler behind a raw request.
Respond = Callable[[str, str, bytes], Awaitable[tuple[int, bytes]]]
SandboxFactory = Callable[[], Any]  # () -> an object with Sandbox's spawn / kill / close
BASE_URL = "http://arl-pull.invalid/v1"  # what the agent's client believes it calls (never resolved)
API_KEY = "arl-pull"  # the stock client insists on a key; the pipe is the episode's capability
STDERR_DRAIN_S = 1.0  # after exit, how long to wait for the rest of the output (children may hold it)
# An agent's default address-space limit (RLIMIT_AS). The example gym agent peaks at ~190 MiB
# (openai, numpy, gymnasium imported); each extra thread reserves up to 64 MiB of malloc arena it
# may never touch, so allow several times that. An agent that imports torch passes its own limits.
AGENT_MEMORY_BYTES = 2 * 2**30
# Its process limit (RLIMIT_NPROC): room for the agent's own tool sandboxes. A Sandbox started
# inside this one cannot nest bubblewrap, falls back to isolation "none" and sets its commands'
# limit to (processes running) + its max_procs, which must stay under this hard limit.
AGENT_MAX_PROCS = 1024

_log = logging.getLogger(__name__)


class PullModeRunner(AgentRunner):
    """Runs ``command`` as the agent of one episode and answers its model calls with ``respond``.

    ``sandbox`` is the sandbox backend to ask for (`arl.sandbox.backends`): None (default: the
    configured one, ``rollout.sandbox.backend``, itself ``"auto"`` by default: bubblewrap when it
    can start, else a container runtime, else ``"none"``, warned once with what it loses, network
    access first), ``"bwrap"``, ``"podman"``, ``"docker"`` (or fail), ``"none"``; or a factory
    ``() -> Sandbox`` of your own. The sandbox shows this interpreter and arl's source read-only
    and applies ``limits`` (default: CPU seconds = ``timeout_s``, `AGENT_MEMORY_BYTES` of address
    space, `AGENT_MAX_PROCS` processes, the sandbox's file-size limit); its PATH, HOME and TMPDIR
    replace the trainer's. ``isolation`` says what the last episode ran under.

    ``tool_isolation`` (``"auto"``, ``"uid"``, ``"none"``: see the module docstring) says whether
    the agent's tool commands run as uids other than its own; the chosen one is kept in
    ``tool_isolation``.
    """

    # how the program is told where the model is, named in the error of an episode with no call
    model_address = "the pipe transport of arl.agents.pipe_transport, OPENAI_BASE_URL being a placeholder"

    def __init__(
        self,
        respond: Respond,
        command: Sequence[str],
        *,
        timeout_s: float,
        env_extra: Mapping[str, str] | None = None,
        model: str = "arl",
        inherit_env: Sequence[str] = (),
        sandbox: str | SandboxFactory | None = None,
        limits: SandboxLimits | None = None,
        exit_grace_s: float = 5.0,
        tool_isolation: str = "auto",
    ) -> None:
        super().__init__(None, model)  # no client of its own: the agent's calls arrive over its pipes
        if not command:
            raise ValueError("command must not be empty")
        if not callable(respond):
            raise TypeError("respond must be the episode's responder (arl.intercept.exchange.responder(client))")
        self.respond = respond
        self.command = [str(c) for c in command]
        self.timeout_s = float(timeout_s)
        self.env_extra = dict(env_extra or {})
        self.inherit_env = (*INHERITED_ENV, *inherit_env)
        if sandbox is not None and not callable(sandbox) and sandbox not in BACKENDS:
            raise ValueError(f"sandbox must be one of {BACKENDS} or a factory, got {sandbox!r}")
        self.sandbox = sandbox
        self.limits = limits or SandboxLimits(wall_s=self.timeout_s, cpu_s=self.timeout_s,
                                              memory_bytes=AGENT_MEMORY_BYTES, max_procs=AGENT_MAX_PROCS)
        self.exit_grace_s = float(exit_grace_s)
        self.returncode: int | None = None
        self.isolation: str | None = None  # what the last episode ran under ("bwrap", "none", ...)
        self.stats = {"requests": 0, "malformed_frames": 0}
        self.tool_isolation, why = choose_tool_isolation(tool_isolation, sandbox, self.command)
        if why is not None:
            _warn_no_tool_uids(why)

    async def run_job(self, seed: int) -> EpisodeResult:
        result = await self._run(seed)
        # the runner's word, not the agent's (an agent may report any metrics it likes)
        result.metrics = {**(result.metrics or {}), "isolated_uid": float(self.tool_isolation == "uid")}
        return result

    async def _run(self, seed: int) -> EpisodeResult:
        self.returncode = None
        box = self._sandbox()
        self.isolation = str(getattr(box, "isolation", "none"))
        own = getattr(box, "env", {})  # what the sandbox sets itself (its PATH, HOME, TMPDIR) wins
        env = agent_env([k for k in self.inherit_env if k not in own], self.env_extra, {
            TRANSPORT_ENV: PIPE, "OPENAI_BASE_URL": BASE_URL, "OPENAI_API_KEY": API_KEY,
            "ARL_SEED": str(seed), "ARL_MODEL": self.model,
        })
        output = _Tail(STDERR_TAIL)
        tool_uids = fresh_uid_block() if self.tool_isolation == "uid" else None
        try:
            try:
                if tool_uids is None:  # a factory's sandbox need not know the keyword
                    proc = await box.spawn(self.command, env=env, limits=self.limits)
                else:
                    proc = await box.spawn(self.command, env=env, limits=self.limits, tool_uids=tool_uids)
            except OSError as exc:  # no such program, not executable, ...
                return EpisodeResult(status="Failed", exit_reason="agent_error",
                                     error=f"cannot start the agent {self.command[0]!r}: {exc}")
            with anyio.move_on_after(self.timeout_s):
                return await self._session(proc, output)
            return EpisodeResult(  # only reached when the timeout cancelled the session
                status="Timeout", exit_reason="timeout",
                error=f"agent process ran past {self.timeout_s:g}s and was killed\n{output.text()}".strip(),
            )
        finally:
            with anyio.CancelScope(shield=True):  # kill and reap even while our task is being cancelled
                await box.close()
                if tool_uids is not None:  # what the tool commands left (a daemon) dies with the episode
                    await reap_uids(tool_uids, REAP_BOUND_S)
                    release_uid_block(tool_uids)

    def _sandbox(self) -> Any:
        if callable(self.sandbox):
            return self.sandbox()
        return open_sandbox(self.limits, backend=self.sandbox, python=True, read_only=agent_paths())

    # -- one session -----------------------------------------------------------------------------
    async def _session(self, proc: asyncio.subprocess.Process, output: _Tail) -> EpisodeResult:
        async with anyio.create_task_group() as tg:
            drained = anyio.Event()
            tg.start_soon(output.drain, proc.stderr, drained)
            end = await self._serve(proc, output)
            _close(proc.stdin)  # the agent's reader sees EOF: nothing more will be answered
            if end is None:
                self.returncode = await proc.wait()
            else:
                with anyio.move_on_after(self.exit_grace_s):
                    self.returncode = await proc.wait()
            with anyio.move_on_after(STDERR_DRAIN_S):
                await drained.wait()
            tg.cancel_scope.cancel()
        return self._result(end, output.text())

    async def _serve(self, proc: asyncio.subprocess.Process, output: _Tail) -> bytes | None:
        """Answer request frames until the end frame (its body returned) or EOF (None)."""
        reader, writer = proc.stdout, proc.stdin
        assert reader is not None and writer is not None
        # A line is one of: agent output (no magic: kept for the error tail), the end frame, a
        # request frame (answered in its own task, so calls may overlap), or a broken header.
        async with anyio.create_task_group() as requests:
            try:
                while True:
                    try:
                        line = await reader.readuntil(b"\n")
                    except asyncio.LimitOverrunError as exc:  # a very long line: the agent's output
                        output.add(await reader.read(exc.consumed))
                        continue
                    if not line.startswith(MAGIC + b" "):
                        output.add(line)  # printed before the agent's transport claimed stdout
                        continue
                    fields = line.split()
                    kind = fields[1] if len(fields) > 1 else b""
                    size = _int(fields[-1])
                    if kind == b"end" and len(fields) == 3 and size is not None and 0 <= size <= MAX_BODY:
                        body = await reader.readexactly(size)
                        requests.cancel_scope.cancel()  # calls still pending have no one to answer
                        return body
                    request_id = _int(fields[2]) if kind == b"req" and len(fields) > 2 else None
                    if kind != b"req" or len(fields) != 6 or request_id is None or size is None or size < 0:
                        self.stats["malformed_frames"] += 1
                        _log.debug("pull mode: malformed frame header %r", line[:200])
                        if request_id is not None:  # it names its request: answer so the agent goes on
                            await _send(writer, request_id, 400, _error(f"malformed frame header {line[:200]!r}"))
                        continue
                    self.stats["requests"] += 1
                    if size > MAX_BODY:
                        await _discard(reader, size)
                        await _send(writer, request_id, 413, _error(
                            f"request body of {size} bytes exceeds {MAX_BODY}", "payload_too_large"))
                        continue
                    body = await reader.readexactly(size)
                    method, path = fields[3].decode("ascii", "replace"), fields[4].decode("ascii", "replace")
                    requests.start_soon(self._answer, writer, request_id, method, path, body)
            except asyncio.IncompleteReadError as exc:  # EOF: the agent closed stdout or exited
                output.add(exc.partial)
                requests.cancel_scope.cancel()
                return None

    async def _answer(self, writer: asyncio.StreamWriter, request_id: int, method: str, path: str,
                      body: bytes) -> None:
        try:
            status, payload = await self.respond(method, path, body)
        except Exception as exc:  # noqa: BLE001 -- a responder bug must not end the session
            _log.error("pull mode: responder raised; answering 500", exc_info=True)
            status, payload = 500, _error(f"handler failed: {type(exc).__name__}: {exc}", "handler_error")
        await _send(writer, request_id, status, payload)

    def _result(self, end: bytes | None, output: str) -> EpisodeResult:
        failed = EpisodeResult(status="Failed", exit_reason="agent_error")
        if end is None:
            failed.error = f"agent exited with {self.returncode} without ending the session\n{output}".strip()
            return failed
        try:
            result = EpisodeResult.from_bytes(end)  # bounded, depth-checked, scores finite
        except (ValueError, TypeError) as exc:
            failed.error = f"agent ended the session with a malformed result ({exc})\n{output}".strip()
            return failed
        if self.returncode not in (0, None):  # None: still running after its grace, killed
            result.status, result.exit_reason = "Failed", "agent_error"
            result.error = f"agent exited with {self.returncode}\n{output}".strip()
        return result


def choose_tool_isolation(isolation: str, sandbox: str | SandboxFactory | None,
                          command: Sequence[str]) -> tuple[str, str | None]:
    """("uid" or "none", the reason "uid" was not possible or None) for the tool commands of the
    agent ``command`` (`PullModeRunner`'s ``tool_isolation``) in a sandbox of kind ``sandbox``.
    ``"uid"`` asked for and not possible raises ValueError with the reason; ``"auto"`` falls back
    to ``"none"``."""
    if isolation not in process.ISOLATIONS:
        raise ValueError(f"tool_isolation={isolation!r} is not one of {', '.join(map(repr, process.ISOLATIONS))}")
    if isolation == "none":
        return "none", None
    why = None
    if os.geteuid() != 0:
        why = "the trainer is not root, so it cannot give an agent's tool commands a uid other than the agent's"
    elif callable(sandbox):
        why = "the agent's sandbox comes from a factory of your own, which cannot be asked to set the uids up"
    elif (sandbox := choose_backend(sandbox)) in ("podman", "docker"):
        why = (f"the agent runs in a {sandbox} container, which cannot hand it uids for its tool commands "
               "(that needs the bwrap backend)")
    elif sandbox != "none" and bwrap_problem() is None:
        # the agent runs under bwrap, which shows what it binds to every uid (its parents 0755)
        problem = delegation_problem()
        if problem is not None:
            why = f"the agent cannot be given uids for its tool commands: {problem}"
    else:  # the agent runs as root, unsandboxed: its commands see the host's permissions
        problems = unreachable_paths([*command, *agent_paths()])
        if problems:
            why = ("another uid could not run the agent's interpreter or read arl's source for its tool commands: "
                   + "; ".join(problems) + " (install them where others can read them, e.g. under /usr or /opt, "
                   "or run the agent in the bwrap sandbox)")
    if why is None:
        return "uid", None
    if isolation == "uid":
        raise ValueError(f"tool_isolation='uid': {why}")
    return "none", why


@functools.cache
def _warn_no_tool_uids(why: str) -> None:
    _log.warning("pull-mode agents get no uids for their tool commands: a command its sandbox runs as the "
                 "agent's uid (isolation 'none', as under the bwrap sandbox) can ptrace, signal and read the "
                 "environment of the agent, and so make it report what it likes: %s", why)


def agent_paths() -> tuple[str, ...]:
    """What a sandboxed Python agent must read besides this interpreter (`Sandbox(python=True)`):
    arl's own source (an editable install points there) and the ``PYTHONPATH`` entries."""
    import arl

    paths = [str(Path(arl.__file__).resolve().parent.parent),
             *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.exists(p)))


class _Tail:
    """The last ``limit`` bytes of the agent's output (stderr, and stdout lines that were not frames)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()

    def add(self, data: bytes) -> None:
        self._buf += data
        del self._buf[:-self.limit]

    async def drain(self, stream: asyncio.StreamReader | None, done: anyio.Event) -> None:
        try:
            while stream is not None and (chunk := await stream.read(1 << 16)):
                self.add(chunk)
        finally:
            done.set()

    def text(self) -> str:
        return self._buf.decode("utf-8", errors="replace")


def _int(field: bytes) -> int | None:
    try:
        return int(field)
    except ValueError:
        return None


def _error(message: str, code: str = "malformed_frame") -> bytes:
    """An OpenAI-shaped error body (the proxy's shape) for frames that never reach the handler."""
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()


async def _send(writer: asyncio.StreamWriter, request_id: int, status: int, body: bytes) -> None:
    """Write one response frame; an agent that is gone just misses it."""
    try:
        writer.write(header("res", request_id, status, len(body)) + body)
        await writer.drain()
    except (ConnectionError, RuntimeError):  # broken pipe, or the transport already closed
        pass


async def _discard(reader: asyncio.StreamReader, size: int) -> None:
    while size > 0:
        chunk = await reader.read(min(size, 1 << 16))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(chunk)


def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        try:
            writer.close()
        except (ConnectionError, RuntimeError):
            pass


__all__ = ["AGENT_MAX_PROCS", "AGENT_MEMORY_BYTES", "API_KEY", "BASE_URL", "PullModeRunner", "Respond", "agent_paths",
           "choose_tool_isolation"]
