"""Checkpoints: `run_dir/ckpt_<step:06d>/`, each a plain Hugging Face model directory plus
`trainer_state.pt`.

Layout of one checkpoint::

    ckpt_000040/
        config.json, generation_config.json, model.safetensors   (model.save_pretrained)
        tokenizer.json, tokenizer_config.json, chat_template.jinja (tokenizer.save_pretrained)
        preprocessor_config.json                                    (a VLM's image processor)
        trainer_state.pt   {"format", "step", "optimizer", "scheduler", "rng", "extra_state"}

So any checkpoint loads directly with `AutoModelForCausalLM.from_pretrained` or in vLLM, and
`load_checkpoint` continues a run exactly (optimizer moments, LR schedule, every RNG stream).

A LoRA run's checkpoint (the model is a peft model) holds the adapter instead of the weights:
adapter_config.json + adapter_model.safetensors, loadable with `PeftModel.from_pretrained` and by
vLLM as a `LoRARequest` on the directory; the config names the base it applies to.

Atomicity: a checkpoint is written into a hidden temp directory in `run_dir`, its files fsynced,
then renamed to its final name in one `os.replace`. A crash mid-write leaves at most a hidden
`.tmp-ckpt_*` directory, which `list_checkpoints` never returns and the next save removes.
Deletion (keep-last-k) is the same move in reverse: rename away, then remove.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
FORMAT_VERSION = 1
_CKPT_RE = re.compile(r"^ckpt_(\d+)$")
_TMP_PREFIX = ".tmp-ckpt_"
_WEIGHTS_FILE = "model.safetensors"
_WEIGHTS_INDEX = "model.safetensors.index.json"
_ADAPTER_FILE = "adapter_model.safetensors"  # a LoRA run's checkpoint (peft's name)


def checkpoint_dir(run_dir: str | os.PathLike[str], step: int) -> Path:
    """The directory name a checkpoint of `step` gets: ``run_dir/ckpt_000040``."""
    return Path(run_dir) / f"ckpt_{step:06d}"


def _is_complete(path: Path) -> bool:
    # The rename makes a ckpt_* directory complete by construction; checking the files as well
    # keeps a hand-damaged directory from being picked up as the resume point.
    return (path / STATE_FILE).is_file() and any(
        (path / name).is_file() for name in (_WEIGHTS_FILE, _WEIGHTS_INDEX, _ADAPTER_FILE)
    )


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints in `run_dir` as ``(step, path)``, ascending by step.

    Temp directories of interrupted saves and incomplete directories are ignored.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    out = []
    for p in run_dir.iterdir():
        m = _CKPT_RE.match(p.name)
        if m and p.is_dir() and _is_complete(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1][1] if ckpts else None


# ------------------------------------------------------------------------------------ RNG states


def rng_state() -> dict[str, Any]:
    """Every global RNG stream a training step may draw from."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the streams saved by `rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning(
                "checkpoint has CUDA RNG states for %d devices, this machine has %d: not restored",
                len(cuda), torch.cuda.device_count(),
            )


# ------------------------------------------------------------------------------------------ save


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (the data must be on disk before the rename
    that publishes it, or a power loss could leave a complete-looking directory of empty files)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_dir(path: Path) -> None:
    """Rename away, then delete: an interrupted delete leaves a hidden temp dir, never a
    `ckpt_*` directory with half its files."""
    trash = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}del-{os.getpid()}-", dir=path.parent))
    os.replace(path, trash / path.name)
    shutil.rmtree(trash, ignore_errors=True)


