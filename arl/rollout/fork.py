"""ForkEnvManager: anchor groups made by forking the state, not found by chance (issue 25).

GiGPO's step term compares the returns of steps that *happen* to meet the same state across a
group's episodes. Those anchor groups form by accident: most are singletons (no comparison, a
step term of 0), and the big ones come from agents looping in place. Here the env is a Python
object beside the engine, so it can be copied. At chosen states of a training episode (the
*trunk*) the manager

1. copies the env K-1 times (`arl.envs.fork.fork_env`: deepcopy of the wrapper stack, or the
   game's own ``fork()``),
2. samples K actions from the identical state and prompt in ONE engine request with n=K (vLLM
   runs them as K child sequences of one prompt, a single prefix in its cache; a seeded request's
   child i gets seed + i, arl's hf backend does the same); completion 0 is the trunk's own action
   (the trunk goes on with it, as the step manager would have: same request seed, same index),
3. plays each other completion in its own copy, then on under the current policy until the
   episode ends (or for ``fork.horizon`` steps), so its return from the forked state is known.

Every forked state is then an anchor group of exactly K rows, with no aliasing: keyed by the fork
(``Sample.fork_id``), never by the state's hash, so two trunks that fork the same grid make two
groups of K, and an unforked visit of that grid stays in GiGPO's natural (group, state) group.

Configured in ``rollout.manager.fork`` (`arl.config.ForkConfig`; ``rollout.mode: step``):

    rollout:
      mode: step
      manager:
        fork: {k: 4, at: first, states: 1, horizon: null}   # k: 0 (default) is off

``at``: ``first`` (the first ``states`` states of every episode), ``every`` (every state), or
``"package.module:rule"`` with ``rule(step, observation) -> bool``. Only episodes tagged in
``fork.tags`` fork (``train``): the validation panel and the warm-start play plain step episodes.

What is trained, what only estimates the baseline
-------------------------------------------------
- Trained: every trunk step (exactly the step manager's samples) and each branch's *forked
  action*: one row per branch, whose prompt is the trunk's prompt token for token and whose
  response is completion k of the fork's request (its engine log-probs: on-policy). A forked
  state contributes K rows, all sampled from the same distribution.
- Not trained: a branch's playout after its forked action. Those turns only estimate the value of
  the forked action under the current policy (the return the fork group compares); they are no
  episode of the group and their prompts differ from every trunk's, so no baseline exists for
  them. They cost engine tokens, not trainer tokens.

The advantage (`arl.algo.forked.gigpo_forked`, chosen by ``algo.estimator: gigpo`` as soon as a
batch holds forked rows):

    A(j) = A_E(j) + step_weight * A_S(j)

- A_E, GiGPO's episode term, over the group's TRUNKS only, unchanged; a branch row gets none: its
  prefix is the trunk's, so counting branches as episodes would weigh that prefix K times in the
  group's baseline, and the fork's own comparison already prices its action.
- A_S at a forked state: the fork return F_k = sum_i gamma^i r_(t+i) over the branch's rewards
  from the forked state (the trunk's own from step t, over the same horizon), normalised inside
  the K rows of the fork (mean_norm: F_k - mean; mean_std_norm: also / (std + eps)). At every
  other trunk step: GiGPO's natural anchor term, unchanged. A constant fork group (every branch
  ended alike) gives 0, as every group does.
- The invalid-action penalty acts as in GiGPO: on the row's return (all rows) and on the episode
  term (trunk rows, which have one).

So with forking, GiGPO's step term is guaranteed a comparison of K at each forked state, with a
baseline from the same state and prompt (an unbiased leave-in-mean estimate of Q(s, a) - V(s)
under the current policy when the playout runs to the end), and its episode term is GRPO over the
trunks, as before. ``grpo`` and ``reinforce`` refuse forked batches (they would treat branch rows
as episodes); the config refuses the combination at load.

What it costs per update
------------------------
With N trunk episodes of mean length T, F forked states per episode, mean step prompt P and reply
R tokens, and a branch of mean length L turns (its forked action included; L <= horizon):

    plain step mode:  N * T requests,                               N * T * (P + R) engine tokens
    forking adds:     N * F * (K - 1) * (L - 1) requests,           N * F * (K - 1) * (R + (L - 1) * (P + R))
    trainer rows:     N * T + N * F * (K - 1)                       (each P + R tokens)

The fork's own request is one request with n=K: its prompt's full KV blocks are computed once for
all K (vLLM's prefix cache: 16-token blocks on a GPU, 128 on CPU, where a short step prompt is
prefilled per child) and its K - 1 extra replies cost R tokens each. With ``at: first, states: 1`` and full playouts a branch is about an
episode long (L ~ T), so an update costs ~K times the engine tokens of the unforked one; with
``horizon: h`` the playout is at most h turns. `benchmarks/credit.py` compares forked and natural
groups at an equal engine-token budget; ``rollout/branch_turns`` and ``rollout/branch_tokens``
count what the branches cost in each batch.

Faults, seeds, order
--------------------
A branch fails like a trunk step (env error, engine error, ...): its episode ends with that typed
exit reason, and the trunk's completed steps are salvaged without their fork rows (the abnormal
exit masks them anyway). A branch's playout requests get their own sampling seeds (a hash of the
fork and the turn), so branches that reach the trunk's state and history still sample
independently. Branches of an episode play concurrently with its trunk; their rows follow the
trunk's rows, in fork order, whatever order they finished in.
"""

