"""arl's format warm-start for a verl launch (`arl.integrations.verl.warm_start`): the agent loop's own
episodes, arl's SFT, an HF directory verl loads as ``actor_rollout_ref.model.path``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
AGENT_LOOPS = REPO / "arl/integrations/verl/examples/agent_loops_cpu.yaml"


def test_config_plays_the_agent_loops_episodes(tmp_path):
    """The warm-start's manager is the one ArlAgentLoop builds from the same YAML entry, so the prompts it
    teaches on are the verl episodes' prompts; no RL step, arl's HF engine."""
    from omegaconf import OmegaConf

    from arl.integrations.verl.agent_loop import rollout_config
    from arl.integrations.verl.warm_start import warm_start_config

    config = warm_start_config(AGENT_LOOPS, "arl/FrozenLake-v0", out_dir=tmp_path)
    entry = next(e for e in OmegaConf.load(AGENT_LOOPS) if e.name == "arl_agent")
    expected = rollout_config(entry.rollout)
    assert config.rollout.manager == expected.manager and config.rollout.mode == expected.mode == "traj"
    assert (config.rollout.manager.max_tokens, config.rollout.manager.max_turns) == (24, 4)
    assert config.rollout.env_id == "arl/FrozenLake-v0"
    assert (config.steps, config.engine.backend, config.sft.steps, config.sft.batch_episodes) == (0, "hf", 30, 64)
    with pytest.raises(ValueError, match="no agent loop named 'nope'"):
        warm_start_config(AGENT_LOOPS, "arl/FrozenLake-v0", out_dir=tmp_path, name="nope")


@pytest.mark.slow
def test_writes_a_model_dir_verl_loads(tmp_path):
    """A short warm-start (2 steps of 4 episodes) writes weights and tokenizer; they load as verl loads a
    model path, and the weights are the trained ones, not the initial model's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arl.integrations.verl.warm_start import main
    from arl.models import resolve_model

    out = tmp_path / "warm_start"
    metrics = main(["--agent-loops", str(AGENT_LOOPS), "--env", "arl/FrozenLake-v0", "--out", str(out),
                    "--steps", "2", "--episodes", "4"])
    assert metrics and all(isinstance(v, float) for v in metrics.values()), metrics
    assert json.loads((out / "config.json").read_text())["architectures"]
    base_path = resolve_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    moved = [n for (n, p), (_, q) in zip(model.named_parameters(), base.named_parameters(), strict=True)
             if not torch.equal(p, q)]
    assert moved, "the warm-start changed no weight"
    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(base_path).chat_template
