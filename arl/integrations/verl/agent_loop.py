"""ArlAgentLoop: one arl episode as one verl agent-loop trajectory.

verl (0.9.x, `verl/experimental/agent_loop`) instantiates an agent loop per dataset row and
awaits ``run(sampling_params, **row) -> AgentLoopOutput | list[AgentLoopOutput]``. This loop plays
the row's episode with arl's own env managers (nothing copied): ``mode: traj`` is TrajEnvManager
(token-exact multi-turn prompts), ``mode: step`` is StepEnvManager (a fresh prompt per turn: the
board and, with ``history_len``, the last few moves), ``mode: proxy`` is ProxyEnvManager running any
`AgentRunner` through the MessageTracker (its OpenAI-compatible client is served by the episode's
ChatHandler). All talk to verl's ``server_manager`` through `ServerEngine`, under one request id
per episode (sticky routing, the server's prefix cache reused across turns).

Step mode returns one output per turn (`step_outputs`), as verl-agent builds GiGPO's step rows:
verl's v1 worker stores a list as rows ``{uid}_{session}_{index}`` (`verl.trainer.ppo.v1.
agent_loop_tq`), and its metrics read the last row of each session. Each row's ``extra_fields``
hold its one turn, and ``arl_turn_steps`` its index in the episode, so GiGPO discounts across the
episode's rows. The legacy (non-TransferQueue) worker takes one output per row: step mode needs
``trainer.use_v1=true``.

In traj and proxy mode the output is verl's own `AgentLoopOutput`: ``prompt_ids`` = the first turn's prompt,
``response_ids`` = everything after it (generated tokens, masked end-of-turn and bridge tokens),
``response_mask`` 1 exactly on generated tokens, ``response_logprobs`` the engine's log-probs
there (0 elsewhere), ``reward_score`` the episode score, and in ``extra_fields`` what GiGPO needs
per turn (`TURN_FIELDS`, and ``arl_turn_steps``): each turn's token span in response coordinates, its state key (the
hash of the game's ``state_key()``, as arl's step manager takes it; ``arl_state_key_sources``
names any fallback), step reward, action validity, plus the episode's success, status and exit
reason. verl copies ``extra_fields`` into the batch (legacy trainer: one ``non_tensor_batch``
column per key; the v1 trainer: the row's ``extra_fields`` dict), where
`arl.integrations.verl.gigpo` reads them.

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

Registration: verl's registry maps a name to a hydra config. The YAML entry is the real one (it
carries ``rollout``); this module registers a bare ``arl_agent`` (arl's defaults) only where no
entry of that name exists, because verl loads the YAML first and imports this module on the
first ``instantiate``: an unconditional ``@register("arl_agent")`` would replace the configured
entry for every later episode.

Episodes that ended abnormally (engine/env/agent error, max_length, timeout: arl's
``NORMAL_EXITS`` complement) get an all-zero ``response_mask`` when ``rollout.mask_abnormal``
(default on, as in arl's trainer): no loss, no advantage, for every verl estimator; they still
count in their group's statistics, as in arl's `collate(mask_abnormal=True)`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from arl.config import RolloutConfig
from arl.envs.game import state_hash
from arl.integrations.verl.engine import ServerEngine
from arl.intercept.template import chat_ids
from arl.rollout.base import Episode, EpisodeSpec
from arl.rollout.factory import close_manager, make_manager
from arl.rollout.records import Turn

try:  # verl is an optional extra: arl[verl]
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        _agent_loop_registry,
        register,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("arl.integrations.verl needs verl: pip install 'arl[verl]'") from exc

logger = logging.getLogger(__name__)

# extra_fields keys this loop writes, one entry per turn (spans are [start, end) response indices),
# that `arl.integrations.verl.gigpo` needs; beside them, ``arl_state_key_sources`` says per turn
# where its state key came from ("game": the game's state_key(); else a text-hash fallback)
TURN_FIELDS = ("arl_turn_spans", "arl_state_keys", "arl_step_rewards", "arl_action_valid")
# ... and each turn's index in its episode (GiGPO's step t): the row's own turns 0..n-1 in traj and
# proxy mode, the one turn a step row holds in step mode. A row without it counts from 0.
TURN_STEPS = "arl_turn_steps"

_converter = cattrs.Converter(forbid_extra_keys=True)


def rollout_config(data: Mapping[str, Any] | None) -> RolloutConfig:
    """arl's RolloutConfig from the loop's YAML block (a dict or an OmegaConf node).

    Differences from arl's own trainer, for verl: per-request seeds default to off, and proxy
    mode keeps one branch per episode (verl takes one trajectory row per loop) in traj tracking.
    Step mode is arl's StepEnvManager, one verl row per turn (module docstring).
    """
    if data is not None and hasattr(data, "_metadata"):  # an OmegaConf DictConfig from hydra
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(data, resolve=True)
    data = {"mode": "traj", **dict(data or {})}  # arl's own default (step) does not apply here
    manager = dict(data.pop("manager", None) or {})
    manager.setdefault("sampling_seed", None)
    proxy = {"granularity": "traj", "keep_branches": "longest", **dict(data.pop("proxy", None) or {})}
    config = _converter.structure({**data, "manager": manager, "proxy": proxy}, RolloutConfig)
    if config.mode == "step" and config.manager.fork.k:
        # a forked action is a row of no episode's turns, and its group is no verl uid
        raise ValueError("ArlAgentLoop's step mode plays each episode's own turns: rollout.manager.fork is not supported")
    if config.mode == "proxy" and (config.proxy.granularity, config.proxy.keep_branches) != ("traj", "longest"):
        raise ValueError("ArlAgentLoop returns one trajectory row: proxy.granularity=traj, keep_branches=longest")
    return config


def episode_spec(row: Mapping[str, Any]) -> EpisodeSpec:
    """The episode a dataset row names: ``extra_info`` {env_id, seed, tag}; the group is verl's
    prompt ``uid`` (shared by the n sessions of one row), the member its `member_id`."""
    info = dict(row.get("extra_info") or {})
    seed = int(info["seed"])
    tag = str(info.get("tag", "train"))
    group = row.get("uid") or f"{tag}_{info.get('index', row.get('index', 0))}_{seed}"
    return EpisodeSpec(env_id=str(info["env_id"]), seed=seed, group_id=str(group),
                       episode_id=member_id(row), tag=tag)


def member_id(row: Mapping[str, Any]) -> int:
    """The session's id inside its group; per-request seeds and trajectory ids hash it.

    v1 (TransferQueue) worker: ``session_id`` (0..n-1). The legacy worker repeats each row n times
    and passes no session id, only ``priority``, the row's position in the step's batch
    (`AgentLoopManager.generate_sequences`): distinct per session and reproducible. A row with
    neither gets a random id: its sessions still sample apart, but not reproducibly.
    """
    for key in ("session_id", "priority"):
        if row.get(key) is not None:
            return int(row[key])
    return uuid.uuid4().int % (2**31)


class ArlAgentLoop(AgentLoopBase):
    """Plays one arl episode per verl row (see the module docstring)."""

    def __init__(self, *args: Any, rollout: Mapping[str, Any] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.arl_rollout = rollout_config(rollout)
        self.response_length = int(self.rollout_config.response_length)
        self.max_model_len = int(self.rollout_config.prompt_length) + self.response_length

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        if self.arl_rollout.mode == "step" and row.get("session_id") is None:
            # the legacy worker passes no session id, and takes one output per row: it would fail on the list
            raise ValueError("ArlAgentLoop's step mode returns a row per turn, which only verl's v1 worker "
                             "(TransferQueue) takes: set trainer.use_v1=true")
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
        versions = (engine.min_global_steps, engine.max_global_steps)
        if None in versions:
            # No model call returned: no weights made these tokens. Report the version in effect
            # when the row was sampled (verl's sync trainer generates step t with version t-1),
            # so verl's staleness metrics read 0 instead of failing on None.
            current = max(int(row.get("global_steps", 1)) - 1, 0)
            versions = (current, current)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        to_output = step_outputs if self.arl_rollout.mode == "step" else episode_output
        return to_output(episode, response_length=self.response_length, fallback_prompt=fallback,
                         global_steps=versions, mask_abnormal=self.arl_rollout.mask_abnormal,
                         filler_token=int(pad or 0))


def episode_output(
    episode: Episode, *, response_length: int, fallback_prompt: list[int] | None = None,
    global_steps: tuple[int, int] = (0, 0), mask_abnormal: bool = True, filler_token: int = 0,
) -> AgentLoopOutput:
    """verl's AgentLoopOutput of an arl trajectory-mode episode (one sample).

    A response longer than ``response_length`` is cut there (verl pads to that width); turns
    past the cut lose their span (``arl_cut_tokens`` counts the dropped tokens). An episode that
    produced no sample (it failed before its first model call) returns the row's own prompt and
    a one-token response (``filler_token``, mask 0): it carries no loss, and verl's v1 worker needs
    a response to put the reward on (`AgentLoopOutput.as_dict`: ``rm_scores[-1]``). ``global_steps`` = (min, max) weight version of the
    episode's tokens, verl's ``min_global_steps`` / ``max_global_steps`` (its v1 trainer's tags and
    off-policy metrics read them). With ``mask_abnormal`` an abnormally ended episode keeps its
    tokens and turns but gets an all-zero ``response_mask`` (``arl_masked``).
    """
    traj = episode.trajectory
    metrics = _loop_metrics(episode)
    masked = bool(mask_abnormal and not traj.ok)
    fields = _episode_fields(episode, global_steps, masked)
    if not episode.samples:
        return _no_sample_output(episode, fields, metrics, fallback_prompt, filler_token)
    if len(episode.samples) != 1:
        raise ValueError(f"a trajectory-mode episode has one sample, got {len(episode.samples)}")
    sample = episode.samples[0]
    turns = _sample_turns(episode)
    prompt_len = len(turns[0].prompt_ids)
    response = list(sample.input_ids[prompt_len:])
    mask = [0] * (len(sample.input_ids) - prompt_len) if masked else list(sample.response_mask[prompt_len:])
    logprobs = [float(x) for x in sample.old_logprobs[prompt_len:]]
    if any(sample.response_mask[:prompt_len]):
        raise AssertionError("the first prompt of an episode holds no generated token")

    spans, steps, keys, sources, rewards, valid = [], [], [], [], [], []
    for t, turn in enumerate(turns):
        if list(sample.input_ids[: len(turn.prompt_ids)]) != list(turn.prompt_ids):
            raise AssertionError("a turn's prompt is not a prefix of the episode's tokens")
        start = len(turn.prompt_ids) - prompt_len
        end = min(start + len(turn.response_ids), response_length)
        if start >= response_length:
            break  # cut off (see the docstring)
        spans.append([start, end])
        steps.append(t)
        key, source = turn_state_key(turn, f"{traj.traj_id}/{t}")
        keys.append(key)
        sources.append(source)
        rewards.append(float(turn.reward))
        valid.append(bool(turn.action_valid))
    fields["arl_cut_tokens"] = max(0, len(response) - response_length)
    if fields["arl_cut_tokens"]:
        logger.warning("episode %s: response of %d tokens cut to rollout.response_length=%d",
                       traj.traj_id, len(response), response_length)
    fields.update(arl_turn_spans=spans, arl_turn_steps=steps, arl_state_keys=keys, arl_step_rewards=rewards,
                  arl_action_valid=valid, arl_state_key_sources=sources, turn_scores=rewards)
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


def step_outputs(
    episode: Episode, *, response_length: int, fallback_prompt: list[int] | None = None,
    global_steps: tuple[int, int] = (0, 0), mask_abnormal: bool = True, filler_token: int = 0,
) -> list[AgentLoopOutput]:
    """verl's AgentLoopOutputs of an arl step-mode episode: one row per turn, in order.

    Row t: ``prompt_ids`` = turn t's own prompt, ``response_ids`` its reply (cut at
    ``response_length``), ``response_mask`` / ``response_logprobs`` the step sample's, and one
    turn in ``extra_fields``: span [0, reply length), ``arl_turn_steps`` [t], its state key, step
    reward and validity. Every row carries the episode's fields (score, success, status) and
    reward. An episode with no sample gives one filler row, as `episode_output` does.
    """
    traj = episode.trajectory
    masked = bool(mask_abnormal and not traj.ok)
    if not episode.samples:
        fields = _episode_fields(episode, global_steps, masked)
        return [_no_sample_output(episode, fields, _loop_metrics(episode), fallback_prompt, filler_token)]
    outputs = []
    for sample in episode.samples:
        turn = traj.turns[sample.step]
        prompt_len = len(turn.prompt_ids)
        if list(sample.input_ids[:prompt_len]) != list(turn.prompt_ids) or any(sample.response_mask[:prompt_len]):
            raise AssertionError(f"step sample {sample.step} does not begin with its turn's prompt")
        response = list(sample.input_ids[prompt_len:])
        mask = [0] * len(response) if masked else list(sample.response_mask[prompt_len:])
        fields = _episode_fields(episode, global_steps, masked)
        key, source = turn_state_key(turn, f"{traj.traj_id}/{sample.step}")
        fields.update(arl_turn_spans=[[0, min(len(response), response_length)]], arl_turn_steps=[sample.step],
                      arl_state_keys=[key], arl_step_rewards=[float(turn.reward)],
                      arl_action_valid=[bool(turn.action_valid)], arl_state_key_sources=[source],
                      turn_scores=[float(turn.reward)], arl_cut_tokens=max(0, len(response) - response_length),
                      # verl's v1 worker copies the last row's reward_extra_info to the others when the loop
                      # scored the episode itself (its reward workers write it otherwise): it must exist
                      reward_extra_info={})
        outputs.append(AgentLoopOutput(
            prompt_ids=list(turn.prompt_ids),
            response_ids=response[:response_length],
            response_mask=mask[:response_length],
            response_logprobs=[float(x) for x in sample.old_logprobs[prompt_len:]][:response_length],
            reward_score=float(traj.episode_score),
            num_turns=2,  # its user and assistant message
            metrics=_loop_metrics(episode),  # the episode's timings, on each of its rows
            extra_fields=fields,
        ))
    return outputs


def _loop_metrics(episode: Episode) -> AgentLoopMetrics:
    """verl's timing metrics of an episode: model calls, and env steps in the slot verl calls tool time."""
    timings = episode.trajectory.timings
    return AgentLoopMetrics(generate_sequences=timings.get("generate", 0.0), tool_calls=timings.get("env", 0.0))


