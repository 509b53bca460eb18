"""Typed records of a rollout: EpisodeSpec -> Turn -> Trajectory -> Sample, and `collate()` into tensors.

An EpisodeSpec is what to play; a Trajectory is what happened (the env's view); a Sample is what
the trainer eats (the token view), built by `Sample.of` in every manager. Trajectory-level
managers make one Sample per episode, step-level managers one per turn.
A forking step manager (`arl.rollout.fork`) also records the branches it played from copies of a
trajectory's env (`ForkBranch`), and one Sample per branch: its forked action, in the trunk's state and prompt.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Sequence
from typing import Any

import attrs

from arl._renamed import old_names, renamed_fields, renamed_keywords, warn_renamed
from arl.agents.runner import RunnerStatus
from arl.engine.base import SampledWith
from arl.engine.tokens import TokenRow, count_runs

# Why an episode ended. Normal: the game ended or its step limit hit. Abnormal: everything else;
# abnormal episodes can be masked out of the loss (`collate(..., mask_abnormal=True)`).
NORMAL_EXITS = frozenset({"terminated", "truncated"})
EXIT_REASONS = NORMAL_EXITS | {
    "max_length",  # the next prompt would no longer fit the context
    "env_error",  # the environment raised
    "engine_error",  # the engine failed the request
    "timeout",  # the episode ran past its time budget
    "agent_error",  # agent code (a runner) raised
    "internal_error",  # arl's own code raised (a bug in arl, e.g. a failed InternalError check)
    "invalid_prompt",  # the engine rejected the prompt
    "no_data",  # the agent finished without producing a single model call
}


@attrs.frozen
class EpisodeSpec:
    """One episode to play. Every member of a group has the same `seed` and `group_id`."""

    env_id: str  # gymnasium id, e.g. "arl/FrozenLake-v0"
    seed: int  # env seed; equal for all members of a group
    group_id: str  # "{tag}_{group_index}_{group_seed}", shared by the group
    episode_id: int  # member index inside the group
    tag: str = "train"  # "train" | "val" | user tags

    @property
    def traj_id(self) -> str:
        return f"{self.group_id}/{self.episode_id}"


@renamed_fields(state_hash="state_key")
@attrs.define
class Turn:
    """One model call and the env step it drove. (``state_hash``, the old name of ``state_key``,
    still works as a keyword and an attribute, with a DeprecationWarning.)"""

    observation: str  # raw observation the action was taken in
    # The full prompt fed to the engine: a list, or a PromptView into the episode's token list
    # (trajectory mode, where each prompt extends the previous one).
    prompt_ids: Sequence[int]
    response_ids: list[int]  # engine-generated tokens, exactly as sampled
    response_logprobs: list[float]  # one per response token
    reward: float = 0.0
    action: str | None = None  # parsed action, None when invalid
    action_valid: bool = False
    # The state key, GiGPO's anchor: a hash of the game's state_key() in that state
    # (`arl.envs.anchor_key`; info["state_key_source"] names any fallback)
    state_key: str | None = None
    finish_reason: str = "stop"
    policy_version: int = 0
    info: dict[str, Any] = attrs.Factory(dict)
    sampled_with: SampledWith | None = None  # how response_ids were drawn (None: not recorded)
    # A prompt that showed images (ManagerConfig.observation "image"/"both"): its
    # `arl.engine.image_prompt.RenderedPrompt`, whose expanded ids are ``prompt_ids`` (what the engine
    # ran) and whose pixel values the trainer's forward gets. A trajectory keeps it on its last turn only
    # (each one holds every image of the episode so far). None: a token prompt.
    rendered: Any = None


@attrs.define
class ForkBranch:
    """One alternative sampled at a forked state of a trajectory (`arl.rollout.fork`): a copy of the
    env at trunk step `step` took completion `index` of the fork's n=K request, then played on under
    the policy. Not an episode of its group: the trunk is; a branch only prices one action."""

    fork_id: str  # "{traj_id}@{step}": shared by the fork's K rows, the trunk's own included
    traj_id: str  # "{fork_id}.{index}"
    step: int  # the trunk step it forked at (the state the K actions were sampled in)
    index: int  # completion index in the fork's request; 0 is the trunk's own action, so >= 1 here
    turns: list[Turn] = attrs.Factory(list)  # [0]: the forked action (the fork's prompt); then the playout
    exit_reason: str = "truncated"  # terminated | truncated | horizon (fork.horizon reached) | max_length
    success: bool = False

    @property
    def rewards(self) -> list[float]:
        return [turn.reward for turn in self.turns]


@attrs.define
class Trajectory:
    """One episode of one env. `group_id` is shared by every member that played the same seed."""

    env_id: str
    group_id: str
    episode_id: int
    seed: int
    turns: list[Turn] = attrs.Factory(list)
    episode_score: float = 0.0
    success: bool = False
    status: RunnerStatus = "Finished"  # the runner vocabulary (arl.agents.runner.STATUSES), for every manager
    exit_reason: str = "terminated"
    error: str | None = None  # the exception text for abnormal exits
    traceback: str | None = None  # the formatted traceback of the exception that ended the episode
    timings: dict[str, float] = attrs.Factory(dict)
    branches: list[ForkBranch] = attrs.Factory(list)  # forked alternatives (arl.rollout.fork), in fork order

    @property
    def traj_id(self) -> str:
        return f"{self.group_id}/{self.episode_id}"

    @property
    def ok(self) -> bool:
        return self.exit_reason in NORMAL_EXITS


@attrs.frozen
class TurnSpan:
    """One turn inside a trajectory sample: its reply is ``input_ids[start:end]``; ``reward`` is what
    its env step earned, ``state_key`` the anchor key of the state it acted in (`EnvManager.take`),
    ``action_valid`` whether its reply was a valid action. GiGPO reads a trajectory sample as one
    step row per turn through these (`arl.algo.estimators`), as verl's ``arl_gigpo`` reads the
    agent loop's turn spans."""

    start: int
    end: int
    reward: float
    state_key: str | None
    action_valid: bool


