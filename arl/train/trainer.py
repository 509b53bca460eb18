"""The synchronous trainer: rollout -> advantages -> update -> weight push -> eval (docs/architecture.md §3).

    trainer = Trainer(load_config("configs/tiny_frozenlake_gigpo.yaml"))
    await trainer.train()          # or: await trainer.step() / await trainer.evaluate()

The rollout is one injectable component: by default `arl.rollout.factory` builds the manager the
config's ``rollout.mode`` names (traj, step, or proxy with an agent runner); any `EnvManager`
can be passed instead (``Trainer(config, manager=ProxyEnvManager(engine, ..., my_runner_factory))``) and
trains with the same evaluation, checkpoints and metrics.

A run directory is never cleared implicitly: a fresh run into one that holds a run refuses
(`RunExistsError`) unless ``resume=True`` or ``config.overwrite`` says which (`run_dir.py`).
The policy update itself (micro-batches, PPO-clip, KL, IS correction) is `update.py`; this
module is the loop around it: set-up, rollout, advantages, weight push, evaluation, records.
With ``engine.sleep_mode`` (vLLM on CUDA) the engine sleeps through every update, which then has
the GPU memory of its KV cache and weights. With ``lora.rank > 0`` the policy is a peft model and only its adapter is trained, pushed and
checkpointed (`lora.py`). ``optim.precision: bf16`` stores LoRA's frozen base in bf16 and runs full
fine-tuning under bf16 autocast on fp32 master weights (`precision.py`).

Everything is awaited on the caller's event loop (the CLI's `asyncio.run`, or a notebook's);
the blocking torch work of an update runs in a worker thread so the loop stays responsive.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import torch

from arl.algo import estimators
from arl.config import ConfigError, RunExistsError, TrainConfig, unstructure
from arl.engine import make_engine
from arl.models import resolve_model
from arl.rollout import Sample, collate
from arl.rollout.factory import check_rollout, close_manager, make_manager, make_scheduler
from arl.rollout.partial import PartialScheduler
from arl.rollout.records import sampling_counts
from arl.rollout.scheduler import check_batch
from arl.train import episodes, lora
from arl.train.canary import SyncCanary, WeightSyncError
from arl.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from arl.train.checks import check_config, check_estimator_reads
from arl.train.logging import MetricsLogger, plot_learning_curve
from arl.train.precision import resolve_precision, weights_dtype
from arl.train.run_dir import check_fresh, load_reference, save_config, save_reference
from arl.train.update import policy_update

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _timed(timings: dict[str, float], key: str) -> Iterator[None]:
    """``timings[key]``: the seconds the block took (an ``await`` inside included)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[key] = time.perf_counter() - start


