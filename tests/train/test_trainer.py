"""The training loop end to end on the tiny model (scripted engine for exactness, vLLM for the push)."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_support import params_of, scripted, small_config, step_gradients

from arl.config import ConfigError, load_config
from arl.engine import SamplingParams
from arl.train import Trainer

pytestmark = pytest.mark.anyio


async def test_every_parameter_moves_and_metrics_are_namespaced(tmp_path):
    config = small_config(tmp_path, "algo.estimator=gigpo")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.setup()
        before = params_of(trainer.model)
        metrics = await trainer.step()
        moved = {n: not torch.equal(before[n], p) for n, p in trainer.model.named_parameters()}
    assert all(moved.values()), [n for n, m in moved.items() if not m]
    for prefix in ("rollout/", "train/", "timing/", "env/arl/FrozenLake-v0/"):
        assert any(k.startswith(prefix) for k in metrics), prefix
    assert metrics["train/skipped_updates"] == 0
    assert metrics["train/gigpo_anchor_group_size_mean"] >= 1


async def test_gigpo_in_traj_mode_credits_each_turn_on_its_own_tokens(tmp_path):
    """Trajectory samples list their turns (Sample.turns): GiGPO reads one step row per turn, so the
    group's members meet at their shared first state (an anchor group, not singletons) and each
    turn's reply tokens carry that turn's advantage; prompts and bridges carry 0. Before, a traj
    episode was one row: every anchor group a singleton and the step term 0."""
    import numpy as np

    from arl.algo import gigpo

    config = small_config(tmp_path, "algo.estimator=gigpo", "rollout.mode=traj", "rollout.manager.max_turns=4",
                          "algo.gamma=0.5", "algo.step_weight=1.0")
    seen = []
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.setup()
        update = trainer.update

        def recording(samples, advantages):
            seen.append((samples, advantages))
            return update(samples, advantages)

        trainer.update = recording
        before = params_of(trainer.model)
        metrics = await trainer.step()
        moved = any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    (samples, adv), = seen
    assert moved and metrics["train/skipped_updates"] == 0
    assert adv.shape == (len(samples), max(len(s.input_ids) for s in samples))
    assert metrics["train/gigpo_anchor_singleton_frac"] < 1  # the members' shared first state is one anchor group
    rows = [(i, t, span) for i, s in enumerate(samples) for t, span in enumerate(s.turns)]
    assert all(s.turns and len(s.turns) == s.info["num_turns"] for s in samples)
    expected, _ = gigpo([samples[i].episode_score for i, _, _ in rows], [sp.reward for *_, sp in rows],
                        [samples[i].group_id for i, _, _ in rows], [samples[i].traj_id for i, _, _ in rows],
                        [t for _, t, _ in rows], [sp.state_key for *_, sp in rows], gamma=0.5, step_weight=1.0,
                        action_valid=[sp.action_valid for *_, sp in rows])
    for (i, _, span), a in zip(rows, expected, strict=True):
        mask = np.asarray(samples[i].response_mask)
        assert mask[span.start:span.end].all()  # a turn's span is its reply
        assert np.allclose(adv[i, span.start:span.end], a)
    for i, s in enumerate(samples):  # context tokens and padding: 0
        outside = np.ones(adv.shape[1], dtype=bool)
        for span in s.turns:
            outside[span.start:span.end] = False
        assert not adv[i, outside].any()
    assert np.abs(expected).max() > 0 and metrics["train/gigpo_step_adv_abs_mean"] > 0


@pytest.mark.vllm
async def test_weight_push_makes_engine_logprobs_equal_trainer_logprobs(tmp_path, vllm_engine, tiny_path):
    from transformers import AutoModelForCausalLM

    from arl.algo import token_logprobs

    config = small_config(tmp_path, "steps=1")
    original = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    trainer = Trainer(config, engine=vllm_engine)  # not owned: the session engine stays open
    try:
        await trainer.setup()
        before = params_of(trainer.model)
        metrics = await trainer.step()
        assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
        # what the engine did during the rollout: every turn needs at least one engine step
        assert metrics["rollout/engine_steps"] >= metrics["rollout/num_turns"] / metrics["rollout/num_episodes"]
        assert 0 < metrics["rollout/engine_busy_frac"] <= 1.0
        prompt = list(range(5, 60))
        gen = await vllm_engine.generate(prompt, SamplingParams(max_tokens=16, ignore_eos=True, seed=3))
        assert gen.policy_version == vllm_engine.policy_version
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            lp = token_logprobs(trainer.model(input_ids=ids).logits, ids)[0, len(prompt):]
        assert lp.tolist() == pytest.approx(gen.logprobs, abs=1e-4)
    finally:
        trainer.logger.close()
        await vllm_engine.update_weights(list(original.state_dict().items()))


async def test_micro_batches_accumulate_to_the_full_batch_update(tmp_path):
    """The accumulated gradient over micro-batches equals the one-shot full-batch gradient."""
    grads = []
    for micro in ("64", "3"):
        config = small_config(tmp_path / micro, f"optim.micro_batch_size={micro}", "steps=1", "optim.grad_clip=null")
        async with Trainer(config, engine=scripted(config)) as trainer:
            await trainer.setup()
            grads.append(await step_gradients(trainer))
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-7)


async def test_resume_matches_an_uninterrupted_run(tmp_path):
    full = small_config(tmp_path / "full", "steps=4", "save_every=2")
    async with Trainer(full, engine=scripted(full)) as trainer:
        await trainer.train()
        want = params_of(trainer.model)

    part = small_config(tmp_path / "part", "steps=4", "save_every=2")
    async with Trainer(part, engine=scripted(part)) as trainer:  # "killed" after step 2
        await trainer.setup()
        for _ in range(2):
            await trainer.step()
    async with Trainer(part, engine=scripted(part)) as trainer:
        await trainer.train(resume=True)
        assert trainer.step_count == 4
        got = params_of(trainer.model)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)

    def rows(run):
        lines = (run / "t" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")} for line in lines]

    assert rows(tmp_path / "part") == rows(tmp_path / "full")


async def test_resume_keeps_the_warm_started_kl_reference(tmp_path):
    """The KL anchor is snapshotted after the format warm-start; a resumed run must anchor to that
    policy, not to the initial model it rebuilds (which would change every later update)."""
    extra = ("steps=4", "save_every=2", "sft.steps=2", "sft.batch_episodes=4", "algo.kl_coef=0.5")
    full = small_config(tmp_path / "full", *extra)
    async with Trainer(full, engine=scripted(full)) as trainer:
        await trainer.train()
        want = params_of(trainer.model)

    part = small_config(tmp_path / "part", *extra)
    killed = small_config(tmp_path / "part", *extra, "steps=2")  # stops after step 2, warm-start done as in full
    async with Trainer(killed, engine=scripted(killed)) as trainer:
        await trainer.train()
        reference = params_of(trainer.ref_model)
    async with Trainer(part, engine=scripted(part)) as trainer:
        await trainer.train(resume=True)
        assert trainer.step_count == 4
        for name, value in params_of(trainer.ref_model).items():
            torch.testing.assert_close(value, reference[name], rtol=0, atol=0)
        got = params_of(trainer.model)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)


async def test_nan_update_is_skipped_not_applied(tmp_path):
    config = small_config(tmp_path, "steps=1")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.setup()
        with torch.no_grad():
            trainer.model.model.norm.weight.fill_(float("nan"))
        before = params_of(trainer.model)
        metrics = await trainer.step()
        assert metrics["train/skipped_updates"] >= 1
        for n, p in trainer.model.named_parameters():
            assert torch.equal(p, before[n]) or (torch.isnan(p).any() and torch.isnan(before[n]).any())


async def test_evaluate_reports_the_validation_panel(tmp_path):
    config = small_config(tmp_path, "eval.num_seeds=6")
    async with Trainer(config, engine=scripted(config)) as trainer:
        metrics = await trainer.evaluate()
    assert metrics["eval/num_episodes"] == 6
    # the scripted engine is seeded per request: the panel's figures are exact (8 of 13 turns valid
    # at its invalid_rate 0.3, no level solved by its random valid moves)
    assert metrics["eval/success_rate"] == 0.0 and metrics["eval/valid_action_rate"] == 8 / 13


@pytest.mark.parametrize(
    "override, words",
    [
        ("rollout.mode=chat", ["mode", "traj", "step"]),
        ("engine.backend=tpu", ["backend", "vllm", "hf", "scripted"]),
        ("optim.lrr=0.1", ["lrr", "optim"]),
        ("optim.lr=fast", ["optim.lr", "float"]),
        ("rollout.num_groups=0", ["num_groups", ">= 1"]),
    ],
)
def test_bad_config_names_the_field_and_the_choices(override, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    for word in words:
        assert word in str(err.value)


def test_gigpo_on_conversation_branches_is_refused(tmp_path):
    """A proxy traj sample (a conversation branch) records no turns: one GiGPO row, every anchor
    group a singleton, the step term 0. Training that under GiGPO's name would log gigpo_* metrics
    of an estimator that never ran its step term. The config still loads (an eval directory's
    config.yaml is read back, and evaluation trains nothing); the Trainer refuses it."""
    from arl.rollout import ProxyEnvManager

    overrides = [f"out_dir={tmp_path}", "rollout.mode=proxy", "rollout.proxy.granularity=traj"]
    config = load_config(None, [*overrides, "algo.estimator=gigpo"])
    with pytest.raises(ConfigError, match="step term is 0") as err:
        Trainer(config)
    assert "rollout.proxy.granularity=step" in str(err.value) and "algo.estimator=grpo" in str(err.value)
    with pytest.raises(ConfigError, match="step term is 0"):  # an injected manager: its own mode counts
        Trainer(load_config(None, [f"out_dir={tmp_path}", "algo.estimator=gigpo"]),
                manager=ProxyEnvManager(scripted(config), granularity="traj"))
    Trainer(load_config(None, [*overrides, "algo.estimator=grpo"]))
    Trainer(load_config(None, [f"out_dir={tmp_path}", "rollout.mode=traj", "algo.estimator=gigpo"]))  # turns: per turn


def test_every_shipped_config_loads():
    from pathlib import Path

    configs = sorted(Path(__file__).parents[2].joinpath("configs").glob("*.yaml"))
    assert configs
    for path in configs:
        first = path.read_text().splitlines()[0]
        assert first.startswith("#") and "arl train" in first, f"{path.name}: first line must be its command"
        load_config(path)


async def test_ppo_mini_batches_and_epochs_use_the_old_policy(tmp_path):
    """Several optimizer steps per rollout: the ratio leaves 1 and clipping can engage."""
    config = small_config(tmp_path, "optim.mini_batches=2", "optim.epochs=2", "optim.lr=0.05", "steps=1")
    async with Trainer(config, engine=scripted(config)) as trainer:
        metrics = await trainer.step()
    assert metrics["train/ratio_max"] > 1.0
    assert metrics["train/skipped_updates"] == 0


async def test_overlapped_steps_train_one_version_behind(tmp_path):
    """rollout.max_staleness=1: the next step's rollout runs during this step's update, on the
    policy one version behind; the synchronous default never lags."""
    sync = small_config(tmp_path / "sync", "steps=3")
    async with Trainer(sync, engine=scripted(sync)) as trainer:
        history = await trainer.train()
    assert [row["train/staleness_max"] for row in history if "train/staleness_max" in row] == [0, 0, 0]

    overlap = small_config(tmp_path / "overlap", "steps=3", "rollout.max_staleness=1")
    async with Trainer(overlap, engine=scripted(overlap)) as trainer:
        await trainer.setup()
        before = params_of(trainer.model)
        history = await trainer.train()
        assert trainer._prefetch is None  # nothing left running after the last step
        moved = any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    lags = [row["train/staleness_max"] for row in history if "train/staleness_max" in row]
    assert lags == [0, 1, 1] and moved
    assert all(row["train/skipped_updates"] == 0 for row in history if "train/skipped_updates" in row)


async def test_closing_mid_run_cancels_the_prefetched_rollout(tmp_path):
    config = small_config(tmp_path, "steps=5", "rollout.max_staleness=1")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.step()
        assert trainer._prefetch is not None
        task = trainer._prefetch
    assert task.done() and trainer._prefetch is None


async def test_spare_groups_train_on_the_first_finished_groups(tmp_path):
    """rollout.spare_groups: the step plays G + k groups and trains on the G that finish first."""
    config = small_config(tmp_path, "rollout.spare_groups=1")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.setup()
        metrics = await trainer.step()
    assert metrics["rollout/groups_dropped"] == 1
    assert metrics["rollout/num_episodes"] == 2 * 4  # num_groups x group_size, the spare dropped


async def test_sleep_mode_frees_the_engine_through_every_update(tmp_path):
    """engine.sleep_mode: each step sleeps the engine after the rollout, updates, wakes it, then
    pushes the new weights (a sleeping vLLM engine refuses them); a failed update still wakes it."""
    config = small_config(tmp_path, "engine.sleep_mode=true", "steps=2")
    engine = scripted(config)
    calls: list[str] = []
    for name in ("sleep", "wake", "update_weights"):
        method = getattr(engine, name)

        async def record(*args, _name=name, _method=method):
            calls.append(_name)
            return await _method(*args)

        setattr(engine, name, record)
    async with Trainer(config, engine=engine) as trainer:
        await trainer.setup()
        update = trainer.update

        def update_while_asleep(samples, advantages):
            calls.append("update")
            return update(samples, advantages)

        trainer.update = update_while_asleep
        calls.clear()
        history = await trainer.train()
        assert calls == ["sleep", "update", "wake", "update_weights"] * 2
        assert all(row["timing/engine_sleep_s"] >= 0 for row in history if "timing/update_s" in row)

        def failing(samples, advantages):
            raise RuntimeError("out of memory")

        trainer.update, trainer.config.steps = failing, 3
        calls.clear()
        with pytest.raises(RuntimeError, match="out of memory"):
            await trainer.step()
        assert calls == ["sleep", "wake"]
