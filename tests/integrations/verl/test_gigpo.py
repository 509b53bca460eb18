"""GiGPO on a verl batch (built by verl's real post-processing) equals arl.algo's GiGPO on the
same episodes; arl's GRPO as a registered verl estimator; the arl_sync trainer mode registers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arl.algo.advantages import gigpo, grpo
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.envs.game import state_hash
from arl.integrations.verl.gigpo import row_fields, token_advantages
from arl.rollout.base import EpisodeSpec
from arl.rollout.traj import TrajEnvManager

ROLLOUT = {"mode": "traj", "manager": {"max_tokens": 24, "max_turns": 5}}
GROUPS = {"u0": 3, "u1": 4}  # uid -> seed; three sessions each


async def _batch(make_loop, verl_worker, engine):
    """Rows of two groups x three sessions through verl's _agent_loop_postprocess/_postprocess."""
    internals, uids, sessions = [], [], []
    for uid, seed in GROUPS.items():
        for session in range(3):
            loop, _ = make_loop(engine, ROLLOUT)
            r = {"extra_info": {"env_id": "arl/FrozenLake-v0", "seed": seed}, "uid": uid, "session_id": session,
                 "raw_prompt": [{"role": "user", "content": "play"}]}
            out = await loop.run({"temperature": 1.0}, **r)
            internals.append(await verl_worker._agent_loop_postprocess(out, validate=False, **r))
            uids.append(uid)
            sessions.append(session)
    batch = verl_worker._postprocess(internals, input_non_tensor_batch={"uid": np.array(uids, dtype=object)})
    return batch, uids, sessions


async def _arl_turns(engine, uids, sessions):
    """The same episodes replayed by arl's own TrajEnvManager: one step-row per turn."""
    rows = {k: [] for k in ("score", "reward", "group", "traj", "step", "state", "valid")}
    for uid, session in zip(uids, sessions, strict=True):
        spec = EpisodeSpec(env_id="arl/FrozenLake-v0", seed=GROUPS[uid], group_id=uid, episode_id=session)
        manager = TrajEnvManager(engine, ManagerConfig(max_tokens=24, max_turns=5, sampling_seed=None))
        episode = await manager.run_episode(spec)
        for t, turn in enumerate(episode.trajectory.turns):
            rows["score"].append(episode.trajectory.episode_score)
            rows["reward"].append(turn.reward)
            rows["group"].append(uid)
            rows["traj"].append(f"{uid}/{session}")
            rows["step"].append(t)
            rows["state"].append(state_hash(turn.observation))
            rows["valid"].append(turn.action_valid)
    return rows


@pytest.mark.anyio
@pytest.mark.parametrize("options", [{}, {"norm": "mean_std_norm", "invalid_penalty": 0.1},
                                     {"episode_stats": "steps", "singleton": "raw", "gamma": 0.9}])
async def test_token_advantages_equal_arl_gigpo(make_loop, verl_worker, tiny_tokenizer, options):
    engine = ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=7)
    batch, uids, sessions = await _batch(make_loop, verl_worker, engine)
    mask = batch.batch["response_mask"]
    fields = row_fields(batch.non_tensor_batch, len(uids))
    adv, stats = token_advantages(mask, fields, list(batch.non_tensor_batch["uid"]), **options)

    rows = await _arl_turns(engine, uids, sessions)
    want, want_stats = gigpo(rows["score"], rows["reward"], rows["group"], rows["traj"], rows["step"], rows["state"],
                             action_valid=rows["valid"], **options)
    assert stats == pytest.approx(want_stats)
    expected = torch.zeros_like(adv)
    k = 0
    for i, f in enumerate(fields):
        for start, end in f["arl_turn_spans"]:
            expected[i, start:end] = float(want[k])
            k += 1
    assert k == len(want) > len(uids)  # multi-turn episodes
    torch.testing.assert_close(adv, expected * mask)
    assert torch.all(adv[mask == 0] == 0)
    assert adv.abs().sum() > 0  # the batch carries signal (invalid replies and different outcomes)


STEP = {"mode": "step", "manager": {"max_tokens": 8, "max_turns": 6, "history_len": 0, "prompt_style": "compact"}}


@pytest.mark.anyio
@pytest.mark.parametrize("options", [{"gamma": 0.5, "step_weight": 10.0, "norm": "mean_norm", "invalid_penalty": 0.0,
                                      "episode_stats": "episodes", "singleton": "zero"},
                                     {"gamma": 0.95, "step_weight": 1.0, "norm": "mean_norm", "invalid_penalty": 0.1,
                                      "episode_stats": "steps", "singleton": "raw"}])
