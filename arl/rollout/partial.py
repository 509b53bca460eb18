"""Partial rollouts: unfinished episodes are carried over an update and resume under the new weights
(``rollout.partial``, docs/reference.md §2; off by default: a researcher chooses it).

A step's slowest episode no longer holds its update, and its tokens are not thrown away (what
``rollout.spare_groups`` does). `PartialScheduler.collect` keeps ``num_groups + carry_over_groups``
groups in flight, each episode its own asyncio task that lives across steps:

1. it tops the groups in flight up to ``num_groups + carry_over_groups`` (new groups, new seeds);
2. it waits until ``num_groups`` groups have finished every member;
3. it closes the `RequestGate` every engine request of the manager passes (`EnvManager.generate`):
   no new request reaches the engine, and the requests already running are **drained** (awaited to
   their end), not aborted, so no generated token is lost and no reply straddles a weight push;
   episodes go on with their env steps meanwhile and wait at the gate for their next model call;
4. it returns the oldest ``num_groups`` finished groups as the batch (a group trains only when all
   its members finished: GRPO and GiGPO compare whole groups); the others are carried over intact,
   their turns with their tokens, masks, behaviour log-probs and the policy version that sampled
   each turn (every token of a turn comes from one version: the gate is drained before a push);
   a trained sample holds the version of each of its tokens (`Sample.token_versions`);
5. groups whose oldest token would be more than ``max_age`` versions behind the serving policy
   when the next step trains them are cancelled and dropped, counted (``rollout/partial_dropped_*``,
   their generated tokens included); a group that has sampled no token yet holds nothing stale.

Ages are in policy versions (weight pushes), measured from the engine's ``policy_version`` at
collection (``serving``): a token's age is ``serving`` minus the version that sampled it, an
episode's the age of its oldest token. An engine without a ``policy_version`` falls back to the
steps since the group was launched.

The trainer then updates, pushes the weights (``rollout.partial.kv``: the engine drops the KV of
the old weights and recomputes a resumed episode's prompt, or keeps it; `BaseEngine.update_weights`)
and calls `resume`, which opens the gate: the carried episodes' next turns are sampled by the new
policy. Their older tokens are trained with the truncated importance weight against the behaviour
log-probs they were sampled with (``algo.is_cap``, required).

Proxy mode: an agent's model calls reach the gate through the proxy (`EnvManager.generate`), so its
episodes carry over too. Over the http transport a call held at the gate is an HTTP request left
open through the update: an agent client that times out sooner than an update lasts gets an error,
and the episode's ``episode_timeout_s`` clock is not stopped there (the handler does not run in the
episode's task context; `episode_clock_paused`).

Seeds: group n (0, 1, 2, ... in launch order over the whole run) plays env seed ``base_seed + n``,
its id ``"{tag}_{n}_{seed}"``. A checkpoint saves the next n (`state`), not the episodes in flight:
a resumed run drops them, counted in its first step (``rollout/partial_dropped_on_resume``), and
starts new groups after them, so no level repeats and no token is trained twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import attrs

from arl.rollout.base import EnvManager, Episode, episode_clock_paused
from arl.rollout.metrics import rollout_metrics
from arl.rollout.records import EpisodeSpec, Sample, Trajectory
from arl.rollout.scheduler import GroupScheduler, RolloutBatch, _group

__all__ = ["PartialScheduler", "RequestGate", "tokens_by_lag", "version_metrics"]


class RequestGate:
    """The switch between a manager's episodes and its engine: open, requests pass; closed, new
    requests wait and `drain` returns once the ones already running have finished. It also counts
    the response tokens generated per group (``tokens``), for what a dropped group wasted, and
    keeps the oldest policy version that sampled any of them (``oldest``), for ``max_age``.

    One event loop only (the trainer's)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight = 0
        self.held = 0  # requests that found the gate closed and waited
        self.tokens: Counter[str] = Counter()
        self.oldest: dict[str, int] = {}  # group id -> the oldest policy version of its generated tokens

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def enter(self, traj: Trajectory) -> None:
        """Wait while the gate is closed (timed into ``traj.timings["paused"]``, with the episode's
        ``episode_timeout_s`` clock stopped: the update's time is not the episode's), then count the request in."""
        if not self._open.is_set():
            self.held += 1
            start = time.perf_counter()
            with episode_clock_paused():
                while not self._open.is_set():  # closed again before this waiter ran: wait again
                    await self._open.wait()
            traj.timings["paused"] = traj.timings.get("paused", 0.0) + time.perf_counter() - start
        self.in_flight += 1
        self._idle.clear()

    def leave(self, traj: Trajectory, generation: Any) -> None:
        """Count a finished (or failed: ``generation`` None) request out."""
        self.in_flight -= 1
        gens = generation if isinstance(generation, list) else [generation] if generation is not None else []
        self.tokens[traj.group_id] += sum(len(g.token_ids) for g in gens)
        versions = [g.policy_version for g in gens if len(g.token_ids)]
        if versions:
            self.oldest[traj.group_id] = min(self.oldest.get(traj.group_id, versions[0]), *versions)
        if self.in_flight == 0:
            self._idle.set()

    def close(self) -> None:
        """No new request passes from now on."""
        self._open.clear()

    async def drain(self) -> None:
        """Return once no request is running (call after `close`)."""
        await self._idle.wait()

    def open(self) -> None:
        self._open.set()


@attrs.define(eq=False)
class _Group:
    group_id: str
    born: int  # the training step during whose rollout it was launched
    specs: list[EpisodeSpec]
    tasks: list[asyncio.Task]

    @property
    def done(self) -> bool:
        return all(t.done() for t in self.tasks)

    @property
    def running(self) -> int:
        return sum(not t.done() for t in self.tasks)


class PartialScheduler(GroupScheduler):
    """A `GroupScheduler` whose training rollout (`collect`) carries unfinished groups over updates
    (module docstring). Validation (`val_specs`, `run`) is the plain scheduler's."""

    def __init__(self, env_id: str, num_groups: int, group_size: int, base_seed: int = 0, tag: str = "train",
                 max_concurrency: int = 64, carry_over_groups: int = 1, max_age: int = 1):
        super().__init__(env_id, num_groups, group_size, base_seed=base_seed, tag=tag, max_concurrency=max_concurrency)
        if carry_over_groups < 0 or max_age < 0:
            raise ValueError(f"carry_over_groups and max_age must be >= 0, got {carry_over_groups} and {max_age}")
        self.carry_over_groups = carry_over_groups
        self.max_age = max_age
        self.gate = RequestGate()
        self.next_group = 0  # the serial number of the next group launched (its seed: base_seed + it)
        self._live: dict[str, _Group] = {}  # launch order
        self._slots: asyncio.Semaphore | None = None
        self._dropped_on_resume = 0

    def specs(self, step: int) -> list[EpisodeSpec]:
        raise TypeError("a partial rollout launches its groups itself: PartialScheduler.collect(manager, step)")

    @property
    def in_flight(self) -> list[str]:
        """The group ids launched and not yet trained or dropped, in launch order."""
        return list(self._live)

    def _age_when_next_trained(self, group: _Group, step: int, serving: int | None) -> int:
        """How many versions behind the serving policy ``group``'s oldest token will be when the
        next step trains it (one push from now); 0 for a group with no token yet. Without a
        ``serving`` version: the steps since it was launched."""
        if serving is None:
            return step + 1 - group.born
        oldest = self.gate.oldest.get(group.group_id)
        return 0 if oldest is None else serving + 1 - oldest

    def _forget(self, group: _Group) -> int:
        """Stop tracking ``group`` (trained or dropped); returns the response tokens it generated."""
        del self._live[group.group_id]
        self.gate.oldest.pop(group.group_id, None)
        return self.gate.tokens.pop(group.group_id, 0)

    def _launch(self, manager: EnvManager, step: int) -> None:
        n, self.next_group = self.next_group, self.next_group + 1
        specs = _group(self.env_id, self.tag, n, self.base_seed + n, self.group_size)
        tasks = [asyncio.ensure_future(self._play(manager, spec)) for spec in specs]
        self._live[specs[0].group_id] = _Group(specs[0].group_id, step, specs, tasks)

    async def _play(self, manager: EnvManager, spec: EpisodeSpec) -> Episode:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrency)
        async with self._slots:
            return await manager.run_episode(spec)

    async def collect(self, manager: EnvManager, step: int) -> RolloutBatch:
        """The batch of training step ``step``: ``num_groups`` finished groups, with the engine's
        requests stopped and drained when it returns (`resume` lets them go on after the push)."""
        if manager.gate is None:
            manager.gate = self.gate
        elif manager.gate is not self.gate:
            raise ValueError("the manager's requests pass another PartialScheduler's gate")
        serving = getattr(manager.engine, "policy_version", None)
        self.gate.open()
        start = time.perf_counter()
        while len(self._live) < self.num_groups + self.carry_over_groups:
            self._launch(manager, step)
        while sum(g.done for g in self._live.values()) < self.num_groups:
            running = [t for g in self._live.values() for t in g.tasks if not t.done()]
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        collected = time.perf_counter()
        self.gate.close()  # the update is next: stop new requests, let the running ones finish
        drained = self.gate.in_flight
        await self.gate.drain()
        drain = time.perf_counter() - collected
        take = [g for g in self._live.values() if g.done][: self.num_groups]  # the oldest finished ones
        for g in take:
            self._forget(g)
        too_old = [g for g in self._live.values() if self._age_when_next_trained(g, step, serving) > self.max_age]
        dropped_tokens = sum(self._forget(g) for g in too_old)
        for g in too_old:
            for t in g.tasks:
                t.cancel()
        await asyncio.gather(*(t for g in too_old for t in g.tasks), return_exceptions=True)
        wall = time.perf_counter() - start

        episodes = [t.result() for g in take for t in g.tasks]
        groups = {g.group_id: [t.result() for t in g.tasks] for g in take}
        metrics = rollout_metrics(episodes)
        if serving is not None:
            metrics.update(version_metrics(episodes, serving))
        else:
            ages = [float(step - g.born) for g in take for _ in g.tasks]
            metrics.update({"rollout/partial_age_max": max(ages), "rollout/partial_age_mean": sum(ages) / len(ages)})
        metrics.update({
            "rollout/partial_carried_groups": float(len(self._live)),
            "rollout/partial_carried_episodes": float(sum(g.running for g in self._live.values())),
            "rollout/partial_dropped_groups": float(len(too_old)),
            "rollout/partial_dropped_episodes": float(sum(len(g.tasks) for g in too_old)),
            "rollout/partial_dropped_tokens": float(dropped_tokens),
            "rollout/partial_drained_requests": float(drained),
            "rollout/partial_drain_s": drain,
        })
        if self._dropped_on_resume:
            metrics["rollout/partial_dropped_on_resume"] = float(self._dropped_on_resume)
            self._dropped_on_resume = 0
        metrics["timing/rollout_s"] = wall
        turns = metrics.get("rollout/num_turns", 0.0)
        metrics["timing/rollout_turns_per_s"] = turns / wall if wall > 0 else 0.0
        samples = [s for e in episodes for s in e.samples]
        return RolloutBatch(episodes=episodes, groups=groups, samples=samples, metrics=metrics)

    def resume(self) -> None:
        """After the weight push: the carried episodes' requests go on, sampled by the new policy."""
        self.gate.open()

    def state(self) -> dict[str, int]:
        """What a checkpoint keeps: the next group's serial number, and what is in flight (dropped on resume)."""
        return {"next_group": self.next_group, "carried_groups": len(self._live),
                "carried_episodes": sum(g.running for g in self._live.values())}

    def restore(self, state: dict[str, int] | None) -> None:
        """Continue after a checkpoint's `state`: new groups after its last one; the groups it had
        in flight are not restored (their episodes' env state is gone) but counted."""
        if state:
            self.next_group = int(state["next_group"])
            self._dropped_on_resume = int(state.get("carried_groups", 0))

    async def aclose(self) -> None:
        """Cancel every episode in flight (a run that ends leaves none behind)."""
        tasks = [t for g in self._live.values() for t in g.tasks]
        self._live.clear()
        self.gate.oldest.clear()
        for t in tasks:
            t.cancel()
        self.gate.open()
        await asyncio.gather(*tasks, return_exceptions=True)


