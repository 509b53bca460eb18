"""The example launch as verl sees it before Ray starts: its config through verl's own
`validate_config`, the ``arl_sync`` trainer mode against verl's ``sync``, and the agent-loop YAML
through verl's registry with no setup hook."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


@pytest.mark.parametrize("n_gpus", [1, 2, 8])
def test_example_launch_passes_verl_validate_config(example_config, n_gpus):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = example_config(n_gpus)
    # what the other tests in this directory rely on
    assert config.trainer.use_v1 and config.trainer.v1.trainer_mode == "arl_sync"
    assert config.algorithm.adv_estimator == "arl_gigpo"
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "arl_agent"
    assert (REPO / config.actor_rollout_ref.rollout.agent.agent_loop_config_path).is_file()
    assert config.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == "arl.integrations.verl.setup_verl"
    # what verl.trainer.main_ppo.main runs before Ray starts
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    # what it does not check: verl starts world_size // (tp * dp * pp) vLLM replicas
    # (workers/rollout/llm_server.py); verl's default tensor parallel 2 would start none on 1 GPU
    rollout = config.actor_rollout_ref.rollout
    per_replica = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    assert config.trainer.n_gpus_per_node * config.trainer.nnodes // per_replica == n_gpus


@pytest.mark.parametrize(("n_gpus", "tp"), [(1, 2), (3, 2), (8, 3), (8, 0)])
def test_example_launch_refuses_gpus_its_tensor_parallel_leaves_idle(tmp_path, n_gpus, tp):
    fake = tmp_path / "python"  # were the script to go on, nothing would be launched or written
    fake.write_text("#!/bin/sh\nexit 97\n")
    fake.chmod(0o755)
    result = subprocess.run(["bash", str(REPO / "arl/integrations/verl/examples/sokoban_gigpo.sh")],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
                                 "N_GPUS": str(n_gpus), "TP": str(tp)})
    assert result.returncode == 2, result
    assert f"N_GPUS={n_gpus} is not a multiple of TP={tp}" in result.stderr


def test_example_launch_takes_its_tensor_parallel_from_tp(launch_commands):
    main = next(c for c in launch_commands(N_GPUS="8", TP="2") if c[:2] == ["-m", "verl.trainer.main_ppo"])
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in main


def test_example_writes_the_datasets_it_trains_on(launch_commands):
    calls = launch_commands(N_GPUS="1")
    datasets = [c for c in calls if c[:2] == ["-m", "arl.integrations.verl.dataset"]]
    outs = [c[c.index("--out") + 1] for c in datasets]
    main = next(c for c in calls if c[:2] == ["-m", "verl.trainer.main_ppo"])
    assert f"data.train_files={outs[0]}" in main and f"data.val_files={outs[1]}" in main


def _trainer(config):
    from verl.trainer.ppo.v1 import get_trainer_cls

    from arl.integrations.verl import setup_verl

    setup_verl()
    return get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


def test_arl_sync_is_verls_sync_trainer(example_config):
    """Everything verl decides from the trainer mode comes out as for ``sync``."""
    from verl.trainer.ppo.v1 import PPOTrainerSync

    from arl.integrations.verl.trainer import ArlPPOTrainerSync

    ours = _trainer(example_config(8))
    theirs = _trainer(example_config(8, "trainer.v1.trainer_mode=sync"))
    assert type(ours) is ArlPPOTrainerSync and type(theirs) is PPOTrainerSync
    assert ours.trainer_mode == theirs.trainer_mode == ours.config.trainer.v1.trainer_mode == "sync"
    assert type(ours.replay_buffer) is type(theirs.replay_buffer)
    for attr in ("trainer_mode", "trainer_config", "train_batch_size", "gen_batch_size", "max_inflight_gen_batches",
                 "filter_groups_metric", "sync_refill_failed_groups"):
        assert getattr(ours.replay_buffer, attr) == getattr(theirs.replay_buffer, attr), attr
    assert ours.replay_buffer.gen_batch_size == ours.config.data.train_batch_size
    assert ours.parameter_sync_step == theirs.parameter_sync_step


def test_yaml_agent_loop_keeps_its_config_without_the_setup_hook(tmp_path):
    """verl's worker loads the YAML into its registry, then hydra imports ArlAgentLoop on the first
    episode: every episode, the first and the later ones, must get the YAML's max_tokens (100),
    not the bare default (64). A fresh interpreter: nothing of arl imported before."""
    script = textwrap.dedent(f"""
        import asyncio
        from omegaconf import OmegaConf
        from verl.experimental.agent_loop import agent_loop as al

        assert "arl.integrations.verl.agent_loop" not in __import__("sys").modules
        # verl's AgentLoopWorker.__init__: the YAML entries go into the registry by name
        for entry in OmegaConf.load({str(REPO / "arl/integrations/verl/examples/agent_loops.yaml")!r}):
            al._agent_loop_registry[entry.name] = entry

        import sys
        sys.path.insert(0, {str(HERE)!r})
        from conftest import EngineServerManager, verl_config
        from arl.engine.scripted import ScriptedEngine
        from transformers import AutoTokenizer
        from arl.models import resolve_model

        tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))
        server = EngineServerManager(ScriptedEngine(tokenizer, seed=0))
        config = verl_config()

        class Worker:  # what AgentLoopWorker._run_agent_loop reads
            _run_agent_loop = al.AgentLoopWorker._run_agent_loop
            def __init__(self):
                self.config, self.llm_client, self.tokenizer, self.processor = config, server, tokenizer, None
                self.hf_model_type, self.dataset_cls, self.tools = None, None, []
            async def _agent_loop_postprocess(self, output, validate, **kwargs):
                return output

        async def main():
            worker = Worker()
            for session in range(3):
                row = {{"extra_info": {{"env_id": "arl/FrozenLake-v0", "seed": 0}}, "uid": "u", "session_id": session,
                       "raw_prompt": [{{"role": "user", "content": "play"}}]}}
                await worker._run_agent_loop({{"temperature": 1.0}}, {{"step": 1, "sample_index": 0, "rollout_n": session,
                                             "validate": False}}, agent_name="arl_agent", trace=False, **row)
            print(sorted({{c["params"]["max_tokens"] for c in server.calls}}))

        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[100]"