async def test_step_rows_equal_arls_trainer_on_step_samples(make_loop, tiny_tokenizer, options):
    """Step mode's verl rows (one per turn, a trajectory per session) get, token for token, the
    advantage arl's own trainer gives the same episodes' step samples (`arl.algo.estimators`, the
    demo's settings and verl-agent's): the discount runs across an episode's rows."""
    import types

    from arl.algo.estimators import estimate
    from arl.rollout.step import StepEnvManager

    rows, uids, trajs, samples = [], [], [], []
    for uid, seed in GROUPS.items():
        for session in range(3):
            r = {"extra_info": {"env_id": "arl/FrozenLake-v0", "seed": seed}, "uid": uid, "session_id": session,
                 "raw_prompt": [{"role": "user", "content": "play"}]}
            loop, _ = make_loop(ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=20 + session), STEP)
            outs = await loop.run({"temperature": 1.0}, **r)
            rows += outs
            uids += [uid] * len(outs)
            trajs += [f"{uid}_{session}"] * len(outs)
            manager = StepEnvManager(ScriptedEngine(tiny_tokenizer, invalid_rate=0.3, seed=20 + session),
                                     ManagerConfig(**STEP["manager"], sampling_seed=None))
            episode = await manager.run_episode(EpisodeSpec(env_id="arl/FrozenLake-v0", seed=seed, group_id=uid,
                                                            episode_id=session))
            samples += episode.samples
    assert len(rows) == len(samples) > 2 * len(GROUPS) * 3
    width = max(len(o.response_ids) for o in rows)
    mask = torch.tensor([o.response_mask + [0] * (width - len(o.response_mask)) for o in rows])
    adv, _ = token_advantages(mask, [o.extra_fields for o in rows], uids, trajs, **options)

    settings = types.SimpleNamespace(gigpo_norm=options["norm"], **{k: v for k, v in options.items() if k != "norm"})
    want, _ = estimate("gigpo", samples, settings)
    assert np.abs(want).sum() > 0 and len({round(float(a), 6) for a in want}) > 2
    torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float32)[:, None] * mask.float())


def test_row_fields_reads_both_layouts():
    one = {"arl_turn_spans": [[0, 2]], "arl_state_keys": ["s"], "arl_step_rewards": [1.0],
           "arl_action_valid": [True], "arl_episode_score": 1.0}
    v1 = {"extra_fields": np.array([one], dtype=object)}
    legacy = {k: np.empty(1, dtype=object) for k in one}  # one object column per key
    for k, v in one.items():
        legacy[k][0] = v
    assert row_fields(v1, 1) == [one] == row_fields(legacy, 1)
    with pytest.raises(KeyError, match="ArlAgentLoop"):
        row_fields({"uid": np.array(["u"])}, 1)


def test_arl_grpo_is_a_registered_verl_estimator():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from arl.integrations.verl.gigpo import register_estimators

    register_estimators()
    register_estimators()  # idempotent
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.float32)
    rewards = torch.zeros(4, 3)
    rewards[torch.arange(4), mask.sum(1).long() - 1] = torch.tensor([1.0, 0.0, 0.0, 5.0])
    uid = np.array(["a", "a", "a", "b"], dtype=object)
    adv, ret = get_adv_estimator_fn("arl_grpo")(token_level_rewards=rewards, response_mask=mask, config=None, index=uid)
    want = grpo([1.0, 0.0, 0.0, 5.0], list(uid))  # the singleton "b" gets 0 (verl's grpo: 5 / 1)
    torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float32)[:, None] * mask)
    with pytest.raises(RuntimeError, match="arl_sync"):
        get_adv_estimator_fn("arl_gigpo")(token_level_rewards=rewards, response_mask=mask, index=uid)


def test_setup_hook_registers_the_trainer_mode():
    pytest.importorskip("transfer_queue")
    from verl.trainer.ppo.v1 import get_trainer_cls

    from arl.integrations.verl import setup_verl
    from arl.integrations.verl.trainer import ArlPPOTrainerSync

    setup_verl()
    setup_verl()
    assert get_trainer_cls("arl_sync") is ArlPPOTrainerSync


def test_gigpo_defaults_are_verl_agents():
    """verl-agent's GiGPO (the paper's code): gamma 0.95, step weight 1, mean_norm, episode
    statistics over step rows, raw singletons, invalid-action penalty 0.1; overridable."""
    from omegaconf import OmegaConf

    from arl.integrations.verl.gigpo import gigpo_options

    want = {"gamma": 0.95, "step_weight": 1.0, "norm": "mean_norm", "episode_stats": "steps",
            "singleton": "raw", "invalid_penalty": 0.1}
    assert gigpo_options(None) == want
    assert gigpo_options(OmegaConf.create({"singleton": "zero"})) == {**want, "singleton": "zero"}
    # verl-agent's name of the norm (algorithm.gigpo.mode), and this block's before: taken as norm
    assert gigpo_options(OmegaConf.create({"mode": "mean_std_norm"})) == {**want, "norm": "mean_std_norm"}
    with pytest.raises(ValueError, match="give only norm"):
        gigpo_options({"mode": "mean_std_norm", "norm": "mean_norm"})
