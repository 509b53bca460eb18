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
option takes it (`arl.envs.bugfix.env.BugFixEnv`'s ``test_latency``). benchmarks/partial.py
draws its game workload's per-episode wait with `pareto_scale` too.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

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


__all__ = ["MAX_CAP_S", "ParetoLatency", "pareto_scale"]
