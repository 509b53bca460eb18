"""Experiment configuration: attrs classes, loaded from YAML with dotted overrides.

    cfg = load_config("configs/tiny_frozenlake_gigpo.yaml", ["optim.lr=3e-4", "algo.estimator=grpo"])

Every config record of arl is here, and this module imports no other arl module: the records are
plain data, and the code that builds from them (`arl.engine.make_engine`,
`arl.rollout.factory.make_manager`, the `Trainer`) imports them, never the other way round, so
reading a config loads no engine, manager or server. Fields are checked by attrs validators
(`attrs.validators`), checks across fields by `__attrs_post_init__`.

Unknown keys and invalid values raise `ConfigError` naming the field (as a dotted path) and,
for choices, the allowed values.
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import attrs
import cattrs
import yaml
from attrs import validators as v


def arl_home() -> Path:
    """arl's cache root, ``$ARL_HOME`` (default ``~/.cache/arl``): the zoo's built models live under
    ``models/``, the real-code tasks' packages under ``realbugs/``. Here, in the bottom layer, so that
    every layer reads the one variable the same way."""
    return Path(os.environ.get("ARL_HOME", Path.home() / ".cache" / "arl"))

__all__ = [  # the public names (docs/architecture.md §10; tests/test_public_api.py holds them to it)
    "AGENT_SAMPLING", "BACKENDS", "CONFIG_DIR", "DEFAULT_MODEL", "DEMO_CONFIG", "FORK_AT", "MODES", "PRECISIONS",
    "RENAMED_KEYS", "SANDBOX_BACKENDS", "AlgoConfig", "ConfigError", "EngineConfig", "EvalConfig", "ForkConfig", "Granularity",
    "KV_AFTER_PUSH", "KeepBranches", "LoRAConfig", "ManagerConfig", "OptimConfig", "PartialConfig", "ProxyConfig",
    "RolloutConfig", "RunExistsError",
    "SFTConfig", "SandboxConfig", "TrainConfig", "Transport", "apply_overrides", "load_config", "packaged_configs",
    "read_config_data", "resolve_config_path", "structure", "to_yaml", "unstructure",
]


class ConfigError(ValueError):
    """A config file or override that does not describe a valid experiment."""


class RunExistsError(FileExistsError):
    """A fresh run was asked to start in a run directory that holds another run."""


# -- engine -------------------------------------------------------------------------------------

BACKENDS = ("vllm", "vllm-async", "hf", "scripted")


@attrs.define
class EngineConfig:
    """How to build an engine (`arl.engine.make_engine`). `model` is a zoo name, a local directory
    or a hub id."""

    backend: str = attrs.field(default="vllm", validator=v.in_(BACKENDS))
    model: str = "tiny"
    max_model_len: int = 2048
    seed: int = 0
    # "bfloat16" beside a bf16 policy (optim.precision: bf16); "policy": whatever optim.precision
    # resolves to (bfloat16 for bf16, float32 for fp32), so that "auto" sets both sides at once.
    dtype: str = "float32"
    kv_cache_memory_bytes: int | None = 256 * 2**20
    max_num_seqs: int = 256
    gpu_memory_utilization: float | None = None
    max_batch_size: int = 32  # hf backend: requests per batched generate()
    scripted: dict[str, Any] = attrs.Factory(dict)  # scripted backend options
    extra: dict[str, Any] = attrs.Factory(dict)  # passed through to vLLM's EngineArgs
    # vLLM on CUDA only: start with vLLM's sleep mode, so `sleep()` frees the engine's GPU memory
    # (KV cache dropped, weights offloaded to host memory) until `wake()`; the trainer then sleeps the
    # engine through every policy update, which gets that memory. It costs a weight round trip per step.
    sleep_mode: bool = attrs.field(default=False, validator=v.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        if self.sleep_mode and not self.backend.startswith("vllm"):
            raise ValueError(f"engine.sleep_mode needs a vLLM backend (vllm, vllm-async), not {self.backend!r}")


# -- rollout ------------------------------------------------------------------------------------


FORK_AT = ("first", "every")  # rollout.manager.fork.at, besides a "package.module:rule"


def _check_fork_at(instance: Any, attribute: Any, value: str) -> None:
    module, sep, name = value.partition(":")
    if value not in FORK_AT and not (sep and module and name):
        raise ValueError(f"fork.at={value!r}: use one of {', '.join(FORK_AT)} or 'package.module:rule'")


@attrs.define
class ForkConfig:
    """Forked anchor groups (`arl.rollout.fork`): at chosen states of a training episode the env is
    copied and ``k`` actions are sampled from the one prompt, each played out under the policy, so
    GiGPO's step term compares ``k`` returns from exactly that state. ``k: 0`` (the default) is off."""

    k: int = attrs.field(default=0, validator=v.ge(0))  # actions per forked state: the anchor-group size
    # "first": the first `states` states of an episode; "every": every state; "package.module:rule":
    # rule(step, observation) -> bool, resolved when the manager is built
    at: str = attrs.field(default="first", validator=[v.instance_of(str), _check_fork_at])
    states: int = attrs.field(default=1, validator=v.ge(1))  # at=first: how many
    # a branch's steps, its forked action included; None: it plays to the episode's end
    horizon: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    # the episode tags that fork: training groups ("train"); the validation panel ("val") and the
    # warm-start ("sft") play unforked, as they measure or imitate, and a branch only adds cost there
    tags: list[str] = attrs.Factory(lambda: ["train"])

    def __attrs_post_init__(self) -> None:
        if self.k == 1:
            raise ValueError("fork.k=1 compares an action with nothing: use k >= 2, or 0 to switch forking off")


