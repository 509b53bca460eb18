"""Image observations in the traj and step managers (issue 46 items 4 and 5), on the zoo's tiny-vl:
the sample's input ids are exactly the ids the engine ran (every image expanded), its pixels the
engine's, the loss mask never on an image token, a turn cut for length gone with its frame, the
trainer's per-token log-probs on an image sample the engine's, and a training step runs.

Scripted engine (fake pixels) and HF engine here; the vLLM one carries the `vllm` marker.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import arl.envs  # noqa: F401  (registers the ids)
from arl.config import ManagerConfig, RolloutConfig
from arl.engine.base import NoVisionTowerError
from arl.rollout import collate
from arl.rollout.base import IMAGE_ONLY_TEXT
from arl.rollout.records import EpisodeSpec
from arl.rollout.step import StepEnvManager
from arl.rollout.traj import TrajEnvManager
from tests.vision_support import MERGE_AREA, pad_id

pytestmark = pytest.mark.anyio


def spec(seed: int = 0, env_id: str = "arl/FrozenLake-v0") -> EpisodeSpec:
    return EpisodeSpec(env_id=env_id, seed=seed, group_id=f"g{seed}", episode_id=0)


def config(observation: str, **kw) -> ManagerConfig:
    return ManagerConfig(observation=observation, max_tokens=kw.pop("max_tokens", 12), prompt_style="compact",
                         **kw)


def check_sample(sample, turns, tok) -> None:
    """The invariants every image sample keeps."""
    pad = pad_id(tok)
    r = sample.rendered
    assert r is not None
    last = turns[-1]
    assert list(last.prompt_ids) == list(r.input_ids)  # the ids the engine ran (act checked gen's)
    assert list(sample.input_ids[: len(r.input_ids)]) == list(r.input_ids)
    assert sample.input_ids.count(pad) == int(r.image_grid_thw.prod(axis=1).sum()) // MERGE_AREA
    assert not any(m and t == pad for t, m in zip(sample.input_ids, sample.response_mask, strict=True))


@pytest.mark.parametrize("observation", ["image", "both"])
async def test_traj_scripted_carries_every_frame(vl_tokenizer, observation):
    from arl.engine.scripted import ScriptedEngine

    tok = vl_tokenizer
    engine = ScriptedEngine(tok, image_tokens=3, max_model_len=4096)
    ep = await TrajEnvManager(engine, config(observation, max_turns=4)).run_episode(spec(0, "arl/Sokoban-v0"))
    traj, [sample] = ep.trajectory, ep.samples
    assert traj.ok and len(traj.turns) == 4
    check_sample(sample, traj.turns, tok)
    # every turn showed one more frame: turn k's prompt has k+1 images of 3 tokens
    for k, turn in enumerate(traj.turns):
        assert list(turn.prompt_ids).count(pad_id(tok)) == 3 * (k + 1)
    assert len(sample.rendered.images) == len(traj.turns)
    text = tok.decode(sample.input_ids)
    assert (IMAGE_ONLY_TEXT in text) == (observation == "image")
    assert all(t.rendered is None for t in traj.turns[:-1])  # one copy of the pixels per episode


async def test_traj_turn_cut_for_length_drops_its_frame(vl_tokenizer):
    from arl.engine.scripted import ScriptedEngine

    tok = vl_tokenizer
    engine = ScriptedEngine(tok, image_tokens=40, max_model_len=4096, actions=("Left",))
    sokoban = spec(0, "arl/Sokoban-v0")  # no move ends it early
    first = await TrajEnvManager(engine, config("image", max_turns=6)).run_episode(sokoban)
    lens = [len(t.prompt_ids) for t in first.trajectory.turns]
    assert len(lens) >= 3, lens
    # a context that holds two turns' prompts (+ max_tokens) but not the third's
    limit = lens[1] + 12
    cut = await TrajEnvManager(engine, config("image", max_turns=6, max_model_len=limit)).run_episode(sokoban)
    traj, [sample] = cut.trajectory, cut.samples
    assert traj.exit_reason == "max_length" and len(traj.turns) == 2
    check_sample(sample, traj.turns, tok)
    assert sample.input_ids.count(pad_id(tok)) == 2 * 40 and len(sample.rendered.images) == 2


async def test_step_scripted_one_frame_per_prompt_keyed_by_state(vl_tokenizer):
    from arl.engine.scripted import ScriptedEngine

    tok = vl_tokenizer
    engine = ScriptedEngine(tok, image_tokens=5, max_model_len=4096)
    img = await StepEnvManager(engine, config("image", max_turns=5)).run_episode(spec(3, "arl/Sokoban-v0"))
    txt = await StepEnvManager(ScriptedEngine(tok, image_tokens=5, max_model_len=4096),
                               config("text", max_turns=5)).run_episode(spec(3, "arl/Sokoban-v0"))
    assert len(img.samples) == 5
    assert img.samples and len(img.samples) == len(img.trajectory.turns)
    for sample, turn in zip(img.samples, img.trajectory.turns, strict=True):
        check_sample(sample, [turn], tok)
        assert len(sample.rendered.images) == 1 and sample.input_ids.count(pad_id(tok)) == 5
    # GiGPO's anchor: the game's state key, the same as with text prompts
    assert img.samples[0].state_key == txt.samples[0].state_key is not None
    first = tok.decode(img.samples[0].input_ids)
    assert IMAGE_ONLY_TEXT in first and "<|image_pad|>" in first


async def test_text_model_and_unsupported_modes_are_refused(vl_tokenizer, tiny_tokenizer):
    from arl.engine.scripted import ScriptedEngine

    with pytest.raises(NoVisionTowerError, match="no vision tower"):
        TrajEnvManager(ScriptedEngine(tiny_tokenizer), config("image"))
    RolloutConfig(mode="proxy", manager=ManagerConfig(observation="both"))  # GymRunner sends the frames
    with pytest.raises(ValueError):
        ManagerConfig(observation="pixels")


def test_collate_carries_pixels_and_masks_images(vl_tokenizer):
    from arl.engine.image_prompt import ImagePrompt
    from arl.engine.images import fake_pixels
    from arl.rollout.records import Sample

    pad = pad_id(vl_tokenizer)
    r = fake_pixels(ImagePrompt([5, pad, 6], [np.zeros((4, 4, 3), np.uint8)]), pad, tokens_per_image=2)
    ids = [*r.input_ids, 7, 8]
    img = Sample(ids, [0, 0, 0, 0, 1, 1], [0.0] * 4 + [-1.0, -1.0], 1.0, 1.0, "g", "t", rendered=r)
    txt = Sample([5, 6, 7], [0, 1, 1], [0.0, -1.0, -1.0], 0.0, 0.0, "g", "u")
    batch = collate([txt, img])
    assert batch["pixel_values"][0] is None and torch.equal(batch["pixel_values"][1], torch.from_numpy(r.pixel_values))
    assert batch["mm_token_type_ids"].tolist() == [[0] * 6, [0, 1, 1, 0, 0, 0]]
    with pytest.raises(ValueError, match="loss mask is on an image token"):
        Sample(ids, [0, 1, 0, 0, 1, 1], [0.0] * 6, 1.0, 1.0, "g", "t", rendered=r)
    with pytest.raises(ValueError, match="image tokens would not match"):
        Sample([*ids, pad], [0, 0, 0, 0, 1, 1, 0], [0.0] * 7, 1.0, 1.0, "g", "t", rendered=r)


# -- HF: the trainer's view == the engine's ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["traj", "step"])
async def test_hf_trainer_logprobs_match_the_engine_and_a_step_runs(hf_vl, mode):
    from arl.config import AlgoConfig, OptimConfig
    from arl.train.update import policy_update, sequence_logprobs

    manager = (TrajEnvManager if mode == "traj" else StepEnvManager)(hf_vl, config("both", max_turns=3))
    episodes = [await manager.run_episode(spec(s)) for s in (0, 1)]
    samples = [s for ep in episodes for s in ep.samples]
    assert samples and all(ep.trajectory.ok for ep in episodes), [ep.trajectory.error for ep in episodes]
    for ep in episodes:
        for s in ep.samples:
            assert s.rendered is not None
            check_hf(s, ep.trajectory.turns if mode == "traj" else [ep.trajectory.turns[s.step]], hf_vl)
    # a text row beside the image rows: a mixed batch, right-padded
    text = await StepEnvManager(hf_vl, config("text", max_turns=1)).run_episode(spec(2))
    samples += text.samples
    batch = collate(samples, pad_id=hf_vl.tokenizer.pad_token_id or 0)
    model = hf_vl.model
    with torch.no_grad():
        lp = sequence_logprobs(model, batch, range(len(samples)), None, micro_batch_size=3)
    on = batch["response_mask"].bool()
    gap = (lp[on] - batch["logprobs"][on]).abs().max().item()
    assert gap < 1e-3, gap
    # one optimizer step on a copy (the engine keeps its weights)
    import copy

    trained = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    adv = np.linspace(-1, 1, len(samples)).astype(np.float32)
    metrics = policy_update(trained, optimizer, batch, adv, algo=AlgoConfig(), optim=OptimConfig(micro_batch_size=2),
                            rng=np.random.default_rng(0))
    assert np.isfinite(metrics["train/loss"]) and metrics["train/skipped_updates"] == 0
    assert metrics["train/grad_norm"] > 0
    with torch.no_grad():
        after = sequence_logprobs(trained, batch, range(len(samples)), None, micro_batch_size=3)
    assert not torch.allclose(after[on], lp[on])  # the step moved the policy on these image samples


def check_hf(sample, turns, engine) -> None:
    pad = pad_id(engine.tokenizer)
    r = sample.rendered
    assert list(turns[-1].prompt_ids) == list(r.input_ids)
    fresh = engine.image_renderer.render(r.prompt)  # what the engine rendered when it ran the prompt
    assert fresh.input_ids == r.input_ids and np.array_equal(fresh.pixel_values, r.pixel_values)
    assert sample.input_ids.count(pad) == int(r.image_grid_thw.prod(axis=1).sum()) // MERGE_AREA
    assert not any(m and t == pad for t, m in zip(sample.input_ids, sample.response_mask, strict=True))


async def test_a_sampled_image_token_ends_the_episode_typed(vl_tokenizer):
    """A reply with the image placeholder token could not be scored (the forward would look for an
    image there): the episode ends engine_error with the reason, its earlier turns kept. The arl
    engines never sample it (tests/engine/test_vision_tokens.py; the scripted one refuses such a
    script), so the manager's own check is the backstop for an engine that does not forbid it."""
    from arl.engine.scripted import ScriptedEngine

    class Unguarded(ScriptedEngine):  # an injected engine that does not forbid the vision tokens
        def _check_forbidden(self, gen):
            return None

    replies = ["<answer>Left</answer>", "<answer>Up</answer><|image_pad|>"]
    for cls, said in ((Unguarded, "image placeholder token"), (ScriptedEngine, "never samples its vision tokens")):
        engine = cls(vl_tokenizer, image_tokens=3, max_model_len=4096, responses=replies)
        ep = await TrajEnvManager(engine, config("both", max_turns=4)).run_episode(spec(0, "arl/Sokoban-v0"))
        traj = ep.trajectory
        assert traj.exit_reason == "engine_error" and said in traj.error
        assert len(traj.turns) == 1 and len(ep.samples) == 1
        check_sample(ep.samples[0], traj.turns, vl_tokenizer)


@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["traj", "step"])
async def test_vllm_samples_are_what_the_trainer_scores(vllm_vl, hf_vl, mode):
    """vLLM plays the episodes; the HF trainer-side forward (same weights) scores each sample's
    response tokens as vLLM did, from the sample's own ids and pixels."""
    from arl.train.update import sequence_logprobs

    manager = (TrajEnvManager if mode == "traj" else StepEnvManager)(vllm_vl, config("both", max_turns=3))
    episodes = [await manager.run_episode(spec(s)) for s in (0, 1)]
    assert all(ep.trajectory.ok for ep in episodes), [ep.trajectory.error for ep in episodes]
    samples = [s for ep in episodes for s in ep.samples]
    for ep in episodes:
        for s in ep.samples:
            check_hf(s, ep.trajectory.turns if mode == "traj" else [ep.trajectory.turns[s.step]], vllm_vl)
    batch = collate(samples, pad_id=vllm_vl.tokenizer.pad_token_id or 0)
    with torch.no_grad():
        lp = sequence_logprobs(hf_vl.model, batch, range(len(samples)), None, micro_batch_size=4)
    on = batch["response_mask"].bool()
    assert (lp[on] - batch["logprobs"][on]).abs().max().item() < 1e-3
