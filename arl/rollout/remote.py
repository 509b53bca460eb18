"""Rollouts against a model server: the same games and agents, the model behind an OpenAI-compatible URL.

    endpoint = ChatEndpoint("http://127.0.0.1:8000/v1", model="tiny", timeout_s=60)
    manager = make_remote_manager(endpoint, rollout)        # rollout: a RolloutConfig
    episode = await manager.run_episode(spec)               # as with make_manager(engine, rollout)
    await endpoint.aclose()

What `arl eval --base-url` plays (docs/guide.md). The step and traj managers are the in-process
ones (`StepEnvManager`, `TrajEnvManager`) with one change: the model call sends the chat messages
those managers render (`StepEnvManager.prompt_messages`, `TrajEnvManager.start_messages` /
`user_message`) to ``POST /v1/chat/completions`` and the env gets the reply text, where in
process the messages are rendered to token ids for the engine and the reply's tokens decoded.
A traj conversation goes on with the reply text as the assistant message (the server renders it
again), not with the sampled token ids. Proxy mode runs the configured agent (`make_runner_factory`)
with an OpenAI client pointed at the server: in-process agents (the gym and tool runners, agent
functions) and pull mode's calls, which arrive over the agent's pipes (`RecordingClient.handler`),
go through `RecordingClient`, which times and counts each call; a push-mode agent gets the
server's URL, key and model name and calls it from its own process, so its calls are not seen here
(its turns are the steps it reports, without replies or latency, and its score is what it reports).

What needs token ids cannot run against a server: training (exact samples and log-probs), forks
of a state (``rollout.manager.fork``) and proxy mode's token-exact tracking; `check_remote`
refuses them with a message. Episodes played here yield no training samples.

Each call is recorded on its turn (``turn.info``): ``reply`` (the text), ``latency_s``,
``prompt_tokens`` and ``completion_tokens`` (the server's ``usage``; None when it sends none) and
``finish_reason``. A call that fails raises an `EndpointError` (an `EngineError`): the refused
connection (`EndpointUnreachable`), a request past ``timeout_s`` (`EndpointTimeout`), an HTTP
error status (`EndpointStatusError`; a 400 that says the prompt exceeds the context is
`EndpointPromptTooLong`, which ends the episode as ``max_length`` like an in-process prompt that
no longer fits) or a reply that is not a chat completion (`EndpointReplyError`: not JSON, no
choices, no message). The manager's fault boundary (`EnvManager.run_episode`) makes it the
rollout's ``engine_error`` with the error's class and text in ``traj.error``; the run goes on.
"""

from __future__ import annotations

import json
import time
from typing import Any

import attrs

from arl.agents.runner import EpisodeResult
from arl.config import RolloutConfig
from arl.engine.base import EngineError, Generation, PromptTooLongError
from arl.envs.prompts import history_action
from arl.rollout.base import EnvManager, EpisodeSpec, request_seed
from arl.rollout.records import Sample, Trajectory, Turn
from arl.rollout.runners import make_runner_factory
from arl.rollout.step import StepEnvManager
from arl.rollout.traj import TrajEnvManager

# ----------------------------------------------------------------------------------------------
# errors


class EndpointError(EngineError):
    """A model server did not answer a chat call with a chat completion."""


class EndpointUnreachable(EndpointError):
    """The connection was refused or dropped (nothing listening, a server that went away)."""


class EndpointTimeout(EndpointError):
    """No reply within the endpoint's ``timeout_s``."""


class EndpointStatusError(EndpointError):
    """The server answered with an HTTP error status (``status``)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class EndpointPromptTooLong(EndpointStatusError, PromptTooLongError):
    """A 400 that says the prompt exceeds the model's context (the episode ends ``max_length``)."""


class EndpointReplyError(EndpointError):
    """The reply is not a chat completion: not JSON, no choices, or no message."""


_TOO_LONG = ("maximum context length", "context length", "too long", "context_length_exceeded")


