"""PushModeRunner: the agent is a separate OS process that calls the HTTP proxy.

Any program that uses the stock `openai` client works: it is started with

- ``OPENAI_BASE_URL`` = the proxy's base URL and ``OPENAI_API_KEY`` = the episode key
  (both read by ``openai.AsyncOpenAI()`` / ``openai.OpenAI()`` with no arguments), and the base
  URL again as ``OPENAI_API_BASE``, the older name some frameworks read instead (LlamaIndex's
  ``OpenAI`` / ``OpenAILike``: without it they call api.openai.com with the episode key),
- ``ARL_SEED`` = the episode seed, ``ARL_MODEL`` = the model name to send,
- ``ARL_RESULT_PATH`` = where to write its episode result as JSON (the fields of
  `EpisodeResult`: ``score``, ``success``, ``step_scores``, ``status``, ``exit_reason``, ...),

in its own process group, under limits (``limits``, `push_limits`: CPU seconds, address space,
file size and processes as rlimits it cannot raise, and as root all its processes together in a
cgroup of their own, `arl.sandbox.cgroups`), with a *minimal* environment: the variables above, ``env_extra``, and
only the harmless basics of the trainer's own environment (`INHERITED_ENV`: PATH, HOME, locale,
TMPDIR, VIRTUAL_ENV, PYTHONPATH; more by name with ``inherit_env``), and agent frameworks'
telemetry switched off (`TELEMETRY_OFF`, e.g. ``OPENAI_AGENTS_DISABLE_TRACING=1``) with their
downloads at import and interactive first runs (`NETWORK_OFF`, e.g.
``LITELLM_LOCAL_MODEL_COST_MAP=True``; either of the others overrides each). Its client-side
response caches live in the episode's own work dir and die with it (`cache_env`: ``DSPY_CACHEDIR``, ``DSP_CACHEDIR`` and ``XDG_CACHE_HOME`` there, the model
caches ``HF_HOME``, ``TORCH_HOME``, ``UV_CACHE_DIR``, ``PIP_CACHE_DIR`` left at ``$HOME/.cache``;
``env_extra`` / ``inherit_env`` override each): a cached reply would answer a later episode's
prompt without a call, and that episode would end NoData. The agent may run
model-written code: it must not see the trainer's secrets (API keys, tokens, credentials). The runner waits for it; past ``timeout_s`` (or when the runner's
task is cancelled) it kills the whole group. Outcomes, all as data:

- exit 0 with a valid result -> that result;
- past the timeout -> status "Timeout", exit reason "timeout";
- non-zero exit, or no / malformed result -> status "Failed", exit reason "agent_error", with
  the tail of the program's stderr in ``error``. Malformed includes a score that is not a
  finite number within `arl.agents.runner.MAX_ABS_SCORE`, a document past `MAX_RESULT_BYTES`
  or `MAX_RESULT_DEPTH`, and a result path that is not a regular file
  (`EpisodeResult.from_bytes`). A return code that is a limit's signal says which limit.

The agent controls its work dir, so what the trainer reads back is never opened by a name the
agent chose: its stderr goes to an unnamed file the trainer made and reads through its own fd, and
the result is opened relative to the dir fd taken before the spawn, non-blocking, without
following a link, a regular file (under a uid, the agent's own) read bounded, in a worker thread.
The work dir lies in a dir of the trainer's, so the agent cannot swap the dir itself either.

Isolation (``isolation``; docs/threat_model.md, "Push-mode agents"): under ``"uid"`` each agent
process runs as a uid of its own (`arl.sandbox.bwrap.fresh_uid`, its own group, no supplementary
groups), with its work dir chowned to it and ``HOME`` pointed there, and every process left under
that uid is killed when the episode ends (`reap_uid`: a daemon that left the process group too).
The kernel then keeps a sibling's or the trainer's ``/proc/<pid>/environ`` (the bearer token,
secrets) from it, and keeps it from signalling or ptracing them or writing their files. It needs
root, and an agent that an unprivileged uid can run: every path of ``command`` (the executable, its
``#!`` interpreter, the real file behind a venv's ``python`` link, each argument that names an
existing path) and ``cwd`` reachable by others (`unreachable_paths`). ``"auto"`` (the default) is
``"uid"`` where both hold and ``"none"`` otherwise, saying why once; ``"none"`` runs the agent as
the trainer's user, not isolated from its siblings (the result's ``metrics["isolated_uid"]`` says
which: 1.0 or 0.0).

See ``arl/agents/examples/gym_agent.py`` for such a program.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from arl.agents.runner import MAX_RESULT_BYTES, AgentRunner, ChatClient, EpisodeResult
from arl.sandbox.bwrap import fresh_uid, reap_uid, release_uid, setpriv_argv
from arl.sandbox.cgroups import Cgroup, cgroup_problem
from arl.sandbox.hostfs import remove_tree
from arl.sandbox.rlimits import SandboxLimits, limits_prefix

log = logging.getLogger(__name__)

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
    "AGNO_TELEMETRY": "false",  # agno: its agent/team run events posted to agno's API
    "CREWAI_TRACING_ENABLED": "false",  # crewai: execution traces uploaded to app.crewai.com
    "AUTOGEN_DISABLE_RUNTIME_TRACING": "true",  # autogen-core: the agent runtime's OpenTelemetry spans
}
# Other framework defaults that reach the network or the terminal, off in every agent process and
# overridable the same way (`agent_env`): an agent's sandbox may have no network (pull mode) or no
# TTY, and a download at import costs every episode its timeout.
NETWORK_OFF = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm (DSPy, mini-swe-agent, crewai): no price-map download at import
    "MSWEA_COST_TRACKING": "ignore_errors",  # mini-swe-agent: no abort on a model litellm has no price for
    "MSWEA_CONFIGURED": "true",  # mini-swe-agent: no interactive first-run setup wizard (aborts without a TTY)
}
# Response caches that answer a prompt seen before on the client side: a group's members share a
# seed, hence their prompts, so with a cache that outlives the episode only the first member's
# calls reach arl and the others end NoData. Each agent gets them inside its episode's work dir,
# removed with it. DSPy's (on by default); DSP_CACHEDIR is DSPy < 2.5's joblib cache.
RESPONSE_CACHE_DIRS = {"DSPY_CACHEDIR": "dspy", "DSP_CACHEDIR": "dsp"}
# XDG_CACHE_HOME goes there too (tools that keep their caches by platformdirs), but these model
# and package caches default to $XDG_CACHE_HOME/<name>: they are pinned where they resolve without
# it ($HOME/.cache/<name>), so that no agent downloads its model or packages again per episode.
MODEL_CACHE_DIRS = {"HF_HOME": "huggingface", "TORCH_HOME": "torch", "UV_CACHE_DIR": "uv", "PIP_CACHE_DIR": "pip"}
ISOLATIONS = ("auto", "uid", "none")
RESULT_NAME = "result.json"  # in the agent's work dir (ARL_RESULT_PATH)
# An agent's default limits (`PushModeRunner` ``limits``; docs/threat_model.md): CPU seconds =
# ``timeout_s``, and these. RLIMIT_AS per process: the example gym agent peaks at ~190 MiB, each
# thread may reserve 64 MiB of malloc arena it never touches, agent frameworks import more (an
# agent that imports torch passes its own). All its processes together, as root: a cgroup.
AGENT_MEMORY_BYTES = 4 * 2**30
AGENT_TOTAL_MEMORY_BYTES = 4 * 2**30
AGENT_FILE_SIZE_BYTES = 256 * 2**20  # RLIMIT_FSIZE: any one file it writes, its stderr included
AGENT_MAX_PROCS = 1024  # RLIMIT_NPROC (threads count) and the cgroup's pids.max, tool subprocesses included
# the signals that a limit kills with, named in the error
_LIMIT_SIGNALS = {signal.SIGXCPU: "SIGXCPU: past its CPU-time limit", signal.SIGXFSZ: "SIGXFSZ: past its file-size limit",
                  signal.SIGKILL: "SIGKILL: past its memory or CPU limit, or killed"}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
REAP_BOUND_S = 5.0  # how long the leftovers of an agent's uid may take to die
_said: set[str] = set()  # why "auto" fell back to "none", said once per reason


def unreachable_paths(command: Sequence[str], cwd: str | os.PathLike[str] | None = None,
                      path_env: str | None = None) -> list[str]:
    """What an unprivileged uid could not use of ``command`` run in ``cwd``: one line per path
    (the executable, its ``#!`` interpreter, the real file behind a link, each argument that names
    an existing path, ``cwd``) whose file or some directory above it others may not read/enter.
    Empty: nothing found in the way (the agent may still need paths no argument names)."""
    problems: list[str] = []
    search = path_env if path_env is not None else os.environ.get("PATH")
    exe = shutil.which(command[0], path=search)
    if exe is None:
        return [f"{command[0]}: not found on PATH"]
    targets = [(exe, True)]
    try:  # a script: its interpreter (and the program `env` looks up) must be runnable too
        with open(os.path.realpath(exe), "rb") as f:
            head = f.readline(256)
        if head.startswith(b"#!"):
            words = head[2:].decode(errors="replace").split()
            if words:
                targets.append((words[0], True))
                if os.path.basename(words[0]) == "env" and len(words) > 1:
                    found = shutil.which(words[1], path=search)
                    targets.append((found or words[1], True))
    except OSError:
        pass
    targets += [(arg, False) for arg in command[1:] if os.sep in arg and os.path.exists(arg)]
    if cwd is not None:
        targets.append((str(cwd), True))
    for path, execute in targets:
        for p in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
            why = _others_cannot(p, execute)
            if why:
                problems.append(f"{path}: {why}")
                break
    return problems


def _others_cannot(path: str, execute: bool) -> str | None:
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot stat ({exc.strerror})"
    directory = stat.S_ISDIR(st.st_mode)
    need = stat.S_IROTH | (stat.S_IXOTH if execute or directory else 0)
    if st.st_mode & need != need:
        return f"mode {stat.filemode(st.st_mode)} lets others not {'enter' if directory else 'run' if execute else 'read'} it"
    parent = os.path.dirname(path)
    while parent and parent != os.path.dirname(parent):
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return f"{parent} is closed to others (mode {stat.filemode(os.stat(parent).st_mode)})"
        except OSError as exc:
            return f"cannot stat {parent} ({exc.strerror})"
        parent = os.path.dirname(parent)
    return None


def choose_isolation(isolation: str, command: Sequence[str], cwd: str | os.PathLike[str] | None = None,
                     path_env: str | None = None) -> tuple[str, str | None]:
    """("uid" or "none", the reason "uid" was not possible or None). ``"uid"`` asked for and not
    possible raises ValueError with the reason; ``"auto"`` falls back to ``"none"``."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r} is not one of {', '.join(map(repr, ISOLATIONS))}")
    if isolation == "none":
        return "none", None
    why = None
    if os.geteuid() != 0:
        why = "the trainer is not root, so it cannot give each agent a uid of its own"
    elif shutil.which("setpriv") is None and shutil.which("setpriv", path=os.defpath) is None:
        why = "setpriv (util-linux), which drops an agent to its uid, is not installed"
    else:
        problems = unreachable_paths(command, cwd, path_env)
        if problems:
            why = ("an unprivileged uid could not run the agent: " + "; ".join(problems)
                   + " (install it, and its interpreter, where others can read it, e.g. under /usr or /opt)")
    if why is None:
        return "uid", None
    if isolation == "uid":
        raise ValueError(f"isolation='uid': {why}")
    return "none", why


