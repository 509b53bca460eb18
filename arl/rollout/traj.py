"""TrajEnvManager: one multi-turn conversation per episode, one training Sample per episode.

The prompt of turn 1 is the chat template of `traj_messages_start(...)`. Every later prompt is
the EXACT token stream so far (previous prompt + the engine's generated tokens, closed with the
template's end-of-turn if the engine was cut at max_tokens) plus the bridge tokens of the next
user message (`bridge_ids`). The model's output is never decoded and re-encoded for training, so
the sample's input_ids equal what the chat template renders for the whole conversation
(docs/reference.md §2), and the loss mask covers exactly the tokens the engine sampled.

Exit reasons: "terminated" (the game ended), "truncated" (the step limit: the env's TimeLimit or
config.max_turns), "max_length" (the next prompt plus max_tokens would not fit the context).
With ``observation: image | both`` (`ManagerConfig.observation`) each user turn shows the game's frame
too: the prompts carry every frame of the episode so far, each expanded to its image tokens as the
engine runs it (the turns' ``prompt_ids`` are those expanded ids), and the sample carries the last
prompt's `RenderedPrompt` (`Sample.rendered`: the pixel values of every image in it). A user turn
that no longer fits is no turn: its tokens and its frame are in no sample.

max_length is abnormal in records.py: `collate(mask_abnormal=True)` drops such episodes from
the loss, by default they train like any other (their score is the partial sum of rewards).
"""

from __future__ import annotations

from typing import Any

from arl.engine.prompt import PromptView
from arl.engine.tokens import TokenRow
from arl.envs.prompts import compact_messages, compact_user_message, traj_messages_start, traj_user_message
from arl.rollout.base import EnvManager, EpisodeSpec, bridge_ids, chat_ids, image_kwargs
from arl.rollout.records import Sample, Trajectory, Turn, TurnSpan


class TrajEnvManager(EnvManager):
    mode = "traj"

    async def _play(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        tok = self.tokenizer
        env, obs, limit = self.start_episode(spec, traj)
        start = self.start_messages(env, obs, limit)
        # One append-only token list per episode; each turn keeps a PromptView of its prefix, so
        # the episode's memory grows linearly with its length, not quadratically.
        ids = chat_ids(tok, start)
        # Image observations: `ids` holds one placeholder per image, `images` every frame of the
        # episode so far in order; each prompt is rendered (expanded) whole, so every image is carried
        # forward and the turns' expanded prompts still extend one another.
        images = [self.frame(traj, env)] if self.shows_images else []
        traj.exit_reason = "truncated"  # unless the game ends first or the context runs out
        while len(traj.turns) < limit:
            rendered = self.render(ids, images) if images else None
            if not self.fits(len(ids) if rendered is None else len(rendered.input_ids)):
                traj.exit_reason = "max_length"  # the cut user turn and its frame are in no sample
                break
            prompt = PromptView(ids) if rendered is None else ids
            turn, obs, terminated, truncated = await self.act(spec, traj, env, prompt, obs, **image_kwargs(rendered))
            if len(traj.turns) > 1:  # the last turn's rendered prompt holds every image: one is enough
                traj.turns[-2].rendered = None
            ids += turn.response_ids + self.close_turn(turn.response_ids)
            if terminated or truncated:
                traj.exit_reason = "terminated" if terminated else "truncated"
                break
            n = len(traj.turns)
            if n < limit:  # the bridge of the next user turn
                ids += bridge_ids(tok, [self.user_message(n, obs, limit)])
                if self.shows_images:
                    images.append(self.frame(traj, env))
        return self._build_samples(spec, traj)

    def start_messages(self, env: Any, obs: str, limit: int) -> list[dict[str, str]]:
        """The conversation's first messages (the system turn and the first observation)."""
        c = self.config
        if c.prompt_style == "compact":
            messages = compact_messages(self.shown(obs), limit, c.system_prompt)
        else:
            messages = traj_messages_start(self.shown(obs), limit, c.max_tokens, env.instructions)
        return [*messages[:-1], self.with_frame(messages[-1])]

    def user_message(self, n: int, obs: str, limit: int) -> dict[str, str]:
        """The user turn after ``n`` turns were played, showing ``obs``."""
        c = self.config
        if c.prompt_style == "compact":
            return self.with_frame({"role": "user", "content": compact_user_message(self.shown(obs), limit - n)})
        return self.with_frame({"role": "user", "content": traj_user_message(n + 1, self.shown(obs), limit - n,
                                                                             c.max_tokens)})

    def _samples_after_error(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        return self._build_samples(spec, traj)

    def _build_samples(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        """The episode's single sample, rebuilt from its turns (each turn's prompt extends the
        previous turn's tokens, so the new part of each prompt is that turn's bridge)."""
        if not traj.turns:
            return []
        row, spans = TokenRow(), []
        for turn in traj.turns:
            _check_prefix(row.ids, turn)
            bridge = turn.prompt_ids[len(row.ids) :]
            start = len(row.context(bridge).ids)
            row.generated(turn.response_ids, turn.response_logprobs, turn.sampled_with, turn.policy_version)
            spans.append(TurnSpan(start, len(row.ids), turn.reward, turn.state_key, turn.action_valid))
            row.context(self.close_turn(turn.response_ids))
        return [Sample.of(spec, traj, row, mode=self.mode, step_score=traj.episode_score,
                          action_valid=all(t.action_valid for t in traj.turns),  # policy_version: the oldest token's
                          rendered=traj.turns[-1].rendered, turns=spans)]


def _check_prefix(ids: list[int], turn: Turn) -> None:
    if turn.prompt_ids[: len(ids)] != ids:  # a bug in the prompt builder, never expected
        raise AssertionError("trajectory prompt does not extend the previous turn's tokens")
