"""What every env manager shares: the episode spec and the fault boundary (its config, a
`ManagerConfig`, is in `arl.config`).

An env manager turns one `EpisodeSpec` into an `Episode` (a Trajectory plus its training
Samples). Subclasses implement `_play(spec, traj)`; `run_episode()` wraps it so that an episode
never raises: env crashes, engine errors, rejected prompts, timeouts and bugs all end the
episode with a typed `status` / `exit_reason` on its trajectory (docs/architecture.md §4, "faults are
data"), and the formatted traceback on `traj.traceback`. Only cancellation of the caller
propagates. Traj and step managers run no agent code, so an exception that is none of the typed
ones above is arl's own bug: "internal_error" (`InternalError` for arl's invariant checks).

The chat-template helpers every manager builds token prompts with (`chat_ids`, `bridge_ids`,
`end_of_turn_ids`) live in `arl.intercept.template`, beside the MessageTracker's, so managers and
tracker render conversations the same way; they are re-exported here.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import hashlib
import math
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import attrs

from arl.config import ManagerConfig
from arl.engine.base import (
    EngineError,
    Generation,
    InvalidPromptError,
    NoVisionTowerError,
    PromptTooLongError,
    SampledWith,
    SamplingParams,
)
from arl.engine.image_prompt import ImagePrompt, RenderedPrompt
from arl.engine.prompt import PromptView
from arl.envs.game import anchor_key
from arl.envs.prompts import IMAGE_ONLY_TEXT
from arl.intercept.template import bridge_ids, chat_ids, end_of_turn_ids
from arl.rollout.records import EpisodeSpec, Sample, Trajectory, Turn

__all__ = [
    "IMAGE_ONLY_TEXT",
    "EnvError",
    "EnvManager",
    "Episode",
    "EpisodeSpec",
    "InternalError",
    "bridge_ids",
    "chat_ids",
    "end_of_turn_ids",
    "request_seed",
]


@attrs.define
class Episode:
    trajectory: Trajectory
    samples: list[Sample]


class EnvError(RuntimeError):
    """The environment raised; wraps the original exception (`__cause__`)."""


class InternalError(RuntimeError):
    """One of arl's own invariants failed: a bug in arl, not in the env, the engine or the agent.

    Raise it from an invariant check; the fault boundary ends the episode as ("Failed",
    "internal_error"). Any other unexpected exception in a manager without agent code (traj,
    step) is classified the same way.
    """


# the running episode's timeout scope (None without episode_timeout_s): tasks its agent starts inherit it
_EPISODE_SCOPE: contextvars.ContextVar[Any] = contextvars.ContextVar("arl_episode_scope", default=None)


@contextlib.contextmanager
def episode_clock_paused() -> Iterator[None]:
    """Stop the running episode's ``episode_timeout_s`` clock for the block: the time the trainer
    holds the episode (a partial rollout's update, `arl.rollout.partial.RequestGate`) is not the
    episode's own. No-op outside an episode, without a timeout, and in tasks that do not inherit the
    episode's context (the http proxy's request handlers)."""
    scope = _EPISODE_SCOPE.get()
    if scope is None:
        yield
        return
    left = scope.deadline - anyio.current_time()
    scope.deadline = math.inf
    try:
        yield
    finally:
        scope.deadline = anyio.current_time() + left


def request_seed(config: ManagerConfig, spec: EpisodeSpec, turn: int) -> int | None:
    """Per-request sampling seed, or None when `config.sampling_seed` is None.

    A stable hash of (sampling_seed, group_id, episode_id, turn): members of a group play the
    same env seed but must not sample the same tokens, and a rerun must reproduce them. 31 bits
    so every backend's generator (torch, numpy) accepts it. ProxyEnvManager uses this same
    function so proxy and traj samples match.
    """
    if config.sampling_seed is None:
        return None
    key = f"{config.sampling_seed}|{spec.group_id}|{spec.episode_id}|{turn}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") % (2**31)


# -- the manager base ---------------------------------------------------------------------------


def image_kwargs(rendered: RenderedPrompt | None) -> dict[str, RenderedPrompt]:
    """`EnvManager.act`'s keyword for an image prompt: ``{"rendered": ...}`` when there is one, else
    nothing, so a subclass written before image observations (its ``act`` without ``rendered``) keeps
    working on text prompts.

    >>> image_kwargs(None)
    {}
    """
    return {} if rendered is None else {"rendered": rendered}


class EnvManager(abc.ABC):
    """Plays episodes against an engine. Subclasses implement `_play`.

    `_play` appends Turns to `traj.turns` as they complete, sets `traj.exit_reason`, and returns
    the episode's samples. When it raises instead, `run_episode` classifies the error and asks
    `_samples_after_error(spec, traj)` for samples of the turns completed so far (by default
    none); those samples carry the abnormal exit_reason, so `collate(mask_abnormal=True)` masks
    them.
    """

    mode: str = "base"
    forks: bool = False  # plays `config.fork` (arl.rollout.fork.ForkEnvManager); the others refuse it
    gate: Any = None  # a partial rollout's RequestGate (arl.rollout.partial) that every engine request passes

    def __init__(self, engine: Any, config: ManagerConfig | None = None):
        self.engine = engine
        self.config = config or ManagerConfig()
        if self.config.observation != "text" and getattr(engine, "image_renderer", None) is None:
            raise NoVisionTowerError(
                f"observation={self.config.observation!r} shows the model the game's frames, but the "
                f"{getattr(engine, 'name', type(engine).__name__)} engine's model has no vision tower (serve a VLM, "
                "e.g. the zoo's tiny-vl)")
        if self.config.fork.k and not self.forks:  # rather than silently play unforked
            raise ValueError(f"{type(self).__name__} does not fork states: ManagerConfig.fork is played by "
                             "arl.rollout.fork.ForkEnvManager (what make_manager builds for rollout.mode=step)")

    def derive(self, config: ManagerConfig | None = None, engine: Any = None) -> EnvManager:
        """A manager of the same kind with another config (e.g. the validation temperature) or
        engine (e.g. a warm-start teacher). Subclasses with more constructor state override it."""
        return type(self)(self.engine if engine is None else engine, config or self.config)

    # -- the fault boundary ----------------------------------------------------------------------
    async def run_episode(self, spec: EpisodeSpec) -> Episode:
        """Play one episode; never raises except for cancellation of the caller."""
        traj = Trajectory(env_id=spec.env_id, group_id=spec.group_id, episode_id=spec.episode_id, seed=spec.seed)
        traj.timings.update(total=0.0, generate=0.0, env=0.0)
        start = time.perf_counter()
        samples: list[Sample] = []
        try:
            timeout = self.config.episode_timeout_s
            with anyio.fail_after(timeout) if timeout is not None else _null_scope() as scope:
                token = _EPISODE_SCOPE.set(scope)
                try:
                    samples = await self._play(spec, traj)
                finally:
                    _EPISODE_SCOPE.reset(token)
        except Exception as exc:  # noqa: BLE001 -- the boundary: every failure becomes data
            traj.status, traj.exit_reason = _classify(exc)
            traj.traceback = traceback.format_exc()  # an EnvError's includes its cause's
            traj.error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, EnvError) and exc.__cause__ is not None:
                cause = exc.__cause__
                traj.error = f"{type(cause).__name__}: {cause}"
            try:
                samples = self._samples_after_error(spec, traj)
            except Exception:  # noqa: BLE001 -- salvage is best effort
                samples = []
        traj.timings["total"] = time.perf_counter() - start
        if not samples and traj.ok and not traj.turns:
            traj.status, traj.exit_reason = "NoData", "no_data"
            # a normal end says nothing of why: without the reason it reads as a silent loss
            # (ProxyEnvManager explains its own agents' NoData episodes before this point)
            traj.error = traj.error or (
                "the episode ended without a model call, so there is nothing to train on (for the traj and step "
                "managers: a turn limit of 0, from ManagerConfig.max_turns or the env's max_steps)")
        for s in samples:  # one source of truth for how the episode ended
            s.exit_reason = traj.exit_reason
        return Episode(trajectory=traj, samples=samples)

    @abc.abstractmethod
    async def _play(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]: ...

    def _samples_after_error(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        """Samples of the turns completed before a failure (override to salvage them)."""
        return []

    # -- helpers for subclasses ------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int | None:
        return self.config.max_model_len or getattr(self.engine, "max_model_len", None)

    def sampling_params(self, spec: EpisodeSpec, turn: int) -> SamplingParams:
        c = self.config
        return SamplingParams(
            max_tokens=c.max_tokens, temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
            seed=request_seed(c, spec, turn),
            # Stop at the template's end-of-turn too (it may differ from the tokenizer's EOS).
            stop_token_ids=tuple(end_of_turn_ids(self.tokenizer)[-1:]),
        )

    @property
    def sampled_with(self) -> SampledWith:
        """How this manager's replies are drawn (`sampling_params` without its per-request seed)."""
        c = self.config
        return SampledWith(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k)

    def close_turn(self, response_ids: list[int]) -> list[int]:
        """End-of-turn tokens to append (masked) after a response the engine did not close itself,
        e.g. one cut at max_tokens, so the token stream stays what the chat template renders."""
        eot = end_of_turn_ids(self.tokenizer)
        return [] if eot and response_ids[-len(eot) :] == eot else eot

    def fits(self, prompt_len: int) -> bool:
        """Whether a prompt of this length leaves room for a full `max_tokens` response."""
        limit = self.max_model_len
        return limit is None or prompt_len + self.config.max_tokens <= limit

    async def generate(self, traj: Trajectory, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """engine.generate, timed into traj.timings["generate"]. With a ``gate`` (a partial rollout's
        `arl.rollout.partial.RequestGate`) the request first waits while the gate is closed (an update
        is under way; the wait is timed into traj.timings["paused"], not "generate")."""
        gate = self.gate
        if gate is not None:
            await gate.enter(traj)
        start = time.perf_counter()
        gen: Any = None
        try:
            gen = await self.engine.generate(prompt_ids, params)
        finally:
            traj.timings["generate"] += time.perf_counter() - start
            if gate is not None:
                gate.leave(traj, gen)
        if isinstance(gen, list):  # n > 1 is not how managers sample
            gen = gen[0]
        return gen

    # -- image observations (config.observation "image" | "both"; docs/guide.md "Image observations") ---
    @property
    def shows_images(self) -> bool:
        return self.config.observation != "text"

    def shown(self, observation: str) -> str:
        """The text a prompt shows for ``observation``: the grid, or with ``observation: image`` a
        sentence that points to the image (the model learns the board from the pixels alone)."""
        return IMAGE_ONLY_TEXT if self.config.observation == "image" else observation

    def with_frame(self, message: dict[str, Any]) -> dict[str, Any]:
        """``message`` with the game's frame first in its content (an image content part, which the
        VLM's chat template renders as one image placeholder), when the prompts show images."""
        if not self.shows_images:
            return message
        return {**message, "content": [{"type": "image"}, {"type": "text", "text": message["content"]}]}

    def frame(self, traj: Trajectory, env: Any) -> Any:
        """The game's RGB frame now (`arl.envs.render`); an env error for a game that draws none."""
        game = getattr(env, "unwrapped", env)
        if not callable(getattr(game, "frame", None)):
            raise EnvError(f"{type(game).__name__} draws no frames: observation={self.config.observation!r} needs a "
                           "game with frame() (FrozenLake, Sokoban)")
        return self.env_call(traj, game.frame)

    def render(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> RenderedPrompt:
        """``prompt_ids`` (one placeholder per image) and ``images`` as the engine will run them: its
        renderer's expanded ids and pixel values (what the trainer's forward gets)."""
        return self.engine.image_renderer.render(ImagePrompt(list(prompt_ids), list(images)))

    async def act(
        self, spec: EpisodeSpec, traj: Trajectory, env: Any, prompt_ids: Sequence[int], observation: str,
        rendered: RenderedPrompt | None = None,
    ) -> tuple[Turn, str, bool, bool]:
        """One model call on `prompt_ids` and the env step it drives.

        Records the Turn on `traj` (and its reward / success) and returns
        (turn, next observation, terminated, truncated). The env gets the decoded reply text;
        the Turn keeps the engine's exact tokens. A PromptView `prompt_ids` is kept as it is (no
        copy); any other sequence is copied into the Turn's own list. With ``rendered`` (a prompt
        that shows images, `render`) the engine is sent its `ImagePrompt`, and the Turn keeps the
        expanded ids the engine ran as ``prompt_ids`` and ``rendered`` itself.
        """
        params = self.sampling_params(spec, len(traj.turns))
        if rendered is None:
            gen = await self.generate(traj, prompt_ids, params)
        else:
            gen = await self.generate(traj, rendered.prompt, params)
            if gen.prompt_token_ids != rendered.input_ids:
                raise InternalError(f"the engine ran {gen.prompt_len} prompt ids, not the {len(rendered.input_ids)} "
                                    "expanded ids the manager rendered: image features and image tokens would not match")
            if rendered.image_token_id in gen.token_ids:  # a forward would take it for an image's slot
                raise EngineError(f"the model sampled the image placeholder token (id {rendered.image_token_id}) in "
                                  "its reply: a sample with it cannot be scored (its image tokens would not match)")
            prompt_ids = list(rendered.input_ids)
        turn, obs, terminated, truncated = await self.take(traj, env, prompt_ids, observation, gen)
        turn.rendered = rendered
        self.record(traj, turn)
        return turn, obs, terminated, truncated

    async def take(
        self, traj: Trajectory, env: Any, prompt_ids: Sequence[int], observation: str, gen: Generation,
        text: str | None = None,
    ) -> tuple[Turn, str, bool, bool]:
        """The env step ``gen``'s reply drives, as a Turn that is not recorded on ``traj`` (a forked
        branch's turns are not the trajectory's): (turn, next observation, terminated, truncated).

        The turn's ``state_key`` is GiGPO's anchor key of ``observation``'s state, taken before
        the step moves the env on (`anchor_key`: the game's ``state_key()``, or the observation's
        hash for an env that is not an arl game, which ``info["state_key_source"]`` then says).
        ``text``: the reply as a model server sent it, when there are no token ids to decode
        (`arl.rollout.remote`)."""
        if text is None:
            text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        key, source = self.env_call(traj, anchor_key, env, observation)
        obs, reward, terminated, truncated, info = await self.env_step(traj, env, text)
        info = {**info, "state_key_source": source}
        turn = Turn(
            observation=observation,
            prompt_ids=prompt_ids if isinstance(prompt_ids, PromptView) else list(prompt_ids),
            response_ids=list(gen.token_ids),
            response_logprobs=list(gen.logprobs),
            reward=float(reward),
            action=info.get("action"),
            action_valid=bool(info.get("action_valid", False)),
            state_key=key,
            finish_reason=gen.finish_reason,
            policy_version=gen.policy_version,
            info={k: v for k, v in info.items() if k != "raw_obs"},
            sampled_with=self.sampled_with,
        )
        return turn, str(info.get("raw_obs", obs)), bool(terminated), bool(truncated)

    def record(self, traj: Trajectory, turn: Turn) -> None:
        """Append ``turn`` to the trajectory, with its reward and the success it reports."""
        traj.turns.append(turn)
        traj.episode_score += turn.reward
        traj.success = bool(turn.info.get("success", False))

    def start_episode(self, spec: EpisodeSpec, traj: Trajectory) -> tuple[Any, str, int]:
        """A fresh env reset to the spec's seed: (env, raw first observation, turn limit)."""
        env = self.make_env(spec, traj)
        # The episode's name: what a per-episode env latency is drawn for (TextEnv's step_latency).
        obs, info = self.env_call(traj, env.reset, seed=spec.seed, options={"episode": spec.traj_id})
        return env, str(info.get("raw_obs", obs)), self.turn_limit(env)

    def make_env(self, spec: EpisodeSpec, traj: Trajectory) -> Any:
        """A fresh TextEnv for `spec` (construction errors are env errors)."""
        from arl.envs.text import TextEnv

        return self.env_call(
            traj, TextEnv, spec.env_id, format_penalty=self.config.format_penalty, **self.config.env_kwargs
        )

    def env_call(self, traj: Trajectory, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call into the env, timed into traj.timings["env"]; its exceptions become EnvError.

        Envs run synchronously on the loop: the games are microseconds per step, and a thread hop
        would cost more than it saves. A step that waits (an env with ``astep``) goes through
        `env_step` instead.
        """
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise EnvError(str(exc)) from exc
        finally:
            traj.timings["env"] += time.perf_counter() - start

    async def env_step(self, traj: Trajectory, env: Any, text: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """``env.step(text)`` as `env_call` runs it, or, for an env with ``astep`` (a game with a
        ``step_latency``, a tool env whose steps run subprocesses), awaited: a slow step then waits
        without stalling every other episode on the loop. Timed into traj.timings["env"] the same way."""
        astep = getattr(env, "astep", None)
        if astep is None:
            return self.env_call(traj, env.step, text)
        start = time.perf_counter()
        try:
            return await astep(text)
        except Exception as exc:  # a cancellation (BaseException) passes through, as everywhere on the loop
            raise EnvError(str(exc)) from exc
        finally:
            traj.timings["env"] += time.perf_counter() - start

    def turn_limit(self, env: Any) -> int:
        """The smaller of config.max_turns and the env's own step limit.

        Prompts tell the model how many actions it has left, so an env without a step limit
        needs config.max_turns.
        """
        limits = [x for x in (self.config.max_turns, getattr(env, "max_steps", None)) if x is not None]
        if not limits:
            raise ValueError("the env has no step limit: set ManagerConfig.max_turns")
        return min(limits)


def _classify(exc: BaseException) -> tuple[str, str]:
    """(status, exit_reason) of an exception that ended an episode."""
    if isinstance(exc, TimeoutError):
        return "Timeout", "timeout"
    if isinstance(exc, EnvError):
        return "Failed", "env_error"
    if isinstance(exc, PromptTooLongError):
        # The prompt outgrew the engine's context: the same end as the managers' own fit check.
        return "Finished", "max_length"
    if isinstance(exc, InvalidPromptError):
        return "Failed", "invalid_prompt"
    if isinstance(exc, EngineError):
        return "Failed", "engine_error"
    # Traj and step managers run no agent code: anything else is arl's own bug (InternalError or
    # not). Agent code runs in ProxyEnvManager, which classifies its runner's exceptions itself.
    return "Failed", "internal_error"


class _null_scope:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
