"""ProxyEnvManager: black-box agent code plays the episode; its model calls become samples.

Per episode the manager builds the episode's `ChatHandler` (arl/intercept/handler.py: messages
-> tokens via the episode's `MessageTracker`, the engine with the same sampling parameters and
per-request seed TrajEnvManager would use, the engine's exact tokens and log-probs recorded) and
an OpenAI-compatible client calling it — an `InProcessClient` (``transport="inprocess"``: a
plain function call, episode key ``spec.traj_id``) or a stock ``openai.AsyncOpenAI`` pointed at a
`ProxyServer` (``transport="http"``, with an unguessable per-episode bearer token as the episode
key) — makes the episode's runner with ``runner_factory(client, spec, config)`` (a runner
factory: `arl.rollout.runners`) and awaits ``runner.run_job(spec.seed)``.

After the episode the tracker yields the samples: ``granularity="traj"`` one per branch (see
`MessageTracker` for forks; ``keep_branches="longest"`` keeps one) scored with the runner's
episode score; ``"step"`` (the default, as in ``rollout.proxy``: `arl.config.ProxyConfig` holds
the manager's defaults) one per model call, scored with the runner's ``step_scores`` when it
reports one per call (else the episode score). GiGPO's state key is the hash of the game's
``state_key()`` the runner reports per step (``EpisodeResult.step_infos[i]["state_key"]``;
GymRunner and ToolCallRunner do), the same key the step manager uses; it falls back to the hash
of the reported raw observation (``["state"]``: an env that is not an arl game), then to that of
the call's latest user/tool message, and each turn says which (documented in `_turn`).

Images: an agent may send ``image_url`` parts (PNG/JPEG data URLs) to a VLM policy; the handler
renders each such prompt with the engine's own renderer, and each sample carries the
`RenderedPrompt` of its last call (`Sample.rendered`): its input ids are the expanded ids the engine
ran, its pixels the engine's. `GymRunner` sends the game's frames so with
``rollout.manager.observation: image | both`` (docs/guide.md "Image observations").

How an episode ends (the manager knows better than the agent what went wrong server-side):
a fault the handler saw (prompt too long -> "max_length"; engine error -> "engine_error";
rejected prompt -> "invalid_prompt") wins; else the runner's status / exit reason; a runner that
raises, or reports a result that cannot be trained on (`EpisodeResult.problem`: a score that is
NaN, infinite or past `MAX_ABS_SCORE`, too many steps) -> "agent_error" with score 0; past ``config.episode_timeout_s`` -> "timeout" (the runner's task is
cancelled: `PushModeRunner` kills its process); an agent that finished (or reported "NoData")
without one model call arl answered -> "no_data" with score 0 and success False, whatever it
reported, and an error naming the likely causes (a client-side response cache, such as DSPy's
default one; a client that is not the one it was given). Once the episode ended, its requests get 410.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import secrets
import traceback
import warnings
from typing import Any, get_args

import anyio
import attrs

from arl._renamed import old_names, renamed_fields
from arl.agents.gym_runner import GymRunner
from arl.agents.runner import AgentRunner, EpisodeResult, StepReport
from arl.config import Granularity, KeepBranches, ManagerConfig, ProxyConfig, Transport
from arl.engine.tokens import TokenRow
from arl.envs.game import StateKeySource, state_hash
from arl.intercept.client import InProcessClient
from arl.intercept.handler import ChatHandler, SamplingDefaults
from arl.intercept.server import ProxyServer
from arl.intercept.tracker import MessageTracker, Request, TrackedSample
from arl.rollout.base import EnvManager, Episode, EpisodeSpec, request_seed
from arl.rollout.records import EXIT_REASONS, Sample, Trajectory, Turn
from arl.rollout.runners import RunnerFactory, gym_runner

_DEFAULTS = ProxyConfig()  # the manager's defaults are rollout.proxy's: one place for each

_log = logging.getLogger(__name__)


def _with_config(factory: Any) -> RunnerFactory:
    """``factory`` as a runner factory. One that can be called as ``(client, spec)`` alone is of
    the old shape, which takes no config (``lambda client, spec, r=result: ...`` too: its third
    parameter is not a config): it is called so, with a DeprecationWarning. One whose signature
    cannot be read is taken as it is."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return factory  # type: ignore[no-any-return]

    def takes(*args: None) -> bool:
        try:
            signature.bind(*args)
        except TypeError:
            return False
        return True

    if not takes(None, None):  # a runner factory (it needs the config), or what its episodes will say is wrong
        return factory  # type: ignore[no-any-return]
    warnings.warn("a runner factory of (client, spec) is deprecated: take (client, spec, config), the manager's "
                  "ManagerConfig (arl.rollout.runners.RunnerFactory)", DeprecationWarning, stacklevel=3)
    return functools.partial(_without_config, factory)


