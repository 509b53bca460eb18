"""ProxyEnvManager: black-box agent code plays the episode; its model calls become samples.

Per episode (env id = ``spec.traj_id``) the manager builds an OpenAI-compatible client — an
`InProcessClient` (``transport="inprocess"``: a plain function call) or a stock
``openai.AsyncOpenAI`` pointed at a `ProxyServer` (``transport="http"``) — hands it to
``runner_factory(client, spec)`` and awaits ``runner.run_job(spec.seed)``. Every model call
reaches `_handle`: the episode's `MessageTracker` turns the messages into prompt tokens (only new
messages are tokenized), the prompt must leave room for max_tokens, the engine generates with
the same sampling parameters and per-request seed TrajEnvManager would use (`request_seed` with a
per-episode call counter), the tracker records the engine's exact tokens and log-probs, and the
agent gets a `ChatCompletion` (tool calls parsed from ``<tool_call>`` blocks when it sent tools).

After the episode the tracker yields the samples: ``tracker_mode="traj"`` one per branch (see
`MessageTracker` for forks; ``keep_branches="longest"`` keeps one) scored with the runner's
episode score; ``"step"`` one per model call, scored with the runner's ``step_scores`` when it
reports one per call (else the episode score). Both carry the tracker's state hash (the latest
observation message), so GiGPO works in proxy mode.

How an episode ends (the manager knows better than the agent what went wrong server-side):
a fault the handler saw (prompt too long -> "max_length"; engine error -> "engine_error";
rejected prompt -> "invalid_prompt") wins; else the runner's status / exit reason; a runner that
raises -> "agent_error"; past ``config.episode_timeout_s`` -> "timeout" (the runner's task is
cancelled: `PushModeRunner` kills its process). Once the episode ended, its requests get 410.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any, Literal

import anyio
import attrs

from arl.agents.gym_runner import GymRunner
from arl.agents.runner import AgentRunner, EpisodeResult
from arl.engine.base import InvalidPromptError, PromptTooLongError, SamplingParams
from arl.intercept.client import InProcessClient
from arl.intercept.protocol import (
    BadRequest,
    ChatRequest,
    ContextLengthExceeded,
    EngineFailure,
    EpisodeClosed,
    make_completion,
)
from arl.intercept.server import ProxyServer
from arl.intercept.toolcalls import parse_tool_calls
from arl.intercept.tracker import Keep, MessageTracker, Request, TrackedSample
from arl.rollout.base import EnvManager, Episode, EpisodeSpec, ManagerConfig, request_seed
from arl.rollout.records import EXIT_REASONS, Sample, Trajectory, Turn

RunnerFactory = Callable[[Any, EpisodeSpec], AgentRunner]
Transport = Literal["inprocess", "http"]


def gym_runner_factory(config: ManagerConfig, runner_cls: type = GymRunner, **kwargs: Any) -> RunnerFactory:
    """A factory of `GymRunner` (or `ToolCallRunner`) playing ``spec.env_id`` with the config's
    sampling settings, so proxy episodes sample like TrajEnvManager's."""

    def make(client: Any, spec: EpisodeSpec) -> AgentRunner:
        return runner_cls(
            client, spec.env_id, max_tokens=config.max_tokens, temperature=config.temperature,
            top_p=config.top_p, max_turns=config.max_turns, format_penalty=config.format_penalty,
            extra_body={"top_k": config.top_k} if config.top_k else None, env_kwargs=config.env_kwargs,
            **kwargs,
        )

    return make


@attrs.define(eq=False)
class _Episode:
    """One running episode: what the handler and the sample builder share."""

    spec: EpisodeSpec
    traj: Trajectory
    tracker: MessageTracker
    calls: int = 0  # model calls started (the `turn` of request_seed)
    closed: bool = False
    fault: tuple[str, str, str] | None = None  # (status, exit_reason, error) seen by the handler
    result: EpisodeResult | None = None