class PushModeRunner(AgentRunner):
    """Runs ``command`` as the agent of one episode, pointed at ``client``'s server.

    ``client`` is an HTTP OpenAI client (``openai.AsyncOpenAI(base_url=proxy.base_url,
    api_key=episode_key)``): the runner passes its ``base_url`` and ``api_key`` to the process and
    never calls it itself. ``env_extra`` adds environment variables, ``inherit_env`` names more of
    the trainer's to pass through; ``cwd`` is the working dir.
    """

    # how the program is told where the model is, named in the error of an episode with no call
    model_address = "OPENAI_BASE_URL and OPENAI_API_KEY in its environment"

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
        isolation: str = "auto",
        limits: SandboxLimits | Mapping[str, Any] | None = None,
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
        self.limits = push_limits(self.timeout_s, limits)
        path_env = self.env_extra.get("PATH", os.environ.get("PATH"))
        self.isolation, why = choose_isolation(isolation, self.command, cwd, path_env)
        if why is not None and why not in _said:
            _said.add(why)
            log.warning("push-mode agents run as the trainer's user, not isolated from each other or from the "
                        "trainer: %s", why)

    async def run_job(self, seed: int) -> EpisodeResult:
        # The episode's dir is the trainer's (0700, or 0711 for an agent uid to pass through); the
        # agent's own home is the one dir inside it, so the agent cannot rename or replace it. What
        # the trainer reads back after the agent exits it never opens by a name the agent chose:
        # the stderr file has no name (created here, passed as the child's stderr, read back
        # through the same fd) and the result is opened relative to a dir fd taken before the spawn.
        episode_dir = Path(tempfile.mkdtemp(prefix="arl-agent-"))
        workdir = episode_dir / "home"
        workdir.mkdir(mode=0o700)
        result_path = workdir / RESULT_NAME
        env = agent_env(self.inherit_env, self.env_extra, {
            "OPENAI_BASE_URL": self.base_url, "OPENAI_API_BASE": self.base_url, "OPENAI_API_KEY": self.api_key,
            "ARL_SEED": str(seed), "ARL_MODEL": self.model, "ARL_RESULT_PATH": str(result_path),
        })
        uid = None
        cache = workdir / "cache"
        cache.mkdir()
        if self.isolation == "uid":
            uid = fresh_uid()
            for path in (workdir, cache):
                os.chown(path, uid, uid)  # still 0700: its own, and no one else's but root's
            os.chmod(episode_dir, 0o711)  # root's; the agent may pass through it to its home only
            env["HOME"] = str(workdir)
        env.update(cache_env(cache, env))  # after HOME is final: the model caches stay under it
        proc: asyncio.subprocess.Process | None = None
        group: Cgroup | None = None
        dir_fd = os.open(workdir, _DIR_FLAGS)
        stderr = None
        try:
            stderr = tempfile.TemporaryFile(dir=episode_dir)  # noqa: SIM115  # closed in the finally
            # as in a Sandbox of isolation "none": join the cgroup (as root), drop to the uid, set
            # the rlimits (which it cannot raise again), exec the command; each step a wrapper.
            # The cgroup is made here, not in a thread: a few writes, and never lost to a cancel.
            if os.geteuid() == 0 and cgroup_problem() is None:
                try:
                    group = Cgroup.create(self.limits.total_memory_bytes, self.limits.max_procs)
                except OSError as exc:
                    if str(exc) not in _said:
                        _said.add(str(exc))
                        log.warning("push-mode agents run without a cgroup for their memory and processes: %s", exc)
            argv = [*(_absolute(group.join_prefix()) if group is not None else []),
                    *(_absolute(setpriv_argv(uid)) if uid is not None else []),
                    *_absolute(limits_prefix(self.limits, _uid_tasks(os.getuid()) if os.geteuid() else 0)),
                    *self.command]
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=self.cwd, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            )
            try:
                self.returncode = await asyncio.wait_for(proc.wait(), self.timeout_s)
            except TimeoutError:
                await _kill_group(proc)
                return self._tag(EpisodeResult(
                    status="Timeout", exit_reason="timeout",
                    error=f"agent process ran past {self.timeout_s:g}s and was killed",
                ))
            # bounded and non-blocking, but still file system work: in a worker thread, which the
            # task waits for even when cancelled (the fds stay open until it is done)
            raw, tail = await anyio.to_thread.run_sync(_collect, dir_fd, stderr.fileno(), uid)
            return self._tag(self._result(raw, tail))
        finally:
            if proc is not None and proc.returncode is None:  # cancelled while waiting
                await _kill_group(proc)
            with anyio.CancelScope(shield=True):
                if uid is not None:  # what left the process group (a daemon) dies with the episode
                    await reap_uid(uid, REAP_BOUND_S)
                    release_uid(uid)
                if group is not None:  # its processes killed, then the cgroup removed
                    await anyio.to_thread.run_sync(group.remove)
            os.close(dir_fd)
            if stderr is not None:
                stderr.close()
            # whatever the agent left there (too deep for shutil.rmtree, 100k files): in a worker
            # thread, not on the event loop; the thread finishes it even if this task is cancelled
            await asyncio.to_thread(remove_tree, episode_dir)

    def _tag(self, result: EpisodeResult) -> EpisodeResult:
        """The result says whether its agent ran under a uid of its own (1.0) or the trainer's (0.0)."""
        result.metrics = {**(result.metrics or {}), "isolated_uid": float(self.isolation == "uid")}
        return result

    def _result(self, raw: bytes | OSError | ValueError, stderr: str) -> EpisodeResult:
        """The episode's result from what `_collect` read: the result file's bytes, or why not."""
        failed = EpisodeResult(status="Failed", exit_reason="agent_error")
        code = _describe(self.returncode)
        if isinstance(raw, FileNotFoundError):
            failed.error = f"agent exited with {code} without writing a result\n{stderr}".strip()
            return failed
        try:
            if isinstance(raw, (OSError, ValueError)):  # OSError: a symlink, unreadable
                raise raw
            result = EpisodeResult.from_bytes(raw)  # bounded, depth-checked, scores finite
        except (ValueError, TypeError, OSError) as exc:
            failed.error = f"agent wrote a malformed result ({exc})\n{stderr}".strip()
            return failed
        if self.returncode != 0:
            result.status, result.exit_reason = "Failed", "agent_error"
            result.error = f"agent exited with {code}\n{stderr}".strip()
        return result