def endpoint_error(exc: BaseException) -> EndpointError:
    """The `EndpointError` an ``openai`` client exception stands for.

    >>> import httpx, openai
    >>> request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    >>> type(endpoint_error(openai.APIConnectionError(request=request))).__name__
    'EndpointUnreachable'
    >>> type(endpoint_error(openai.APITimeoutError(request=request))).__name__
    'EndpointTimeout'
    """
    import openai

    if isinstance(exc, EndpointError):
        return exc
    if isinstance(exc, openai.APITimeoutError):  # a subclass of APIConnectionError: first
        return EndpointTimeout(f"no reply in time ({exc})")
    if isinstance(exc, openai.APIConnectionError):
        return EndpointUnreachable(f"{exc}: {exc.__cause__}" if exc.__cause__ else str(exc))
    if isinstance(exc, openai.APIStatusError):
        text = str(exc)
        if exc.status_code == 400 and any(s in text.lower() for s in _TOO_LONG):
            return EndpointPromptTooLong(text, exc.status_code)
        return EndpointStatusError(text, exc.status_code)
    return EndpointReplyError(f"{type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------------------------
# the endpoint


@attrs.frozen
class ChatReply:
    """One chat call's reply and what it cost."""

    text: str
    finish_reason: str
    latency_s: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def info(self) -> dict[str, Any]:
        """What a turn records of the call (``turn.info``)."""
        return {"reply": self.text, "latency_s": round(self.latency_s, 4), "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "finish_reason": self.finish_reason}


def read_completion(completion: Any, latency_s: float) -> ChatReply:
    """The `ChatReply` of an ``openai`` ``ChatCompletion``; anything else is an `EndpointReplyError`.
    A reply's tool calls are in its text as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
    lines after its content (what results rows and `arl view` show)."""
    try:
        return _read_completion(completion, latency_s)
    except EndpointReplyError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a field of the wrong shape (the client does not validate replies)
        raise EndpointReplyError(f"the reply is not a chat completion ({type(exc).__name__}: {exc})") from exc


def _read_completion(completion: Any, latency_s: float) -> ChatReply:
    choices = getattr(completion, "choices", None)
    if not choices or not isinstance(choices, list):
        raise EndpointReplyError(f"the reply is not a chat completion with choices: {str(completion)[:200]!r}")
    message = getattr(choices[0], "message", None)
    if message is None:
        raise EndpointReplyError("the reply's first choice has no message")
    text, tool_calls = message.content, getattr(message, "tool_calls", None) or []
    if text is None and not tool_calls:
        raise EndpointReplyError("the reply's message has neither content nor tool calls")
    if text is not None and not isinstance(text, str):
        raise EndpointReplyError(f"the reply's content is a {type(text).__name__}, not text")
    calls = [f"<tool_call>{json.dumps({'name': c.function.name, 'arguments': _arguments(c.function.arguments)})}"
             "</tool_call>" for c in tool_calls if getattr(c, "function", None) is not None]
    text = "\n".join([text or "", *calls]).strip() if calls else text
    usage = getattr(completion, "usage", None)
    return ChatReply(text=text or "", finish_reason=str(choices[0].finish_reason or "stop"), latency_s=latency_s,
                     prompt_tokens=_count(getattr(usage, "prompt_tokens", None)),
                     completion_tokens=_count(getattr(usage, "completion_tokens", None)))


def _count(value: Any) -> int | None:
    """A usage count as the server sent it, or None when it is not a count (absent, a string, negative)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _arguments(text: str) -> Any:
    """A tool call's arguments as the JSON they hold (as sent where they are not JSON)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


class ChatEndpoint:
    """An OpenAI-compatible server's ``/v1/chat/completions``, one ``openai.AsyncOpenAI`` for every call.

    ``timeout_s`` bounds each request; ``max_retries`` is the client's own retry of refused
    connections, timeouts, 429s and 5xx (with its back-off) before a call fails."""

    tokenizer = None  # replies come back as text: nothing here has token ids

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout_s: float = 120.0,
                 max_retries: int = 2):
        import openai

        self.base_url, self.model = base_url, model
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
                                         max_retries=max_retries)

    async def chat(self, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float, top_p: float = 1.0,
                   top_k: int = 0, seed: int | None = None) -> ChatReply:
        """One call; failures raise an `EndpointError`."""
        extra = {"top_k": top_k} if top_k else None  # not an OpenAI field: vLLM and arl's proxy read it
        start = time.perf_counter()
        try:
            completion = await self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                seed=seed, extra_body=extra)
        except Exception as exc:  # noqa: BLE001 -- the server's failure, whatever the client raised for it
            raise endpoint_error(exc) from exc
        return read_completion(completion, time.perf_counter() - start)  # EndpointReplyError for what it cannot read

    async def aclose(self) -> None:
        await self.client.close()


# ----------------------------------------------------------------------------------------------
# managers


