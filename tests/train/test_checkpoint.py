"""Checkpoints: exact continuation (weights, AdamW moments, LR schedule, RNG streams), plain-HF
loadability, atomic publication and keep-last-k."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arl.train import checkpoint as ck
from arl.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


class _Schedule:
    """LR factor as a bound method, the way the Trainer builds its LambdaLR."""

    def factor(self, step: int) -> float:
        return 1.0 / (1 + step)


def _build(tiny_path: str):
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _Schedule().factor)
    return model, opt, sched


def _train_step(model, opt, sched) -> None:
    # Data drawn from the global torch RNG, so a restored RNG must give the same batch.
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture
def trained(tiny_path):
    torch.manual_seed(0)
    model, opt, sched = _build(tiny_path)
    for _ in range(2):
        _train_step(model, opt, sched)
    return model, opt, sched


def test_round_trip_continues_exactly(tmp_path: Path, tiny_path, tiny_tokenizer, trained):
    model, opt, sched = trained
    gen = np.random.default_rng(7)
    gen.random()
    extra = {"history": [{"step": 1, "train/loss": 1.5}], "rng": gen.bit_generator.state, "config": {"lr": 1e-3}}
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = save_checkpoint(tmp_path, 2, model, tiny_tokenizer, opt, sched, extra_state=extra)
    assert path == tmp_path / "ckpt_000002"
    saved = _params(model)

    # The uninterrupted run: draw, then one more step.
    draws_a = _draws()
    _train_step(model, opt, sched)
    after_a, lr_a = _params(model), sched.get_last_lr()

    # Scramble the global RNGs, then resume into freshly built objects.
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    model2, opt2, sched2 = _build(tiny_path)
    state = load_checkpoint(path, model2, opt2, sched2)
    assert state["step"] == 2
    assert state["extra_state"]["history"] == extra["history"]
    assert state["extra_state"]["config"] == {"lr": 1e-3}
    gen2 = np.random.default_rng(0)
    gen2.bit_generator.state = state["extra_state"]["rng"]
    assert gen2.random() == gen.random()

    _assert_same_params(_params(model2), saved)
    assert model2.lm_head.weight is model2.model.embed_tokens.weight  # still tied after the load
    assert sched2.last_epoch == 2
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s2["param_groups"][0]["lr"] == pytest.approx(_Schedule().factor(2) * 1e-3)

    draws_b = _draws()
    assert draws_b == draws_a
    _train_step(model2, opt2, sched2)
    _assert_same_params(_params(model2), after_a)
    assert sched2.get_last_lr() == lr_a
    s2 = opt2.state_dict()
    for i, st in s1["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(st[key], s2["state"][i][key]), (i, key)


def test_checkpoint_is_a_plain_hf_directory(tmp_path: Path, tiny_tokenizer, trained):
    model, opt, sched = trained
    path = save_checkpoint(tmp_path, 5, model, tiny_tokenizer, opt, sched)
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", ck.STATE_FILE} <= names
    loaded = AutoModelForCausalLM.from_pretrained(path)
    _assert_same_params(_params(loaded), _params(model))
    tok = AutoTokenizer.from_pretrained(path)
    text = "<|im_start|>user\nUp<|im_end|>"
    assert tok(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert tok.chat_template == tiny_tokenizer.chat_template


def test_failed_save_leaves_no_checkpoint(tmp_path: Path, tiny_tokenizer, trained, monkeypatch):
    model, opt, sched = trained
    first = save_checkpoint(tmp_path, 1, model, tiny_tokenizer, opt, sched)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    # Weights and tokenizer are already written when the state file fails.
    monkeypatch.setattr(ck.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, model, tiny_tokenizer, opt, sched)
    monkeypatch.undo()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_000001"]
    assert latest_checkpoint(tmp_path) == first

    # A failed re-save of an existing step keeps the old checkpoint intact.
    monkeypatch.setattr(ck.torch, "save", crash)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 1, model, tiny_tokenizer, opt, sched)
    monkeypatch.undo()
    assert list_checkpoints(tmp_path) == [(1, first)]


def test_leftovers_of_a_hard_crash_are_ignored_then_cleaned(tmp_path: Path, tiny_tokenizer, trained):
    model, opt, sched = trained
    first = save_checkpoint(tmp_path, 1, model, tiny_tokenizer, opt, sched)
    # A process killed mid-save leaves its temp dir (here even with every file in it) ...
    save_checkpoint(tmp_path / "scratch", 3, model, tiny_tokenizer, opt, sched)
    leftover = tmp_path / ".tmp-ckpt_000003-abc"
    (tmp_path / "scratch" / "ckpt_000003").rename(leftover)
    (tmp_path / "scratch").rmdir()
    # ... and a hand-damaged directory without its state file.
    (tmp_path / "ckpt_000009").mkdir()
    (tmp_path / "ckpt_000009" / "config.json").write_text("{}")

    assert latest_checkpoint(tmp_path) == first
    assert list_checkpoints(tmp_path) == [(1, first)]

    second = save_checkpoint(tmp_path, 2, model, tiny_tokenizer, opt, sched)
    assert not leftover.exists()
    assert latest_checkpoint(tmp_path) == second


def test_keep_last_k(tmp_path: Path, tiny_tokenizer, trained):
    model, opt, sched = trained
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, model, tiny_tokenizer, opt, sched, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_000004", "ckpt_000005"]
    # Re-saving an earlier step (a resume from an older checkpoint) keeps the one just written.
    save_checkpoint(tmp_path, 3, model, tiny_tokenizer, opt, sched, keep=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3]
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, 6, model, tiny_tokenizer, opt, sched, keep=0)


def test_mismatched_model_is_an_error(tmp_path: Path, tiny_path, tiny_tokenizer, trained):
    model, opt, sched = trained
    path = save_checkpoint(tmp_path, 1, model, tiny_tokenizer, opt, sched)
    other = torch.nn.Linear(3, 3)
    with pytest.raises(RuntimeError, match="does not match"):
        load_checkpoint(path, other, restore_rng=False)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "ckpt_000099", None)


def test_a_vlm_checkpoint_loads_back(tmp_path: Path, vl_path):
    """transformers saves Qwen2-VL under its original key names (``visual.*``, ``model.layers.*``) and
    maps them back only in from_pretrained: `load_weights` must too, or a VLM run cannot resume."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(vl_path, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # trained: not the weights a fresh load gives
    path = save_checkpoint(tmp_path, 3, model, None, None)
    fresh = AutoModelForImageTextToText.from_pretrained(vl_path, dtype=torch.float32)
    ck.load_weights(path, fresh)
    want = model.state_dict()
    assert any(k.startswith("model.visual.") for k in want)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, want[name]), name