# What a manager does with the temperature/top_p/top_k an agent's request sets (proxy, push, pull):
# draw at them, or at the config's values (counted). docs/guide.md, "Agents' sampling fields".
AGENT_SAMPLING: tuple[str, ...] = ("override", "honour")


# ManagerConfig.observation's choices: what a traj/step prompt shows of the game's state
OBSERVATIONS: tuple[str, ...] = ("text", "image", "both")


@attrs.define
class ManagerConfig:
    """How a manager plays episodes (sampling, limits, prompt shape)."""

    max_turns: int | None = None  # None: the env's own step limit
    max_tokens: int = 64  # per model call
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    agent_sampling: str = attrs.field(default="override", validator=v.in_(AGENT_SAMPLING))
    max_model_len: int | None = None  # None: engine.max_model_len
    format_penalty: float | None = None  # None: the game's default
    history_len: int = 2  # step mode: last h steps shown
    episode_timeout_s: float | None = None
    sampling_seed: int | None = 0  # None: engine RNG; else per-request seeds from request_seed()
    env_kwargs: dict[str, Any] = attrs.Factory(dict)
    # "full": the anchors' prompts (docs/reference.md §1.4); "compact": grid + turns left only, for models
    # that cannot read the instructions anyway (see arl.envs.prompts.compact_messages).
    prompt_style: str = attrs.field(default="full", validator=v.in_(("full", "compact")))
    # compact style: a system turn with this text first (None: no system turn, so the chat
    # template's default applies, if it has one; "" an empty one). The full style always sends
    # the anchors' system prompt (docs/reference.md §1.4).
    system_prompt: str | None = None
    fork: ForkConfig = attrs.Factory(ForkConfig)  # step mode: forked anchor groups (off by default)
    # What a prompt shows of the game's state (traj and step modes, and proxy mode's GymRunner, which
    # sends the frames as image_url parts; docs/guide.md "Image observations"):
    # "text" the grid as text; "image" the game's RGB frame only (the text says the board is in the
    # image); "both" the frame and the grid text. "image"/"both" need a VLM (the zoo's tiny-vl).
    observation: str = attrs.field(default="text", validator=v.in_(OBSERVATIONS))

    def __attrs_post_init__(self) -> None:
        if self.system_prompt is not None and self.prompt_style != "compact":
            raise ValueError("system_prompt applies to prompt_style 'compact' only (the full style sends its own)")
        if self.observation != "text" and self.fork.k:
            raise ValueError(f"fork mode plays text observations only, not observation={self.observation!r}")


