"""GroupScheduler: G groups x N members per training step, run concurrently, returned grouped.

Seeds (docs/reference.md §2): group g of training step s plays env seed
`base_seed + s * num_groups + g`, so every step sees new levels and all N members of a group
play the same level (GRPO compares them). Group ids are "{tag}_{g}_{seed}", unique across steps
because the seed is. Validation uses a fixed panel in a separate seed range (`VAL_BASE_SEED`),
identical on every call, so evaluation points are comparable.

Each episode is its own task in an anyio task group, bounded by a capacity limiter. Episodes
advance freely: there is no per-turn barrier, an episode asks for its next model call as soon as
its env step is done, and a freed slot starts the next queued episode. Episodes never raise
(`EnvManager.run_episode` is the fault boundary), so one failure never cancels its siblings.

Over-provisioning (``spare_groups = k``, as ROLL's group redundancy and slime's over-sampling):
a training step plays G + k groups and keeps the first G whose every member has finished; the
rest are cancelled (their engine requests aborted) and dropped. The step no longer waits for its
slowest groups. The price is a bias: groups whose episodes end early (short games, early
failures or early successes) are kept more often than long ones; `rollout/groups_dropped` counts
what was dropped. Seeds stay disjoint across steps (the stride is G + k).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

import anyio
import attrs

from arl.rollout.base import EnvManager, Episode, EpisodeSpec
from arl.rollout.metrics import rollout_metrics
from arl.rollout.records import Sample

VAL_BASE_SEED = 1_000_000_000  # far above any training step's seeds


@attrs.define
class RolloutBatch:
    """Episodes in spec order, the same episodes by group id, and their samples in spec order."""

    episodes: list[Episode]
    groups: dict[str, list[Episode]]
    samples: list[Sample]
    metrics: dict[str, float]


class BatchFailedError(RuntimeError):
    """Every episode of a batch failed and none left a token to train on: a broken set-up (a runner
    factory with the wrong signature, an engine that refuses every request), not bad luck.
    ``episodes`` holds them, tracebacks included."""

    def __init__(self, message: str, episodes: list[Episode]) -> None:
        super().__init__(message)
        self.episodes = episodes


def check_batch(batch: RolloutBatch, what: str) -> None:
    """Raise `BatchFailedError` when no episode of ``batch`` finished and no sample has a response
    token, with the counts per status and exit reason and the first episode's error; ``what``
    names the batch ("training step 3"). Any other batch passes, empty ones included."""
    trajectories = [e.trajectory for e in batch.episodes]
    if (not trajectories or any(t.status == "Finished" for t in trajectories)
            or any(s.num_response_tokens for s in batch.samples)):
        return
    counts = "; ".join(
        f"{field} " + ", ".join(f"{key} {n}" for key, n in sorted(Counter(getattr(t, field) for t in trajectories).items()))
        for field in ("status", "exit_reason"))
    first = trajectories[0]
    raise BatchFailedError(
        f"every episode of {what} failed ({len(trajectories)} of {len(trajectories)}: {counts}), so there is "
        f"nothing to train on; the first one ({first.traj_id}): {first.error or 'no error text'}",
        batch.episodes,
    )


class GroupScheduler:
    def __init__(
        self,
        env_id: str,
        num_groups: int,
        group_size: int,
        base_seed: int = 0,
        tag: str = "train",
        max_concurrency: int = 64,
        spare_groups: int = 0,
    ):
        if num_groups < 1 or group_size < 1 or max_concurrency < 1:
            raise ValueError("num_groups, group_size and max_concurrency must be >= 1")
        if spare_groups < 0:
            raise ValueError(f"spare_groups must be >= 0, got {spare_groups}")
        self.env_id = env_id
        self.num_groups = num_groups
        self.group_size = group_size
        self.base_seed = base_seed
        self.tag = tag
        self.max_concurrency = max_concurrency
        self.spare_groups = spare_groups

    def group_seed(self, step: int, group: int) -> int:
        return self.base_seed + step * (self.num_groups + self.spare_groups) + group

    def specs(self, step: int) -> list[EpisodeSpec]:
        """The episodes of training step `step`: (num_groups + spare_groups) x group_size, group-major.
        Run them with ``keep_groups=num_groups`` to keep the first num_groups that finish."""
        return [
            spec
            for g in range(self.num_groups + self.spare_groups)
            for spec in _group(self.env_id, self.tag, g, self.group_seed(step, g), self.group_size)
        ]

    def val_specs(
        self, num_seeds: int = 256, base_seed: int = VAL_BASE_SEED, group_size: int = 1, tag: str = "val"
    ) -> list[EpisodeSpec]:
        """A fixed validation panel: seeds base_seed .. base_seed + num_seeds - 1, same every call."""
        return [spec for i in range(num_seeds) for spec in _group(self.env_id, tag, i, base_seed + i, group_size)]

    async def run(
        self, manager: EnvManager, specs: Sequence[EpisodeSpec], keep_groups: int | None = None
    ) -> RolloutBatch:
        """Play every spec concurrently (at most max_concurrency at once) and collect the results.

        ``keep_groups=n``: stop once n groups have finished every member, cancel the others and
        return those n groups only (in spec order); None or at least the number of groups: all.
        """
        results: list[Episode | None] = [None] * len(specs)
        limiter = anyio.CapacityLimiter(self.max_concurrency)
        left: dict[str, int] = {}
        for spec in specs:
            left[spec.group_id] = left.get(spec.group_id, 0) + 1
        keep = keep_groups if keep_groups is not None and keep_groups < len(left) else None
        finished: set[str] = set()

        async def one(i: int, spec: EpisodeSpec) -> None:
            async with limiter:
                results[i] = await manager.run_episode(spec)
            left[spec.group_id] -= 1
            if keep is not None and left[spec.group_id] == 0 and len(finished) < keep:
                finished.add(spec.group_id)
                if len(finished) == keep:  # enough whole groups: the stragglers are not waited for
                    tg.cancel_scope.cancel()

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i, spec in enumerate(specs):
                tg.start_soon(one, i, spec)
        wall = time.perf_counter() - start
        if keep is not None:  # the kept groups, in spec order
            kept = [i for i, spec in enumerate(specs) if spec.group_id in finished]
            specs, results = [specs[i] for i in kept], [results[i] for i in kept]
        episodes = [e for e in results if e is not None]  # all of them: run_episode never raises
        groups: dict[str, list[Episode]] = {}
        for spec, episode in zip(specs, episodes, strict=True):
            groups.setdefault(spec.group_id, []).append(episode)
        samples = [s for e in episodes for s in e.samples]
        metrics = rollout_metrics(episodes)
        if keep is not None:
            metrics["rollout/groups_dropped"] = float(len(left) - len(finished))
        metrics["timing/rollout_s"] = wall
        turns = metrics.get("rollout/num_turns", 0.0)
        metrics["timing/rollout_turns_per_s"] = turns / wall if wall > 0 else 0.0
        return RolloutBatch(episodes=episodes, groups=groups, samples=samples, metrics=metrics)


def _group(env_id: str, tag: str, index: int, seed: int, size: int) -> list[EpisodeSpec]:
    group_id = f"{tag}_{index}_{seed}"
    return [EpisodeSpec(env_id=env_id, seed=seed, group_id=group_id, episode_id=m, tag=tag) for m in range(size)]
