"""The memory planner (arl/plan/, `arl plan`): parameter counts against transformers and the
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
    planner,
    standard_settings,
    terms,
)

ROOT = Path(__file__).resolve().parents[1]
# "Number of Parameters" on each model card (billions, as rounded there)
MODEL_CARD_BILLIONS = {"qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.61,
                       "qwen2.5-vl-3b": 3.75, "qwen2.5-vl-7b": 8.29}


@pytest.mark.parametrize("module", [planner, terms], ids=lambda m: m.__name__)
def test_doctests(module):
    failures, tried = doctest.testmod(module)
    assert tried >= 2 and failures == 0


def _meta_model(shape):
    """The transformers model of `shape` on the meta device (no memory, no weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
                  num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
                  head_dim=shape.head_dim, intermediate_size=shape.intermediate_size,
                  tie_word_embeddings=shape.tie_word_embeddings)
    if shape.vision_params:  # a Qwen2-VL-family model: the decoder above plus its vision tower
        return _meta_vl_model(shape, common)
    with torch.device("meta"):
        if shape.attention_bias:  # the Qwen2 family
            return Qwen2ForCausalLM(Qwen2Config(**common))
        return LlamaForCausalLM(LlamaConfig(attention_bias=False, **common))


def _meta_vl_model(shape, text):
    """Qwen2.5-VL (its published vision_config) or, for the zoo's tiny-vl, Qwen2-VL (TinyVLSpec's)."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    from arl.models.tiny_vl import TinyVLSpec

    with torch.device("meta"):
        if shape.name == "tiny-vl":
            spec = TinyVLSpec()
            vision = dict(depth=spec.vision_depth, embed_dim=spec.vision_embed_dim, hidden_size=shape.hidden_size,
                          num_heads=spec.vision_heads, mlp_ratio=spec.vision_mlp_ratio)
            return Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision,
                                                                 tie_word_embeddings=shape.tie_word_embeddings))
        vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=shape.hidden_size)
        return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                                                                   tie_word_embeddings=shape.tie_word_embeddings))


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


def _random_model(shape, layers, *, dtype, lora_rank=None):
    """The transformers model of `shape` cut to `layers` layers, random weights, CPU, train mode
    (with a peft LoRA adapter on every linear layer when `lora_rank` is given)."""
    import torch

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
    return model


def _saved_bytes(model, vocab_size, *, padded, rows=2, seq_len=96, response_len=None):
    """Bytes of the distinct tensors (not weights) autograd saves in a forward pass + arl's
    token_logprobs: on every position (`response_len` None), or as the update computes them, on the
    `predicting_positions` of rows whose last `response_len` tokens are the response
    (`response_logits` + `token_logprobs(positions=...)`)."""
    import torch

    from arl.algo import predicting_positions, token_logprobs
    from arl.train.update import response_logits

    ids = torch.randint(0, vocab_size, (rows, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, seq_len, dtype=torch.long)
    if padded:
        mask[-1, -8:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if response_len is None:
            token_logprobs(model(**inputs).logits, ids)
        else:
            response_mask = torch.zeros(rows, seq_len)
            response_mask[:, seq_len - response_len :] = 1
            keep = predicting_positions(response_mask)
            assert keep.numel() == response_len
            token_logprobs(response_logits(model, inputs, keep), ids, positions=keep)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in saved.items() if ptr not in weights)


def _saved_bytes_per_token(shape, layers, *, dtype, padded, lora_rank=None, rows=2, seq_len=96):
    model = _random_model(shape, layers, dtype=dtype, lora_rank=lora_rank)
    return _saved_bytes(model, shape.vocab_size, padded=padded, rows=rows, seq_len=seq_len) / (rows * seq_len)


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
    assert two - one == terms.layer_activation_bytes(shape, dtype, 96, padded=padded, lora_rank=lora_rank)


@pytest.mark.parametrize(("name", "dtype", "lora_rank"), [
    ("smollm2-135m", "fp32", None), ("smollm2-135m", "bf16", None), ("smollm2-135m", "bf16", 8),
])
def test_kept_positions_activations_equal_what_autograd_saves(name, dtype, lora_rank):
    """The head on response_len < seq_len positions per row, as the update runs it: what autograd
    saves through the whole forward is `activation_bytes` at the head's backward (the peak with a
    real vocabulary and one micro-batch) less the logits the loss loop holds (bV) and the
    backward's 3 * 4V, per kept position; plus two int64 index vectors (the kept positions, shared
    by the rows) and, with LoRA, less the first layer's first norm (the frozen embedding's output
    needs no gradient)."""
    if lora_rank is not None:
        pytest.importorskip("peft")
    # `_random_model` unties lm_head from the embedding (to_empty copies them apart)
    shape = attrs.evolve(KNOWN_SHAPES[name], num_layers=1, tie_word_embeddings=False)
    b, v, h = BYTES[dtype], shape.vocab_size, shape.hidden_size
    rows, seq_len = 2, 96
    model = _random_model(shape, 1, dtype=dtype, lora_rank=lora_rank)
    for response_len in (24, 72):  # two lengths pin both the per-token and the per-position terms
        plan = activation_bytes(shape, rows, seq_len, dtype, checkpointing=False, lora_rank=lora_rank,
                                response_len=response_len, accumulating=False)
        unsaved = rows * response_len * (b * v + 3 * 4 * v)
        index_vectors = 2 * 8 * response_len
        first_norm = 0 if lora_rank is None else rows * seq_len * (4 * h + 4)
        measured = _saved_bytes(model, v, padded=True, rows=rows, seq_len=seq_len, response_len=response_len)
        assert measured == plan - unsaved + index_vectors - first_norm
    # the whole row through the head costs the vocabulary terms at every position
    whole = activation_bytes(shape, rows, seq_len, dtype, checkpointing=False, lora_rank=lora_rank, accumulating=False)
    a_head = b * v + terms.head_activation_bytes(shape, dtype, lora_rank=lora_rank) + 3 * 4 * v
    assert whole - plan == rows * (seq_len - 72) * a_head


def test_accumulating_full_fine_tune_adds_lm_heads_weight_gradient():
    """A later micro-batch's lm_head backward holds its weight's gradient (bVH) beside the logits
    and their gradient: the peak of a full fine-tune with short responses, not with long ones."""
    shape, b = KNOWN_SHAPES["qwen2.5-7b"], 2
    v, h = shape.vocab_size, shape.hidden_size
    a_head = b * v + terms.head_activation_bytes(shape, "bf16") + 3 * 4 * v

    def act(response_len, accumulating, lora_rank=None):
        return activation_bytes(shape, 1, 4096, "bf16", checkpointing=False, response_len=response_len,
                                accumulating=accumulating, lora_rank=lora_rank)

    assert act(256, True) - act(256, False) == b * v * h - 256 * (a_head - 2 * b * v)
    assert act(1024, True) == act(1024, False)
    assert act(256, True, lora_rank=16) == act(256, False, lora_rank=16)  # lm_head is frozen
    assert activation_bytes(shape, 0, 4096, "bf16", checkpointing=False) == 0


def test_tied_embedding_gradient_can_be_the_peak():
    """A tied lm_head's gradient waits for the embedding's: with few tokens the end of the backward,
    two (accumulating: three) vocabulary-sized gradients, is a full fine-tune's peak."""
    shape, b = KNOWN_SHAPES["qwen2.5-0.5b"], 2
    assert shape.tie_word_embeddings
    w = b * shape.vocab_size * shape.hidden_size
    logits = 8 * b * shape.vocab_size

    def act(accumulating, **kw):
        return activation_bytes(shape, 1, 64, "bf16", checkpointing=False, response_len=8, accumulating=accumulating, **kw)

    assert act(True) == logits + 3 * w
    assert act(False) == logits + 2 * w + 64 * b * shape.hidden_size
    assert act(True, lora_rank=16) < w  # LoRA: lm_head and the embedding are frozen
    untied = attrs.evolve(shape, tie_word_embeddings=False)
    assert activation_bytes(untied, 1, 64, "bf16", checkpointing=False, response_len=8, accumulating=False) < w


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


