"""Heavy-tailed latencies drawn from a key: the same key gives the same latency on every run.

    latency = ParetoLatency(alpha=1.2, scale_s=0.5, cap_s=30.0)
    latency.draw_s("bugfix-tests|7")     # seconds, a pure function of the key

Agentic rollouts have a long tail: most episodes' environment time is short, a few take far
longer (a repository whose test suite waits on a slow fixture, a tool that times out). The
remedies (``rollout.spare_groups``, ``rollout.partial``) are compared on such a tail, and a fair
comparison gives every mode the same episodes' costs: so a latency here is not sampled from a
random stream but computed from a key (the episode's seed, its group and member), through a
stable hash, the same in every process, mode and run.

`pareto_scale` is the draw; `ParetoLatency` is its configurable form, validated, as an env's
option takes it (`arl.envs.bugfix.env.BugFixEnv`'s ``test_latency``). `StepLatency` is a wait
after every step of a game (`arl.envs.text.TextEnv`'s ``step_latency``): the game workload of
benchmarks/partial.py, and any config's ``rollout.manager.env_kwargs.step_latency``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any, Literal, get_args

import attrs

MAX_CAP_S = 3600.0  # an hour: a longer wait is a misconfiguration, not a test


def pareto_scale(key: str, alpha: float, cap: float = math.inf) -> float:
    """A Pareto(``alpha``) draw with minimum 1, capped at ``cap``, determined by ``key``:
    x = min(cap, (1 - u) ** (-1 / alpha)), with u in [0, 1) the first 8 bytes of sha256(key).

    P(x > t) = t ** -alpha for 1 <= t < cap: the median is 2 ** (1 / alpha), the mean
    alpha / (alpha - 1) (infinite for alpha <= 1, before the cap). Smaller alpha, heavier tail.

    >>> round(pareto_scale("b", 1.2), 3), round(pareto_scale("b", 1.2, cap=3.0), 3)
    (1.331, 1.331)
    >>> round(pareto_scale("a", 1.2), 3), pareto_scale("a", 1.2, cap=3.0)
    (3.7, 3.0)
    """
    digest = hashlib.sha256(key.encode()).digest()
    u = int.from_bytes(digest[:8], "little") / 2**64
    return min(cap, (1.0 - u) ** (-1.0 / alpha))


def _positive_finite(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


@attrs.frozen
class ParetoLatency:
    """A per-key latency: ``scale_s`` x `pareto_scale` (tail index ``alpha``), capped at ``cap_s``:
    wait = min(cap_s, scale_s * (1 - u) ** (-1 / alpha)), so every key waits at least ``scale_s``
    (or ``cap_s``, if smaller), half of them more than ``scale_s * 2 ** (1 / alpha)``.

    Raises ValueError on a value that is not a finite number > 0, or a cap above `MAX_CAP_S`.

    >>> latency = ParetoLatency(alpha=1.2, scale_s=0.5, cap_s=30.0)
    >>> round(latency.draw_s("a"), 3), latency.median_s == 0.5 * 2 ** (1 / 1.2)
    (1.85, True)
    """

    alpha: float = attrs.field(default=1.2, validator=_positive_finite)
    scale_s: float = attrs.field(default=0.5, validator=_positive_finite)
    cap_s: float = attrs.field(default=30.0, validator=_positive_finite)

    def __attrs_post_init__(self) -> None:
        if self.cap_s > MAX_CAP_S:
            raise ValueError(f"cap_s must be at most {MAX_CAP_S:.0f} s, got {self.cap_s}")

    def draw_s(self, key: str) -> float:
        """The latency of ``key``, in seconds (0 < it <= ``cap_s``)."""
        return min(self.cap_s, self.scale_s * pareto_scale(key, self.alpha))

    @property
    def median_s(self) -> float:
        """The distribution's median, before the cap: ``scale_s * 2 ** (1 / alpha)``."""
        return self.scale_s * 2.0 ** (1.0 / self.alpha)

    @classmethod
    def from_config(cls, value: Any, *, option: str = "latency") -> ParetoLatency | None:
        """None (no latency), a `ParetoLatency`, or a mapping of its fields (a config's
        ``{alpha: 1.2, scale_s: 0.5, cap_s: 30}``; a field left out keeps its default). Anything
        else, an unknown key or a bad value raises ValueError naming ``option``.

        >>> ParetoLatency.from_config({"scale_s": 2}, option="test_latency")
        ParetoLatency(alpha=1.2, scale_s=2, cap_s=30.0)
        >>> ParetoLatency.from_config({"alpha": 0}, option="test_latency")
        Traceback (most recent call last):
        ValueError: test_latency: alpha must be a finite number > 0, got 0
        """
        if value is None or isinstance(value, ParetoLatency):
            return value
        fields = [f.name for f in attrs.fields(cls)]
        if not isinstance(value, Mapping):
            raise ValueError(f"{option} must be a mapping with keys {fields} (or null: off), got {value!r}")
        unknown = sorted(set(value) - set(fields), key=str)
        if unknown:
            raise ValueError(f"{option}: unknown key(s) {unknown}; the keys are {fields}")
        try:
            return cls(**value)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None