def _collect(dir_fd: int, stderr_fd: int, owner: int | None) -> tuple[bytes | OSError | ValueError, str]:
    """(the result file's bytes, or the error that kept them from us; the stderr tail)."""
    try:
        raw: bytes | OSError | ValueError = _read_result(dir_fd, owner)
    except (OSError, ValueError) as exc:
        raw = exc
    return raw, _tail(stderr_fd)


def _read_result(dir_fd: int, owner: int | None = None) -> bytes:
    """The result file's bytes, at most `MAX_RESULT_BYTES` + 1 of them. The agent chose what is in
    its work dir (``dir_fd``): a FIFO would block the trainer in ``open()``, /dev/zero would never
    end, a link would lead to a file of the trainer's. So the name is opened relative to the dir
    the trainer made (a link in place of the dir changes nothing), non-blocking, without following
    a link, and only a regular file is read; under an agent uid (``owner``) only one of its own
    (a hard link to someone else's file is refused)."""
    fd = os.open(RESULT_NAME, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("the result path is not a regular file")
        if owner is not None and st.st_uid != owner:
            raise ValueError(f"the result file is not the agent's own (owner uid {st.st_uid})")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_RESULT_BYTES + 1)
    finally:
        os.close(fd)


def push_limits(timeout_s: float, limits: SandboxLimits | Mapping[str, Any] | None = None) -> SandboxLimits:
    """A push agent's limits: ``limits`` as given (a `SandboxLimits`), or the defaults (CPU seconds
    = ``timeout_s``, `AGENT_MEMORY_BYTES`, `AGENT_TOTAL_MEMORY_BYTES`, `AGENT_FILE_SIZE_BYTES`,
    `AGENT_MAX_PROCS`) with the fields a mapping names (a config's ``runner_kwargs.limits``)
    replaced. Of its fields, ``cpu_s``, ``memory_bytes``, ``file_size_bytes``, ``max_procs`` and
    ``total_memory_bytes`` apply; the wall time is ``timeout_s``."""
    if isinstance(limits, SandboxLimits):
        return limits
    defaults: dict[str, Any] = {"wall_s": timeout_s, "cpu_s": timeout_s, "memory_bytes": AGENT_MEMORY_BYTES,
                                "total_memory_bytes": AGENT_TOTAL_MEMORY_BYTES,
                                "file_size_bytes": AGENT_FILE_SIZE_BYTES, "max_procs": AGENT_MAX_PROCS}
    return SandboxLimits(**{**defaults, **dict(limits or {})})