def test_readme_shows_the_launch_these_tests_check(launch_commands):
    import shlex

    text = (REPO / "docs" / "verl.md").read_text()  # the verl section moved out of the README
    section = text[text.index("## When one GPU is not enough"):]
    block = section[section.index("python -m verl.trainer.main_ppo"):]
    block = block[: block.index("```")]
    shown = shlex.split(block.replace("\\\n", " "))[3:]
    main = next(c for c in launch_commands(N_GPUS="8") if c[:2] == ["-m", "verl.trainer.main_ppo"])
    assert shown == main[2:]


def _cpu_launch_table() -> list[str]:
    """The overrides docs/verl.md's "The CPU launch" table lists (every backticked ``key=value`` of its
    second column)."""
    import re

    text = (REPO / "docs" / "verl.md").read_text()
    section = text[text.index("## The CPU launch"):]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]
    assert rows, "no table under '## The CPU launch'"
    return [item for row in rows for item in re.findall(r"`([^`=]+=[^`]*)`", row.split(" | ")[1])]


def test_cpu_launch_is_the_gpu_launch_with_the_documented_overrides(tmp_path):
    """docs/verl.md shows the CPU launch as the 8-GPU launch plus a table of overrides. Checked both
    ways: the table lists exactly the overrides by which cpu_fit.sh's main_ppo differs from
    sokoban_gigpo.sh's (same MODEL, OUT at its default), and the GPU launch's overrides followed by the
    table's compose, through verl's own hydra config, to the config cpu_fit.sh launches."""
    from conftest import CPU_EXAMPLE, compose_verl, example_overrides
    from omegaconf import OmegaConf

    model = "Qwen/Qwen2.5-0.5B-Instruct"  # the same MODEL for both: the model is an env var, not an override
    gpu = example_overrides(tmp_path, N_GPUS="8", MODEL=model)
    cpu = example_overrides(tmp_path, CPU_EXAMPLE, MODEL=model, PYTHON="python", OUT="/tmp/arl-verl-cpu-fit")
    gpu_values = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in gpu}
    differing = [o for o in cpu if gpu_values.get(o.split("=", 1)[0].lstrip("+")) != o.split("=", 1)[1]]
    table = _cpu_launch_table()
    assert sorted(table) == sorted(differing)
    # hydra.run.dir is hydra's own (where the run's files go), not part of verl's config
    config_of = lambda overrides: OmegaConf.to_container(  # noqa: E731
        compose_verl([o for o in overrides if not o.startswith("hydra.")]))
    assert config_of(gpu + table) == config_of(cpu)
    # the two environment variables that make verl a CPU verl (arl.integrations.verl.cpu)
    script = CPU_EXAMPLE.read_text()
    assert "export VERL_USE_EXTERNAL_MODULES=arl.integrations.verl.cpu VERL_PLATFORM=cpu" in script


def test_cpu_launch_takes_its_agent_loop_and_batch_from_the_environment(tmp_path):
    """AGENT_LOOP reaches the rows (verl's agent_name column wins over default_agent_loop, so the
    datasets must name it), the launch and the warm-start; MINI and MICRO reach verl's batch sizes."""
    from conftest import CPU_EXAMPLE, example_commands

    calls = example_commands(tmp_path, CPU_EXAMPLE, MODEL="m", PYTHON="python", OUT=str(tmp_path / "out"),
                             AGENT_LOOP="arl_agent_step", MINI="16", MICRO="32", WARM_START="1")
    datasets = [c for c in calls if c[:2] == ["-m", "arl.integrations.verl.dataset"]]
    assert len(datasets) == 2 and all(c[c.index("--agent-name") + 1] == "arl_agent_step" for c in datasets)
    warm = next(c for c in calls if c[:2] == ["-m", "arl.integrations.verl.warm_start"])
    assert warm[warm.index("--name") + 1] == "arl_agent_step"
    main = next(c for c in calls if c[:2] == ["-m", "verl.trainer.main_ppo"])
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=arl_agent_step" in main
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=16" in main
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32" in main
    entries = {e["name"] for e in __import__("yaml").safe_load(
        (REPO / "arl/integrations/verl/examples/agent_loops_cpu.yaml").read_text())}
    assert {"arl_agent", "arl_agent_step"} <= entries
