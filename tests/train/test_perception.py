"""The perception warm-start (`arl.train.perception`, ``sft.perception_steps``): captioning samples
token for token as RL's (a frame's image tokens and the prompt masked, the board's grid text and the
end of turn trained), its measured read accuracy, its steps on the zoo's tiny-vl (HF engine, the
real image processor: the loss falls, the vision tower moves), nothing when it is off, and the
config errors."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from trainer_support import params_of, scripted, small_config

from arl.config import ConfigError, ManagerConfig, load_config
from arl.engine.scripted import ScriptedEngine
from arl.envs import FrozenLakeEnv
from arl.intercept.template import end_of_turn_ids
from arl.models.tiny_vl import auto_model_class
from arl.models.zoo import resolve_model
from arl.rollout.step import StepEnvManager
from arl.train import Trainer, lora
from arl.train.lora import vision_towers
from arl.train.perception import (
    INSTRUCTION,
    boards,
    check_perception,
    make_env,
    perception_samples,
    read_accuracy,
)

pytestmark = pytest.mark.anyio


class BlindLake(FrozenLakeEnv):
    """An arl game that draws no frame."""

    frame = None


if "test/BlindLake-v0" not in gym.registry:
    gym.register(id="test/BlindLake-v0", entry_point=BlindLake, max_episode_steps=10,
                 kwargs={"size": 4, "p": 0.8, "is_slippery": False})


def _check_sample(sample, board, tokenizer) -> None:
    """``sample`` is ``board``'s captioning sample, token for token."""
    rendered = sample.rendered
    prompt = len(rendered.input_ids)
    assert sample.input_ids[:prompt] == list(rendered.input_ids)
    image = rendered.image_token_id
    assert sample.input_ids.count(image) == rendered.image_token_mask.sum() > 0  # the frame's image tokens
    assert sample.response_mask == [0] * prompt + [1] * (len(sample.input_ids) - prompt)  # only the reply trains
    reply = sample.input_ids[prompt:]
    assert reply == tokenizer.encode(board.text, add_special_tokens=False) + end_of_turn_ids(tokenizer)
    assert tokenizer.decode(reply, skip_special_tokens=True) == board.text
    text = tokenizer.decode(list(rendered.prompt.token_ids))
    assert "<|vision_start|><|image_pad|><|vision_end|>" + INSTRUCTION in text
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt RL's replies follow


def _scripted_samples(seeds, env_id="arl/FrozenLake-v0"):
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(resolve_model("tiny-vl"))
    manager = StepEnvManager(ScriptedEngine(tokenizer, image_tokens=16), ManagerConfig(observation="image"))
    states = boards(make_env(load_config(None, ["rollout.manager.observation=image", f"rollout.env_id={env_id}"])),
                    seeds)
    return states, perception_samples(manager, states, env_id), tokenizer


def test_boards_are_random_states_of_their_seeds():
    env = make_env(load_config(None, []))
    first, again = boards(env, range(40)), boards(env, range(40))
    assert [b.text for b in first] == [b.text for b in again]  # a pure function of the seed
    assert all(b.frame.shape == (4 * 28, 4 * 28, 3) for b in first)
    at_reset = []
    for seed in range(40):
        env.reset(seed=seed)
        at_reset.append(env.unwrapped.grid_text())
    moved = [b for b, start in zip(first, at_reset, strict=True) if b.text != start]
    assert moved and len(moved) < len(first)  # 0-3 random moves: some boards moved, some did not


@pytest.mark.parametrize("env_id", ["arl/FrozenLake-v0", "arl/Sokoban-v0"])
def test_perception_samples_are_token_exact(env_id):
    states, samples, tokenizer = _scripted_samples([3, 4], env_id)
    for sample, board in zip(samples, states, strict=True):
        _check_sample(sample, board, tokenizer)
        assert sample.input_ids.count(sample.rendered.image_token_id) == 16  # image_tokens=16


class _Reader(torch.nn.Module):
    """A model whose argmax at every position is the next token of the rows it is shown, except
    at ``wrong`` (row, position) pairs: a reader of known accuracy."""

    def __init__(self, wrong=()):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.wrong = set(wrong)

    def forward(self, input_ids, logits_to_keep, **_):
        nxt = torch.roll(input_ids, -1, dims=1)[:, logits_to_keep]
        logits = torch.nn.functional.one_hot(nxt, 4096).float()
        for b, t in self.wrong:
            k = int(torch.nonzero(logits_to_keep == t))
            logits[b, k] = torch.nn.functional.one_hot(nxt[b, k] + 1, 4096).float()
        return SimpleNamespace(logits=logits)


