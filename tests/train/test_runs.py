"""Runs are never lost, one model name drives everything, and black-box agents train like the
built-in managers (proxy mode from the config; a push-mode agent process through `arl train`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_support import params_of, scripted, small_config

from arl.config import EngineConfig, ManagerConfig, RunExistsError, TrainConfig
from arl.engine import make_engine
from arl.rollout import ProxyEnvManager
from arl.rollout.runners import gym_runner, make_runner_factory
from arl.train import Trainer

pytestmark = pytest.mark.anyio


def checkpoints(run_dir) -> list[str]:
    return sorted(p.name for p in run_dir.glob("ckpt_*"))


# -- no run is ever deleted implicitly -----------------------------------------------------------


async def test_evaluate_then_resume_keeps_every_checkpoint(tmp_path):
    config = small_config(tmp_path, "save_every=1", "keep_checkpoints=null")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.train()
    run = config.run_dir
    kept = checkpoints(run)
    assert kept == ["ckpt_000001", "ckpt_000002"]
    rows = (run / "metrics.jsonl").read_text()

    # A user evaluates first (a fresh trainer), then resumes: the old code cleared the directory here.
    async with Trainer(config, engine=scripted(config)) as trainer:
        with pytest.raises(RunExistsError):
            await trainer.evaluate()
        assert checkpoints(run) == kept and (run / "metrics.jsonl").read_text() == rows
        await trainer.train(resume=True)  # nothing left to do: steps=2 reached
        assert trainer.step_count == 2
    # ... and the way the API now spells it: resume in the constructor, evaluate, continue.
    longer = small_config(tmp_path, "save_every=1", "keep_checkpoints=null", "steps=3")
    async with Trainer(longer, engine=scripted(longer), resume=True) as trainer:
        metrics = await trainer.evaluate()
        assert "eval/success_rate" in metrics and trainer.step_count == 2
        await trainer.train()
    assert checkpoints(run) == ["ckpt_000001", "ckpt_000002", "ckpt_000003"]


async def test_a_fresh_run_into_a_run_directory_refuses_and_names_both_ways_out(tmp_path):
    config = small_config(tmp_path, "steps=1")
    async with Trainer(config, engine=scripted(config)) as trainer:
        await trainer.train()
    assert checkpoints(config.run_dir) == ["ckpt_000001"]
    with pytest.raises(RunExistsError) as err:
        async with Trainer(config, engine=scripted(config)) as trainer:
            await trainer.step()
    message = str(err.value)
    assert "ckpt_000001" in message and "--resume" in message and "--overwrite" in message
    assert checkpoints(config.run_dir) == ["ckpt_000001"]

    overwrite = small_config(tmp_path, "steps=1", "overwrite=true", "sft.steps=0")
    async with Trainer(overwrite, engine=scripted(overwrite)) as trainer:
        await trainer.setup()
        assert checkpoints(config.run_dir) == []  # told to: the old run is gone
        await trainer.train()
    assert checkpoints(config.run_dir) == ["ckpt_000001"]


def test_cli_refuses_without_a_traceback(tmp_path, capsys):
    from arl.cli import main

    run = tmp_path / "t"
    (run / "ckpt_000005").mkdir(parents=True)
    code = main(["train", "tiny_frozenlake_gigpo", f"out_dir={tmp_path}", "name=t", "engine.backend=scripted"])
    assert code == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert (run / "ckpt_000005").is_dir()


# -- one model name --------------------------------------------------------------------------------


async def test_a_python_built_config_uses_its_model_in_the_engine(tmp_path, monkeypatch, tiny_path):
    config = TrainConfig(model=str(tiny_path), engine=EngineConfig(backend="scripted"), out_dir=str(tmp_path))
    assert config.engine.model == str(tiny_path)
    built = []

    def spy(engine_config):
        built.append(engine_config)
        return make_engine(engine_config)

    monkeypatch.setattr("arl.train.trainer.make_engine", spy)
    async with Trainer(config) as trainer:
        await trainer.setup()
    assert [c.model for c in built] == [str(tiny_path)]
    config.model = "smollm2-135m"  # setting it later moves the engine too
    assert config.engine.model == "smollm2-135m"
    with pytest.raises(ValueError, match="disagree"):
        TrainConfig(model="tiny-a", engine=EngineConfig(model="tiny-b"))


# -- the rollout is injectable; proxy mode from the config -----------------------------------------


async def test_an_injected_proxy_manager_trains_with_evaluation_and_checkpoints(tmp_path):
    config = small_config(tmp_path, "rollout.mode=proxy", "eval.at_start=true", "sft.steps=1", "sft.batch_episodes=4",
                          "algo.estimator=gigpo")
    engine = scripted(config)
    manager = ProxyEnvManager(engine, ManagerConfig(max_tokens=8, history_len=0),
                              make_runner_factory(gym_runner, conversation="step"),
                              granularity="step")
    async with Trainer(config, manager=manager) as trainer:
        await trainer.setup()
        before = params_of(trainer.model)
        history = await trainer.train()
        assert trainer.val_manager is not manager and isinstance(trainer.val_manager, ProxyEnvManager)
        after = params_of(trainer.model)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert sum("eval/success_rate" in row for row in history) == 2
    assert any("sft/loss_last" in row for row in history)
    assert checkpoints(config.run_dir) == ["ckpt_000002"]
    with pytest.raises(ValueError, match="another engine"):
        Trainer(config, engine=scripted(config), manager=manager)


async def test_proxy_mode_from_the_config_with_a_runner_import_path(tmp_path):
    runner = "arl.rollout.runners:gym_runner"
    config = small_config(tmp_path, "rollout.mode=proxy", f"rollout.proxy.runner={runner}",
                          "rollout.proxy.runner_kwargs={conversation: step}", "algo.estimator=gigpo", "steps=1")
    async with Trainer(config, engine=scripted(config)) as trainer:
        metrics = await trainer.step()
        assert isinstance(trainer.manager, ProxyEnvManager) and trainer.manager.granularity == "step"
    assert metrics["train/num_samples"] > 0 and metrics["train/gigpo_anchor_group_size_mean"] >= 1


def test_a_bad_runner_path_is_a_clear_error(tmp_path):
    from arl.rollout.factory import make_manager

    for bad, words in [("nope", "package.module:factory"), ("no_such_pkg.x:make", "cannot import"),
                       ("arl.rollout.runners:missing", "has no 'missing'")]:
        config = small_config(tmp_path, "rollout.mode=proxy", f"rollout.proxy.runner={bad}")
        with pytest.raises(ValueError, match=words):
            make_manager(None, config.rollout)
    push = small_config(tmp_path, "rollout.mode=proxy", "rollout.proxy.runner=push",
                        "rollout.proxy.runner_kwargs={command: [x]}")
    with pytest.raises(ValueError, match="transport=http"):
        make_manager(None, push.rollout)


async def test_tool_call_agents_warm_start_from_the_scripted_tool_call_teacher(tmp_path):
    config = small_config(tmp_path, "rollout.mode=proxy", "rollout.proxy.runner=tool", "rollout.proxy.granularity=traj",
                          "algo.estimator=grpo",
                          "sft.steps=2", "sft.batch_episodes=4", "steps=1", "rollout.manager.max_tokens=40")
    async with Trainer(config, engine=scripted(config)) as trainer:
        history = await trainer.train()
    sft = next(row for row in history if "sft/loss_last" in row)
    assert sft["sft/steps"] == 2 and sft["sft/loss_first"] > 0
    # The teacher's episodes were played through tool calls: every warm-start action was valid.
    from arl.train.sft import TOOL_CALL_ANSWER, teacher_engine

    assert teacher_engine(trainer).answer_format == TOOL_CALL_ANSWER


# -- a push-mode agent (its own OS process, stock openai client) through `arl train` ---------------


@pytest.mark.slow
def test_push_mode_agent_trains_through_arl_train_and_resumes_exactly(tmp_path):
    from arl.cli import main

    common = ["engine.backend=scripted", "rollout.num_groups=2", "rollout.group_size=2", "rollout.max_concurrency=4",
              "sft.steps=1", "sft.batch_episodes=2", "eval.num_seeds=2", "eval.every=0", "tensorboard=false",
              "save_every=1", "keep_checkpoints=null", "rollout.manager.max_turns=3"]
    assert main(["train", "tiny_frozenlake_push_gigpo", *common, "steps=2", f"out_dir={tmp_path / 'full'}"]) == 0
    assert main(["train", "tiny_frozenlake_push_gigpo", *common, "steps=1", f"out_dir={tmp_path / 'part'}"]) == 0
    assert main(["train", "tiny_frozenlake_push_gigpo", *common, "steps=2", f"out_dir={tmp_path / 'part'}",
                 "--resume"]) == 0
    full = tmp_path / "full" / "tiny_frozenlake_push_gigpo"
    part = tmp_path / "part" / "tiny_frozenlake_push_gigpo"
    assert checkpoints(full) == checkpoints(part) == ["ckpt_000001", "ckpt_000002"]
    want, got = load_file(full / "ckpt_000002" / "model.safetensors"), load_file(part / "ckpt_000002" / "model.safetensors")
    from arl.models import resolve_model

    initial = load_file(Path(resolve_model("tiny")) / "model.safetensors")
    assert any(not torch.equal(want[n], initial[n]) for n in want if n in initial), "parameters moved"
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
    steps = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in steps if "rollout/num_turns" in row]
    assert len(steps) == 2
    for row in steps:  # every agent process played its episode to a normal end
        assert row["rollout/num_turns"] > 0 and row["rollout/exit/agent_error"] == 0, row
