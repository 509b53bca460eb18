"""StepEnvManager: a fresh self-contained prompt per step, one training Sample per step.

The prompt of step t is `step_messages(...)`: instructions, the last `history_len` steps
(observation, action, reward) — every step, valid or not — and the current observation. Each
sample is prompt + response with the loss mask on the response; its ``step_score`` is the step
reward, and every sample of an episode gets the final ``episode_score`` once the episode ends. Its
``state_key`` is the hash of the game's ``state_key()`` in the state the action was taken in (not
the prompt, not the history; `arl.envs.anchor_key`, set by `take`), so GiGPO can group equal states
across the members of a group (docs/reference.md §2, §3.2); an env that is not an arl game is keyed by its
raw observation text, and its turns say so (``info["state_key_source"] == "observation"``).

With ``observation: image | both`` (`ManagerConfig.observation`) each step prompt shows one frame,
the game's state now (the history stays text, and with ``image`` it names no grid); the sample keeps
the prompt's `RenderedPrompt`. The state key is still the game's ``state_key()``, never the pixels.

Exit reasons as in TrajEnvManager; "max_length" here means a single step prompt (which grows
only with the history window) no longer fits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from arl.engine.tokens import TokenRow
from arl.envs.prompts import compact_messages, history_action, step_messages
from arl.rollout.base import EnvManager, EpisodeSpec, chat_ids, image_kwargs
from arl.rollout.records import Sample, Trajectory, Turn

# (env, prompt ids, observation, history, turn limit) -> (turn, next observation, terminated, truncated)
TakeTurn = Callable[[Any, list[int], str, list[tuple[str, str, float]], int], Awaitable[tuple[Turn, str, bool, bool]]]


class StepEnvManager(EnvManager):
    mode = "step"

    async def _play(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        await self.play_steps(spec, traj)
        return self._build_samples(spec, traj)

    async def play_steps(self, spec: EpisodeSpec, traj: Trajectory, take_turn: TakeTurn | None = None) -> None:
        """The episode's loop: a fresh prompt per step until the game ends, the limit or a prompt
        that no longer fits. ``take_turn(env, prompt, obs, history, limit)`` plays one turn
        (default `act`; the fork manager forks there at chosen states)."""
        env, obs, limit = self.start_episode(spec, traj)
        history: list[tuple[str, str, float]] = []
        traj.exit_reason = "truncated"
        while len(traj.turns) < limit:
            t = len(traj.turns)
            prompt = self.step_prompt(env, obs, t, history, limit)
            rendered = self.render(prompt, [self.frame(traj, env)]) if self.shows_images else None
            if not self.fits(len(prompt) if rendered is None else len(rendered.input_ids)):
                traj.exit_reason = "max_length"
                break
            if take_turn is None:
                turn, next_obs, terminated, truncated = await self.act(spec, traj, env, prompt, obs, **image_kwargs(rendered))
            else:
                turn, next_obs, terminated, truncated = await take_turn(env, prompt, obs, history, limit)
            self.remember(history, obs, turn)
            obs = next_obs
            if terminated or truncated:
                traj.exit_reason = "terminated" if terminated else "truncated"
                break

    def step_prompt(self, env: Any, obs: str, t: int, history: list[tuple[str, str, float]], limit: int) -> list[int]:
        """The token prompt of step ``t`` in state ``obs`` after ``history``, with ``limit`` turns in all."""
        return chat_ids(self.tokenizer, self.prompt_messages(env, obs, t, history, limit))

    def prompt_messages(self, env: Any, obs: str, t: int, history: list[tuple[str, str, float]],
                        limit: int) -> list[dict[str, str]]:
        """The chat messages `step_prompt` renders (what a model server is sent, `arl.rollout.remote`)."""
        c = self.config
        if c.prompt_style == "compact":
            messages = compact_messages(self.shown(obs), limit - t, c.system_prompt)
        else:
            messages = step_messages(env.instructions, self.shown(obs), t, history, c.history_len, limit - t,
                                     c.max_tokens)
        return [*messages[:-1], self.with_frame(messages[-1])]

    def remember(self, history: list[tuple[str, str, float]], obs: str, turn: Turn) -> None:
        """Append the step ``turn`` took in ``obs`` to the history the next prompts show."""
        reply = self.tokenizer.decode(turn.response_ids, skip_special_tokens=True)
        history.append((self.shown(obs), history_action(turn.action, turn.action_valid, reply), turn.reward))

    def _samples_after_error(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        return self._build_samples(spec, traj)

    def _build_samples(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        return [self.turn_sample(spec, traj, turn, index) for index, turn in enumerate(traj.turns)]

    def turn_sample(self, spec: EpisodeSpec, traj: Trajectory, turn: Turn, step: int, **differences: Any) -> Sample:
        """One turn as a sample: its prompt, its reply (closed), credited with its reward; the fork
        manager's branch rows give their ``differences`` (`Sample.of`'s keywords)."""
        row = TokenRow.turn(turn.prompt_ids, turn.response_ids, turn.response_logprobs,
                            self.close_turn(turn.response_ids), turn.sampled_with, turn.policy_version)
        return Sample.of(spec, traj, row, mode=self.mode, step_score=turn.reward, step=step, state_key=turn.state_key,
                         action_valid=turn.action_valid, policy_version=turn.policy_version, rendered=turn.rendered,
                         **differences)
