"""ArlAgentLoop: one arl episode as one verl agent-loop trajectory.

verl (0.9.x, `verl/experimental/agent_loop`) instantiates an agent loop per dataset row and
awaits ``run(sampling_params, **row) -> AgentLoopOutput``. This loop plays the row's episode with
arl's own env managers (nothing copied): ``mode: traj`` is TrajEnvManager (token-exact multi-turn
prompts), ``mode: proxy`` is ProxyEnvManager running any `AgentRunner` through the MessageTracker
(its OpenAI-compatible client is served by the episode's ChatHandler). Both talk to verl's
``server_manager`` through `ServerEngine`, under one request id per episode (sticky routing, the
server's prefix cache reused across turns).

The output is verl's own `AgentLoopOutput`: ``prompt_ids`` = the first turn's prompt,
``response_ids`` = everything after it (generated tokens, masked end-of-turn and bridge tokens),
``response_mask`` 1 exactly on generated tokens, ``response_logprobs`` the engine's log-probs
there (0 elsewhere), ``reward_score`` the episode score, and in ``extra_fields`` what GiGPO needs
per turn (`TURN_FIELDS`): each turn's token span in response coordinates, its state key, step
reward, action validity, plus the episode's success, status and exit reason. verl copies
``extra_fields`` into the batch (legacy trainer: one ``non_tensor_batch`` column per key; the v1
trainer: the row's ``extra_fields`` dict), where `arl.integrations.verl.gigpo` reads them.

Configured from the agent-loop YAML (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: arl_sokoban
      _target_: arl.integrations.verl.agent_loop.ArlAgentLoop
      rollout:              # arl's RolloutConfig fields (mode, manager, proxy); env comes per row
        mode: traj
        manager: {max_tokens: 100, max_turns: 10}

Rows come from `arl.integrations.verl.dataset` (``extra_info``: env_id, seed, tag). Sampling
temperature / top-p / top-k are verl's (``sampling_params``; greedy for validation); arl sets
max_tokens and the end-of-turn stop token. Per-request seeds are off unless
``manager.sampling_seed`` is set: verl's rows are resampled every epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from arl.integrations.verl.engine import ServerEngine
from arl.intercept.template import chat_ids
from arl.rollout.base import Episode, EpisodeSpec, state_hash
from arl.rollout.factory import RolloutConfig, close_manager, make_manager
from arl.rollout.records import Turn

try:  # verl is an optional extra: arl[verl]
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("arl.integrations.verl needs verl: pip install 'arl[verl]'") from exc

logger = logging.getLogger(__name__)

# extra_fields keys this loop writes, one entry per turn (spans are [start, end) response indices)
TURN_FIELDS = ("arl_turn_spans", "arl_state_keys", "arl_step_rewards", "arl_action_valid")

_converter = cattrs.Converter(forbid_extra_keys=True)


def rollout_config(data: Mapping[str, Any] | None) -> RolloutConfig:
    """arl's RolloutConfig from the loop's YAML block (a dict or an OmegaConf node).

    Differences from arl's own trainer, for verl: per-request seeds default to off, and proxy
    mode keeps one branch per episode (verl takes one trajectory row per loop) in traj tracking.
    """
    if data is not None and hasattr(data, "_metadata"):  # an OmegaConf DictConfig from hydra
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(data, resolve=True)
    data = {"mode": "traj", **dict(data or {})}  # arl's own default (step) does not apply here
    manager = dict(data.pop("manager", None) or {})
    manager.setdefault("sampling_seed", None)
    proxy = {"tracker_mode": "traj", "keep_branches": "longest", **dict(data.pop("proxy", None) or {})}
    config = _converter.structure({**data, "manager": manager, "proxy": proxy}, RolloutConfig)
    if config.mode == "step":
        raise ValueError("ArlAgentLoop plays whole episodes: rollout.mode must be traj or proxy")
    if config.mode == "proxy" and (config.proxy.tracker_mode, config.proxy.keep_branches) != ("traj", "longest"):
        raise ValueError("ArlAgentLoop returns one trajectory row: proxy.tracker_mode=traj, keep_branches=longest")
    return config


def episode_spec(row: Mapping[str, Any]) -> EpisodeSpec:
    """The episode a dataset row names: ``extra_info`` {env_id, seed, tag}; the group is verl's
    prompt ``uid`` (shared by the n sessions of one row), the member its ``session_id``."""
    info = dict(row.get("extra_info") or {})
    seed = int(info["seed"])
    tag = str(info.get("tag", "train"))
    group = row.get("uid") or f"{tag}_{info.get('index', row.get('index', 0))}_{seed}"
    return EpisodeSpec(env_id=str(info["env_id"]), seed=seed, group_id=str(group),
                       episode_id=int(row.get("session_id", 0)), tag=tag)


@register("arl_agent")
class ArlAgentLoop(AgentLoopBase):
    """Plays one arl episode per verl row (see the module docstring)."""

    def __init__(self, *args: Any, rollout: Mapping[str, Any] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.arl_rollout = rollout_config(rollout)
        self.response_length = int(self.rollout_config.response_length)
        self.max_model_len = int(self.rollout_config.prompt_length) + self.response_length

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        spec = episode_spec(row)
        top_k = int(sampling_params.get("top_k", -1) or -1)
        manager_config = attrs.evolve(
            self.arl_rollout.manager,
            temperature=float(sampling_params.get("temperature", self.arl_rollout.manager.temperature)),
            top_p=float(sampling_params.get("top_p", self.arl_rollout.manager.top_p)),
            top_k=max(top_k, 0),
            max_model_len=self.arl_rollout.manager.max_model_len or self.max_model_len,
        )
        engine = ServerEngine(self.server_manager, self.tokenizer, max_model_len=manager_config.max_model_len,
                              base_params=sampling_params)
        manager = make_manager(engine, self.arl_rollout, manager_config)
        try:
            episode = await manager.run_episode(spec)
        finally:
            await close_manager(manager)
        fallback = chat_ids(self.tokenizer, list(row["raw_prompt"])) if "raw_prompt" in row else None
        return episode_output(episode, response_length=self.response_length, fallback_prompt=fallback)


def episode_output(
    episode: Episode, *, response_length: int, fallback_prompt: list[int] | None = None
) -> AgentLoopOutput:
    """verl's AgentLoopOutput of an arl trajectory-mode episode (one sample).

    A response longer than ``response_length`` is cut there (verl pads to that width); turns
    past the cut lose their span (``arl_cut_tokens`` counts the dropped tokens). An episode that
    produced no sample (it failed before its first model call) returns the row's own prompt and
    an empty response: it carries no loss.
    """
    traj = episode.trajectory
    # verl's timing metrics: model calls, and env steps in the slot verl calls tool time
    metrics = AgentLoopMetrics(generate_sequences=traj.timings.get("generate", 0.0),
                               tool_calls=traj.timings.get("env", 0.0))
    fields: dict[str, Any] = {
        "arl_success": bool(traj.success), "arl_episode_score": float(traj.episode_score),
        "arl_status": traj.status, "arl_exit_reason": traj.exit_reason, "arl_error": traj.error,
        "arl_env_id": traj.env_id, "arl_seed": int(traj.seed), "arl_cut_tokens": 0,
        "tool_rewards": [],  # verl's stable schema keys
    }
    if not episode.samples:
        fields.update({key: [] for key in TURN_FIELDS}, turn_scores=[])
        prompt = fallback_prompt or []
        return AgentLoopOutput(prompt_ids=prompt, response_ids=[], response_mask=[], response_logprobs=[],
                               reward_score=float(traj.episode_score), num_turns=0,
                               metrics=metrics, extra_fields=fields)
    if len(episode.samples) != 1:
        raise ValueError(f"a trajectory-mode episode has one sample, got {len(episode.samples)}")
    sample = episode.samples[0]
    turns = _sample_turns(episode)
    prompt_len = len(turns[0].prompt_ids)
    response = list(sample.input_ids[prompt_len:])
    mask = list(sample.response_mask[prompt_len:])
    logprobs = [float(x) for x in sample.old_logprobs[prompt_len:]]
    if any(sample.response_mask[:prompt_len]):
        raise AssertionError("the first prompt of an episode holds no generated token")

    spans, keys, rewards, valid = [], [], [], []
    for turn in turns:
        if list(sample.input_ids[: len(turn.prompt_ids)]) != list(turn.prompt_ids):
            raise AssertionError("a turn's prompt is not a prefix of the episode's tokens")
        start = len(turn.prompt_ids) - prompt_len
        end = min(start + len(turn.response_ids), response_length)
        if start >= response_length:
            break  # cut off (see the docstring)
        spans.append([start, end])
        keys.append(turn.state_hash or state_hash(turn.observation))
        rewards.append(float(turn.reward))
        valid.append(bool(turn.action_valid))
    fields["arl_cut_tokens"] = max(0, len(response) - response_length)
    if fields["arl_cut_tokens"]:
        logger.warning("episode %s: response of %d tokens cut to rollout.response_length=%d",
                       traj.traj_id, len(response), response_length)
    fields.update(arl_turn_spans=spans, arl_state_keys=keys, arl_step_rewards=rewards, arl_action_valid=valid,
                  turn_scores=rewards)
    return AgentLoopOutput(
        prompt_ids=list(sample.input_ids[:prompt_len]),
        response_ids=response[:response_length],
        response_mask=mask[:response_length],
        response_logprobs=logprobs[:response_length],
        reward_score=float(traj.episode_score),
        num_turns=2 * len(turns),  # a user and an assistant message per turn
        metrics=metrics,
        extra_fields=fields,
    )


def _sample_turns(episode: Episode) -> list[Turn]:
    """The turns the sample holds: all of them (traj), or its branch's requests (proxy)."""
    traj, sample = episode.trajectory, episode.samples[0]
    requests = sample.info.get("requests")
    return [traj.turns[i] for i in requests] if requests is not None else list(traj.turns)
