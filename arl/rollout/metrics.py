"""Rollout metrics: one flat dict of floats per batch of episodes, keys by namespace.

`rollout/...` over the whole batch; `rollout/exit/<reason>` and `rollout/status/<status>` counts
(every known exit reason and runner status, zeros included, and any other seen, so an abnormal end
is never silent); `env/<env_id>/...` per
environment; `timing/episode_..._mean_s`, means of the per-episode timings the managers record.

A key is a measurement or it is absent (docs/metrics.md): a count is always there (zero counted
is a measurement), a mean or a rate only over a set that is not empty, and a per-turn rate only over
the turns whose env or runner reported that field. A rate of nothing, logged as 0, reads as "never";
a default, logged as if reported, reads as a fact (before issue 43, a runner that reports no
``action_effective`` made `rollout/action_effective_rate` 0 in every row).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, get_args

from arl.agents.runner import STATUSES
from arl.envs.game import StateKeySource
from arl.rollout.base import Episode
from arl.rollout.records import EXIT_REASONS, Turn


def _mean(xs: Sequence[float]) -> float | None:
    """The mean, or None over nothing: no value was measured, and 0 would read as one."""
    return float(sum(xs) / len(xs)) if xs else None


def _std(xs: Sequence[float]) -> float | None:
    """Population std; 0 for one value (it has no spread), None for none."""
    if not xs:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _measured(metrics: dict[str, float | None]) -> dict[str, float]:
    """The keys that hold a value: the others are left out, not logged as 0."""
    return {k: v for k, v in metrics.items() if v is not None}


def _reported(turns: Sequence[Turn], field: str) -> list[float]:
    """``field`` of the turns whose env (or runner) reported it in ``info``, as 0/1."""
    return [float(bool(t.info[field])) for t in turns if field in t.info]


def reward_extras(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The mean of each number a reward spec reported beside the score (``reward_extra``: its
    `arl.envs.reward_spec.RewardResult.metrics`), over the rows (dicts) that report it.

    >>> reward_extras([{"tests_broken_passed": 0.0}, {"tests_broken_passed": 1.0}, {}])
    {'tests_broken_passed': 0.5}
    """
    values: dict[str, list[float]] = {}
    for extra in rows:
        for key, value in extra.items():
            values.setdefault(key, []).append(float(value))
    return {key: sum(xs) / len(xs) for key, xs in sorted(values.items())}


def _summary(episodes: Sequence[Episode], prefix: str) -> dict[str, float]:
    trajs = [e.trajectory for e in episodes]
    turns = [t for tr in trajs for t in tr.turns]
    scores = [tr.episode_score for tr in trajs]
    extras = reward_extras([tr.turns[-1].info["reward_extra"] for tr in trajs
                            if tr.turns and isinstance(tr.turns[-1].info.get("reward_extra"), dict)])
    return {**{f"{prefix}/reward/{key}": value for key, value in extras.items()}, **_measured({
        f"{prefix}/num_episodes": float(len(trajs)),
        f"{prefix}/success_rate": _mean([float(tr.success) for tr in trajs]),
        f"{prefix}/mean_episode_score": _mean(scores),
        f"{prefix}/std_episode_score": _std(scores),
        f"{prefix}/mean_turns": _mean([float(len(tr.turns)) for tr in trajs]),
        # the validity the env or runner reported (`Turn.action_valid` defaults to False for a turn
        # whose env says nothing about it: a custom gym env would read as 0% valid)
        f"{prefix}/valid_action_rate": _mean(_reported(turns, "action_valid")),
        f"{prefix}/abnormal_rate": _mean([float(not tr.ok) for tr in trajs]),
    })}


