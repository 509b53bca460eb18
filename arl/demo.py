"""The README demo: the tiny model learns FrozenLake 4x4 from scratch on a CPU.

`make demo` = `arl demo`: build the tiny model, start the in-process vLLM engine, run the
answer-format warm-start, then GiGPO (configs/tiny_frozenlake_gigpo.yaml), and report validation
success before and after RL on a fixed panel of seeds, with the learning-curve PNG.
"""

from __future__ import annotations

from pathlib import Path

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny_frozenlake_gigpo.yaml"


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


def before_after(history: list[dict]) -> tuple[dict, dict] | None:
    """The first and last evaluation rows of a run (warm-start level, final level)."""
    evals = [row for row in history if "eval/success_rate" in row]
    return (evals[0], evals[-1]) if evals else None