def test_response_len_charges_the_head_to_response_positions():
    shape = KNOWN_SHAPES["qwen2.5-1.5b"]
    setting = TrainSetting(lora_rank=16, dtype="bf16", seq_len=4096, gradient_checkpointing=True)
    whole = plan_memory(shape, setting, None)
    assert plan_memory(shape, attrs.evolve(setting, response_len=4096), None) == whole
    short = plan_memory(shape, attrs.evolve(setting, response_len=512), None)
    # the vocabulary dominates, but the layers still see 4096 tokens: more than an eighth of it
    assert whole.activations / 8 < short.activations < whole.activations / 3
    # the step's temporaries hold the last micro-batch's logits: at its kept positions only
    assert whole.optimizer_temp - short.optimizer_temp == (4096 - 512) * shape.vocab_size * 2
    with pytest.raises(ValueError, match="response_len"):
        TrainSetting(seq_len=256, response_len=257)
    with pytest.raises(ValueError, match="response_len"):
        activation_bytes(shape, 1, 256, "bf16", checkpointing=True, response_len=-1)
    # a short response in a tiny-vocabulary model: the peak moves to a layer's backward, where
    # the head's saved tensors are gone and only its logits (bV per kept position) remain
    tiny = KNOWN_SHAPES["tiny"]
    one, two = (activation_bytes(tiny, 4, 256, "fp32", checkpointing=False, response_len=r) for r in (8, 16))
    assert two - one == 4 * 8 * 4 * tiny.vocab_size


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