def _without_config(factory: Any, client: Any, spec: EpisodeSpec, config: ManagerConfig) -> AgentRunner:
    return factory(client, spec)  # type: ignore[no-any-return]


def _from_binder(binder: Any, client: Any, spec: EpisodeSpec, config: ManagerConfig) -> AgentRunner:
    return binder(config)(client, spec)  # type: ignore[no-any-return]  (the old runner_for=binder)


def _gym_runner_factory(config: ManagerConfig, runner_cls: type = GymRunner, **kwargs: Any) -> RunnerFactory:
    """The old ``gym_runner_factory``: `GymRunner` (or ``runner_cls``) bound to ``config``, whatever
    config the manager calls it with."""
    return functools.partial(_bound_gym_runner, config, runner_cls, kwargs)


def _bound_gym_runner(config: ManagerConfig, runner_cls: type, kwargs: dict[str, Any], client: Any,
                      spec: EpisodeSpec) -> AgentRunner:
    return gym_runner(client, spec, config, runner_cls=runner_cls, **kwargs)


@attrs.define(eq=False)
class _Episode:
    """One running episode: what the handler and the sample builder share."""

    spec: EpisodeSpec
    traj: Trajectory
    handler: ChatHandler
    result: EpisodeResult | None = None

    @property
    def tracker(self) -> MessageTracker:
        return self.handler.tracker


def _result_problem(result: Any) -> str | None:
    if not isinstance(result, EpisodeResult):
        return f"run_job must return an EpisodeResult, got {type(result).__name__}"
    return result.problem()


def _no_call_error(result: EpisodeResult | None, runner: Any, refused: int) -> str:
    """Why an episode whose agent finished made no model call arl answered, and what to do."""
    reported = result or EpisodeResult()
    what = (f"none of the agent's {refused} model calls was answered (each refused with a 400, e.g. a constraint "
            "that did not compile, or left unfinished)" if refused else "no model call reached arl")
    # One cause is an agent that called another server: name how it was told where the model is.
    # Runners of agent programs say it (`PushModeRunner.model_address`: its variables; pull: its pipe).
    given = getattr(runner, "model_address", None) or "the client passed to its runner"
    own = f" The agent said: {reported.error}" if reported.error else ""
    return (f"{what} in this episode, so there is nothing to train on; the agent's reported score "
            f"{float(reported.score):g} (success {bool(reported.success)}) is not counted. Likely causes: a "
            "client-side response cache answered the prompts (a group's members share a seed, hence their "
            "prompts, and every evaluation replays the same panel): turn it off, e.g. dspy.LM(..., cache=False) "
            "for DSPy, no litellm.cache for LiteLLM, no set_llm_cache for LangChain; or the agent did not use the "
            f"base_url/client it was given ({given}) and called another server.{own}")


# The episode of the current task, so `_samples_after_error` finds it after a timeout.
_CURRENT: contextvars.ContextVar[list[_Episode]] = contextvars.ContextVar("arl_proxy_episode")