def agent_env(inherit: Sequence[str], extra: Mapping[str, str], protocol: Mapping[str, str]) -> dict[str, str]:
    """An agent process's whole environment: `TELEMETRY_OFF` and `NETWORK_OFF`, then the named
    variables of ours that are set (``inherit``: `INHERITED_ENV` and the user's additions), then
    ``extra``, then the mode's ``protocol`` variables, which win. Nothing else of the trainer's
    environment reaches it."""
    return {**TELEMETRY_OFF, **NETWORK_OFF, **{k: os.environ[k] for k in inherit if k in os.environ}, **extra,
            **protocol}


def cache_env(cache_dir: str | os.PathLike[str], env: Mapping[str, str]) -> dict[str, str]:
    """The cache variables to add to an agent's environment ``env``: its response caches
    (`RESPONSE_CACHE_DIRS`) and ``XDG_CACHE_HOME`` in ``cache_dir``, and the `MODEL_CACHE_DIRS`
    pinned to ``$HOME/.cache/<name>``, where they would be without XDG_CACHE_HOME. A variable
    ``env`` already sets (the user's ``env_extra`` or ``inherit_env``) is left out; a user's own
    XDG_CACHE_HOME also leaves the model caches to follow it."""
    cache = Path(cache_dir)
    out = {name: str(cache / sub) for name, sub in RESPONSE_CACHE_DIRS.items()}
    if "XDG_CACHE_HOME" not in env:
        out["XDG_CACHE_HOME"] = str(cache)
        home = env.get("HOME") or os.path.expanduser("~")
        out.update({name: os.path.join(home, ".cache", sub) for name, sub in MODEL_CACHE_DIRS.items()})
    return {name: value for name, value in out.items() if name not in env}


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the agent's process group (its children too) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    with anyio.CancelScope(shield=True):  # reap it even while our task is being cancelled
        await proc.wait()