LatencyPer = Literal["episode", "task", "step"]


@attrs.frozen
class StepLatency:
    """A wait after every env step, drawn from ``draw`` (a `ParetoLatency`) once per ``per``:

    - ``"episode"`` (default): one wait per episode, for each of its steps; the key is the
      episode's name (``TextEnv.reset``'s ``options["episode"]``, which arl's managers set to the
      episode's ``traj_id``, e.g. ``train_0_17/3``), or its seed when none is given. Members of a
      group draw apart: a group waits for its slowest member, as in a real agentic batch.
    - ``"task"``: one wait per seed; every episode of a task (a whole group) is equally slow, like
      a repository whose tests are slow for every attempt.
    - ``"step"``: a fresh wait per step t, keyed ``"<episode key>|t"``; an episode's total is then
      a sum of draws, a lighter tail than ``"episode"``'s.

    The same key waits the same on every run and in every mode (`pareto_scale`). An episode's
    env time is about its steps x its wait: with ``per: episode`` the waits of a batch spread up
    to ``cap_s`` / the median (``cap_s = 40 x scale_s`` at alpha 1.2: 40 / 2 ** (1 / 1.2) = 22x).

    >>> latency = StepLatency.from_config({"alpha": 1.2, "scale_s": 0.05, "cap_s": 2.0})
    >>> latency.wait_s(seed=7, episode="train_0_7/1", t=0) == latency.wait_s(seed=7, episode="train_0_7/1", t=5)
    True
    >>> round(latency.wait_s(seed=7, episode="train_0_7/1", t=0), 4), round(latency.wait_s(seed=7, episode="train_0_7/2", t=0), 4)
    (0.0763, 0.0796)
    """

    draw: ParetoLatency
    per: str = attrs.field(default="episode", validator=attrs.validators.in_(get_args(LatencyPer)))

    def wait_s(self, *, seed: int | None, episode: str | None, t: int) -> float:
        """Seconds to wait after step ``t`` (0-based) of the episode ``episode`` on task ``seed``."""
        task = f"seed={seed}"
        if self.per == "task":
            return self.draw.draw_s(task)
        key = episode if episode is not None else task
        return self.draw.draw_s(key if self.per == "episode" else f"{key}|{t}")

    @classmethod
    def from_config(cls, value: Any, *, option: str = "step_latency") -> StepLatency | None:
        """None (off), a `StepLatency`, or a mapping of `ParetoLatency`'s fields plus ``per``
        (``{alpha: 1.2, scale_s: 0.05, cap_s: 2.0, per: episode}``). Anything else raises
        ValueError naming ``option``.

        >>> StepLatency.from_config({"scale_s": 0.1, "per": "task"}).per
        'task'
        >>> StepLatency.from_config({"per": "group"})
        Traceback (most recent call last):
        ValueError: step_latency: per must be one of ('episode', 'task', 'step'), got 'group'
        """
        if value is None or isinstance(value, StepLatency):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{option} must be a mapping of alpha, scale_s, cap_s and per (or null: off), got {value!r}")
        rest = dict(value)
        per = rest.pop("per", "episode")
        if per not in get_args(LatencyPer):
            raise ValueError(f"{option}: per must be one of {get_args(LatencyPer)}, got {per!r}")
        return cls(draw=ParetoLatency.from_config(rest, option=option), per=per)


__all__ = ["MAX_CAP_S", "LatencyPer", "ParetoLatency", "StepLatency", "pareto_scale"]
