"""The README demo: the tiny model learns FrozenLake 4x4 from scratch on a CPU.

`make demo` = `arl demo`: build the tiny model, start the in-process vLLM engine, run the
answer-format warm-start, then GiGPO (configs/tiny_frozenlake_gigpo.yaml), and report validation
success before and after RL on a fixed panel of seeds, with the learning-curve PNG.
"""

from __future__ import annotations

from pathlib import Path

DEMO_CONFIG = Path(__file__).resolve().parent / "configs" / "tiny_frozenlake_gigpo.yaml"  # package data


def render_sample(tokenizer, sample) -> str:
    """The sample's text with engine-generated (loss-masked) spans in [[...]]."""
    out, span, masked = [], [], None
    for tok, m in zip(sample.input_ids, sample.response_mask, strict=True):
        if masked is not None and m != masked:
            text = tokenizer.decode(span)
            out.append(f"[[{text}]]" if masked else text)
            span = []
        span.append(tok)
        masked = m
    text = tokenizer.decode(span)
    out.append(f"[[{text}]]" if masked else text)
    return "".join(out)


def free_run_name(config) -> str:
    """``config.name``, or ``name-2``, ``name-3``, ... : the first that has no run directory yet."""
    base, k = config.name, 1
    name = base
    while (Path(config.out_dir) / name).exists():
        k += 1
        name = f"{base}-{k}"
    return name


def before_after(history: list[dict]) -> tuple[dict, dict] | None:
    """The first and last evaluation rows of a run (warm-start level, final level)."""
    evals = [row for row in history if "eval/success_rate" in row]
    return (evals[0], evals[-1]) if evals else None