class Trainer:
    """``Trainer(config, *, engine=None, manager=None, val_manager=None, resume=False)``.

    ``engine``: the engine to train (default: built from ``config.engine``; an injected engine is
    not closed by the trainer). ``manager``: the rollout (default: `make_manager` from
    ``config.rollout``; it must run on the trainer's engine). ``val_manager``: evaluation
    (default: ``manager.derive(...)`` at ``config.eval.temperature``). ``resume``: continue the run
    in ``config.run_dir`` from its latest checkpoint.
    """

    def __init__(self, config: TrainConfig, *, engine: Any = None, manager: Any = None, val_manager: Any = None,
                 resume: bool = False):
        if manager is not None:
            if engine is not None and manager.engine is not engine:
                raise ValueError("the manager runs on another engine than the one given: the trainer must push "
                                 "its weights into the engine that generates the rollout")
            engine = manager.engine
        if val_manager is not None and engine is not None and val_manager.engine is not engine:
            raise ValueError("val_manager runs on another engine than the trainer's")
        # before anything is built: the env id, estimator and runner the config names resolve (ConfigError);
        # an injected manager runs its own rollout, so only what the trainer itself uses is checked then
        check_config(config, rollout=manager is None)
        r = config.rollout
        check_estimator_reads(config.algo.estimator, manager.mode if manager is not None else (
            f"proxy-{r.proxy.granularity}" if r.mode == "proxy" else r.mode))  # what the samples can give it
        self.config = resolve_precision(config)  # optim.precision "auto" -> bf16 or fp32, once
        self.engine = engine  # injected (tests, notebooks) or built in setup()
        self._owns_engine = engine is None
        self.manager = manager
        self.manager_injected = manager is not None  # then config.rollout.mode/proxy are not what runs
        self.val_manager = val_manager
        self._owned_managers: list[Any] = []
        self.resume = resume
        self._prefetch: asyncio.Future | None = None  # overlapped mode: the next step's rollout in flight
        self.step_count = 0
        self._sampling_warned: set[str] = set()  # train/sampling_* conditions already logged once
        self.history: list[dict[str, float]] = []
        self.lora = config.lora.rank > 0  # train a LoRA adapter instead of every weight
        self.push_bytes = 0  # what the last weight push moved into the engine
        self.pushed = "nothing"  # what it was, in words (for WeightSyncError)
        self.canary: SyncCanary | None = None  # the weight-sync check after pushes (canary.py)
        self.partial = False  # rollout.partial: set in setup() (the scheduler is a PartialScheduler)
        self._ready = False

    # -- set-up ------------------------------------------------------------------------------------
    async def setup(self, resume: bool | None = None) -> None:
        """Build engine, policy, optimizer and managers (idempotent). The engine comes first:
        on a GPU, vLLM sizes its memory against what is free when it starts. ``resume``
        overrides the constructor's choice (only before the first set-up)."""
        if self._ready:
            return
        if resume is not None:
            self.resume = resume
        c = self.config
        self.run_dir = c.run_dir
        if not self.resume:  # before anything is built: a refusal costs nothing
            check_fresh(self.run_dir, overwrite=c.overwrite)
            lora.remove_base(self.run_dir)  # a base left by the run just refused or overwritten
        torch.manual_seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        if self.engine is None:
            self.engine = make_engine(attrs.evolve(lora.engine_config(c), model=c.model))
        from arl.models.tiny_vl import auto_model_class, has_vision_tower, mask_logits, vision_token_ids

        self.tokenizer = self.engine.tokenizer
        # Before the policy loads: a rollout whose token streams the chat template does not render
        # is refused (TemplateDriftError) at the cost of a few tokenizer-only renders (`arl doctor`).
        check_rollout(self.tokenizer, c.rollout, self.manager, model=c.model)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # bf16 + LoRA: the frozen base in bf16, no fp32 copy (wrap() keeps the adapter fp32); else fp32
        # weights, which under bf16 are the master copy the forward autocasts (update.py).
        dtype = weights_dtype(c.optim.precision, lora=self.lora)
        path = resolve_model(c.model)
        self.model = auto_model_class(path).from_pretrained(path, dtype=dtype)  # a VLM with its vision tower
        if has_vision_tower(self.model.config):  # the engines never sample vision tokens: score the same distribution
            mask_logits(self.model, vision_token_ids(self.tokenizer))
        if c.optim.gradient_checkpointing:  # non-reentrant: correct with frozen inputs (LoRA) too
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.lora:
            self.model = lora.wrap(self.model, c.lora)
        self.model.to(self.device).train()
        self.ref_model = None
        if c.algo.kl_coef > 0:  # under LoRA the base itself (adapter off), else a frozen copy; same precision
            self.ref_model = lora.AdapterDisabled(self.model) if self.lora else copy.deepcopy(self.model).eval()
        self.optimizer = torch.optim.AdamW(
            lora.param_groups(self.model, c.optim.lr, c.optim.vision_lr), lr=c.optim.lr, betas=tuple(c.optim.betas),
            weight_decay=c.optim.weight_decay,
        )
        self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        if self.manager is None:
            self.manager = make_manager(self.engine, c.rollout)
            self._owned_managers.append(self.manager)
        if self.val_manager is None:
            self.val_manager = self.manager.derive(attrs.evolve(self.manager.config, temperature=c.eval.temperature))
            self._owned_managers.append(self.val_manager)
        self.groups = make_scheduler(c.rollout, c.seed)
        self.partial = isinstance(self.groups, PartialScheduler)  # rollout.partial: episodes carried over updates
        if self.partial and c.rollout.partial.kv == "keep" and not getattr(self.engine, "caches_prefixes", False):
            raise ConfigError(f"rollout.partial.kv=keep: the {getattr(self.engine, 'name', type(self.engine).__name__)} "
                              "engine keeps no KV across requests, so there is none to keep: use recompute or vllm")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(self.run_dir, self.config)  # the resolved config, beside what it produced (`arl view` reads it)
        ckpt = latest_checkpoint(self.run_dir) if self.resume else None
        new_base = False  # the engine's base weights are not the model it started from
        if ckpt is not None:
            new_base = self.lora and lora.load_base(self.run_dir, self.model)  # the adapter applies to it
            state = load_checkpoint(ckpt, self.model, self.optimizer, self.lr_schedule)
            self.step_count = int(state["step"])
            extra = state.get("extra_state") or {}
            self.history = list(extra.get("history", []))
            self.rng.bit_generator.state = extra["rng"]
            if self.partial:  # new groups after the checkpoint's; the ones it had in flight are dropped, counted
                self.groups.restore(extra.get("partial"))
            if self.ref_model is not None and not self.lora:
                load_reference(self.run_dir, self.ref_model, warm_started=c.sft.warm_starts)
        # The engine must serve this policy: an injected engine may hold another run's weights, and a
        # resumed run's weights differ from the checkpoint the engine loaded (~10 ms for the tiny model).
        # Under LoRA the base goes too where it may differ from the engine's (an injected engine, a
        # warm-started base), else only the adapter.
        await self.push_weights(base=not self._owns_engine or new_base)
        if c.canary_every > 0:  # a wrong initial load (or an injected engine's other weights) stops here
            self.canary = SyncCanary(self.engine, self.model, self.tokenizer, precision=c.optim.precision,
                                     engine_dtype=c.engine.dtype)
            await self.canary.check(self.pushed, "set-up")
        if ckpt is not None:  # the rows past the checkpoint are replayed
            episodes.truncate_after(self.run_dir, self.step_count)
        self.logger = MetricsLogger(
            self.run_dir, tensorboard=c.tensorboard, resume_step=self.step_count if ckpt is not None else None
        )
        self._ready = True

    def _lr_factor(self, step: int) -> float:
        o, total = self.config.optim, max(1, self.config.steps)
        if step < o.warmup_steps:
            return (step + 1) / (o.warmup_steps + 1)
        progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
        if o.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if o.schedule == "linear":
            return 1.0 - progress
        return 1.0

    # -- one training step -------------------------------------------------------------------------
    async def step(self) -> dict[str, float]:
        """Collect a batch, compute advantages, update the policy, push weights into the engine.

        Overlapped (``rollout.max_staleness: 1``): the rollout of the next step starts before this
        step's update and runs on the engine meanwhile (the update is a worker thread, the engine
        its driver thread: each owns a core). Its early turns are sampled by the policy one
        version behind, its later ones by the new policy once the push lands (between two engine
        steps); every sample carries the version that generated it, the metrics its staleness,
        and the truncated importance weight between the trainer's and the engine's log-probs
        corrects for it. Synchronous (0, the default) is exact, resume included.

        Partial rollouts (``rollout.partial.enabled``, `arl.rollout.partial`): the batch is the oldest
        ``num_groups`` whole groups finished; the episodes still running wait at the scheduler's gate
        (their engine requests drained) through the update and the push, and go on under the new
        weights once ``groups.resume()`` opens it.
        """
        await self.setup()
        timings: dict[str, float] = {}
        with _timed(timings, "timing/step_s"):
            with _timed(timings, "timing/rollout_s"):  # overlapped: the wait for a batch collected meanwhile
                batch = await self._next_batch()
            with _timed(timings, "timing/advantages_s"):
                samples = [s for s in batch.samples if s.num_response_tokens > 0]
                advantages, adv_stats = self.advantages(samples)
            serving = getattr(self.engine, "policy_version", None)  # the version the engine serves before this update
            train_metrics = await self._update_policy(samples, advantages, timings)
            with _timed(timings, "timing/weight_push_s"):
                await self.push_weights(keep_kv=self.partial and self.config.rollout.partial.kv == "keep")
            if self.partial:  # the carried episodes' requests go on, under the new weights
                self.groups.resume()
            sync_metrics = await self._check_sync()
            self.step_count += 1
            metrics = {**batch.metrics, **adv_stats, **train_metrics, **sync_metrics,
                       **self._progress(samples, serving)}
            if self._eval_due():
                metrics.update(await self.evaluate())
        metrics.update(timings)
        self._record(metrics)
        if (self.config.save_every and self.step_count % self.config.save_every == 0) or self.step_count == self.config.steps:
            self.save()
        return metrics

    async def _next_batch(self) -> Any:
        """This step's rollout: collected now, or (overlapped) the one collected during the last
        update; overlapped, the next step's rollout starts here, to run through this step's update."""
        c = self.config
        pending, self._prefetch = self._prefetch, None
        batch = await (pending if pending is not None else self._rollout(self.step_count))
        check_batch(batch, f"training step {self.step_count}")  # a broken set-up stops here, not in silence
        if c.rollout.max_staleness > 0 and self.step_count + 1 < c.steps:
            self._prefetch = asyncio.ensure_future(self._rollout(self.step_count + 1))
        return batch

    async def _update_policy(self, samples: list[Sample], advantages: np.ndarray,
                             timings: dict[str, float]) -> dict[str, float]:
        """`update` in a worker thread (the event loop, and an overlapped rollout, go on meanwhile).
        Under ``engine.sleep_mode`` the engine sleeps through it, so the update gets its GPU memory
        (KV cache, weights); a failed update still wakes it (its requests would wait forever). A
        batch with nothing to train on skips the update (and its timing)."""
        sleep = self.config.engine.sleep_mode
        if sleep:
            with _timed(timings, "timing/engine_sleep_s"):
                await self.engine.sleep()
        try:
            if not samples:
                return {}
            with _timed(timings, "timing/update_s"):
                return await asyncio.to_thread(self.update, samples, advantages)
        finally:
            if sleep:
                with _timed(timings, "timing/engine_wake_s"):
                    if torch.cuda.is_available():  # the update's cached blocks go back, for vLLM to wake into
                        torch.cuda.empty_cache()
                    await self.engine.wake()

    async def _check_sync(self) -> dict[str, float]:
        """On the canary's steps: does the engine serve the policy just pushed (``sync/*``)?"""
        if self.canary is None or (self.step_count + 1) % self.config.canary_every:
            return {}
        start = time.perf_counter()
        metrics = await self.canary.check(self.pushed, f"step {self.step_count + 1}")
        if metrics:  # a canary that switched itself off measured nothing, so took no time worth a row
            metrics["timing/canary_s"] = time.perf_counter() - start
        return metrics

    def _progress(self, samples: list[Sample], serving: int | None) -> dict[str, float]:
        """Where the run stands after the step's push: the push's size, the learning rate, the
        steps done, and how many updates behind the policy that sampled each row was."""
        out = {
            "train/weight_push_bytes": float(self.push_bytes),
            "train/lr": self.lr_schedule.get_last_lr()[0],
            "train/policy_version": float(self.step_count),  # steps done (engine counters restart on resume)
        }
        if serving is not None and samples:
            lag = [serving - s.policy_version for s in samples]
            out.update({"train/staleness_mean": float(np.mean(lag)), "train/staleness_max": float(max(lag))})
        return out

    async def _rollout(self, step: int) -> Any:
        stats = getattr(self.engine, "engine_stats", lambda: None)  # an engine outside arl's contract has none
        before = stats()
        started = time.perf_counter()
        if self.partial:  # returns with the engine's requests stopped and drained, until `resume`
            batch = await self.groups.collect(self.manager, step)
        else:
            batch = await self.groups.run(self.manager, self.groups.specs(step), keep_groups=self.groups.num_groups)
        if before is not None:  # what the engine did meanwhile (an evaluation overlapping it counts too)
            wall = time.perf_counter() - started
            delta = {k: v - before[k] for k, v in stats().items()}
            queries = delta["prefix_cache_queries"]
            batch.metrics["rollout/prefix_cache_query_tokens"] = float(queries)
            if queries:  # a rate over no look-ups is no measurement
                batch.metrics["rollout/prefix_cache_hit_rate"] = delta["prefix_cache_hits"] / queries
            batch.metrics["rollout/engine_steps"] = float(delta["engine_steps"])
            if wall > 0:  # ~1: the engine bounded the rollout; well below: it waited on envs, agents or the loop
                batch.metrics["rollout/engine_busy_frac"] = delta["engine_busy_s"] / wall
        return batch

    async def _cancel_prefetch(self) -> None:
        task, self._prefetch = self._prefetch, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def advantages(self, samples: list[Sample]) -> tuple[np.ndarray, dict[str, float]]:
        """One scalar per sample from the configured estimator (`arl.algo.estimators`), its stats
        under ``train/``."""
        adv, stats = estimators.estimate(self.config.algo.estimator, samples, self.config.algo)
        return adv, {f"train/{k}": v for k, v in stats.items()}

    # -- the policy update (blocking; runs in a worker thread) ------------------------------------
    def update(self, samples: list[Sample], advantages: np.ndarray) -> dict[str, float]:
        """`arl.train.update.policy_update` on the collated batch, then one LR-schedule step.

        Each reply is scored at the temperature it was drawn at (its sample's ``sampled_with``; the
        manager's configured one for samples that do not record it); ``train/sampling_*`` count what
        the trainer cannot reproduce (`arl.rollout.records.sampling_counts`)."""
        c = self.config
        default_temperature = self.manager.config.temperature
        batch = collate(samples, pad_id=self.tokenizer.pad_token_id or 0, mask_abnormal=c.rollout.mask_abnormal,
                        default_temperature=default_temperature if default_temperature > 0 else 1.0)
        metrics = policy_update(
            self.model, self.optimizer, batch, advantages, algo=c.algo, optim=c.optim,
            rng=self.rng, ref_model=self.ref_model,
        )
        counts = sampling_counts(samples, mask_abnormal=c.rollout.mask_abnormal)
        metrics.update({f"train/{k}": v for k, v in counts.items()})
        self._warn_sampling_once(counts)
        self.lr_schedule.step()
        return metrics

    def _warn_sampling_once(self, counts: dict[str, float]) -> None:
        """Sampling that weakens what the run learns, logged the first time a run sees it (the
        ``train/sampling_*`` metrics count it on every step)."""
        warnings = {
            "sampling_overridden_fields": "the agent asked for its own temperature/top_p/top_k and the config's "
            "values were used instead (rollout.manager.agent_sampling=override); train/sampling_overridden_fields "
            "counts it",
            "sampling_greedy_tokens": "some replies were drawn greedily (temperature 0, e.g. the agent's own "
            "setting under agent_sampling=honour): a group of greedy replies is identical and has no advantage "
            "to learn from; train/sampling_greedy_tokens counts them",
            "sampling_truncated_tokens": "some replies were drawn under top-p/top-k truncation, whose renormalised "
            "log-probs the trainer's full softmax does not reproduce (the importance weight corrects the gap); "
            "train/sampling_truncated_tokens counts them",
        }
        for key, text in warnings.items():
            if counts.get(key, 0) > 0 and key not in self._sampling_warned:
                self._sampling_warned.add(key)
                log.warning("step %d: %s", self.step_count, text)

    async def push_weights(self, base: bool = False, keep_kv: bool = False) -> None:
        """New policy weights into the engine (which also resets its prefix cache, unless ``keep_kv``:
        ``rollout.partial.kv: keep``). Under LoRA only the adapter, after the base weights when
        ``base`` (the engine serves the adapter on them)."""
        if not self.lora:
            state = [(name, t.detach()) for name, t in self.model.state_dict().items()]
            if keep_kv:
                await self.engine.update_weights(state, keep_kv=True)
            else:
                await self.engine.update_weights(state)
            self.push_bytes = sum(t.numel() * t.element_size() for _, t in state)
            self.pushed = "the full weights"
            return
        pushed = 0
        if base:
            weights = lora.base_weights(self.model)
            await self.engine.update_weights(weights)
            pushed += sum(t.numel() * t.element_size() for _, t in weights)
        adapter = lora.adapter_of(self.model)
        await self.engine.update_adapter(adapter)
        self.push_bytes = pushed + adapter.nbytes
        self.pushed = "the base weights and the LoRA adapter" if base else "the LoRA adapter"

    # -- evaluation --------------------------------------------------------------------------------
    def _eval_due(self) -> bool:
        every, c = self.config.eval.every, self.config
        return self.step_count == c.steps or (every > 0 and self.step_count % every == 0)

    async def evaluate(self) -> dict[str, float]:
        """The fixed validation panel at the eval temperature: success, valid actions, turns; and a
        row of run_dir/episodes.jsonl (episodes, exits, per-state actions; `arl.train.episodes`)."""
        await self.setup()
        specs = self.groups.val_specs(num_seeds=self.config.eval.num_seeds)
        batch = await self.groups.run(self.val_manager, specs)
        await self._record_episodes([e.trajectory for e in batch.episodes])
        return evaluation_metrics(batch.metrics)

    async def _record_episodes(self, trajectories: list[Any]) -> None:
        ev, manager = self.config.eval, self.val_manager.config
        if ev.record_episodes == 0:
            return

        def decode(ids: Any) -> str:  # as the managers read a reply (arl/rollout/base.py)
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        row = episodes.eval_record(self.step_count, trajectories, keep=ev.record_episodes, decode=decode)
        firsts = [(t.turns[0].observation, t.turns[0].prompt_ids) for t in trajectories[:ev.record_episodes] if t.turns]
        if ev.state_samples > 0 and firsts:
            try:  # the game's own parser; an env that is no TextEnv game (proxy mode's agents) has none
                from arl.envs.text import TextEnv

                game = TextEnv(self.config.rollout.env_id, **manager.env_kwargs)
                try:
                    row["states"] = await episodes.state_action_counts(
                        self.engine, firsts, n=ev.state_samples, temperature=manager.temperature,
                        max_tokens=manager.max_tokens, decode=decode, parse=game.parse_action)
                finally:
                    game.close()
            except Exception as exc:  # a record for the report: never the reason a run stops
                row["states_error"] = f"{type(exc).__name__}: {exc}"
        episodes.append_record(self.run_dir, row)

    # -- the loop ----------------------------------------------------------------------------------
    async def train(self, resume: bool | None = None, progress: Any = None) -> list[dict[str, float]]:
        """Run until `config.steps`; `progress` is an optional callback(step, metrics). ``resume``
        as in the constructor (it only matters before the first set-up)."""
        await self.setup(resume=resume)
        if self.step_count == 0 and self.config.sft.warm_starts:
            from arl.train.sft import warm_start

            if self.lora:  # the warm-start trains the base (it stands in for a pretrained model)
                with lora.base_training(self.model):
                    sft_metrics = await warm_start(self)
                # also the KL anchor: base, adapter off
                lora.save_base(self.run_dir, self.model, self.tokenizer, self.image_processor)
            else:
                sft_metrics = await warm_start(self)
            if self.ref_model is not None and not self.lora:  # the KL anchor is the policy RL starts from
                self.ref_model.load_state_dict(self.model.state_dict())
                save_reference(self.run_dir, self.ref_model)
            await self.push_weights(base=self.lora)
            if self.canary is not None:
                await self.canary.check(self.pushed, "the format warm-start's push")
            self._record_raw(0, sft_metrics)
        if self.step_count == 0 and self.config.eval.at_start:
            self._record_raw(0, await self.evaluate())
        while self.step_count < self.config.steps:
            metrics = await self.step()
            if progress is not None:
                progress(self.step_count, metrics)
        plot_learning_curve(self.run_dir, self.run_dir / "learning_curve.png")
        return self.history

    def _record(self, metrics: dict[str, float]) -> None:
        self._record_raw(self.step_count, metrics)

    def _record_raw(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **metrics}
        self.history.append(row)
        self.logger.log(step, metrics)

    def save(self) -> None:
        save_checkpoint(
            self.run_dir, self.step_count, self.model, self.tokenizer, self.optimizer, self.lr_schedule,
            extra_state={"history": self.history, "rng": self.rng.bit_generator.state,
                         # partial rollouts: the next group's seed; the groups in flight are not saved
                         **({"partial": self.groups.state()} if self.partial else {}),
                         "config": unstructure(self.config),
                         # what actually played the rollout: an injected manager is not in the config
                         "rollout": {"manager": type(self.manager).__name__, "mode": getattr(self.manager, "mode", None),
                                     "injected": self.manager_injected}},
            keep=self.config.keep_checkpoints,
            image_processor=self.image_processor,
        )

    @property
    def image_processor(self) -> Any:
        """A VLM's image processor (arl.engine.images.ImageRenderer's), saved beside the weights of a
        checkpoint and of LoRA's base so an engine serves them images; None for a text model."""
        return getattr(getattr(self.engine, "image_renderer", None), "image_processor", None)

    async def close(self) -> None:
        await self._cancel_prefetch()
        if self.partial:  # no episode of a partial rollout outlives the run
            await self.groups.aclose()
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        for manager in self._owned_managers:
            await close_manager(manager)
        self._owned_managers = []
        if self._owns_engine and self.engine is not None:
            await self.engine.close()

    async def __aenter__(self) -> Trainer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def evaluation_metrics(rollout_metrics: dict[str, float]) -> dict[str, float]:
    """rollout/* metrics of a validation batch, renamed into the eval/ namespace."""
    keep = ("success_rate", "valid_action_rate", "mean_turns", "mean_episode_score", "num_episodes")
    return {f"eval/{k}": rollout_metrics[f"rollout/{k}"] for k in keep if f"rollout/{k}" in rollout_metrics}


__all__ = ["RunExistsError", "Trainer", "WeightSyncError", "evaluation_metrics"]