# rollout.proxy's choices. transport: a function call | the HTTP proxy server; granularity: a sample per
# conversation branch (traj) | per model call (step); keep_branches (granularity traj): every
# conversation branch's sample | the longest's (conversation branches:
# `arl.intercept.tracker.ConversationBranch`, not fork mode's `arl.rollout.records.ForkBranch`)
Transport = Literal["inprocess", "http"]
Granularity = Literal["traj", "step"]
KeepBranches = Literal["all", "longest"]


@attrs.define
class ProxyConfig:
    """How ``mode: proxy`` runs agent code (the runners: `arl.rollout.factory`'s docstring). Its
    defaults are `arl.rollout.proxy.ProxyEnvManager`'s too."""

    runner: str = "gym"  # gym | tool | push | pull | "package.module:name" (a runner factory or an agent function)
    transport: str = attrs.field(default="inprocess", validator=v.in_(get_args(Transport)))
    # step: one exact sample per model call, its prompt as the agent sent it, which fits every agent
    # (one that rewrites its history too) and gives GiGPO its steps; traj: one per conversation branch
    granularity: str = attrs.field(default="step", validator=v.in_(get_args(Granularity)))
    # which conversation branches (`arl.intercept.tracker.ConversationBranch`) give traj samples: all | longest
    keep_branches: str = attrs.field(default="all", validator=v.in_(get_args(KeepBranches)))
    runner_kwargs: dict[str, Any] = attrs.Factory(dict)  # passed to the runner factory
    # Does the agent send `tools` / get tool calls back? auto: gym is a text agent, any other runner
    # a tool agent (`check_rollout` checks the chat template for what the agent needs).
    tools: Any = attrs.field(default="auto", validator=v.in_(("auto", True, False)))

    @property
    def tracker_mode(self) -> str:
        """Deprecated: the old name of `granularity`."""
        warnings.warn("ProxyConfig.tracker_mode is renamed granularity", DeprecationWarning, stacklevel=2)
        return self.granularity


MODES = ("traj", "step", "proxy")  # rollout.mode
# rollout.sandbox.backend: arl.sandbox.backends.BACKENDS (this module imports no arl module;
# tests/envs/test_sandbox_backends.py holds the two equal)
SANDBOX_BACKENDS = ("auto", "bwrap", "podman", "docker", "none")


@attrs.define
class SandboxConfig:
    """Where the envs' commands, the judges' hidden tests and pull-mode agents run
    (`arl.sandbox.backends`; what each backend isolates: docs/threat_model.md). ``auto``: bwrap
    where it starts, else podman, else docker, else none (warned). An env or runner that names its
    own (``env_kwargs.isolation``, ``runner_kwargs.sandbox``) keeps it."""

    backend: str = attrs.field(default="auto", validator=v.in_(SANDBOX_BACKENDS))
KV_AFTER_PUSH = ("recompute", "keep")  # rollout.partial.kv


@attrs.define
class PartialConfig:
    """Partial rollouts (`arl.rollout.partial`): episodes still running at an update are carried over
    into the next step and resume under the new weights, instead of being waited for or discarded.
    Off by default: it trains on tokens of older policies (corrected by the truncated importance
    weight, ``algo.is_cap``), which a researcher chooses, knowing it."""

    enabled: bool = False
    # groups kept in flight beyond the num_groups a step trains on: the ones still running at an update
    carry_over_groups: int = attrs.field(default=1, validator=v.ge(0))
    # the most updates an episode may live through before it is trained; older ones are dropped (counted)
    max_age: int = attrs.field(default=1, validator=v.ge(0))
    # a resumed episode's prompt KV after a weight push: recompute (under the new weights) | keep
    # (the old policy's KV, reused; needs an engine with a prefix cache: vllm)
    kv: str = attrs.field(default="recompute", validator=v.in_(KV_AFTER_PUSH))