def _episode_fields(episode: Episode, global_steps: tuple[int, int], masked: bool) -> dict[str, Any]:
    """The ``extra_fields`` every row of an episode carries (its turns' fields come on top)."""
    traj = episode.trajectory
    return {
        "arl_success": bool(traj.success), "arl_episode_score": float(traj.episode_score),
        "arl_status": traj.status, "arl_exit_reason": traj.exit_reason, "arl_error": traj.error,
        "arl_env_id": traj.env_id, "arl_seed": int(traj.seed), "arl_cut_tokens": 0, "arl_masked": masked,
        "min_global_steps": int(global_steps[0]), "max_global_steps": int(global_steps[1]),
        "tool_rewards": [],  # verl's stable schema keys
    }


def _no_sample_output(episode: Episode, fields: dict[str, Any], metrics: AgentLoopMetrics,
                      fallback_prompt: list[int] | None, filler_token: int) -> AgentLoopOutput:
    """The row of an episode that failed before its first model call (`episode_output`'s docstring)."""
    fields.update({key: [] for key in (*TURN_FIELDS, TURN_STEPS)}, arl_state_key_sources=[], turn_scores=[])
    return AgentLoopOutput(prompt_ids=fallback_prompt or [], response_ids=[filler_token], response_mask=[0],
                           response_logprobs=[0.0], reward_score=float(episode.trajectory.episode_score),
                           num_turns=0, metrics=metrics, extra_fields=fields)