def tokens_by_lag(samples: list[Sample], serving: int) -> dict[int, int]:
    """Response tokens per policy lag: how many of the samples' response tokens were sampled ``k``
    versions before ``serving`` (the engine's policy version when the batch was collected), for
    each k seen (`Sample.response_versions`: each token's own version).

    >>> s = Sample([1, 2, 3, 4, 5], [0, 1, 1, 0, 1], [0.0] * 5, 0.0, 0.0, "g", "g/0", policy_version=4,
    ...            token_versions=[-1, 4, 4, -1, 5])
    >>> tokens_by_lag([s], serving=5)
    {1: 2, 0: 1}
    """
    out: Counter[int] = Counter(serving - v for s in samples for v in s.response_versions())
    return dict(out)


def version_metrics(episodes: list[Episode], serving: int) -> dict[str, float]:
    """The age, in policy versions behind ``serving``, of a batch's trained tokens, from each
    token's own version (`Sample.response_versions`):

      rollout/partial_age_max        the oldest token's age (an episode's age is its oldest token's)
      rollout/partial_age_mean       the mean episode age, over episodes with a response token
      rollout/partial_token_age_mean the mean age over every response token
      rollout/tokens_lag_<k>         response tokens sampled k versions before ``serving``

    An episode with no response token has no age; with none at all, the ages are 0.

    >>> from arl.rollout.records import Trajectory
    >>> def ep(gid, versions):
    ...     mask = [1] * len(versions)
    ...     s = Sample([0] * len(versions), mask, [0.0] * len(versions), 0.0, 0.0, gid, gid + "/0",
    ...                policy_version=min(versions), token_versions=versions)
    ...     return Episode(Trajectory(env_id="e", group_id=gid, episode_id=0, seed=0), [s])
    >>> m = version_metrics([ep("a", [3, 3, 4, 5]), ep("b", [5] * 6)], serving=5)
    >>> m["rollout/partial_age_max"], m["rollout/partial_age_mean"], m["rollout/partial_token_age_mean"]
    (2.0, 1.0, 0.5)
    >>> m["rollout/tokens_lag_2"], m["rollout/tokens_lag_1"], m["rollout/tokens_lag_0"]
    (2.0, 1.0, 7.0)
    """
    lags = tokens_by_lag([s for e in episodes for s in e.samples], serving)
    ages = [float(serving - min(vs)) for e in episodes if (vs := [v for s in e.samples for v in s.response_versions()])]
    tokens = sum(lags.values())
    return {
        "rollout/partial_age_max": max(ages, default=0.0),
        "rollout/partial_age_mean": sum(ages) / len(ages) if ages else 0.0,
        "rollout/partial_token_age_mean": sum(k * n for k, n in lags.items()) / tokens if tokens else 0.0,
        **{f"rollout/tokens_lag_{k}": float(n) for k, n in sorted(lags.items(), reverse=True)},
    }