@attrs.define
class RolloutConfig:
    env_id: str = "arl/FrozenLake-v0"
    mode: str = attrs.field(default="step", validator=v.in_(MODES))
    num_groups: int = attrs.field(default=8, validator=v.ge(1))
    group_size: int = attrs.field(default=8, validator=v.ge(1))
    max_concurrency: int = attrs.field(default=64, validator=v.ge(1))
    mask_abnormal: bool = True  # drop abnormally ended episodes from the loss
    # 0: synchronous (rollout, then update: exact). 1: overlapped, one step off-policy: the next
    # step's rollout runs during this step's update (see Trainer.step).
    max_staleness: int = attrs.field(default=0, validator=v.in_((0, 1)))
    # Over-provisioning: play num_groups + spare_groups groups per step and keep the first
    # num_groups that finish (GroupScheduler's docstring: what it buys and the bias it costs).
    spare_groups: int = attrs.field(default=0, validator=v.ge(0))
    manager: ManagerConfig = attrs.Factory(ManagerConfig)
    proxy: ProxyConfig = attrs.Factory(ProxyConfig)
    sandbox: SandboxConfig = attrs.Factory(SandboxConfig)
    partial: PartialConfig = attrs.Factory(PartialConfig)

    def __attrs_post_init__(self) -> None:
        if self.manager.fork.k and self.mode != "step":
            raise ValueError(f"rollout.manager.fork needs rollout.mode=step (a fork samples step prompts), not {self.mode!r}")
        if self.partial.enabled and (self.max_staleness > 0 or self.spare_groups > 0):
            raise ValueError("rollout.partial carries unfinished groups over instead of overlapping the next rollout "
                             "(max_staleness) or discarding the slowest groups (spare_groups): use one of them")


# -- training -----------------------------------------------------------------------------------


@attrs.define
class AlgoConfig:
    # a name in arl.algo.estimators (built in: grpo, gigpo, reinforce; more by `register`), checked by
    # the Trainer: this module imports no other arl module, so it cannot know the registered ones
    estimator: str = attrs.field(default="gigpo", validator=v.instance_of(str))
    gamma: float = 0.95
    step_weight: float = 1.0
    # GiGPO's normalisation of both advantages: mean_norm (A = R - mean) | mean_std_norm (/ std too)
    gigpo_norm: str = attrs.field(default="mean_norm", validator=v.in_(("mean_norm", "mean_std_norm")))
    invalid_penalty: float = 0.0
    # GiGPO's episode-term conventions (arl.algo.step_level.gigpo): the group statistics over episodes
    # (arl's) or over step rows (verl-agent's compute_mean_std_cross_steps); a singleton group's
    # advantage 0 (arl's) or its raw score (verl-agent's)
    episode_stats: str = attrs.field(default="episodes", validator=v.in_(("episodes", "steps")))
    singleton: str = attrs.field(default="zero", validator=v.in_(("zero", "raw")))
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = None
    agg: str = attrs.field(default="token-mean", validator=v.in_(("token-mean", "seq-mean-token-mean")))
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    is_cap: float | None = 3.0  # truncated importance sampling between trainer and engine log-probs
    is_level: str = attrs.field(default="token", validator=v.in_(("token", "sequence")))

    @property
    def gigpo_mode(self) -> str:
        """Deprecated: the old name of `gigpo_norm` (an estimator of a user's may still read it)."""
        warnings.warn("AlgoConfig.gigpo_mode is renamed gigpo_norm", DeprecationWarning, stacklevel=2)
        return self.gigpo_norm


PRECISIONS = ("fp32", "bf16", "auto")  # optim.precision; "auto": bf16 where the device computes it fast