@renamed_fields(tracker_mode="granularity")  # the old name, as a keyword and an attribute (deprecated)
class ProxyEnvManager(EnvManager):
    """Runs agent code (an `AgentRunner`) per episode and builds samples from its model calls.

    ``runner_factory`` (default `gym_runner`) makes each episode's runner: the manager calls
    ``runner_factory(client, spec, self.config)`` (`arl.rollout.runners.make_runner_factory`
    makes one from a runner name, an agent function or a `ProxyConfig`). One that can be called
    as ``(client, spec)`` alone is of the old shape: still called so, with a DeprecationWarning.
    """

    def __init__(
        self,
        engine: Any,
        config: ManagerConfig | None = None,
        runner_factory: RunnerFactory | None = None,
        *,
        transport: Transport = _DEFAULTS.transport,  # type: ignore[assignment]
        granularity: Granularity = _DEFAULTS.granularity,  # type: ignore[assignment]
        keep_branches: KeepBranches = _DEFAULTS.keep_branches,  # type: ignore[assignment]
        server: ProxyServer | None = None,
        model_name: str = "arl",
        chat_template_kwargs: dict[str, Any] | None = None,
        runner_for: Any = None,  # deprecated: a config -> (client, spec) -> runner; give runner_factory
    ) -> None:
        super().__init__(engine, config)
        for name, value, choices in (("transport", transport, Transport),
                                     ("granularity", granularity, Granularity)):
            if value not in get_args(choices):
                raise ValueError(f"{name} must be {' or '.join(map(repr, get_args(choices)))}, got {value!r}")
        if runner_for is not None:
            if runner_factory is not None:
                raise ValueError("give runner_factory or runner_for, not both")
            warnings.warn("ProxyEnvManager(runner_for=...) is deprecated: give a runner_factory, which the manager "
                          "calls with its config (arl.rollout.runners.make_runner_factory)", DeprecationWarning,
                          stacklevel=2)
            runner_factory = functools.partial(_from_binder, runner_for)
        self.runner_factory: RunnerFactory = gym_runner if runner_factory is None else _with_config(runner_factory)
        self.transport = transport
        self.granularity = granularity
        self.keep_branches = keep_branches
        self.model_name = model_name
        self.chat_template_kwargs = chat_template_kwargs
        self.mode = f"proxy-{granularity}"
        self.server = server
        self._own_server = False
        self._server_lock = anyio.Lock()
        # One connection pool for every episode's openai client: building a client's own pool
        # (an SSL context) costs ~20 ms, which would dominate the per-episode cost.
        self._http_client: Any = None
        self._active: set[str] = set()
        self.step_report_mismatches = 0  # episodes whose runner's step reports did not line up with its calls
        self.no_call_episodes = 0  # episodes in which no model call reached arl (NoData, `_no_call_error`)

    # -- lifecycle (only the HTTP transport holds resources) --------------------------------------
    async def _ensure_server(self) -> ProxyServer:
        async with self._server_lock:
            if self.server is None:
                self.server, self._own_server = ProxyServer(model_name=self.model_name), True
            if not self.server.running:
                await self.server.start()
            return self.server

    async def _client_for(self, episode_key: str, handler: Any) -> tuple[Any, str | None]:
        """The episode's OpenAI-compatible client, and its bearer token over HTTP.

        The token is an unguessable capability (`secrets.token_urlsafe`), not the episode id:
        episode ids follow a pattern, so an agent that knew its own could forge a sibling's and
        write into that episode's trajectory. Only this manager knows which token is which episode.
        """
        if self.transport == "inprocess":
            return InProcessClient(handler, episode_key, model=self.model_name), None
        import openai

        server = await self._ensure_server()
        token = secrets.token_urlsafe(32)
        server.register(token, handler)
        if self._http_client is None:
            self._http_client = openai.DefaultAsyncHttpxClient()
        # max_retries=0: a refused call ends the episode rather than being replayed.
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=token, max_retries=0,
                                    http_client=self._http_client)
        return client, token

    def derive(self, config: ManagerConfig | None = None, engine: Any = None) -> ProxyEnvManager:
        """The same agent, transport and tracker with another config (the validation manager's
        temperature) or engine (the warm-start teacher): its runner factory gets the new config."""
        config = config or self.config
        return ProxyEnvManager(
            self.engine if engine is None else engine, config, transport=self.transport,  # type: ignore[arg-type]
            granularity=self.granularity, keep_branches=self.keep_branches, model_name=self.model_name,  # type: ignore[arg-type]
            chat_template_kwargs=self.chat_template_kwargs, runner_factory=self.runner_factory,
        )

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
        episode_key = spec.traj_id
        if episode_key in self._active:
            raise RuntimeError(f"episode {episode_key!r} is already running in this manager")
        c = self.config
        tracker = MessageTracker(self.tokenizer, chat_template_kwargs=self.chat_template_kwargs,
                                 granularity=self.granularity)
        handler = ChatHandler(
            self.engine, tracker, name=episode_key, max_model_len=self.max_model_len,
            defaults=SamplingDefaults(c.max_tokens, c.temperature, c.top_p, c.top_k, c.agent_sampling),
            # the same per-call seeds TrajEnvManager uses, so proxy and traj samples can match
            seed_for=functools.partial(request_seed, c, spec) if c.sampling_seed is not None else None,
            generate=functools.partial(self.generate, traj),
        )
        state = _Episode(spec, traj, handler)
        _CURRENT.get().append(state)
        self._active.add(episode_key)
        token = None
        runner: Any = None
        try:
            client, token = await self._client_for(episode_key, handler)
            try:
                runner = self.runner_factory(client, spec, self.config)  # agent code too: its failures are the agent's
                state.result = await runner.run_job(spec.seed)
            except Exception as exc:  # noqa: BLE001 -- agent code failed: data, like any other end
                traj.status, traj.exit_reason = "Failed", "agent_error"
                traj.error = f"{type(exc).__name__}: {exc}"
                traj.traceback = traceback.format_exc()
        finally:
            handler.close()
            self._active.discard(episode_key)
            if token is not None and self.server is not None:
                self.server.close_episode(token)  # its later requests get 410
        if state.result is not None and (problem := _result_problem(state.result)) is not None:
            # agent-reported numbers are data, checked here for every runner: a NaN score would
            # raise in the advantage computation and end the whole training step, not this episode
            state.result = EpisodeResult(status="Failed", exit_reason="agent_error",
                                         error=f"the runner reported an invalid result: {problem}")
        if state.result is not None:
            self._apply_result(traj, state.result)
        if handler.fault is not None:
            traj.status, traj.exit_reason, traj.error = handler.fault  # type: ignore[assignment]
        elif not tracker.requests and (traj.ok or traj.exit_reason == "no_data"):
            # The agent says how an episode went that arl never saw (typically a client-side cache
            # replaying an earlier episode's replies): its score is no evidence of this policy, so
            # it is not counted (metrics, success rate), and the error says what to look at.
            traj.error = _no_call_error(state.result, runner, handler.calls)
            traj.status, traj.exit_reason = "NoData", "no_data"
            traj.episode_score, traj.success = 0.0, False
            self.no_call_episodes += 1
            if self.no_call_episodes == 1:  # training rows keep no error text: say it once
                _log.warning("episode %s ended NoData: %s (said once per manager; rollout/exit/no_data counts "
                             "such episodes)", spec.traj_id, traj.error)
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

    # -- samples ---------------------------------------------------------------------------------
    def _build(self, state: _Episode) -> list[Sample]:
        """Turns (for metrics) and samples of the episode, from its tracker."""
        spec, traj, tracker = state.spec, state.traj, state.tracker
        result = state.result
        requests = list(tracker.requests)
        # One step report per model call (`EpisodeResult.steps`); a count that cannot be lined up
        # with the calls gives every call reward 0 and no state: said loudly, and counted per turn.
        n = len(requests)
        reports, alignment = (result or EpisodeResult()).steps(n)
        if alignment == "mismatch" and result is not None:
            self.step_report_mismatches += 1
            _log.warning(
                "episode %s: the runner reported %d step scores and %d step infos for %d model calls "
                "(expected %d or %d of each, or no infos): its steps get reward 0 and message-hash "
                "GiGPO keys (%d such episodes so far)", spec.traj_id, len(result.step_scores),
                len(result.step_infos), n, n, n - 1, self.step_report_mismatches)
        aligned = alignment in ("exact", "last_missing")
        traj.turns = [self._turn(r, reports[i], alignment) for i, r in enumerate(requests)]
        keyed = sum(1 for t in traj.turns if t.info.get("state_key_source") in get_args(StateKeySource))
        common = {"num_branches": len(tracker.branches), "tracker": dict(tracker.stats),
                  "handler": dict(state.handler.stats),
                  "state_keys_from_runner": keyed}
        if self.granularity == "step":
            samples = []
            for t in tracker.step_samples():
                turn = traj.turns[t.requests[0]]
                samples.append(self._sample(
                    spec, traj, t, step_score=turn.reward if aligned else traj.episode_score, step=t.requests[0],
                    valid=turn.action_valid, state_key=turn.state_key, info=common,
                ))
            return samples
        return [
            self._sample(spec, traj, t, step_score=traj.episode_score, step=0,
                         valid=all(traj.turns[r].action_valid for r in t.requests),
                         state_key=traj.turns[t.requests[-1]].state_key, info=common)
            for t in tracker.traj_samples(self.keep_branches)
        ]

    @staticmethod
    def _turn(r: Request, report: StepReport | None, alignment: str) -> Turn:
        """One model call as a Turn. Its GiGPO state key names the *state*, hashed like the step
        manager's, and ``info["state_key_source"]`` says where it came from: "game", the game's
        ``state_key()`` the runner reports for the step (`StepReport.state_key`, as arl's runners
        do: the same key the step manager takes); "observation", the raw observation text it
        reports (`StepReport.observation`: an env that is not an arl game, or a runner that reports no
        key); "message", for runners that report neither, the hash of the call's latest user/tool
        message (which may carry turn counters, splitting equal states apart)."""
        report = report or StepReport(reward=0.0)
        if report.state_key is not None:
            key, source = state_hash(report.state_key), "game"
        elif report.observation is not None:
            key, source = state_hash(report.observation), "observation"
        else:
            key, source = r.prompt.state_key, "message"
        return Turn(
            observation=report.observation if report.observation is not None else (r.prompt.observation or ""),
            # the tracker's, not copied; an image prompt's as the engine ran it (its images expanded)
            prompt_ids=r.prompt.prompt_ids if r.rendered is None else list(r.rendered.input_ids),
            rendered=r.rendered,
            response_ids=list(r.response_ids), response_logprobs=list(r.logprobs), reward=report.reward,
            action=report.action, action_valid=report.action_valid is not False,  # unreported: no penalty
            state_key=key, finish_reason=r.finish_reason, policy_version=r.policy_version,
            sampled_with=r.sampled_with,
            # "action_valid" only where the runner reported it: valid_action_rate averages those
            info={**report.info, "action": report.action,
                  **({} if report.action_valid is None else {"action_valid": report.action_valid}),
                  "branch": r.branch, "state_key_source": source, "step_report": alignment},
        )

    def _sample(self, spec: EpisodeSpec, traj: Trajectory, t: TrackedSample, *, step_score: float, step: int,
                valid: bool, state_key: str | None, info: dict[str, Any]) -> Sample:
        row = TokenRow.whole(t.input_ids, t.response_mask, t.logprobs, t.sampled_with, t.token_versions)
        return Sample.of(spec, traj, row, mode=self.mode, step_score=float(step_score), step=step, state_key=state_key,
                         action_valid=valid, rendered=t.rendered,
                         policy_version=t.policy_version, info={**info, "branch": t.branch, "requests": list(t.requests)})


__all__ = ["ProxyEnvManager", "RunnerFactory"]


# Keep, this module's old name of arl.config.KeepBranches; gym_runner_factory, the old way to bind
# GymRunner to a config
__getattr__ = old_names(__name__, globals(), Keep="arl.config:KeepBranches", gym_runner_factory=(
    "arl.rollout.runners.gym_runner (a runner factory), or make_runner_factory(gym_runner, runner_cls=...)",
    lambda: _gym_runner_factory))
