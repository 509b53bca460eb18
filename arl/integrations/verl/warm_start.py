"""arl's format warm-start for a verl launch: the model verl's actor, reference and rollout start from.

The tiny model (random init) never emits a parseable ``<answer>X</answer>``, so a verl run started
from it sees only invalid actions: every reward is the same format penalty and GiGPO's advantages
carry nothing. arl's own trainer starts such a model with a format warm-start (`arl.train.sft`,
``sft.steps`` in its config, as `configs/tiny_frozenlake_gigpo.yaml` does): episodes played by a
scripted teacher answering uniformly random valid actions, through the very manager RL will use, and
cross-entropy on those answers. It teaches the format, not the game.

This module runs that same warm-start for a verl launch and writes the result where verl loads a
model from (``actor_rollout_ref.model.path``): an HF directory (``save_pretrained``: weights and
tokenizer). The manager is the agent loop's: its YAML entry's ``rollout`` block, turned into arl's
RolloutConfig by `arl.integrations.verl.agent_loop.rollout_config`, exactly as `ArlAgentLoop` does, so
the warm-start's prompts are the verl episodes' prompts.

    python -m arl.integrations.verl.warm_start --agent-loops arl/integrations/verl/examples/agent_loops_cpu.yaml \\
        --env arl/FrozenLake-v0 --model tiny --out /tmp/arl-verl-cpu-fit/warm_start

(`arl/integrations/verl/examples/cpu_fit.sh` runs it with ``WARM_START=1``.) Defaults are the demo
config's warm-start (30 steps of 64 episodes at lr 1e-3, seed 0) on arl's HF engine.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

import attrs

from arl.config import SFTConfig, TrainConfig, load_config


def agent_loop_rollout(path: str | Path, name: str = "arl_agent") -> Any:
    """arl's RolloutConfig of the agent-loop YAML entry ``name`` (as `ArlAgentLoop` builds it)."""
    import yaml

    from arl.integrations.verl.agent_loop import rollout_config

    entries = yaml.safe_load(Path(path).read_text())
    entry = next((e for e in entries if e.get("name") == name), None)
    if entry is None:
        raise ValueError(f"{path} has no agent loop named {name!r} (names: {[e.get('name') for e in entries]})")
    return rollout_config(entry.get("rollout"))


def warm_start_config(agent_loops: str | Path, env_id: str, *, model: str = "tiny", sft: SFTConfig | None = None,
                      seed: int = 0, out_dir: str | Path, name: str = "arl_agent") -> TrainConfig:
    """The TrainConfig whose trainer runs the warm-start: the agent loop's rollout on ``env_id``, arl's
    HF engine (no vLLM in verl's venv), ``steps=0`` (no RL step)."""
    sft = sft or SFTConfig(steps=30, lr=1e-3, batch_episodes=64)
    # algo.estimator=grpo: no RL step runs, and gigpo is refused on a proxy agent loop's conversation branches
    config = load_config(None, [f"model={model}", f"seed={seed}", "steps=0", "engine.backend=hf", "algo.estimator=grpo",
                                f"out_dir={out_dir}", "name=warm_start", "eval.every=0", "eval.at_start=false"])
    rollout = attrs.evolve(agent_loop_rollout(agent_loops, name), env_id=env_id)
    return attrs.evolve(config, rollout=rollout, sft=sft)


async def warm_start(config: TrainConfig, out: str | Path) -> dict[str, float]:
    """Run `arl.train.sft.format_warm_start` for ``config`` and save the model and tokenizer to ``out``;
    returns the warm-start's metrics."""
    from arl.train.sft import format_warm_start
    from arl.train.trainer import Trainer

    trainer = Trainer(config)
    try:
        await trainer.setup()
        metrics = await format_warm_start(trainer)
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        trainer.model.save_pretrained(out)
        trainer.tokenizer.save_pretrained(out)
    finally:
        await trainer.close()
    return metrics


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m arl.integrations.verl.warm_start", description=__doc__.split("\n")[0])
    parser.add_argument("--agent-loops", required=True, help="the launch's rollout.agent.agent_loop_config_path")
    parser.add_argument("--name", default="arl_agent", help="the agent loop entry (rollout.agent.default_agent_loop)")
    parser.add_argument("--env", required=True, help="the game the dataset rows name (e.g. arl/FrozenLake-v0)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", required=True, help="the HF directory to write (the launch's MODEL)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--episodes", type=int, default=64, help="episodes per warm-start step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sft = SFTConfig(steps=args.steps, lr=args.lr, batch_episodes=args.episodes)
    with tempfile.TemporaryDirectory(prefix="arl-warm-start-") as runs:
        config = warm_start_config(args.agent_loops, args.env, model=args.model, sft=sft, seed=args.seed,
                                   out_dir=runs, name=args.name)
        return asyncio.run(warm_start(config, args.out))


if __name__ == "__main__":
    main()
