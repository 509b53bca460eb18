"""The memory planner (arl/plan.py, `arl plan`): parameter counts against transformers and the
model cards, LoRA counts against peft, the worked examples, the fit decisions, the CLI table, and
benchmarks/memory.py's predicted-vs-measured smoke run."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from arl import plan as plan_mod
from arl.cli import main
from arl.models import UnknownModelError
from arl.plan import (
    ALL_LINEAR,
    BYTES,
    KNOWN_SHAPES,
    EngineSetting,
    GiB,
    TrainSetting,
    activation_bytes,
    kv_cache_bytes,
    lora_parameter_count,
    model_shape,
    parameter_count,
    plan_memory,
    standard_settings,
)

ROOT = Path(__file__).resolve().parents[1]
# "Number of Parameters" on each model card (billions, as rounded there)
MODEL_CARD_BILLIONS = {"qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.61}


def test_doctests():
    failures, tried = doctest.testmod(plan_mod)
    assert tried >= 8 and failures == 0


def _meta_model(shape):
    """The transformers model of `shape` on the meta device (no memory, no weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
                  num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
                  head_dim=shape.head_dim, intermediate_size=shape.intermediate_size,
                  tie_word_embeddings=shape.tie_word_embeddings)
    with torch.device("meta"):
        if shape.attention_bias:  # the Qwen2 family
            return Qwen2ForCausalLM(Qwen2Config(**common))
        return LlamaForCausalLM(LlamaConfig(attention_bias=False, **common))


@pytest.mark.parametrize("name", sorted(KNOWN_SHAPES))
def test_parameter_count_equals_transformers(name):
    shape = KNOWN_SHAPES[name]
    model = _meta_model(shape)
    assert parameter_count(shape) == sum(p.numel() for p in model.parameters())
    if name in MODEL_CARD_BILLIONS:
        # the cards round 3.086 up and truncate 7.616: agree to the cards' last digit
        assert abs(parameter_count(shape) / 1e9 - MODEL_CARD_BILLIONS[name]) <= 0.01


def test_tiny_shape_and_count_match_the_built_model(tiny_path):
    import torch
    from transformers import AutoModelForCausalLM

    from_dir = model_shape(tiny_path)
    assert attrs.evolve(from_dir, name="tiny", source="") == attrs.evolve(KNOWN_SHAPES["tiny"], source="")
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    assert parameter_count(from_dir) == sum(p.numel() for p in model.parameters()) == 581_888


@pytest.mark.slow
def test_smollm2_shape_and_count_match_the_built_model():
    import torch
    from transformers import AutoModelForCausalLM

    from arl.models import resolve_model

    path = resolve_model("smollm2-135m")
    from_dir = model_shape(path)
    assert attrs.evolve(from_dir, name="smollm2-135m", source="") == attrs.evolve(KNOWN_SHAPES["smollm2-135m"], source="")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert parameter_count(from_dir) == sum(p.numel() for p in model.parameters()) == 134_515_008


def test_lora_count_equals_peft():
    peft = pytest.importorskip("peft")
    shape = KNOWN_SHAPES["smollm2-135m"]
    for rank, targets in ((16, ALL_LINEAR), (4, ("q_proj", "v_proj"))):
        model = peft.get_peft_model(_meta_model(shape), peft.LoraConfig(r=rank, target_modules=list(targets)))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert lora_parameter_count(shape, rank, targets) == trainable


def test_lora_count_edge_cases():
    shape = KNOWN_SHAPES["tiny"]
    assert lora_parameter_count(shape, 0) == 0
    assert lora_parameter_count(shape, 8, []) == 0
    assert lora_parameter_count(shape, 8, ["q_proj", "q_proj"]) == lora_parameter_count(shape, 8, ["q_proj"])
    with pytest.raises(ValueError, match="lm_head"):
        lora_parameter_count(shape, 8, ["lm_head"])
    with pytest.raises(ValueError, match="rank"):
        lora_parameter_count(shape, -1)


def test_kv_cache_and_activation_edge_cases():
    shape = KNOWN_SHAPES["qwen2.5-1.5b"]
    assert kv_cache_bytes(shape, 0) == 0 and activation_bytes(shape, 0, 4096, "bf16", checkpointing=True) == 0
    assert kv_cache_bytes(shape, 1000, "fp32") == 2 * kv_cache_bytes(shape, 1000, "bf16")
    with pytest.raises(ValueError):
        kv_cache_bytes(shape, -1)
    with pytest.raises(ValueError):
        activation_bytes(shape, -1, 4096, "bf16", checkpointing=False)
    # checkpointing keeps one input per layer instead of every layer's activations
    ckpt, full = (activation_bytes(shape, 1, 4096, "bf16", checkpointing=c) for c in (True, False))
    assert ckpt < full / 2


def _saved_bytes_per_token(shape, layers, *, dtype, padded, lora_rank=None, rows=2, seq_len=96):
    """Bytes of the distinct tensors autograd saves in a forward pass + arl's token_logprobs, per
    token, for `shape` cut to `layers` layers (random weights, CPU)."""
    import torch

    from arl.algo import token_logprobs

    model = _meta_model(attrs.evolve(shape, num_layers=layers)).to_empty(device="cpu")
    model = model.to(torch.float32 if dtype == "fp32" else torch.bfloat16).train()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.model.rotary_emb.inv_freq = model.model.rotary_emb.original_inv_freq = (
        1.0 / (10000 ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float32) / shape.head_dim)))
    if lora_rank is not None:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=lora_rank, target_modules=list(ALL_LINEAR)))
    ids = torch.randint(0, shape.vocab_size, (rows, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, seq_len, dtype=torch.long)
    if padded:
        mask[-1, -8:] = 0
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
        token_logprobs(logits, ids)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in saved.items() if ptr not in weights) / (rows * seq_len)