def turn_state_key(turn: Turn, turn_id: str) -> tuple[str, str]:
    """A turn's GiGPO anchor key and where it came from (``arl_state_keys`` / ``arl_state_key_sources``).

    The manager's key (`EnvManager.take`: the hash of the game's ``state_key()``, source "game";
    of the observation text for an env that is not an arl game, "observation"; in proxy mode as
    the runner reported it, or "message") with its ``info["state_key_source"]``. A turn without a
    key (a proxy call with no user or tool message to hash) is keyed by the hash of its
    observation text; with no observation either, its state is unknown and it gets a key of its
    own, ``"unknown:" + turn_id`` (source "none"), so that it forms its own anchor group, as a
    row without a state key does in `arl.algo.gigpo`: the hash of "" would pool every such turn
    of the batch into one group. verl's rows need a string per turn.

    >>> from arl.rollout.records import Turn
    >>> turn_state_key(Turn(observation="", prompt_ids=[], response_ids=[], response_logprobs=[]), "t0/3")
    ('unknown:t0/3', 'none')
    """
    if turn.state_key is not None:
        return turn.state_key, str(turn.info.get("state_key_source", "observation"))
    if turn.observation:
        return state_hash(turn.observation), "observation"
    return f"unknown:{turn_id}", "none"


def _sample_turns(episode: Episode) -> list[Turn]:
    """The turns the sample holds: all of them (traj), or its branch's requests (proxy)."""
    traj, sample = episode.trajectory, episode.samples[0]
    requests = sample.info.get("requests")
    return [traj.turns[i] for i in requests] if requests is not None else list(traj.turns)


# A bare default only where no entry exists: the YAML's entry of this name (loaded by verl before it
# imports this module) carries the rollout config and must survive the import (module docstring).
if "arl_agent" not in _agent_loop_registry:
    register("arl_agent")(ArlAgentLoop)