from __future__ import annotations

import hashlib
import importlib
import time
from collections.abc import Callable
from typing import Any

import anyio
import attrs
from anyio.abc import TaskGroup

from arl.config import ManagerConfig
from arl.engine.base import Generation, SamplingParams
from arl.envs.fork import NotForkableError, fork_env
from arl.rollout.base import EpisodeSpec
from arl.rollout.records import ForkBranch, Sample, Trajectory, Turn
from arl.rollout.step import StepEnvManager

__all__ = ["ForkEnvManager", "NotForkableError", "check_forkable", "resolve_rule"]

History = list[tuple[str, str, float]]
Rule = Callable[[int, str], bool]


def resolve_rule(at: str, states: int = 1) -> Rule:
    """``fork.at`` as a predicate ``(step, observation) -> fork here?``.

    >>> resolve_rule("first", states=2)(1, "P_G"), resolve_rule("first", states=2)(2, "P_G")
    (True, False)
    >>> resolve_rule("every")(7, "P_G")
    True
    """
    if at == "first":
        return lambda step, observation: step < states
    if at == "every":
        return lambda step, observation: True
    module_name, _, attribute = at.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"rollout.manager.fork.at={at!r}: cannot load the rule ({exc})") from exc
    if not callable(target):
        raise ValueError(f"rollout.manager.fork.at={at!r} is not callable")
    return target


def check_forkable(env_id: str, config: ManagerConfig) -> None:
    """Raise `NotForkableError` now, at start, when ``env_id``'s env cannot be forked: the env the
    manager would build (with ``config.env_kwargs``), reset and copied once. make_manager calls it."""
    from arl.envs.text import TextEnv

    env = TextEnv(env_id, format_penalty=config.format_penalty, **config.env_kwargs)
    try:
        env.reset(seed=0)
        fork_env(env).close()
    finally:
        env.close()


def branch_seed(config: ManagerConfig, spec: EpisodeSpec, branch: ForkBranch, turn: int) -> int | None:
    """A branch's playout request seed: `request_seed`'s hash with the branch in the key, so a
    branch that meets the trunk's state and history does not replay the trunk's sample."""
    if config.sampling_seed is None:
        return None
    key = f"{config.sampling_seed}|{spec.group_id}|{spec.episode_id}|{branch.traj_id}|{turn}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") % (2**31)