def test_read_accuracy_counts_cells_and_boards():
    _, samples, tokenizer = _scripted_samples([3, 4])
    assert read_accuracy(_Reader(), samples, tokenizer) == (1.0, 1.0)
    first_cell = len(samples[0].rendered.input_ids) - 1  # predicts the first cell of board 0
    newline = first_cell + 4  # predicts the newline after the first row: not a cell
    assert read_accuracy(_Reader({(0, first_cell)}), samples, tokenizer) == (31 / 32, 0.5)
    assert read_accuracy(_Reader({(0, newline)}), samples, tokenizer) == (1.0, 1.0)


async def test_perception_steps_read_the_board_and_train_the_vision_tower(tmp_path):
    c = small_config(tmp_path, "model=tiny-vl", "engine.backend=hf", "rollout.manager.observation=image",
                     "rollout.manager.prompt_style=compact", "steps=0", "sft.perception_steps=4",
                     "sft.perception_batch=16", "sft.micro_batch_size=16")
    async with Trainer(c) as trainer:
        await trainer.setup()
        [board] = boards(make_env(c), [11])
        [sample] = perception_samples(trainer.manager, [board])  # the real processor's expansion
        _check_sample(sample, board, trainer.tokenizer)
        assert np.array_equal(np.asarray(sample.rendered.images[0]), board.frame)
        model = trainer.model
        [tower] = vision_towers(model)
        before = params_of(model)
        history = await trainer.train()
        after = params_of(model)
    [row] = [r for r in history if "sft/perception_steps" in r]
    assert row["sft/perception_steps"] == 4
    assert row["sft/perception_loss_last"] < row["sft/perception_loss_first"]
    assert 0.0 <= row["sft/perception_board_acc"] <= row["sft/perception_cell_acc"] <= 1.0
    assert "sft/loss_first" not in row  # sft.steps=0: no format warm-start
    moved = [n for n in before if n.startswith(tower + ".") and not torch.equal(before[n], after[n])]
    assert moved  # the tower learns to see here


async def test_perception_under_lora_trains_the_base_the_adapter_then_applies_to(tmp_path):
    """Under LoRA a warm-start stands in for pretraining: it trains the base, the vision tower
    included, never the adapter, and saves that base where the adapter and the engine load it."""
    c = small_config(tmp_path, "model=tiny-vl", "engine.backend=hf", "rollout.manager.observation=image",
                     "rollout.manager.prompt_style=compact", "steps=0", "sft.perception_steps=4",
                     "sft.perception_batch=16", "sft.micro_batch_size=16", "lora.rank=8")
    async with Trainer(c) as trainer:
        await trainer.setup()
        model = trainer.model
        [tower] = vision_towers(model)
        before = params_of(model)
        history = await trainer.train()
        after = params_of(model)
        base = dict(lora.base_weights(model))
        run_dir = trainer.run_dir
    [row] = [r for r in history if "sft/perception_steps" in r]
    assert row["sft/perception_loss_last"] < row["sft/perception_loss_first"]
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and not [n for n in moved if "lora_" in n]  # the adapter gets no warm-start gradient
    assert [n for n in moved if f"{tower}." in n]  # the tower learns to see under LoRA too
    assert not [p for p in model.parameters() if p.requires_grad and p.grad is not None]  # nothing left for RL
    saved = auto_model_class(run_dir / lora.BASE_DIR).from_pretrained(run_dir / lora.BASE_DIR).state_dict()
    assert set(saved) == set(base) and all(torch.equal(saved[n], base[n]) for n in base)


async def test_perception_steps_0_adds_nothing(tmp_path):
    c = small_config(tmp_path, "steps=0", "sft.steps=1", "sft.batch_episodes=2")
    assert c.sft.perception_steps == 0
    async with Trainer(c, engine=scripted(c)) as trainer:
        history = await trainer.train()
    [row] = [r for r in history if "sft/steps" in r]
    assert "sft/loss_first" in row and not [k for k in row if "perception" in k]


def test_perception_on_text_observations_is_a_config_error():
    with pytest.raises(ConfigError, match="sft.perception_steps.*observation=text"):
        load_config(None, ["sft.perception_steps=2"])
    load_config(None, ["sft.perception_steps=2", "rollout.manager.observation=image"])  # fine


def test_perception_needs_a_vision_tower_and_a_game_that_draws():
    def trainer(env_id="arl/FrozenLake-v0"):
        c = load_config(None, ["sft.perception_steps=2", "rollout.manager.observation=image",
                               f"rollout.env_id={env_id}"])
        return SimpleNamespace(config=c, model=torch.nn.Linear(2, 2), engine=SimpleNamespace(image_renderer=None))

    with pytest.raises(ConfigError, match=r"model='tiny' has none"):
        check_perception(trainer())
    with pytest.raises(ConfigError, match=r"rollout.env_id='test/BlindLake-v0' \(BlindLake\) has no frame\(\)"):
        check_perception(trainer("test/BlindLake-v0"))