# Sample's arguments after old_logprobs; before `score` was removed it came fourth, these after it
_AFTER_LOGPROBS = ("episode_score", "step_score", "group_id", "traj_id")


def _score_as_fourth_argument(cls: type[Sample]) -> type[Sample]:
    """Sample's ``__init__`` also takes the positional arguments of before ``score`` was removed,
    ``(input_ids, response_mask, old_logprobs, score, episode_score, step_score, group_id, ...)``:
    ``score`` is dropped with a DeprecationWarning (TypeError unless it equals ``step_score``).
    Told apart by what follows: a number where ``group_id`` comes now, or an argument given both
    positionally now and by keyword (the old layout's ``episode_score=`` / ``step_score=``)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Sample, *args: Any, **kwargs: Any) -> None:
        if len(args) >= 4 and (
            any(name in kwargs for name in _AFTER_LOGPROBS[: len(args) - 3])
            or (len(args) >= 6 and isinstance(args[5], numbers.Number))
        ):
            score, args = args[3], args[:3] + args[4:]
            warn_renamed("Sample(input_ids, response_mask, old_logprobs, score, ...)",
                         "Sample(input_ids, response_mask, old_logprobs, episode_score, step_score, ...): "
                         "score, a copy of step_score, is removed", stacklevel=3)  # Sample()'s caller
            step_score = args[4] if len(args) >= 5 else kwargs.get("step_score")
            if score != step_score:
                raise TypeError(f"Sample() got score={score!r} and step_score={step_score!r}: score, the old "
                                "copy of step_score, is removed; give only step_score")
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


@renamed_fields(state_hash="state_key", score="step_score")
@_score_as_fourth_argument
@attrs.define
class Sample:
    """One training sequence. `old_logprobs` and `response_mask` align with `input_ids`.

    Old names, still accepted with a DeprecationWarning: ``state_hash`` (now ``state_key``) and
    ``score`` (a copy of ``step_score``, removed; given with ``step_score``, the two must be equal),
    as keywords and read-only attributes, and ``score`` as the fourth positional argument.
    """

    input_ids: list[int]
    response_mask: list[int]  # 1 on engine-generated tokens (the loss mask), else 0
    old_logprobs: list[float]  # engine log-probs at response positions, 0.0 elsewhere
    episode_score: float  # the episode's total
    step_score: float  # this step's reward (== episode_score for trajectory samples): collate's scores
    group_id: str  # members of a group played the same seed ("traj_group_id")
    traj_id: str
    step: int = 0  # turn index inside its trajectory (0 for trajectory samples)
    state_key: str | None = None  # the state key (GiGPO's anchor) of the state the action was taken in
    env_id: str = ""
    exit_reason: str = "terminated"
    action_valid: bool = True
    policy_version: int = 0  # the oldest policy version among its response tokens (`token_versions`)
    info: dict[str, Any] = attrs.Factory(dict)
    # Forked anchor groups (arl.rollout.fork): rows with one fork_id acted in one copied state from
    # one prompt; fork_rewards are the rewards from that state on (this row's action first), whose
    # discounted sum is the return the fork group compares. A branch row is a forked action played
    # in a copy of the env: it is trained, but it is no episode of its group (no episode term).
    fork_id: str | None = None
    fork_rewards: tuple[float, ...] = attrs.field(default=(), converter=tuple)
    branch: bool = False
    # How each reply in the sample was drawn: one record per run of response_mask, in order (a
    # trajectory sample has one per turn). The trainer scores each reply's tokens at its own
    # temperature; empty: not recorded, scored at the run's configured temperature.
    sampled_with: tuple[SampledWith, ...] = attrs.field(default=(), converter=tuple)
    # The images the sample shows: the `arl.engine.image_prompt.RenderedPrompt` of its last prompt, whose
    # expanded ids begin ``input_ids`` and whose pixel values the engine ran; every image token of
    # input_ids is one of its images' (a turn cut for length is no turn: its images are not here).
    # None: a text sample.
    rendered: Any = None
    # The policy version that sampled each token, aligned with input_ids (-1 on context tokens): a
    # partial rollout's carried episode holds tokens of several versions (`arl.rollout.partial`).
    # Empty: not recorded, every response token counts as ``policy_version``'s (`response_versions`).
    token_versions: list[int] = attrs.Factory(list)
    # A trajectory sample's turns, in order, one per reply (`TurnSpan`): what GiGPO's step term reads
    # there. Empty: a step sample (its own step, state_key and step_score are the turn's), or a
    # trajectory sample made without them.
    turns: tuple[TurnSpan, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        n = len(self.input_ids)
        end = 0
        for span in self.turns:
            if not end <= span.start <= span.end <= n:
                raise ValueError(f"Sample turns misaligned: a turn spans [{span.start}, {span.end}) after "
                                 f"{end}, in {n} input ids (turns are in order, inside input_ids)")
            end = span.end
        if self.rendered is not None:
            check_images(self.input_ids, self.response_mask, self.rendered)
        if len(self.response_mask) != n or len(self.old_logprobs) != n:
            raise ValueError(
                f"Sample fields misaligned: input_ids {n}, response_mask {len(self.response_mask)}, "
                f"old_logprobs {len(self.old_logprobs)}"
            )
        if self.sampled_with and len(self.sampled_with) != count_runs(self.response_mask):
            raise ValueError(f"{len(self.sampled_with)} sampled_with records for "
                             f"{count_runs(self.response_mask)} replies (runs of response_mask)")
        if self.branch and self.fork_id is None:
            raise ValueError("a branch sample needs the fork_id of the state it was forked in")
        if self.token_versions:
            if len(self.token_versions) != n:
                raise ValueError(f"Sample fields misaligned: input_ids {n}, token_versions {len(self.token_versions)}")
            sampled = [v for v, m in zip(self.token_versions, self.response_mask, strict=True) if m]
            if any(v < 0 for v in sampled):
                raise ValueError("token_versions has no version (-1) on a response token")
            if sampled and min(sampled) != self.policy_version:
                raise ValueError(f"policy_version {self.policy_version} is not the oldest of the response tokens' "
                                 f"versions ({min(sampled)})")

    @classmethod
    @renamed_keywords("Sample.of", score="step_score", state_hash="state_key")
    def of(
        cls, spec: EpisodeSpec, traj: Trajectory, row: TokenRow, *, mode: str, step_score: float,
        action_valid: bool, policy_version: int | None = None, step: int = 0, state_key: str | None = None,
        traj_id: str | None = None, episode_score: float | None = None, info: dict[str, Any] | None = None,
        fork_id: str | None = None, fork_rewards: Sequence[float] = (), branch: bool = False, rendered: Any = None,
        turns: Sequence[TurnSpan] = (),
    ) -> Sample:
        """The one way a manager makes a Sample: ``row``'s tokens, loss mask, log-probs and draws,
        credited with ``step_score``, in ``spec``'s group, env and trajectory
        (``traj_id``: another, a branch's) and ``traj``'s exit and episode score (``episode_score``:
        another, a branch's). ``rendered``: the images of its last prompt (`Sample.rendered`); ``turns``: a
        trajectory sample's `TurnSpan` per reply. ``info`` holds ``mode`` and the episode's seed, tag, number of turns and
        success, then ``info``'s own entries (which may replace them). ``policy_version``: the
        oldest of the row's token versions when it records them (None: that one; 0 if it does not)."""
        versions = row.token_versions
        if policy_version is None:
            policy_version = min((v for v, m in zip(versions, row.mask, strict=True) if m), default=0)
        return cls(
            input_ids=row.ids, response_mask=row.mask, old_logprobs=row.logprobs, sampled_with=row.sampled_with,
            episode_score=traj.episode_score if episode_score is None else episode_score,
            step_score=step_score, group_id=spec.group_id, traj_id=spec.traj_id if traj_id is None else traj_id,
            step=step, state_key=state_key, env_id=spec.env_id, exit_reason=traj.exit_reason,
            action_valid=action_valid, policy_version=policy_version,
            info={"mode": mode, "seed": spec.seed, "tag": spec.tag, "num_turns": len(traj.turns),
                  "success": traj.success, **(info or {})},
            fork_id=fork_id, fork_rewards=fork_rewards, branch=branch, rendered=rendered, token_versions=versions,
            turns=turns,
        )

    @property
    def ok(self) -> bool:
        return self.exit_reason in NORMAL_EXITS

    @property
    def num_response_tokens(self) -> int:
        return sum(self.response_mask)

    def response_versions(self) -> list[int]:
        """The policy version that sampled each response token, in order: its `token_versions`,
        or ``policy_version`` for every one where the sample does not record them.

        >>> s = Sample([1, 2, 3, 4], [0, 1, 0, 1], [0.0] * 4, 0.0, 0.0, "g", "g/0", policy_version=2,
        ...            token_versions=[-1, 2, -1, 3])
        >>> s.response_versions(), attrs.evolve(s, token_versions=[]).response_versions()
        ([2, 3], [2, 2])
        """
        if not self.token_versions:
            return [self.policy_version] * self.num_response_tokens
        return [v for v, m in zip(self.token_versions, self.response_mask, strict=True) if m]


def check_images(input_ids: Sequence[int], response_mask: Sequence[int], rendered: Any) -> None:
    """`ValueError` unless ``rendered`` (a `RenderedPrompt`) is what ``input_ids`` show: its expanded ids
    begin them, no image token lies past them (a cut turn's images are dropped with its tokens), and
    the loss mask is on no image token.

    >>> import numpy as np
    >>> from arl.engine.image_prompt import ImagePrompt, RenderedPrompt
    >>> r = RenderedPrompt(ImagePrompt([5, 9], [None]), (5, 9, 9), np.zeros((8, 3)), np.array([[1, 2, 4]]), (None,), 9)
    >>> check_images([5, 9, 9, 7, 2], [0, 0, 0, 1, 0], r)
    >>> check_images([5, 9, 9, 7, 9], [0, 0, 0, 1, 0], r)
    Traceback (most recent call last):
    ...
    ValueError: 3 image tokens in the sample for 2 in its rendered images: image features and image tokens would not match
    """
    ids = list(input_ids)
    expanded = list(rendered.input_ids)
    if ids[: len(expanded)] != expanded:
        raise ValueError("the sample's input_ids do not begin with its rendered prompt's expanded ids")
    token = rendered.image_token_id
    shown, have = ids.count(token), expanded.count(token)
    if shown != have:
        raise ValueError(f"{shown} image tokens in the sample for {have} in its rendered images: "
                         "image features and image tokens would not match")
    if any(m and t == token for t, m in zip(ids, response_mask, strict=True)):
        raise ValueError("the loss mask is on an image token")


def reply_index(response_mask: Sequence[int]) -> list[int | None]:
    """Per token, the index of the reply (the run of ``response_mask`` ones) it belongs to, None
    on context tokens: the position of its `SampledWith` in ``Sample.sampled_with``.

    >>> reply_index([0, 1, 0, 1, 1])
    [None, 0, None, 1, 1]
    """
    out: list[int | None] = []
    run = -1
    for i, m in enumerate(response_mask):
        if m and (i == 0 or not response_mask[i - 1]):
            run += 1
        out.append(run if m else None)
    return out


def token_temperatures(sample: Sample, default: float = 1.0) -> list[float]:
    """The temperature to score each token of ``sample`` at: on each reply, the one it was drawn
    at (`SampledWith.scoring_temperature`: 1 for a greedy draw), ``default`` where the sample
    does not say; 1 on context tokens (never scored).

    >>> s = Sample([1, 2, 3, 4, 5], [0, 1, 0, 1, 1], [0.0] * 5, 0.0, 0.0, "g", "g/0",
    ...            sampled_with=[SampledWith(temperature=0.3), SampledWith(temperature=0.0)])
    >>> token_temperatures(s)
    [1.0, 0.3, 1.0, 1.0, 1.0]
    >>> token_temperatures(attrs.evolve(s, sampled_with=()), default=0.7)
    [1.0, 0.7, 1.0, 0.7, 0.7]
    """
    drawn = sample.sampled_with
    return [1.0 if run is None else drawn[run].scoring_temperature if drawn else default
            for run in reply_index(sample.response_mask)]


def sampling_counts(samples: Sequence[Sample], mask_abnormal: bool = False) -> dict[str, float]:
    """How the trained tokens were drawn, counted over the response tokens that enter the loss.

      sampling_recorded_tokens    tokens whose sample records how they were drawn
      sampling_greedy_tokens      drawn at temperature 0 (a group of greedy replies is identical: no signal)
      sampling_truncated_tokens   drawn under top-p/top-k: the trainer's full softmax cannot reproduce
                                  the engine's renormalised log-probs for them
      sampling_constrained_tokens drawn under an output constraint (masked logits, likewise)
      sampling_stop_string_tokens in replies a stop string ended
      sampling_temperature_mean   mean draw temperature of the recorded tokens (absent without any)
      sampling_overridden_fields  agent requests' temperature/top_p/top_k the config overrode
                                  (``agent_sampling: override``), over the batch's episodes; present
                                  only where samples carry their handler's stats (proxy mode)

    >>> s = Sample([1, 2, 3], [0, 1, 1], [0.0] * 3, 0.0, 0.0, "g", "g/0",
    ...            sampled_with=[SampledWith(temperature=0.5, top_p=0.9)])
    >>> sampling_counts([s])["sampling_truncated_tokens"]
    2.0
    """
    counts = dict.fromkeys(("recorded", "greedy", "truncated", "constrained", "stop_string"), 0.0)
    temperature_sum = 0.0
    for s in samples:
        if not s.sampled_with or (mask_abnormal and not s.ok):
            continue
        for run in reply_index(s.response_mask):
            if run is None:
                continue
            drawn = s.sampled_with[run]
            counts["recorded"] += 1
            counts["greedy"] += drawn.temperature == 0
            counts["truncated"] += drawn.truncated
            counts["constrained"] += drawn.constrained
            counts["stop_string"] += drawn.stopped_by_string
            temperature_sum += drawn.temperature
    out = {f"sampling_{k}_tokens": float(v) for k, v in counts.items()}
    if counts["recorded"]:
        out["sampling_temperature_mean"] = temperature_sum / counts["recorded"]
    overrides = {s.traj_id: s.info["handler"].get("sampling_overrides", 0)
                 for s in samples if isinstance(s.info.get("handler"), dict)}
    if overrides:  # one count per episode (its samples share their handler's stats)
        out["sampling_overridden_fields"] = float(sum(overrides.values()))
    return out


def collate(samples: Sequence[Sample], pad_id: int = 0, mask_abnormal: bool = False,
            default_temperature: float = 1.0) -> dict[str, Any]:
    """Right-pad samples into tensors.

    Returns input_ids, attention_mask, position_ids, response_mask, logprobs, temperatures
    (`token_temperatures`, ``default_temperature`` for samples that do not record theirs) (B, L)
    tensors; token_scores (B, L) with each sample's ``step_score`` on its last response token;
    scores (each sample's ``step_score``, as step_scores), episode_scores, step_scores, steps (B,)
    tensors; and group_ids, traj_ids, state_keys lists. A batch with images (`Sample.rendered`) has
    ``pixel_values`` and ``image_grid_thw`` too, lists with each row's arrays (None for a text row),
    and ``mm_token_type_ids`` (B, L), 1 on image tokens: what a Qwen2-VL forward takes, from which it
    computes its 3-D rotary positions (`arl.train.update.rows_of` joins the rows it takes).
    With `mask_abnormal`, samples of abnormally ended episodes get an all-zero response_mask.
    """
    import torch

    if not samples:
        raise ValueError("collate() needs at least one sample")
    batch, length = len(samples), max(len(s.input_ids) for s in samples)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    response_mask = torch.zeros((batch, length), dtype=torch.float32)
    logprobs = torch.zeros((batch, length), dtype=torch.float32)
    token_scores = torch.zeros((batch, length), dtype=torch.float32)
    temperatures = torch.ones((batch, length), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        input_ids[i, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        temperatures[i, :n] = torch.tensor(token_temperatures(s, default_temperature), dtype=torch.float32)
        attention_mask[i, :n] = 1
        if not (mask_abnormal and not s.ok):
            response_mask[i, :n] = torch.tensor(s.response_mask, dtype=torch.float32)
        logprobs[i, :n] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        resp = [j for j, m in enumerate(s.response_mask) if m]
        token_scores[i, resp[-1] if resp else n - 1] = s.step_score
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    images = _image_inputs(samples, input_ids)
    return {
        **images,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "logprobs": logprobs,
        "temperatures": temperatures,
        "token_scores": token_scores,
        "scores": torch.tensor([s.step_score for s in samples], dtype=torch.float32),
        "episode_scores": torch.tensor([s.episode_score for s in samples], dtype=torch.float32),
        "step_scores": torch.tensor([s.step_score for s in samples], dtype=torch.float32),
        "steps": torch.tensor([s.step for s in samples], dtype=torch.long),
        "group_ids": [s.group_id for s in samples],
        "traj_ids": [s.traj_id for s in samples],
        "state_keys": [s.state_key for s in samples],
    }


def _image_inputs(samples: Sequence[Sample], input_ids: Any) -> dict[str, Any]:
    """collate's image keys ({} for a text batch): each row's pixels and grid, and the image-token mask."""
    import torch

    if all(s.rendered is None for s in samples):
        return {}
    mm = torch.zeros_like(input_ids)
    for i, s in enumerate(samples):
        if s.rendered is not None:
            n = len(s.input_ids)
            mm[i, :n] = input_ids[i, :n] == s.rendered.image_token_id
    return {"pixel_values": [None if s.rendered is None else torch.from_numpy(s.rendered.pixel_values) for s in samples],
            "image_grid_thw": [None if s.rendered is None else torch.from_numpy(s.rendered.image_grid_thw)
                               for s in samples],
            "mm_token_type_ids": mm}


__getattr__ = old_names(__name__, globals(), Branch="ForkBranch")  # its old name
