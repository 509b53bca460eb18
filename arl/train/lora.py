"""LoRA on the policy (``config.lora.rank > 0``): peft adapters in the trainer, only they go to the engine.

    model = wrap(model, config.lora)           # base weights frozen, low-rank A and B trainable
    await engine.update_adapter(adapter_of(model))   # megabytes, not the model

What changes against full fine-tuning, and why:

- The KL reference is the base model with the adapter switched off (`AdapterDisabled`): the same
  weights, no second copy of the model.
- A format warm-start (`sft.steps`) trains the *base* weights (`base_training`): it stands in for
  the pretrained checkpoint a real run starts from (the tiny model is random-init), and it makes
  the KL anchor the warm-started policy, as without LoRA. Its result is saved once per run as a
  plain HF model directory (`save_base`, ``run_dir/base/``), which the checkpoints' adapters name
  as their base, so a checkpoint loads with `PeftModel.from_pretrained` and in vLLM.
- Checkpoints hold the adapter (peft's adapter_config.json + adapter_model.safetensors) and the
  optimizer state of the adapter's parameters only.
- Engines without a LoRA path get the merged weights (`merged_weights`: W + alpha/r * B @ A).
- ``optim.precision: bf16`` (`arl.train.precision`): the base is stored in bf16 and has no fp32
  copy; the adapter stays fp32 (the only fp32 master copy: it is all the optimizer steps). A format
  warm-start then steps the bf16 base itself (a stand-in for a pretrained checkpoint, which real
  runs start from instead).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import torch

from arl.engine.base import LoRAAdapter

BASE_DIR = "base"  # run_dir/base: the warm-started base weights the adapters apply to
ADAPTER_NAME = "default"  # peft's name for the one adapter


def vision_towers(model: Any) -> list[str]:
    """The module names of a VLM's vision tower(s) (the modules built from its ``vision_config``,
    outermost only: ``model.visual`` for Qwen2-VL and Qwen2.5-VL); [] for a text model."""
    vision_config = getattr(getattr(model, "config", None), "vision_config", None)
    if vision_config is None:
        return []
    found: list[str] = []
    for name, module in model.named_modules():
        if isinstance(getattr(module, "config", None), type(vision_config)) and name and not any(
                name.startswith(f"{outer}.") for outer in found):
            found.append(name)
    return found


def wrap(model: Any, lora: Any) -> Any:
    """A peft `PeftModelForCausalLM` around ``model``: LoRA layers on ``lora.target_modules``, B = 0 (the
    wrapped model computes what ``model`` did), every base weight frozen. The adapter is fp32 whatever
    the base's dtype (a bf16 base: peft upcasts its input for the adapter and casts the sum back).

    A VLM's vision tower gets no adapter (its modules are excluded by name, `vision_towers`: Qwen2.5-VL's
    vision MLPs are ``gate_proj``/``up_proj``/``down_proj`` too) unless ``lora.vision`` asks for it; it
    stays frozen either way, and vLLM's LoRA path serves the language model's adapters."""
    import re

    from peft import LoraConfig, get_peft_model

    towers = [] if getattr(lora, "vision", False) else vision_towers(model)
    exclude = "|".join(rf"{re.escape(t)}\..*" for t in towers) or None
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), exclude_modules=exclude, bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config, adapter_name=ADAPTER_NAME, autocast_adapter_dtype=True)


def engine_config(config: Any) -> Any:
    """``config.engine``, started so that it serves LoRA adapters when the run trains one (vLLM must
    be told at start-up; its ``engine.extra`` settings win). Other backends need nothing.

    ``lora.vision`` (adapters on a VLM's vision tower too): vLLM's LoRA path applies adapters to the
    language model only and drops the vision tower's with a log line, so the engine would serve another
    policy than the trainer's; vLLM is then started without LoRA and gets the merged weights at each
    push, and an ``engine.extra`` that turns vLLM's LoRA on anyway is a `ConfigError`."""
    if config.lora.rank <= 0 or config.engine.backend not in ("vllm", "vllm-async"):
        return config.engine
    if config.lora.vision:
        if config.engine.extra.get("enable_lora"):
            from arl.config import ConfigError

            raise ConfigError("lora.vision: vLLM's LoRA path ignores adapters on the vision tower, so the engine "
                              "would not serve the trained policy; leave engine.extra.enable_lora unset (the "
                              "engine then gets the merged weights) or set lora.vision=false")
        return config.engine
    from arl.engine.vllm_lora import lora_engine_args

    extra = {**lora_engine_args(config.lora.rank), **config.engine.extra}
    return attrs.evolve(config.engine, extra=extra)


# -------------------------------------------------------------------------------- weights by name


def _base_parameters(model: Any) -> dict[str, torch.Tensor]:
    """HF name -> live base tensor of a peft model (``x.q_proj.base_layer.weight`` is ``x.q_proj.weight``
    in the model's own checkpoint names)."""
    inner = model.get_base_model()
    return {name.replace(".base_layer.", "."): t for name, t in inner.state_dict(keep_vars=True).items()
            if ".lora_" not in name}


def base_weights(model: Any) -> list[tuple[str, torch.Tensor]]:
    """The base weights under the adapter, by HF name (what `update_weights` and vLLM take)."""
    return [(name, t.detach()) for name, t in _base_parameters(model).items()]


@torch.no_grad()
def merged_weights(model: Any) -> list[tuple[str, torch.Tensor]]:
    """Base weights with the adapter folded in (W + alpha/r * B @ A), by HF name, without touching
    the model: for engines that have no LoRA path."""
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    delta = {f"{name}.weight": module.get_delta_weight(ADAPTER_NAME)
             for name, module in inner.named_modules() if isinstance(module, LoraLayer)}
    return [(name, t + delta[name] if name in delta else t) for name, t in base_weights(model)]


def adapter_of(model: Any) -> LoRAAdapter:
    """The current adapter as a `LoRAAdapter` (peft names and config; tensors copied, so the engine
    may read them while training goes on). Its merged weights are computed from the model when an
    engine asks for them, which is during the push."""
    from peft import get_peft_model_state_dict

    tensors = {k: t.detach().clone() for k, t in get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME).items()}
    config = model.peft_config[ADAPTER_NAME].to_dict()
    return LoRAAdapter(config, tensors, merged=lambda: merged_weights(model))


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    """What the optimizer steps (the adapter's A and B under LoRA), in a fixed order for resume."""
    return [p for p in model.parameters() if p.requires_grad]