class ForkEnvManager(StepEnvManager):
    """The step manager, plus K-way forks at the states ``config.fork`` chooses (module docstring)."""

    forks = True

    def __init__(self, engine: Any, config: ManagerConfig | None = None):
        super().__init__(engine, config)
        fork = self.config.fork
        self.fork_here = resolve_rule(fork.at, fork.states)  # a bad rule name fails here, at start

    # -- the trunk ----------------------------------------------------------------------------------
    async def _play(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        if not (self.config.fork.k and spec.tag in self.config.fork.tags):
            return await super()._play(spec, traj)
        error: BaseException | None = None
        try:
            async with anyio.create_task_group() as branches:
                await self._play_trunk(spec, traj, branches)
        except ExceptionGroup as group:
            error = _first_error(group)  # the fault boundary classifies the error, not its group
        if error is not None:
            raise error
        return self._build_samples(spec, traj)

    async def _play_trunk(self, spec: EpisodeSpec, traj: Trajectory, branches: TaskGroup) -> None:
        """The step manager's loop; at a chosen state the turn is a fork (its branches start in
        ``branches`` and play on while the trunk does)."""

        async def take_turn(env: Any, prompt: list[int], obs: str, history: History,
                            limit: int) -> tuple[Turn, str, bool, bool]:
            if self.fork_here(len(traj.turns), obs):
                return await self.fork(spec, traj, env, prompt, obs, history, limit, branches)
            return await self.act(spec, traj, env, prompt, obs)

        await self.play_steps(spec, traj, take_turn)

    async def fork(
        self, spec: EpisodeSpec, traj: Trajectory, env: Any, prompt: list[int], obs: str, history: History,
        limit: int, branches: TaskGroup,
    ) -> tuple[Turn, str, bool, bool]:
        """One forked turn: K-1 copies of the env, K actions from one request, the trunk steps with
        the first and each copy plays one of the others. Returns the trunk's turn as `act` does."""
        t, k = len(traj.turns), self.config.fork.k
        copies = [self.env_call(traj, fork_env, env) for _ in range(k - 1)]  # before the trunk moves
        params = attrs.evolve(self.sampling_params(spec, t), n=k)  # completion 0: the unforked sample
        gens = await self.generate_n(traj, prompt, params)
        fork_id = f"{spec.traj_id}@{t}"
        for index, (copy, gen) in enumerate(zip(copies, gens[1:], strict=True), start=1):
            branch = ForkBranch(fork_id=fork_id, traj_id=f"{fork_id}.{index}", step=t, index=index)
            traj.branches.append(branch)  # in fork order, whatever order they finish in
            branches.start_soon(self.play_branch, spec, traj, branch, copy, prompt, obs, list(history), limit, gen)
        turn, next_obs, terminated, truncated = await self.take(traj, env, prompt, obs, gens[0])
        turn.info["fork_id"] = fork_id
        self.record(traj, turn)
        return turn, next_obs, terminated, truncated

    async def generate_n(self, traj: Trajectory, prompt: list[int], params: SamplingParams) -> list[Generation]:
        """The fork's one request: ``params.n`` completions of one prompt, timed like `generate`."""
        start = time.perf_counter()
        try:
            gens = await self.engine.generate(prompt, params)
        finally:
            traj.timings["generate"] += time.perf_counter() - start
        return list(gens) if isinstance(gens, list) else [gens]

    # -- a branch -----------------------------------------------------------------------------------
    async def play_branch(
        self, spec: EpisodeSpec, traj: Trajectory, branch: ForkBranch, env: Any, prompt: list[int], obs: str,
        history: History, limit: int, gen: Generation,
    ) -> None:
        """The forked action ``gen`` in the copy ``env``, then the policy on until the episode ends,
        the turn limit, or ``fork.horizon`` turns (the forked action included)."""
        horizon = self.config.fork.horizon
        stop = limit if horizon is None else min(limit, branch.step + horizon)
        t = branch.step
        while True:
            turn, next_obs, terminated, truncated = await self.take(traj, env, prompt, obs, gen)
            branch.turns.append(turn)
            branch.success = bool(turn.info.get("success", False))
            self.remember(history, obs, turn)
            obs, t = next_obs, t + 1
            if terminated or truncated:
                branch.exit_reason = "terminated" if terminated else "truncated"
                return
            if t >= stop:
                branch.exit_reason = "truncated" if t >= limit else "horizon"
                return
            prompt = self.step_prompt(env, obs, t, history, limit)
            if not self.fits(len(prompt)):
                branch.exit_reason = "max_length"
                return
            params = attrs.evolve(self.sampling_params(spec, t), seed=branch_seed(self.config, spec, branch, t))
            gen = await self.generate(traj, prompt, params)

    # -- samples ------------------------------------------------------------------------------------
    def _build_samples(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        """The trunk's step samples (its forked steps carry their fork), then one per branch."""
        samples = super()._build_samples(spec, traj)
        horizon = self.config.fork.horizon
        forks = {b.step: b.fork_id for b in traj.branches}
        for sample in samples:
            if sample.step in forks:  # the trunk's own action at a forked state, over the same horizon
                end = None if horizon is None else sample.step + horizon
                sample.fork_id = forks[sample.step]
                sample.fork_rewards = tuple(turn.reward for turn in traj.turns[sample.step : end])
        return samples + [self._branch_sample(spec, traj, b) for b in traj.branches if b.turns]

    def _branch_sample(self, spec: EpisodeSpec, traj: Trajectory, branch: ForkBranch) -> Sample:
        """The forked action of ``branch``: the fork's prompt + its completion, scored by its step
        reward; ``episode_score`` is the episode it completes (the trunk's rewards before the fork,
        then the branch's), for reading only: no estimator counts a branch as an episode."""
        prefix = sum(turn.reward for turn in traj.turns[: branch.step])
        return self.turn_sample(
            spec, traj, branch.turns[0], branch.step, traj_id=branch.traj_id,
            episode_score=prefix + sum(branch.rewards),
            info={"num_turns": len(branch.turns), "success": branch.success, "branch_exit_reason": branch.exit_reason},
            fork_id=branch.fork_id, fork_rewards=branch.rewards, branch=True,
        )

    def _samples_after_error(self, spec: EpisodeSpec, traj: Trajectory) -> list[Sample]:
        """The trunk's completed steps only: a fork whose branches did not all finish is no group."""
        return StepEnvManager._build_samples(self, spec, traj)


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The first leaf of a (nested) exception group."""
    first = group.exceptions[0]
    return _first_error(first) if isinstance(first, BaseExceptionGroup) else first