def test_sleep_mode_counts_the_larger_phase():
    """engine.sleep_mode: the rollout holds the trainer's state and the engine, the update the whole
    trainer and the engine's overhead; the peak is the larger, never more than both summed."""
    shape, setting = KNOWN_SHAPES["qwen2.5-1.5b"], standard_settings()[0]  # full fp32: the update dominates
    awake, asleep = plan_memory(shape, setting), plan_memory(shape, setting, EngineSetting(sleep=True))
    assert asleep.total_bytes == max(awake.weights + awake.optimizer + awake.engine_bytes,
                                     awake.trainer_bytes + awake.engine_overhead)
    assert awake.engine_overhead < awake.engine_bytes and asleep.total_bytes < awake.total_bytes
    assert not awake.fits(24) and asleep.total_bytes < awake.total_bytes - awake.kv_cache
    assert "engine_sleeps" not in asleep.breakdown()


def test_vl_shapes_resolve_by_name_and_from_the_built_tiny_vl():
    from arl.models import resolve_model

    assert model_shape("Qwen/Qwen2.5-VL-3B-Instruct") is KNOWN_SHAPES["qwen2.5-vl-3b"]
    assert model_shape("Qwen2.5-VL-7B-Instruct") is KNOWN_SHAPES["qwen2.5-vl-7b"]
    from_dir = model_shape(resolve_model("tiny-vl"))
    assert attrs.evolve(from_dir, name="tiny-vl", source="") == attrs.evolve(KNOWN_SHAPES["tiny-vl"], source="")


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
    assert main(["plan", "qwen2.5-7b", "--lora-rank", "8", "--response-len", "512"]) == 0
    out = capsys.readouterr().out
    short = [line for line in out.splitlines() if line.startswith("| qwen")]
    assert "512 response positions per row" in out
    assert float(short[-1].split(" | ")[7]) < float(rows[-1].split(" | ")[7])  # activations, LoRA r=8
    assert main(["plan", "tiny", "--seq-len", "256", "--response-len", "257"]) == 2
    capsys.readouterr()
    assert main(["plan", "qwen2.5-7b", "--lora-rank", "8", "--sleep-mode"]) == 0
    out = capsys.readouterr().out
    slept = [line for line in out.splitlines() if line.startswith("| qwen")]
    assert "Sleep mode: total = max(" in out
    assert float(slept[0].split(" | ")[11]) < float(rows[3].split(" | ")[11])  # total, 7B full fp32


@pytest.mark.slow
def test_activation_moments_equal_the_profilers_count(tmp_path):
    """benchmarks/memory.py --points peaks: the tiny model's live tensor bytes at its peak, counted
    by torch's profiler, against `activation_bytes`: exact where the head, lm_head or embedding
    moment is the peak, within 10% where a layer's backward (3bI, an estimate) is."""
    out = tmp_path / "peaks.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--points", "peaks",
                           "--models", "tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = json.loads(out.read_text())["points"]
    for setting, measured, predicted in zip(record["point"]["settings"], record["measured"]["peaks"],
                                            record["predicted"]["peaks"], strict=True):
        long_full = setting["response_len"] > 48 and setting["lora_rank"] is None and not setting["checkpointing"]
        assert abs(measured / predicted - 1) < (1e-3 if long_full else 0.1), (setting, measured, predicted)


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