# The episode of the current task, so `_samples_after_error` finds it after a timeout.
_CURRENT: contextvars.ContextVar[list[_Episode]] = contextvars.ContextVar("arl_proxy_episode")


class ProxyEnvManager(EnvManager):
    """Runs agent code (an `AgentRunner`) per episode and builds samples from its model calls."""

    def __init__(
        self,
        engine: Any,
        config: ManagerConfig | None = None,
        runner_factory: RunnerFactory | None = None,
        *,
        transport: Transport = "inprocess",
        tracker_mode: Literal["traj", "step"] = "traj",
        keep_branches: Keep = "all",
        server: ProxyServer | None = None,
        model_name: str = "arl",
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(engine, config)
        if transport not in ("inprocess", "http"):
            raise ValueError(f"transport must be 'inprocess' or 'http', got {transport!r}")
        if tracker_mode not in ("traj", "step"):
            raise ValueError(f"tracker_mode must be 'traj' or 'step', got {tracker_mode!r}")
        self.runner_factory = runner_factory or gym_runner_factory(self.config)
        self.transport = transport
        self.tracker_mode = tracker_mode
        self.keep_branches = keep_branches
        self.model_name = model_name
        self.chat_template_kwargs = chat_template_kwargs
        self.mode = f"proxy-{tracker_mode}"
        self.server = server
        self._own_server = False
        self._server_lock = anyio.Lock()
        # One connection pool for every episode's openai client: building a client's own pool
        # (an SSL context) costs ~20 ms, which would dominate the per-episode cost.
        self._http_client: Any = None
        self._active: set[str] = set()

    # -- lifecycle (only the HTTP transport holds resources) --------------------------------------
    async def _ensure_server(self) -> ProxyServer:
        async with self._server_lock:
            if self.server is None:
                self.server, self._own_server = ProxyServer(model_name=self.model_name), True
            if not self.server.running:
                await self.server.start()
            return self.server

    async def _client_for(self, env_id: str, handler: Any) -> Any:
        if self.transport == "inprocess":
            return InProcessClient(handler, env_id, model=self.model_name)
        import openai

        server = await self._ensure_server()
        server.register(env_id, handler)
        if self._http_client is None:
            self._http_client = openai.DefaultAsyncHttpxClient()
        # max_retries=0: a refused call ends the episode rather than being replayed.
        return openai.AsyncOpenAI(base_url=server.base_url, api_key=env_id, max_retries=0,
                                  http_client=self._http_client)

    async def aclose(self) -> None:
        """Close the shared HTTP connection pool and stop the proxy server this manager started
        (a server passed in is left running)."""
        http, self._http_client = self._http_client, None
        if http is not None:
            await http.aclose()
        if self._own_server and self.server is not None:
            await self.server.stop()

    async def __aenter__(self) -> ProxyEnvManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- one episode -----------------------------------------------------------------------------
    async def run_episode(self, spec: EpisodeSpec) -> Episode:
        token = _CURRENT.set([])
        try:
            return await super().run_episode(spec)
        finally:
            _CURRENT.reset(token)

    async def _play(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        env_id = spec.traj_id
        if env_id in self._active:
            raise RuntimeError(f"episode {env_id!r} is already running in this manager")
        tracker = MessageTracker(self.tokenizer, chat_template_kwargs=self.chat_template_kwargs)
        state = _Episode(spec, traj, tracker)
        _CURRENT.get().append(state)
        handler = functools.partial(self._handle, state)
        self._active.add(env_id)
        try:
            client = await self._client_for(env_id, handler)
            runner = self.runner_factory(client, spec)
            try:
                state.result = await runner.run_job(spec.seed)
            except Exception as exc:  # noqa: BLE001 -- agent code failed: data, like any other end
                traj.status, traj.exit_reason = "Failed", "agent_error"
                traj.error = f"{type(exc).__name__}: {exc}"
        finally:
            state.closed = True
            self._active.discard(env_id)
            if self.transport == "http" and self.server is not None:
                self.server.close_episode(env_id)
        if state.result is not None:
            self._apply_result(traj, state.result)
        if state.fault is not None:
            traj.status, traj.exit_reason, traj.error = state.fault  # type: ignore[assignment]
        return self._build(state)

    def _samples_after_error(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        episodes = _CURRENT.get([])
        return self._build(episodes[-1]) if episodes else []

    @staticmethod
    def _apply_result(traj: Trajectory, result: EpisodeResult) -> None:
        traj.episode_score = float(result.score)
        traj.success = bool(result.success)
        traj.error = result.error
        status = result.status
        reason = {"Timeout": "timeout", "NoData": "no_data"}.get(status, result.exit_reason)
        if reason not in EXIT_REASONS:  # a runner's own vocabulary: keep it visible in the error
            traj.error = f"runner exit reason {reason!r}" + (f": {result.error}" if result.error else "")
            reason = "terminated" if status == "Finished" else "agent_error"
        traj.status, traj.exit_reason = status, reason

    # -- the handler: one model call -------------------------------------------------------------
    async def _handle(self, state: _Episode, env_id: str, request: ChatRequest) -> Any:
        if state.closed or state.fault is not None:
            reason = state.fault[1] if state.fault else "finished"
            raise EpisodeClosed(f"episode {env_id!r} has ended ({reason})")
        c = self.config
        prompt = state.tracker.prepare(request.messages, request.tools, normalized=True)  # parse_request did
        max_tokens = request.max_tokens or c.max_tokens
        limit = self.max_model_len
        if limit is not None and len(prompt.prompt_ids) + max_tokens > limit:
            message = (f"prompt of {len(prompt.prompt_ids)} tokens + max_tokens {max_tokens} exceeds the "
                       f"model's context of {limit} tokens")
            state.fault = ("Finished", "max_length", message)
            raise ContextLengthExceeded(message)
        turn, state.calls = state.calls, state.calls + 1
        seed = request_seed(c, state.spec, turn) if c.sampling_seed is not None else request.seed
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=c.temperature if request.temperature is None else request.temperature,
            top_p=c.top_p if request.top_p is None else request.top_p,
            top_k=c.top_k if request.top_k is None else request.top_k,
            seed=seed,
            stop_token_ids=tuple(state.tracker.end_of_turn_ids[-1:]) + self._stop_ids(request),
        )
        try:
            gen = await self.generate(state.traj, prompt.prompt_ids, params)
        except PromptTooLongError as exc:
            state.fault = ("Finished", "max_length", str(exc))
            raise ContextLengthExceeded(str(exc)) from exc
        except InvalidPromptError as exc:
            state.fault = ("Failed", "invalid_prompt", str(exc))
            raise BadRequest(str(exc), code="invalid_prompt") from exc
        except Exception as exc:  # EngineError or an engine bug: the episode cannot go on
            state.fault = ("Failed", "engine_error", f"{type(exc).__name__}: {exc}")
            raise EngineFailure(f"engine failed: {type(exc).__name__}: {exc}") from exc
        if gen.finish_reason == "abort":
            state.fault = ("Failed", "engine_error", "the engine aborted the request")
            raise EngineFailure("the engine aborted the request")
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        calls: list[dict[str, Any]] = []
        content: str | None = text
        if request.tools and request.tool_choice != "none":
            content, calls = parse_tool_calls(text, id_prefix=f"call_{turn}")
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = calls
        state.tracker.commit(prompt, gen.token_ids, gen.logprobs, gen.finish_reason, reply, gen.policy_version)
        finish = "length" if gen.finish_reason == "length" else ("tool_calls" if calls else "stop")
        token_logprobs = None
        if request.logprobs:
            pieces = self.tokenizer.convert_ids_to_tokens(list(gen.token_ids))
            token_logprobs = list(zip(pieces, gen.logprobs, strict=True))
        return make_completion(
            completion_id=f"chatcmpl-{env_id}-{turn}", model=request.model, content=content, tool_calls=calls,
            finish_reason=finish, prompt_tokens=len(prompt.prompt_ids), completion_tokens=len(gen.token_ids),
            token_logprobs=token_logprobs,
        )

    def _stop_ids(self, request: ChatRequest) -> tuple[int, ...]:
        """``stop`` strings that are single tokens become stop tokens; others are refused (a
        string stop would cut the engine's tokens mid-token and break token-exactness)."""
        ids = []
        for text in request.stop:
            encoded = self.tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) != 1:
                raise BadRequest(f"stop string {text[:40]!r} is not a single token; only single-token "
                                 "stops are supported", param="stop")
            ids.append(int(encoded[0]))
        return tuple(ids)

    # -- samples ---------------------------------------------------------------------------------
    def _build(self, state: _Episode) -> list[Sample]:
        """Turns (for metrics) and samples of the episode, from its tracker."""
        spec, traj, tracker = state.spec, state.traj, state.tracker
        result = state.result
        requests = list(tracker.requests)
        # A runner's steps follow its model calls one to one; the last call's step may be missing
        # (the env crashed on it, or time ran out): that call gets reward 0.
        n = len(requests)
        scores = list(result.step_scores) if result is not None else []
        aligned = n > 0 and len(scores) in (n, n - 1)
        scores = scores + [0.0] * (n - len(scores)) if aligned else [0.0] * n
        infos = list(result.step_infos) if result is not None else []
        infos = infos if len(infos) in (n, n - 1) else []
        traj.turns = [self._turn(r, scores[i], infos[i] if i < len(infos) else None) for i, r in enumerate(requests)]
        common = {"seed": spec.seed, "tag": spec.tag, "num_turns": len(requests), "success": traj.success,
                  "num_branches": len(tracker.branches), "tracker": dict(tracker.stats)}
        if self.tracker_mode == "step":
            return [
                self._sample(spec, traj, t, score=traj.turns[t.requests[0]].reward if aligned else traj.episode_score,
                             step=t.requests[0], valid=traj.turns[t.requests[0]].action_valid, info=common)
                for t in tracker.step_samples()
            ]
        return [
            self._sample(spec, traj, t, score=traj.episode_score, step=0,
                         valid=all(traj.turns[r].action_valid for r in t.requests), info=common)
            for t in tracker.traj_samples(self.keep_branches)
        ]

    @staticmethod
    def _turn(r: Request, reward: float, info: dict[str, Any] | None) -> Turn:
        info = dict(info or {})
        return Turn(
            observation=r.prompt.observation or "", prompt_ids=r.prompt.prompt_ids,  # the tracker's, not copied
            response_ids=list(r.response_ids), response_logprobs=list(r.logprobs), reward=float(reward),
            action=info.get("action"), action_valid=bool(info.get("action_valid", True)),
            state_hash=r.prompt.state_hash, finish_reason=r.finish_reason, policy_version=r.policy_version,
            info={**info, "branch": r.branch},
        )

    def _sample(self, spec: EpisodeSpec, traj: Trajectory, t: TrackedSample, *, score: float, step: int,
                valid: bool, info: dict[str, Any]) -> Sample:
        return Sample(
            input_ids=t.input_ids, response_mask=t.response_mask, old_logprobs=t.logprobs, score=float(score),
            episode_score=traj.episode_score,
            step_score=float(score) if self.tracker_mode == "step" else traj.episode_score,
            group_id=spec.group_id, traj_id=spec.traj_id, step=step, state_hash=t.state_hash,
            env_id=spec.env_id, exit_reason=traj.exit_reason, action_valid=valid,
            policy_version=t.policy_version,
            info={**info, "mode": self.mode, "branch": t.branch, "requests": list(t.requests)},
        )


__all__ = ["ProxyEnvManager", "RunnerFactory", "gym_runner_factory"]