def _remove_stale_temps(run_dir: Path) -> None:
    # Saves are synchronous within one process, so any temp dir here is from a crashed run.
    for p in run_dir.iterdir():
        if p.name.startswith(_TMP_PREFIX) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def _save_model(model: Any, path: Path) -> None:
    # transformers 5 always writes safetensors and no longer takes `safe_serialization`;
    # 4.x needs it spelled out.
    import inspect

    kwargs: dict[str, Any] = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True
    model.save_pretrained(path, **kwargs)


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    model: Any,
    tokenizer: Any | None,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None = None,
    extra_state: dict[str, Any] | None = None,
    *,
    keep: int | None = None,
    image_processor: Any | None = None,
) -> Path:
    """Write ``run_dir/ckpt_{step:06d}/`` atomically and return its path.

    `model` is a transformers `PreTrainedModel` (anything with `save_pretrained`); `tokenizer`
    is saved beside it so the directory is a complete HF model (None skips it), and so is a VLM's
    `image_processor` (its preprocessor_config.json, which the engines' image renderer reads). `extra_state` is
    any picklable dict (metrics history, the trainer's own `np.random.Generator.bit_generator.state`,
    the config as a dict) and comes back from `load_checkpoint` unchanged.

    An existing checkpoint of the same step is replaced. `keep=k` then deletes all but the k
    highest-step checkpoints (the one just written is always kept).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(run_dir)
    final = checkpoint_dir(run_dir, step)

    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{step:06d}-", dir=run_dir))
    try:
        _save_model(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if image_processor is not None:
            image_processor.save_pretrained(tmp)
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": rng_state(),
            "extra_state": extra_state if extra_state is not None else {},
        }
        torch.save(state, tmp / STATE_FILE)
        _fsync_tree(tmp)
        if final.exists():
            _remove_dir(final)
        os.replace(tmp, final)
        _fsync_dir(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    if keep is not None:
        older = [p for s, p in list_checkpoints(run_dir) if p != final]
        for p in older[: max(0, len(older) - (keep - 1))]:
            _remove_dir(p)
    return final


# ------------------------------------------------------------------------------------------ load


def _load_safetensors(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = ckpt_dir / _WEIGHTS_INDEX
    if index.is_file():  # sharded (large models)
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            tensors.update(load_file(ckpt_dir / shard))
        return tensors
    return load_file(ckpt_dir / _WEIGHTS_FILE)


def load_weights(ckpt_dir: str | os.PathLike[str], model: torch.nn.Module) -> None:
    """Copy the checkpoint's safetensors weights into `model` in place (dtype and device of the
    model's parameters are kept).

    Tied weights (e.g. `lm_head.weight` sharing the embedding) are saved once by
    `save_pretrained`; a key missing from the file is fine exactly when its tensor is the same
    object as one that was loaded. Anything else missing or unexpected is an error.
    """
    ckpt_dir = Path(ckpt_dir)
    if (ckpt_dir / _ADAPTER_FILE).is_file():
        _load_adapter(ckpt_dir, model)
        return
    tensors = _load_safetensors(ckpt_dir)
    result = model.load_state_dict(tensors, strict=False)
    if result.unexpected_keys and hasattr(model, "from_pretrained"):
        # transformers writes some models under their original checkpoint names and renames them only
        # in from_pretrained (Qwen2-VL: the file's `visual.*` and `model.layers.*` are the model's
        # `model.visual.*` and `model.language_model.layers.*`): load through it, so a VLM run resumes.
        tensors = _through_from_pretrained(ckpt_dir, model)
        result = model.load_state_dict(tensors, strict=False)

    # Group every parameter/buffer name by tensor identity to find the tied aliases.
    names_by_tensor: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names_by_tensor.setdefault(id(t), []).append(name)
    alias = {n: names for names in names_by_tensor.values() for n in names}
    missing = [k for k in result.missing_keys if not any(a in tensors for a in alias.get(k, []))]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"checkpoint {ckpt_dir} does not match the model: missing {missing}, "
            f"unexpected {list(result.unexpected_keys)}"
        )


def _through_from_pretrained(ckpt_dir: Path, model: Any) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under the in-memory names: ``type(model).from_pretrained`` applies
    transformers' key conversion for the architecture (in the model's dtype, on the CPU)."""
    dtype = next(model.parameters()).dtype
    return type(model).from_pretrained(ckpt_dir, dtype=dtype).state_dict()


def _load_adapter(ckpt_dir: Path, model: Any) -> None:
    """A LoRA checkpoint's adapter into a peft model of the same shape (all of it, nothing else)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    if not hasattr(model, "peft_config"):
        raise RuntimeError(f"checkpoint {ckpt_dir} holds a LoRA adapter, the model has none (set lora.rank)")
    tensors = load_file(ckpt_dir / _ADAPTER_FILE)
    missing = sorted(set(get_peft_model_state_dict(model)) - set(tensors))
    result = set_peft_model_state_dict(model, tensors)
    if missing or result.unexpected_keys:
        raise RuntimeError(f"checkpoint {ckpt_dir} does not match the model's adapter: missing {missing[:5]}, "
                           f"unexpected {list(result.unexpected_keys)[:5]}")


def load_checkpoint(
    ckpt_dir: str | os.PathLike[str],
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore a checkpoint written by `save_checkpoint` into live objects; returns its state
    (``step``, ``extra_state``, ``optimizer``, ``scheduler``, ``rng``, ``format``).

    The optimizer must be built over the same parameters in the same order as when it was saved
    (its state is keyed by parameter index). Pass `model=None` to skip the weights (e.g. when the
    model was already built with `from_pretrained(ckpt_dir)`).
    """
    ckpt_dir = Path(ckpt_dir)
    if not _is_complete(ckpt_dir):
        raise FileNotFoundError(f"{ckpt_dir} is not a complete checkpoint")
    # weights_only=False: the state holds numpy RNG arrays and arbitrary `extra_state`; the file
    # is one this module wrote into the run directory, not untrusted input.
    state: dict[str, Any] = torch.load(ckpt_dir / STATE_FILE, map_location="cpu", weights_only=False)
    if model is not None:
        load_weights(ckpt_dir, model)
    if optimizer is not None:
        if state.get("optimizer") is None:
            raise ValueError(f"{ckpt_dir} has no optimizer state")
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        if state.get("scheduler") is None:
            raise ValueError(f"{ckpt_dir} has no scheduler state")
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state