@attrs.define
class OptimConfig:
    lr: float = attrs.field(default=1e-4, validator=v.gt(0))
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = 1.0
    # A VLM's vision tower's learning rate (the schedule scales it like lr); None: lr, as every other weight;
    # 0 holds the tower as it is (its gradient still counts in grad_clip's norm, as at any vision_lr).
    # tiny_frozenlake_vision_gigpo.yaml holds it: RL at 1e-3 drifted the tower until cells looked alike.
    vision_lr: float | None = attrs.field(default=None, validator=v.optional(v.ge(0)))
    warmup_steps: int = 0
    schedule: str = attrs.field(default="constant", validator=v.in_(("constant", "cosine", "linear")))
    micro_batch_size: int = attrs.field(default=32, validator=v.ge(1))
    mini_batches: int = attrs.field(default=1, validator=v.ge(1))  # optimizer steps per rollout
    epochs: int = attrs.field(default=1, validator=v.ge(1))
    # Recompute each layer's activations in the backward pass instead of keeping them: activation
    # memory of one layer instead of all, for ~1/3 more compute (for large models on one GPU).
    gradient_checkpointing: bool = False
    # The policy's precision (arl/train/precision.py). "bf16": bf16 compute, fp32 only for what is
    # trained: under LoRA the frozen base is stored in bf16 and the adapter (weights, gradients, AdamW
    # moments) in fp32; full fine-tuning keeps fp32 weights as the master copy and runs the
    # forward/backward under bf16 autocast. Log-probs are fp32 from the logits, checkpoints fp32. On a
    # GPU pair it with a bf16 engine (engine.dtype: bfloat16); "fp32" (CPU, exactness tests) with fp32.
    # "auto": bf16 where the trainer's device has fast bf16 matmuls (a CUDA GPU that supports it, a
    # CPU with AVX512-BF16 or AMX), else fp32 (arl/train/precision.py, `resolve_precision`).
    precision: str = attrs.field(default="fp32", validator=v.in_(PRECISIONS))


@attrs.define
class EvalConfig:
    every: int = 5  # steps between evaluations (0: only at start and end)
    num_seeds: int = 64  # fixed validation panel
    temperature: float = 0.5
    at_start: bool = True
    # kept in run_dir/episodes.jsonl at each evaluation for `arl view` (arl/train/episodes.py): the
    # first `record_episodes` validation episodes turn by turn, and their first states answered
    # `state_samples` times each (per-state action distributions over training); 0 turns either off
    record_episodes: int = attrs.field(default=4, validator=v.ge(0))
    state_samples: int = attrs.field(default=8, validator=v.ge(0))


@attrs.define
class SFTConfig:
    """Answer-format warm-start on uniformly random valid actions (teaches the format, not the game)."""

    steps: int = 0  # 0 disables it
    lr: float = 1e-3
    batch_episodes: int = 32
    micro_batch_size: int = 32
    # Who plays the warm-start episodes: "answers" (random valid `<answer>X</answer>` replies),
    # "tool_calls" (random valid `move` tool calls, for function-calling agents), or "auto"
    # (tool_calls when rollout.proxy.runner is "tool", else answers).
    teacher: str = attrs.field(default="auto", validator=v.in_(("auto", "answers", "tool_calls")))
    # A VLM's vision tower stays frozen through the warm-start unless this is on: the targets are random
    # actions, independent of the image, and fitting the tower to them collapses its output onto one
    # direction (arl/train/sft.py, `frozen_vision`). RL trains it unless optim.vision_lr is 0.
    train_vision: bool = False
    # Perception warm-start (arl/train/perception.py), before the format warm-start: this many steps of
    # cross-entropy on `perception_batch` random boards each, a prompt showing the board's frame and the
    # board's grid text as the reply. It teaches a VLM that has never learned to see (the zoo's
    # random-init tiny-vl) to read the board, what a pretrained VLM brings to RL, and nothing about
    # which action is good; the vision tower trains. Needs a VLM and rollout.manager.observation image
    # or both. 0 disables it.
    perception_steps: int = attrs.field(default=0, validator=v.ge(0))
    perception_batch: int = attrs.field(default=64, validator=v.ge(1))

    @property
    def warm_starts(self) -> bool:
        """Whether a run starts with a warm-start (perception, format or both)."""
        return self.steps > 0 or self.perception_steps > 0


