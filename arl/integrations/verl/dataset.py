"""verl dataset rows for arl episodes: one row per (env, seed), written as parquet.

verl samples ``rollout.n`` sessions of each row under one ``uid``; `ArlAgentLoop` maps the row
to an episode (``extra_info``: env_id, seed, tag, index) and the uid to its GiGPO / GRPO group. So
a row is a group: ``num_groups`` rows per epoch, seeds ``base_seed + i`` (validation sets use
another base, as arl's own scheduler does).

The ``prompt`` column is the episode's first chat messages (what TrajEnvManager sends first), so
verl's prompt-length filter and logs see real prompts; the loop itself plays the env from the
seed (a proxy-mode agent builds its own messages).

    python -m arl.integrations.verl.dataset --env arl/Sokoban-v0 --groups 1024 --out data/train.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from arl.envs.prompts import traj_messages_start


def episode_rows(
    env_id: str, num_groups: int, *, base_seed: int = 0, tag: str = "train", max_tokens: int = 100,
    agent_name: str = "arl_agent", env_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One verl row per seed ``base_seed .. base_seed + num_groups - 1``."""
    from arl.envs.text import TextEnv

    env = TextEnv(env_id, **(env_kwargs or {}))
    rows = []
    for i in range(num_groups):
        seed = base_seed + i
        obs, info = env.reset(seed=seed)
        obs = str(info.get("raw_obs", obs))
        rows.append({
            "data_source": f"arl/{env_id}",
            "agent_name": agent_name,
            "prompt": traj_messages_start(obs, env.max_steps, max_tokens, env.instructions),
            "extra_info": {"env_id": env_id, "seed": seed, "tag": tag, "index": i},
            "reward_model": {"style": "rule", "ground_truth": ""},  # rewards come from the env
        })
    return rows


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows with pandas + pyarrow (verl's own requirements)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="arl/Sokoban-v0")
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--base-seed", type=int, default=0)
    parser.add_argument("--tag", default="train")
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--agent-name", default="arl_agent",
                        help="the agent loop entry each row names (verl's agent_name column; it wins over "
                             "rollout.agent.default_agent_loop)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = episode_rows(args.env, args.groups, base_seed=args.base_seed, tag=args.tag, max_tokens=args.max_tokens,
                        agent_name=args.agent_name)
    print(write_parquet(rows, args.out))


if __name__ == "__main__":
    main()