def param_groups(model: Any, lr: float, vision_lr: float | None) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: every trainable parameter at ``lr``, or, with ``vision_lr``
    set and a VLM, the vision tower(s) (`vision_towers`) in a second group at ``vision_lr`` (0: the
    tower stays as it is). Fixed order (decoder first), so a resume restores each group's moments.

    >>> [len(g["params"]) for g in param_groups(torch.nn.Linear(2, 2), 1e-3, 1e-5)]
    [2]
    """
    towers = tuple(f"{t}." for t in vision_towers(model)) if vision_lr is not None else ()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    vision = [p for n, p in named if n.startswith(towers)] if towers else []
    ids = {id(p) for p in vision}
    groups = [{"params": [p for _, p in named if id(p) not in ids], "lr": lr}]
    if vision:
        groups.append({"params": vision, "lr": vision_lr})
    return groups


# ------------------------------------------------------------------------- KL reference, warm-start


class AdapterDisabled:
    """The base model inside a peft model, callable like a model: the KL reference without a copy.

    Every call switches the adapter off for its duration; the trainer calls it only from the update
    thread, which is the only one using the model then.
    """

    def __init__(self, model: Any):
        self.model = model

    def __call__(self, **inputs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(**inputs)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()


@contextmanager
def base_training(model: Any) -> Iterator[None]:
    """Within: the adapter is off and the base weights are trainable (the format warm-start trains
    them; an optimizer over all parameters then moves only the base, as the adapter gets no gradient)."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    with model.disable_adapter():
        for p in frozen:
            p.requires_grad_(True)
        try:
            yield
        finally:
            for p in frozen:  # and no warm-start gradient is left on them to leak into RL's grad norm
                p.requires_grad_(False)
                p.grad = None


# ------------------------------------------------------------------------------ the base directory


def save_base(run_dir: str | os.PathLike[str], model: Any, tokenizer: Any = None,
              image_processor: Any = None) -> Path:
    """Write the base weights as an HF model directory ``run_dir/base`` (atomically) and make it the
    base the adapter's config names, so saved adapters load on it in peft and vLLM; a VLM's
    ``image_processor`` goes beside them, so an engine serves the base images too."""
    final = Path(run_dir) / BASE_DIR
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{BASE_DIR}-", dir=run_dir))
    try:
        model.get_base_model().save_pretrained(tmp, state_dict=dict(base_weights(model)))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if image_processor is not None:
            image_processor.save_pretrained(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    model.peft_config[ADAPTER_NAME].base_model_name_or_path = str(final.resolve())
    return final


def load_base(run_dir: str | os.PathLike[str], model: Any) -> bool:
    """Copy ``run_dir/base``'s weights into the model's base (a resumed run after a warm-start);
    False when the run has none (its base is the initial model)."""
    from arl.models.tiny_vl import auto_model_class

    path = Path(run_dir) / BASE_DIR
    if not (path / "config.json").is_file():
        return False
    saved = auto_model_class(path).from_pretrained(path, dtype=torch.float32).state_dict()  # a VLM: its vision tower too
    live = _base_parameters(model)
    if set(saved) != set(live):
        raise RuntimeError(f"{path} does not match the model: {sorted(set(saved) ^ set(live))[:5]}")
    with torch.no_grad():
        for name, t in live.items():
            t.copy_(saved[name])
    model.peft_config[ADAPTER_NAME].base_model_name_or_path = str(path.resolve())
    return True


def remove_base(run_dir: str | os.PathLike[str]) -> None:
    """A fresh run's leftover ``run_dir/base`` (the run it belonged to was overwritten)."""
    shutil.rmtree(Path(run_dir) / BASE_DIR, ignore_errors=True)


__all__ = [
    "AdapterDisabled", "adapter_of", "base_training", "base_weights", "engine_config", "load_base",
    "merged_weights", "param_groups", "remove_base", "save_base", "trainable_parameters", "vision_towers", "wrap",
]