def error_class(text: str | None) -> str | None:
    """The exception class an error text starts with (Python's ``"Name: message"``, a class
    outside builtins written with its module), by its own name; None when the text names none.

    >>> error_class("arl.envs.reward_spec.RewardTimeout: past its timeout of 300 s")
    'RewardTimeout'
    >>> error_class("EndpointTimeout: no reply in time"), error_class("no class: here"), error_class(None)
    ('EndpointTimeout', None, None)
    """
    parts = str(text or "").split(":", 1)[0].split(".")
    return parts[-1] if all(part.isidentifier() for part in parts) else None


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Namespaced float metrics of a batch of episodes. Empty batch: the counts, all 0, and no
    mean or rate (there is nothing to average)."""
    trajs = [e.trajectory for e in episodes]
    turns = [t for tr in trajs for t in tr.turns]
    samples = [s for e in episodes for s in e.samples]
    out = _summary(episodes, "rollout")
    out.update(_measured(
        {
            "rollout/num_samples": float(len(samples)),
            "rollout/num_turns": float(len(turns)),
            "rollout/response_tokens_mean": _mean([float(len(t.response_ids)) for t in turns]),
            "rollout/response_tokens_max": float(max(len(t.response_ids) for t in turns)) if turns else None,
            "rollout/prompt_tokens_mean": _mean([float(len(t.prompt_ids)) for t in turns]),
            "rollout/sample_tokens_mean": _mean([float(len(s.input_ids)) for s in samples]),
            "rollout/response_clipped_rate": _mean([float(t.finish_reason == "length") for t in turns]),
            "rollout/action_effective_rate": _mean(_reported(turns, "action_effective")),
        }
    ))
    branches = [b for tr in trajs for b in tr.branches]
    if branches:  # forked anchor groups (arl.rollout.fork): what the branches cost beside the trunks
        forked = {b.fork_id for b in branches}
        out["rollout/fork_states"] = float(len(forked))
        out["rollout/branches"] = float(len(branches))
        out["rollout/branch_turns"] = float(sum(len(b.turns) for b in branches))
        # engine tokens: a forked action shares the fork's request (its reply only); a playout
        # turn is a request of its own (prompt and reply)
        out["rollout/branch_tokens"] = float(sum(
            len(t.response_ids) + (len(t.prompt_ids) if i else 0) for b in branches for i, t in enumerate(b.turns)))
        out["rollout/branch_success_rate"] = _mean([float(b.success) for b in branches])
    keyed = [t.info["state_key_source"] for t in turns if "state_key_source" in t.info]
    if keyed:  # GiGPO anchor keys that are not a game's state_key() but a hash of the text shown: 0 for arl's games
        out["rollout/state_key_fallback_rate"] = _mean([float(k != "game") for k in keyed])
    proxied = [t.info.get("state_key_source") for t in turns if "step_report" in t.info]
    if proxied:  # proxy mode: the share of keys from the runner's step reports (else a message hash)
        from_runner = get_args(StateKeySource)  # the sources of a state key (else a message hash)
        out["rollout/state_key_from_runner_rate"] = _mean([float(k in from_runner) for k in proxied])
    reported = [t.info["step_report"] for t in turns if "step_report" in t.info]
    if reported:  # proxy mode: turns whose runner's step reports could not be lined up with its calls
        out["rollout/step_report_mismatch_rate"] = _mean([float(r == "mismatch") for r in reported])
    # Every known reason, zeros included, so logged curves do not start and stop; plus any other.
    exits = Counter(tr.exit_reason for tr in trajs)
    for reason in sorted(EXIT_REASONS | set(exits)):
        out[f"rollout/exit/{reason}"] = float(exits[reason])
    # an env that raised, by the exception's class (a reward spec's RewardTimeout, RewardSandboxDied, ...)
    for name, n in Counter(error_class(tr.error) or "other" for tr in trajs if tr.exit_reason == "env_error").items():
        out[f"rollout/env_error/{name}"] = float(n)
    statuses = Counter(tr.status for tr in trajs)  # likewise every runner status, zeros included
    for status in sorted(set(STATUSES) | set(statuses)):
        out[f"rollout/status/{status}"] = float(statuses[status])
    by_env: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_env[e.trajectory.env_id].append(e)
    for env_id, group in sorted(by_env.items()):
        out.update(_summary(group, f"env/{env_id}"))
    for key in ("total", "generate", "env"):
        values = [tr.timings[key] for tr in trajs if key in tr.timings]
        if values:
            out[f"timing/episode_{key}_mean_s"] = _mean(values)
    return out
