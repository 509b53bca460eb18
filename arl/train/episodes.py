"""What the validation panel did at each evaluation, kept in the run dir for `arl view`:
``run_dir/episodes.jsonl``, one JSON row per evaluation.

A row holds:

- ``episodes``: the first ``eval.record_episodes`` validation episodes in full, turn by turn (the
  frame the action was taken in, the model's reply, the parsed action, the reward; where the prompt
  showed the board as a picture, ``image``: that picture as a PNG data URL, `turn_images`);
- ``exits``: how every episode of the panel ended (``exit_reason`` -> count) and ``statuses``
  (``status`` -> count), so a rise in invalid answers or time-outs shows beside the success rate;
- ``actions``: every validation turn's parsed action (``"(invalid)"`` for none) -> count;
- ``states``: per-state action distributions: the first frame of each recorded episode (the same
  levels at every evaluation, the panel being fixed) answered ``eval.state_samples`` times by the
  engine at the eval temperature, each reply parsed by the game, so the rows of successive
  evaluations show how the policy's choice in one state moves over training.

The states cost ``record_episodes x state_samples`` short generations per evaluation (4 x 8
replies of <= ``max_tokens`` tokens with the defaults), from prompts vLLM's prefix cache already
holds. Where the game cannot parse replies (an agent's own env in proxy mode), ``states`` is empty
and ``states_error`` says why; recording never fails the run.

    >>> from arl.rollout.records import Trajectory, Turn
    >>> t = Trajectory(env_id="g", group_id="val_0_7", episode_id=0, seed=7, success=True, episode_score=1.0,
    ...                turns=[Turn(observation="P.G", prompt_ids=[1], response_ids=[5], response_logprobs=[-0.1],
    ...                            reward=1.0, action="Right", action_valid=True)])
    >>> row = eval_record(3, [t], keep=1, decode=lambda ids: "<answer>Right</answer>")
    >>> row["exits"], row["actions"], row["episodes"][0]["turns"][0]["reply"]
    ({'terminated': 1}, {'Right': 1}, '<answer>Right</answer>')
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

EPISODES_FILE = "episodes.jsonl"
INVALID = "(invalid)"
STATE_SEED = 0  # the request seed of the per-state samples


def eval_record(step: int, trajectories: Sequence[Any], *, keep: int,
                decode: Callable[[Sequence[int]], str]) -> dict[str, Any]:
    """One evaluation's row (without ``states``): the panel's exits and actions, and its first
    ``keep`` episodes turn by turn (replies decoded with ``decode``)."""
    exits = collections.Counter(t.exit_reason for t in trajectories)
    statuses = collections.Counter(t.status for t in trajectories)
    actions = collections.Counter((turn.action if turn.action_valid else None) or INVALID
                                  for t in trajectories for turn in t.turns)
    episodes = [{
        "seed": t.seed, "success": bool(t.success), "score": float(t.episode_score), "status": t.status,
        "exit_reason": t.exit_reason, "error": t.error,
        "turns": [{"frame": turn.observation, "reply": decode(turn.response_ids), "action": turn.action,
                   "valid": bool(turn.action_valid), "reward": float(turn.reward),
                   **({"image": image} if image is not None else {})}
                  for turn, image in zip(t.turns, turn_images(t.turns), strict=True)],
    } for t in trajectories[:keep]]
    return {"step": step, "num_episodes": len(trajectories), "exits": dict(exits), "statuses": dict(statuses),
            "actions": dict(actions), "episodes": episodes, "states": []}


def turn_images(turns: Sequence[Any]) -> list[str | None]:
    """Per turn, the picture of the board its prompt showed (``observation`` image or both) as a PNG
    data URL, None where it showed none. A turn's prompt ends with its own frame, so it is the last
    image of the turn's rendered prompt (``Turn.rendered``); a trajectory keeps that on its last turn
    only, holding one frame per turn in order, so turn k's is its k-th image."""
    from arl.engine.images import to_data_url

    last = next((r for r in (getattr(t, "rendered", None) for t in reversed(turns)) if r is not None), None)
    out: list[str | None] = []
    for k, turn in enumerate(turns):
        rendered = getattr(turn, "rendered", None)
        if rendered is not None and rendered.images:
            out.append(to_data_url(rendered.images[-1]))
        elif last is not None and len(last.images) == len(turns):
            out.append(to_data_url(last.images[k]))
        else:
            out.append(None)
    return out


async def state_action_counts(engine: Any, prompts: Sequence[tuple[str, Sequence[int]]], *, n: int,
                              temperature: float, max_tokens: int, decode: Callable[[Sequence[int]], str],
                              parse: Callable[[str], str | None]) -> list[dict[str, Any]]:
    """For each (frame, prompt ids): ``n`` replies sampled at ``temperature``, parsed by ``parse``,
    as {"frame", "n", "counts": action -> count} (``"(invalid)"`` for a reply that parses to none)."""
    from arl.engine.base import SamplingParams

    # seeded: the samples draw nothing from the engine's generator, so recording them leaves the
    # training rollouts' random stream (and the learning curves) as they were without it (as the
    # canary's probe does); one seed for every evaluation, so their rows differ by the policy only
    params = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=STATE_SEED)
    out = []
    for frame, prompt_ids in prompts:
        gens = await engine.generate(list(prompt_ids), params)
        gens = gens if isinstance(gens, list) else [gens]
        counts = collections.Counter(parse(decode(g.token_ids)) or INVALID for g in gens)
        out.append({"frame": frame, "n": len(gens), "counts": dict(counts)})
    return out


def append_record(run_dir: str | Path, row: dict[str, Any]) -> None:
    with open(Path(run_dir) / EPISODES_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, allow_nan=False) + "\n")


def read_episodes(run_dir: str | Path, up_to_step: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``run_dir/episodes.jsonl`` (none if there is no file); a resumed run's rows past
    its checkpoint are left out with ``up_to_step``. A torn last line (a run killed mid-write) is
    skipped."""
    path = Path(run_dir) / EPISODES_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if up_to_step is None or row.get("step", 0) <= up_to_step:
            rows.append(row)
    return rows


def truncate_after(run_dir: str | Path, step: int) -> None:
    """Drop the rows past ``step`` (a resumed run replays the steps after its checkpoint)."""
    path = Path(run_dir) / EPISODES_FILE
    if path.exists():
        rows = read_episodes(run_dir, up_to_step=step)
        path.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows), encoding="utf-8")


__all__ = ["EPISODES_FILE", "INVALID", "STATE_SEED", "append_record", "eval_record", "read_episodes", "state_action_counts",
           "truncate_after"]