def _tail(fd: int) -> str:
    """The last `STDERR_TAIL` bytes of the stderr file ``fd`` (the trainer's own, unnamed, so
    always a regular file), read by offset: the agent's own offset in it does not matter."""
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - STDERR_TAIL)
        return os.pread(fd, size - start, start).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _uid_tasks(uid: int) -> int:
    """How many tasks (threads) of ``uid`` the kernel lists now: what RLIMIT_NPROC counts. Not
    root, an agent shares the trainer's uid, whose threads (a trainer may have hundreds) count
    against the agent's process limit: they are added to it."""
    tasks = 0
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # the process ended meanwhile
                if entry.stat().st_uid == uid:
                    tasks += len(os.listdir(f"/proc/{entry.name}/task"))
    return tasks


def _absolute(argv: list[str]) -> list[str]:
    """``argv`` with its program looked up now, on the trainer's PATH (the agent's may lack it)."""
    found = shutil.which(argv[0]) or shutil.which(argv[0], path=os.defpath)
    return [found or argv[0], *argv[1:]]


def _describe(returncode: int | None) -> str:
    """A return code, and the limit a signal stands for where it is one of those."""
    if returncode is not None and -returncode in _LIMIT_SIGNALS:
        return f"{returncode} ({_LIMIT_SIGNALS[-returncode]})"
    return str(returncode)


def write_result(result: EpisodeResult | Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> None:
    """For agent programs: write the episode result where ``ARL_RESULT_PATH`` says (atomically)."""
    target = Path(path or os.environ["ARL_RESULT_PATH"])
    data = result.to_json() if isinstance(result, EpisodeResult) else dict(result)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(target)