class _RemoteCalls(EnvManager):
    """A manager whose model is a `ChatEndpoint` (``self.engine``): messages in, text out."""

    async def act(self, spec: EpisodeSpec, traj: Trajectory, env: Any, prompt_ids: Any,
                  observation: str, rendered: Any = None) -> tuple[Turn, str, bool, bool]:
        """`EnvManager.act` with chat messages (``prompt_ids`` here) sent to the endpoint."""
        c = self.config
        start = time.perf_counter()
        try:
            reply = await self.engine.chat(list(prompt_ids), max_tokens=c.max_tokens, temperature=c.temperature,
                                           top_p=c.top_p, top_k=c.top_k, seed=request_seed(c, spec, len(traj.turns)))
        finally:
            traj.timings["generate"] += time.perf_counter() - start
        gen = Generation([], [], "length" if reply.finish_reason == "length" else "stop", reply.prompt_tokens or 0)
        turn, obs, terminated, truncated = await self.take(traj, env, [], observation, gen, text=reply.text)
        turn.info.update(reply.info())
        turn.sampled_with = None  # no tokens were recorded
        self.record(traj, turn)
        return turn, obs, terminated, truncated

    def fits(self, prompt_len: int) -> bool:
        return True  # the server knows its context: a prompt past it is its 400 (EndpointPromptTooLong)

    def _build_samples(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        return []  # no token ids: nothing to train on (the trajectory holds the episode)

    def derive(self, config: Any = None, engine: Any = None) -> EnvManager:
        return type(self)(self.engine if engine is None else engine, config or self.config)


class RemoteStepEnvManager(_RemoteCalls, StepEnvManager):
    """`StepEnvManager` against a `ChatEndpoint`: each step's messages sent as they are."""

    def step_prompt(self, env: Any, obs: str, t: int, history: list[tuple[str, str, float]], limit: int) -> Any:
        return self.prompt_messages(env, obs, t, history, limit)

    def remember(self, history: list[tuple[str, str, float]], obs: str, turn: Turn) -> None:
        history.append((obs, history_action(turn.action, turn.action_valid, turn.info["reply"]), turn.reward))


class RemoteTrajEnvManager(_RemoteCalls, TrajEnvManager):
    """`TrajEnvManager` against a `ChatEndpoint`: one conversation, each reply sent back as text."""

    async def _play(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        env, obs, limit = self.start_episode(spec, traj)
        messages = list(self.start_messages(env, obs, limit))
        traj.exit_reason = "truncated"  # unless the game ends first
        while len(traj.turns) < limit:
            turn, obs, terminated, truncated = await self.act(spec, traj, env, messages, obs)
            messages.append({"role": "assistant", "content": turn.info["reply"]})
            if terminated or truncated:
                traj.exit_reason = "terminated" if terminated else "truncated"
                break
            if len(traj.turns) < limit:
                messages.append(self.user_message(len(traj.turns), obs, limit))
        return []


class RecordingClient:
    """An ``openai.AsyncOpenAI`` whose ``chat.completions.create`` calls are timed and counted.

    With ``model``, every call asks for that model (an agent written for arl's proxy, which serves
    any name, does not know the server's). Everything else (``base_url``, ``api_key``,
    ``responses``, ...) is the wrapped client's. A call
    that fails is recorded as its `EndpointError` (``failure``) and raised to the agent as the
    ``openai`` error it was, so the agent handles it as it would any server's."""

    def __init__(self, client: Any, model: str | None = None):
        self._client = client
        self.model = model
        self.calls: list[ChatReply] = []
        self.failure: EndpointError | None = None
        self.chat = _Namespace(completions=_Namespace(create=self._create))

    async def _create(self, **kwargs: Any) -> Any:
        if self.model is not None:  # the name the server serves, whatever the agent calls its model
            kwargs["model"] = self.model
        start = time.perf_counter()
        try:
            completion = await self._client.chat.completions.create(**kwargs)
            reply = read_completion(completion, time.perf_counter() - start) if not kwargs.get("stream") else None
        except Exception as exc:  # noqa: BLE001 -- recorded, then the agent's to handle
            self.failure = endpoint_error(exc)
            raise
        if reply is not None:
            self.calls.append(reply)
        return completion

    @property
    def handler(self) -> Any:
        """The pull-mode side (`arl.intercept.exchange.responder`): ``await handler(key, request)``
        sends a `ChatRequest` an agent made over its pipes to the server, as ``create`` would."""
        return self._handle

    episode_key = "remote"

    async def _handle(self, episode_key: str, request: Any) -> Any:
        fields = {"tools": list(request.tools) if request.tools else None, "tool_choice": request.tool_choice,
                  "response_format": request.response_format, "max_tokens": request.max_tokens,
                  "temperature": request.temperature, "top_p": request.top_p, "seed": request.seed,
                  "stop": list(request.stop) or None, "parallel_tool_calls": request.parallel_tool_calls}
        kwargs = {k: v for k, v in fields.items() if v is not None}
        if request.top_k is not None:
            kwargs["extra_body"] = {"top_k": request.top_k}
        # a streamed request is answered whole and streamed by the exchange, as arl's proxy does
        return await self._create(model=request.model, messages=list(request.messages), **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@attrs.define
class _Namespace:
    completions: Any = None
    create: Any = None


class RemoteProxyEnvManager(EnvManager):
    """Proxy mode's agent against a `ChatEndpoint`: ``runner_factory(client, spec, config)`` with
    a `RecordingClient` over the endpoint's client; the agent's `EpisodeResult` scores the episode
    and its step reports line up with the recorded calls as turns."""

    mode = "proxy"

    def __init__(self, engine: ChatEndpoint, config: Any = None, runner_factory: Any = None):
        super().__init__(engine, config)
        self.runner_factory = runner_factory

    def derive(self, config: Any = None, engine: Any = None) -> EnvManager:
        return RemoteProxyEnvManager(self.engine if engine is None else engine, config or self.config,
                                     self.runner_factory)

    def client_for(self, spec: EpisodeSpec) -> Any:
        """The client the episode's agent calls (`RecordingClient` wraps it): the endpoint's."""
        return self.engine.client

    async def _play(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        from arl.rollout.proxy import ProxyEnvManager, _result_problem

        client = RecordingClient(self.client_for(spec), getattr(self.engine, "model", None))
        start = time.perf_counter()
        try:
            runner = self.runner_factory(client, spec, self.config)
            if client.model is not None and isinstance(getattr(runner, "model", None), str):
                runner.model = client.model  # what a push-mode agent is told to ask for (ARL_MODEL)
            result = await runner.run_job(spec.seed)
        except Exception as exc:  # noqa: BLE001 -- agent code: its failure is data
            if client.failure is not None:
                raise client.failure from exc
            result = EpisodeResult(status="Failed", exit_reason="agent_error", error=f"{type(exc).__name__}: {exc}")
        finally:
            traj.timings["generate"] += sum(c.latency_s for c in client.calls)
            traj.timings["env"] += time.perf_counter() - start - traj.timings["generate"]
        if (problem := _result_problem(result)) is not None:
            result = EpisodeResult(status="Failed", exit_reason="agent_error",
                                   error=f"the runner reported an invalid result: {problem}")
        # one turn per call seen; an agent in its own process (push mode) calls the server itself, so
        # its turns are the steps it reports, without a reply, tokens or latency
        calls: list[ChatReply | None] = list(client.calls) or [None] * len(result.step_scores)
        reports, _ = result.steps(len(calls))
        for call, report in zip(calls, reports, strict=True):
            info = {**(report.info if report is not None else {}), **(call.info() if call is not None else {})}
            if report is not None and report.action_valid is not None:
                info["action_valid"] = bool(report.action_valid)  # judged: counted in the valid-action rate
            traj.turns.append(Turn(
                observation=(report.observation or "") if report is not None else "", prompt_ids=[], response_ids=[],
                response_logprobs=[], reward=report.reward if report is not None else 0.0,
                action=report.action if report is not None else None,
                action_valid=bool(report.action_valid) if report is not None else False,
                finish_reason="length" if call is not None and call.finish_reason == "length" else "stop", info=info))
        ProxyEnvManager._apply_result(traj, result)
        if client.failure is not None and not traj.ok:  # the server's fault, not the agent's
            raise client.failure
        return []


def check_remote(rollout: RolloutConfig) -> None:
    """Refuse (ValueError, saying why) what cannot run without token ids."""
    if rollout.mode not in ("step", "traj", "proxy"):
        raise ValueError(f"rollout.mode={rollout.mode!r} cannot run against a model server")
    if rollout.manager.fork.k:
        raise ValueError("rollout.manager.fork forks a state into K completions of one token-exact request: it needs "
                         "an in-process engine, not a model server (unset it to evaluate against --base-url)")


def make_remote_manager(endpoint: ChatEndpoint, rollout: RolloutConfig) -> EnvManager:
    """The manager ``rollout.mode`` names, against ``endpoint`` (`make_manager`'s counterpart)."""
    check_remote(rollout)
    if rollout.mode == "step":
        return RemoteStepEnvManager(endpoint, rollout.manager)
    if rollout.mode == "traj":
        return RemoteTrajEnvManager(endpoint, rollout.manager)
    return RemoteProxyEnvManager(endpoint, rollout.manager, make_runner_factory(rollout.proxy))


__all__ = [
    "ChatEndpoint", "ChatReply", "EndpointError", "EndpointPromptTooLong", "EndpointReplyError", "EndpointStatusError",
    "EndpointTimeout", "EndpointUnreachable", "RecordingClient", "RemoteProxyEnvManager", "RemoteStepEnvManager",
    "RemoteTrajEnvManager", "check_remote", "endpoint_error", "make_remote_manager", "read_completion",
]