@attrs.define
class LoRAConfig:
    """LoRA on the policy (peft): the trainer trains low-rank adapters on ``target_modules`` and pushes
    only them into the engine. ``rank: 0`` (the default) trains every weight."""

    rank: int = attrs.field(default=0, validator=v.ge(0))
    alpha: float = attrs.field(default=16.0, validator=v.gt(0))  # the update is scaled by alpha / rank
    # 0: the trainer's log-probs are then deterministic and equal the engine's (dropout would make the
    # importance weight between them noise).
    dropout: float = attrs.field(default=0.0, validator=[v.ge(0), v.lt(1)])
    target_modules: list[str] = attrs.Factory(
        lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # A VLM's vision tower gets adapters too (its modules named in target_modules); off: the language
    # model's only (arl.train.lora.wrap), which is what vLLM's LoRA path serves.
    vision: bool = False


DEFAULT_MODEL = "tiny"


def _set_engine_model(config: TrainConfig, model: str) -> str:
    config.engine.model = model
    return model


@attrs.define
class TrainConfig:
    name: str = "run"
    seed: int = 0
    steps: int = attrs.field(default=20, validator=v.ge(0))
    out_dir: str = "runs"
    save_every: int = 0  # 0: only at the end
    keep_checkpoints: int | None = 2
    # Steps between weight-sync canaries (arl/train/canary.py): after the push, the engine's log-probs
    # of a fixed greedy probe must equal the trainer's, or the run stops with WeightSyncError. Also
    # once at set-up. ~0.1 s on the tiny model on CPU; 0 switches it off.
    canary_every: int = attrs.field(default=1, validator=v.ge(0))
    tensorboard: bool = True
    # A fresh run into a directory that holds a run (checkpoints, metrics) refuses to start unless
    # this is set; resuming is the other way. Nothing else ever deletes a run.
    overwrite: bool = False
    # The one model name: the engine serves it and the trainer trains it (setting it later sets
    # engine.model too).
    model: str = attrs.field(default=DEFAULT_MODEL, on_setattr=lambda self, _, value: _set_engine_model(self, value))
    engine: EngineConfig = attrs.Factory(EngineConfig)
    rollout: RolloutConfig = attrs.Factory(RolloutConfig)
    algo: AlgoConfig = attrs.Factory(AlgoConfig)
    optim: OptimConfig = attrs.Factory(OptimConfig)
    eval: EvalConfig = attrs.Factory(EvalConfig)
    sft: SFTConfig = attrs.Factory(SFTConfig)
    lora: LoRAConfig = attrs.Factory(LoRAConfig)

    def __attrs_post_init__(self) -> None:
        # One model name, however the config was built (YAML, Python, `attrs.evolve`): a model set
        # only on the engine is taken as the run's; two different explicit names are an error.
        if self.engine.model != self.model:
            if self.model != DEFAULT_MODEL and self.engine.model != DEFAULT_MODEL:
                raise ValueError(f"model={self.model!r} and engine.model={self.engine.model!r} disagree: set model only")
            self.model = self.engine.model if self.model == DEFAULT_MODEL else self.model
        self.engine.model = self.model
        if self.rollout.manager.fork.k and self.algo.estimator in ("grpo", "reinforce"):
            raise ValueError(f"rollout.manager.fork with algo.estimator={self.algo.estimator}: it would not read the "
                             "forked groups (their branch rows are no episodes): use gigpo")
        partial = self.rollout.partial
        if partial.enabled and self.algo.is_cap is None:
            raise ValueError("rollout.partial trains tokens sampled by older policies: it needs the truncated "
                             "importance weight against their behaviour log-probs (algo.is_cap), not None")
        if partial.enabled and partial.kv == "keep" and (self.lora.rank > 0 or self.engine.sleep_mode):
            raise ValueError("rollout.partial.kv=keep cannot keep KV across a LoRA adapter push (vLLM keys its prefix "
                             "cache by adapter) or through engine.sleep_mode (sleep drops the KV cache): use recompute")
        if self.sft.perception_steps and self.rollout.manager.observation == "text":
            raise ValueError("sft.perception_steps teaches a VLM to read the game's frames, and rollout.manager."
                             "observation=text shows it none: use image or both, or sft.perception_steps=0")
        if self.engine.sleep_mode and self.rollout.max_staleness > 0:
            raise ValueError("engine.sleep_mode and rollout.max_staleness=1 exclude each other: the overlapped "
                             "rollout runs on the engine during the update, when sleep mode would free it")

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


_converter = cattrs.Converter(forbid_extra_keys=True)


def _path_of(exc: BaseException) -> list[str]:
    """Flatten cattrs' nested validation errors into 'dotted.path: message' lines."""
    def describe(error: BaseException, type_: Any) -> str:
        if isinstance(error, ValueError) and error.args and isinstance(error.args[0], str):
            return error.args[0]  # attrs' and our validators name the field and the choices
        return cattrs.v.format_exception(error, type_)

    lines = cattrs.transform_error(exc, path="config", format_exception=describe)
    lines = [line.replace(" @ config.", " @ ").replace(" @ config", " @ top level") for line in lines]
    # attrs' validators raise in the record's __init__, so cattrs locates them at the record; they
    # name the field first ("'mode' must be in ..."): move it into the path (@ rollout.mode)
    return [re.sub(r"^'(\w+)' (.*) @ (top level|[\w.]+)$",
                   lambda m: f"{m[2]} @ {m[1] if m[3] == 'top level' else m[3] + '.' + m[1]}", line) for line in lines]


# Keys renamed for one word per concept (docs/architecture.md, "Glossary"): the old key still
# loads, with a DeprecationWarning naming the new one.
RENAMED_KEYS = {"algo.gigpo_mode": "algo.gigpo_norm", "rollout.proxy.tracker_mode": "rollout.proxy.granularity"}


def _rename_old_keys(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each old key of `RENAMED_KEYS` moved to its new name (both given: an error).

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     _rename_old_keys({"algo": {"gigpo_mode": "mean_std_norm", "gamma": 0.5}})
    {'algo': {'gamma': 0.5, 'gigpo_norm': 'mean_std_norm'}}
    """
    data = copy.deepcopy(data)
    for old, new in RENAMED_KEYS.items():
        *sections, old_key = old.split(".")
        new_key = new.rsplit(".", 1)[1]
        node: Any = data
        for section in sections:
            node = node.get(section) if isinstance(node, dict) else None
        if not isinstance(node, dict) or old_key not in node:
            continue
        if new_key in node:
            raise ConfigError(f"invalid config: {old} is the old name of {new}; give only {new}")
        warnings.warn(f"config key {old} is renamed {new}", DeprecationWarning, stacklevel=3)
        node[new_key] = node.pop(old_key)
    return data


def structure(data: dict[str, Any]) -> TrainConfig:
    """Dict -> TrainConfig with errors that name the field (an old key of `RENAMED_KEYS` loads too)."""
    data = _rename_old_keys(data)
    try:
        return _converter.structure(data, TrainConfig)
    except (cattrs.ClassValidationError, cattrs.ForbiddenExtraKeysError, ValueError, TypeError) as exc:
        lines = _path_of(exc) if isinstance(exc, cattrs.BaseValidationError) else [str(exc)]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None


def unstructure(config: TrainConfig) -> dict[str, Any]:
    return _converter.unstructure(config)


def to_yaml(config: TrainConfig) -> str:
    """``config`` as YAML, every field in declaration order: what ``arl train --print-config``
    prints and a run directory's config.yaml holds; `load_config` reads it back to an equal config."""
    return yaml.safe_dump(unstructure(config), sort_keys=False)


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (values parsed as YAML: 1e-4, true, [1, 2], null)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
        if key in RENAMED_KEYS:
            warnings.warn(f"config key {key} is renamed {RENAMED_KEYS[key]}", DeprecationWarning, stacklevel=2)
            key = RENAMED_KEYS[key]
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(raw) if raw else ""
    return data


CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # the packaged experiments (package data)
DEMO_CONFIG = CONFIG_DIR / "tiny_frozenlake_gigpo.yaml"  # `make demo` = `arl demo` (README)


def packaged_configs() -> list[str]:
    """Names of the configs shipped inside the package (`arl train NAME` runs one from any directory)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _packaged_config(name: str) -> Path | None:
    """The packaged config a bare name (no directory part) names, else None."""
    if "/" in name or "\\" in name:  # a path, never looked up among the packaged names
        return None
    packaged = CONFIG_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")
    return packaged if packaged.is_file() else None


def resolve_config_path(name_or_path: str | Path) -> Path:
    """An existing file path wins; else a packaged config by name (`tiny_frozenlake_gigpo[.yaml]`)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = str(name_or_path)
    packaged = _packaged_config(name)
    if packaged is not None:
        return packaged
    raise ConfigError(f"no config {name!r}: not a file, and not a packaged config "
                      f"(packaged: {', '.join(packaged_configs()) or 'none'})")


def read_config_data(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping the config file at ``path`` describes: its YAML merged over its ``base:``.

    A top-level ``base: OTHER`` (a string) names the config this one changes. OTHER is a path
    relative to the directory of the file that names it (``tiny_frozenlake_gigpo.yaml``,
    ``../shared/a.yaml``, or absolute) or, when no such file exists, a packaged config's name as
    `resolve_config_path` takes it (``tiny_frozenlake_gigpo`` or ``tiny_frozenlake_gigpo.yaml``);
    the working directory plays no part. The base is read by this same function (so it may name
    a base of its own: chains), then the file is merged over it, for every key k:

        merged[k] = merge(base[k], file[k])    both values are mappings: the same rule, key by key
        merged[k] = file[k]                    k in the file, otherwise (scalar, list, null)
        merged[k] = base[k]                    k only in the base

    Edge cases: a list replaces the base's whole (no concatenation); ``null`` replaces too (it
    neither deletes the key nor restores the field's default: write the default's value); a key
    of a base's mapping cannot be removed (``runner_kwargs: {}`` keeps the base's entries); a
    mapping replaces a base's scalar and a scalar a base's mapping. ``base`` itself is dropped
    (it never reaches `structure`); ``name`` merges like any key, so a config that does not give
    its own runs under its base's name. A file met again on the way down raises ConfigError
    listing the cycle's files; a base that is neither a file nor a packaged name raises
    ConfigError naming the file that asked for it and the base as written.

    Example: b.yaml ``{base: a.yaml, name: b, algo: {kl_coef: 2.0}, engine:
    {kv_cache_memory_bytes: null}, lora: {target_modules: [q_proj]}}`` over a.yaml ``{name: a,
    steps: 200, algo: {gamma: 0.5, kl_coef: 0.5}, engine: {kv_cache_memory_bytes: 268435456},
    lora: {rank: 8, target_modules: [q_proj, v_proj]}}`` reads as ``{name: b, steps: 200, algo:
    {gamma: 0.5, kl_coef: 2.0}, engine: {kv_cache_memory_bytes: null}, lora: {rank: 8,
    target_modules: [q_proj]}}``.
    """
    path, here = Path(path), Path(path).resolve()
    if here in _chain:
        cycle = [*_chain[_chain.index(here):], here]
        raise ConfigError("configs name each other as base: " + " -> ".join(str(p) for p in cycle))
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping at the top level")
    data = _rename_old_keys(data or {})  # per file, so an old key in a base meets a new one in its child
    if "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"config {path}: base must name a config (a path or a packaged name), not {base!r}")
    beside = path.parent / Path(base).expanduser()
    base_path = beside if beside.is_file() else _packaged_config(base)
    if base_path is None:
        raise ConfigError(f"config {path}: its base {base!r} is neither a file ({beside}) nor a packaged config")

    def merge(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        return {**under, **{k: merge(under[k], v) if isinstance(v, dict) and isinstance(under.get(k), dict) else v
                            for k, v in over.items()}}

    return merge(read_config_data(base_path, (*_chain, here)), data)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """YAML file (optional; `read_config_data`: with its ``base:`` merged in) + dotted overrides
    -> validated TrainConfig."""
    data = read_config_data(resolve_config_path(path)) if path is not None else {}
    config = structure(apply_overrides(data, overrides))
    if config.engine.backend not in BACKENDS:  # pragma: no cover - validated by EngineConfig
        raise ConfigError(f"engine.backend must be one of {BACKENDS}")
    return config


def __getattr__(name: str) -> Any:
    if name == "TrackerMode":  # renamed for one word per concept (docs/architecture.md, "Glossary")
        warnings.warn("arl.config.TrackerMode is renamed Granularity", DeprecationWarning, stacklevel=2)
        return Granularity
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
