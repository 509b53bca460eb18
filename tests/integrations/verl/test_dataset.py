"""Dataset rows -> parquet -> verl's real RLHFDataset -> ArlAgentLoop.run(**row)."""

from __future__ import annotations

import pytest

from arl.engine.scripted import ScriptedEngine
from arl.integrations.verl.dataset import episode_rows, write_parquet


def test_rows_round_trip_through_verl_dataset(tmp_path, tiny_tokenizer):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    rows = episode_rows("arl/Sokoban-v0", 3, base_seed=10)
    path = write_parquet(rows, tmp_path / "train.parquet")
    config = OmegaConf.create({"max_prompt_length": 1024, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1, "return_raw_chat": True,
                               "cache_dir": str(tmp_path / "cache")})
    dataset = RLHFDataset(data_files=str(path), tokenizer=tiny_tokenizer, config=config)
    assert len(dataset) == 3
    item = dataset[1]
    assert item["extra_info"]["seed"] == 11 and item["extra_info"]["env_id"] == "arl/Sokoban-v0"
    assert item["agent_name"] == "arl_agent"
    assert [m["role"] for m in item["raw_prompt"]] == ["system", "user"]


@pytest.mark.anyio
async def test_a_dataset_row_plays_its_episode(make_loop, tiny_tokenizer):
    """The first prompt of the episode is the row's prompt, rendered by the chat template."""
    from arl.intercept.template import chat_ids

    row = episode_rows("arl/FrozenLake-v0", 1, base_seed=4, max_tokens=24)[0]
    row.pop("agent_name")  # verl consumes it to pick the loop
    loop, server = make_loop(ScriptedEngine(tiny_tokenizer, seed=0), {"manager": {"max_tokens": 24}})
    out = await loop.run({"temperature": 1.0}, uid="u", raw_prompt=row["prompt"], **row)
    assert out.prompt_ids == chat_ids(tiny_tokenizer, row["prompt"]) == server.calls[0]["prompt_ids"]


def test_cli_rows_name_the_agent_loop(tmp_path):
    """verl picks a row's loop by its agent_name column before rollout.agent.default_agent_loop."""
    import pandas as pd

    from arl.integrations.verl.dataset import main

    main(["--env", "arl/FrozenLake-v0", "--groups", "2", "--agent-name", "arl_agent_step", "--out", str(tmp_path / "a.parquet")])
    main(["--env", "arl/FrozenLake-v0", "--groups", "2", "--out", str(tmp_path / "b.parquet")])
    assert list(pd.read_parquet(tmp_path / "a.parquet")["agent_name"]) == ["arl_agent_step"] * 2
    assert list(pd.read_parquet(tmp_path / "b.parquet")["agent_name"]) == ["arl_agent"] * 2
