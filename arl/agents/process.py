"""PushModeRunner: the agent is a separate OS process that calls the HTTP proxy.

Any program that uses the stock `openai` client works: it is started with

- ``OPENAI_BASE_URL`` = the proxy's base URL and ``OPENAI_API_KEY`` = the episode's env id
  (both read by ``openai.AsyncOpenAI()`` / ``openai.OpenAI()`` with no arguments),
- ``ARL_SEED`` = the episode seed, ``ARL_MODEL`` = the model name to send,
- ``ARL_RESULT_PATH`` = where to write its episode result as JSON (the fields of
  `EpisodeResult`: ``score``, ``success``, ``step_scores``, ``status``, ``exit_reason``, ...),

in its own process group, with a *minimal* environment: the variables above, ``env_extra``, and
only the harmless basics of the trainer's own environment (`INHERITED_ENV`: PATH, HOME, locale,
TMPDIR, VIRTUAL_ENV, PYTHONPATH; more by name with ``inherit_env``), and agent frameworks'
telemetry switched off (`TELEMETRY_OFF`, e.g. ``OPENAI_AGENTS_DISABLE_TRACING=1``; either of the
others overrides it). The agent may run
model-written code: it must not see the trainer's secrets (API keys, tokens, credentials). The runner waits for it; past ``timeout_s`` (or when the runner's
task is cancelled) it kills the whole group. Outcomes, all as data:

- exit 0 with a valid result -> that result;
- past the timeout -> status "Timeout", exit reason "timeout";
- non-zero exit, or no / malformed result -> status "Failed", exit reason "agent_error", with
  the tail of the program's stderr in ``error``. Malformed includes a score that is not a
  finite number within `arl.agents.runner.MAX_ABS_SCORE`, a document past `MAX_RESULT_BYTES`
  or `MAX_RESULT_DEPTH`, and a result path that is not a regular file
  (`EpisodeResult.from_bytes`).

See ``arl/agents/examples/gym_agent.py`` for such a program.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from arl.agents.runner import MAX_RESULT_BYTES, AgentRunner, ChatClient, EpisodeResult
from arl.envs.hostfs import remove_tree

STDERR_TAIL = 4000  # characters of the program's stderr kept in EpisodeResult.error
# What an agent process inherits from the trainer's environment (nothing else: no secrets).
INHERITED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH")
# Agent frameworks' telemetry, off by default in every agent process: openai-agents' tracing would
# send the prompts and the episode's bearer token (its OPENAI_API_KEY) to api.openai.com; the
# others phone home usage data. Overridable: an inherited (`inherit_env`) or `env_extra` value wins.
TELEMETRY_OFF = {
    "OPENAI_AGENTS_DISABLE_TRACING": "1",  # openai-agents
    "LANGCHAIN_TRACING_V2": "false", "LANGSMITH_TRACING": "false",  # langchain / LangSmith
    "HF_HUB_DISABLE_TELEMETRY": "1",  # huggingface_hub (smolagents)
    "GRADIO_ANALYTICS_ENABLED": "False",  # gradio (smolagents' UI)
    "LOGFIRE_SEND_TO_LOGFIRE": "false",  # logfire (pydantic-ai's instrumentation)
    "OTEL_SDK_DISABLED": "true",  # OpenTelemetry SDKs (crewai, openinference instrumentations)
    "CREWAI_DISABLE_TELEMETRY": "true", "HAYSTACK_TELEMETRY_ENABLED": "False",
    "ANONYMIZED_TELEMETRY": "False",  # chromadb and friends
    "SCARF_NO_ANALYTICS": "true", "DO_NOT_TRACK": "1",  # the cross-tool conventions
}


class PushModeRunner(AgentRunner):
    """Runs ``command`` as the agent of one episode, pointed at ``client``'s server.

    ``client`` is an HTTP OpenAI client (``openai.AsyncOpenAI(base_url=proxy.base_url,
    api_key=env_id)``): the runner passes its ``base_url`` and ``api_key`` to the process and
    never calls it itself. ``env_extra`` adds environment variables, ``inherit_env`` names more of
    the trainer's to pass through; ``cwd`` is the working dir.
    """

    def __init__(
        self,
        client: ChatClient,
        command: Sequence[str],
        *,
        timeout_s: float,
        env_extra: Mapping[str, str] | None = None,
        model: str = "arl",
        cwd: str | os.PathLike[str] | None = None,
        inherit_env: Sequence[str] = (),
    ) -> None:
        super().__init__(client, model)
        if not command:
            raise ValueError("command must not be empty")
        base_url = str(getattr(client, "base_url", "") or "")
        if not base_url.startswith(("http://", "https://")) or "arl.inprocess" in base_url:
            raise ValueError(f"PushModeRunner needs an HTTP client (a ProxyServer's base_url), got {base_url!r}")
        self.command = [str(c) for c in command]
        self.timeout_s = float(timeout_s)
        self.env_extra = dict(env_extra or {})
        self.inherit_env = (*INHERITED_ENV, *inherit_env)
        self.cwd = cwd
        self.base_url = base_url.rstrip("/")
        self.api_key = str(client.api_key)
        self.returncode: int | None = None

    async def run_job(self, seed: int) -> EpisodeResult:
        workdir = Path(tempfile.mkdtemp(prefix="arl-agent-"))
        result_path, stderr_path = workdir / "result.json", workdir / "stderr.txt"
        env = agent_env(self.inherit_env, self.env_extra, {
            "OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key,
            "ARL_SEED": str(seed), "ARL_MODEL": self.model, "ARL_RESULT_PATH": str(result_path),
        })
        proc: asyncio.subprocess.Process | None = None
        try:
            with open(stderr_path, "wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    *self.command, env=env, cwd=self.cwd, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                )
                try:
                    self.returncode = await asyncio.wait_for(proc.wait(), self.timeout_s)
                except TimeoutError:
                    await _kill_group(proc)
                    return EpisodeResult(
                        status="Timeout", exit_reason="timeout",
                        error=f"agent process ran past {self.timeout_s:g}s and was killed",
                    )
            return self._result(result_path, _tail(stderr_path))
        finally:
            if proc is not None and proc.returncode is None:  # cancelled while waiting
                await _kill_group(proc)
            # whatever the agent left there (too deep for shutil.rmtree, 100k files): in a worker
            # thread, not on the event loop; the thread finishes it even if this task is cancelled
            await asyncio.to_thread(remove_tree, workdir)

    def _result(self, path: Path, stderr: str) -> EpisodeResult:
        failed = EpisodeResult(status="Failed", exit_reason="agent_error")
        try:
            result = EpisodeResult.from_bytes(_read_result(path))  # bounded, depth-checked, scores finite
        except FileNotFoundError:
            failed.error = f"agent exited with {self.returncode} without writing a result\n{stderr}".strip()
            return failed
        except (ValueError, TypeError, OSError) as exc:  # OSError: a symlink, unreadable
            failed.error = f"agent wrote a malformed result ({exc})\n{stderr}".strip()
            return failed
        if self.returncode != 0:
            result.status, result.exit_reason = "Failed", "agent_error"
            result.error = f"agent exited with {self.returncode}\n{stderr}".strip()
        return result


def _read_result(path: Path) -> bytes:
    """The result file's bytes, at most `MAX_RESULT_BYTES` + 1 of them. The agent chose what is at
    that path: a FIFO would block the event loop forever and /dev/zero would never end, so only a
    regular file is read (opened non-blocking, checked with fstat, a symlink not followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("the result path is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_RESULT_BYTES + 1)
    finally:
        os.close(fd)


def agent_env(inherit: Sequence[str], extra: Mapping[str, str], protocol: Mapping[str, str]) -> dict[str, str]:
    """An agent process's whole environment: `TELEMETRY_OFF`, then the named variables of ours
    that are set (``inherit``: `INHERITED_ENV` and the user's additions), then ``extra``, then the
    mode's ``protocol`` variables, which win. Nothing else of the trainer's environment reaches it."""
    return {**TELEMETRY_OFF, **{k: os.environ[k] for k in inherit if k in os.environ}, **extra, **protocol}


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the agent's process group (its children too) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    with anyio.CancelScope(shield=True):  # reap it even while our task is being cancelled
        await proc.wait()


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - STDERR_TAIL))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def write_result(result: EpisodeResult | Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> None:
    """For agent programs: write the episode result where ``ARL_RESULT_PATH`` says (atomically)."""
    target = Path(path or os.environ["ARL_RESULT_PATH"])
    data = result.to_json() if isinstance(result, EpisodeResult) else dict(result)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(target)