@pytest.mark.parametrize(("name", "dtype", "padded", "lora_rank"), [
    ("smollm2-135m", "fp32", True, None), ("smollm2-135m", "bf16", False, None),
    ("qwen2.5-0.5b", "bf16", True, None), ("smollm2-135m", "fp32", True, 8), ("qwen2.5-0.5b", "bf16", True, 8),
])
def test_layer_activations_equal_what_autograd_saves(name, dtype, padded, lora_rank):
    """`layer_activation_bytes` is exactly the per-layer growth of autograd's saved tensors."""
    if lora_rank is not None:
        pytest.importorskip("peft")
    shape = attrs.evolve(KNOWN_SHAPES[name], vocab_size=512)  # the head is not what this checks
    one, two = (_saved_bytes_per_token(shape, n, dtype=dtype, padded=padded, lora_rank=lora_rank) for n in (1, 2))
    assert two - one == plan_mod.layer_activation_bytes(shape, dtype, 96, padded=padded, lora_rank=lora_rank)


def test_plan_terms():
    shape = KNOWN_SHAPES["qwen2.5-7b"]
    p = parameter_count(shape)
    full32 = plan_memory(shape, TrainSetting(dtype="fp32"))
    assert (full32.weights, full32.master, full32.gradients, full32.optimizer) == (4 * p, 0, 4 * p, 8 * p)
    mixed = plan_memory(shape, TrainSetting(dtype="bf16", fp32_master=True))
    assert (mixed.weights, mixed.master, mixed.gradients, mixed.optimizer) == (2 * p, 4 * p, 2 * p, 8 * p)
    assert mixed.kv_cache == full32.kv_cache == kv_cache_bytes(shape, 32 * 4096)
    assert mixed.engine_weights == 2 * p and mixed.lora_slots == 0
    lora = plan_memory(shape, TrainSetting(lora_rank=16, dtype="bf16", kl_reference=True))
    a = lora_parameter_count(shape, 16)
    assert (lora.weights, lora.gradients, lora.optimizer, lora.reference) == (2 * p + 4 * a, 4 * a, 8 * a, 0)
    assert lora.lora_slots == 2 * 2 * a
    assert plan_memory(shape, TrainSetting(kl_reference=True)).reference == 4 * p  # a second fp32 copy
    trainer_only = plan_memory(shape, TrainSetting(), engine=None)
    assert trainer_only.engine_bytes == 0 and trainer_only.total_bytes == trainer_only.trainer_bytes
    more = plan_memory(shape, TrainSetting(), EngineSetting(concurrency=64))
    assert more.kv_cache == 2 * full32.kv_cache
    assert set(full32.breakdown()) >= {"weights", "kv_cache", "trainer", "engine", "total"}


def test_fits_and_the_readme_table_facts():
    def total(name, setting):
        return plan_memory(KNOWN_SHAPES[name], setting)

    settings = {s.label: s for s in standard_settings(micro_batch=1, seq_len=4096)}
    assert list(settings) == ["full fp32", "full bf16 + fp32 master", "LoRA r=16 bf16", "LoRA r=64 bf16"]
    # the arithmetic: a full fp32 AdamW update of 7B needs > 112 GB before activations
    assert total("qwen2.5-7b", settings["full fp32"]).trainer_bytes > 112e9
    assert not total("qwen2.5-7b", settings["full bf16 + fp32 master"]).fits(141)
    assert total("qwen2.5-7b", settings["LoRA r=16 bf16"]).fits(80)
    assert total("qwen2.5-0.5b", settings["LoRA r=16 bf16"]).fits(24)
    assert not total("qwen2.5-1.5b", settings["full fp32"]).fits(24)
    p = total("qwen2.5-0.5b", settings["full fp32"])
    assert p.fits(p.total_bytes / GiB / 0.9 + 1e-6) and not p.fits(p.total_bytes / GiB / 0.9 - 1e-3)
    assert p.engine_fraction(80) == pytest.approx(p.engine_bytes / (80 * GiB))


def test_model_shape_lookup():
    assert model_shape("Qwen/Qwen2.5-7B-Instruct") is KNOWN_SHAPES["qwen2.5-7b"]
    assert model_shape("SmolLM2-135M-Instruct") is KNOWN_SHAPES["smollm2-135m"]
    with pytest.raises(UnknownModelError):
        model_shape("no-such-model")
    assert set(BYTES) == {"fp32", "bf16"}


def test_cli_plan_table(capsys):
    assert main(["plan", "qwen2.5-0.5b", "qwen2.5-7b", "--gpu-gb", "24", "80", "--lora-rank", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| qwen")]
    assert len(rows) == 2 * 3  # full fp32, full bf16 + master, LoRA r=8
    assert "| 24 GiB | 80 GiB |" in out and "LoRA r=8 bf16" in out
    assert rows[2].count("✓") + rows[2].count("✗") == 2
    assert rows[-1].endswith("| ✗ | ✓ |")  # 7B LoRA: not on 24 GiB, on 80 GiB
    assert main(["plan", "no-such-model"]) == 2


@pytest.mark.slow
def test_memory_benchmark_quick(tmp_path):
    """Predicted and measured (CPU RSS) activations of the tiny model's training step agree."""
    out = tmp_path / "memory.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "|---|" in proc.stdout
    (record,) = json.loads(out.read_text())["points"]
    measured, predicted = record["measured"], record["predicted"]
    assert measured["trainable"] == predicted["trainable"] == parameter_count(KNOWN_SHAPES["tiny"])
    assert 0.7 < measured["activations"] / predicted["activations"] < 1.4
