"""Every token of a training sample as coloured HTML: role, advantage, log-probs, ratio, turns.

Roles: ``prompt`` (context before the first generated token), ``response`` (engine-generated and
trained: response_mask 1) and ``masked`` (everything else after the first response token: closing
tokens, later observations in trajectory mode, and every response token of an abnormal episode
when ``mask_abnormal``). Each token is one ``<span class="tok ROLE">`` whose ``title`` (the hover
text) holds its position, id, text, role and, on response tokens, the advantage, the engine
log-prob, the trainer log-prob and the importance ratio exp(trainer - engine) when given.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

CSS = """
.arl-viz{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;line-height:1.7;color:#222}
.arl-viz .sample{border:1px solid #ccc;border-radius:6px;padding:8px;margin:8px 0;background:#fff}
.arl-viz .head{font-family:system-ui,sans-serif;font-size:12px;color:#444;margin-bottom:6px}
.arl-viz .head b{color:#000}
.arl-viz .anchor{display:inline-block;padding:0 6px;border-radius:8px;color:#fff;font-size:11px}
.arl-viz .toks{white-space:pre-wrap;word-break:break-all}
.arl-viz .tok{border-radius:2px;padding:0 1px;margin:0 1px 0 0}
.arl-viz .tok.prompt{background:#e8e8e8;color:#555}
.arl-viz .tok.response{background:#b7e4b0;color:#063}
.arl-viz .tok.masked{background:#f6d2d2;color:#900;text-decoration:line-through}
.arl-viz .tok.adv-pos{box-shadow:inset 0 -3px 0 #2a9d3a}
.arl-viz .tok.adv-neg{box-shadow:inset 0 -3px 0 #d33}
.arl-viz .turn{display:inline-block;background:#345;color:#fff;font-size:10px;padding:0 4px;margin:0 3px;border-radius:3px}
.arl-viz pre.frame{display:inline-block;vertical-align:top;background:#fffbe6;border:1px solid #e6d98c;padding:4px 6px;margin:2px 4px;line-height:1.2}
.arl-viz .tok.image{display:inline-block;vertical-align:top;background:#dde7f5;padding:2px;margin:2px}
.arl-viz .tok.image img{display:block;image-rendering:pixelated;max-width:168px}
.arl-viz .legend span{margin-right:8px}
"""

LEGEND = ('<div class="legend"><span class="tok prompt">prompt</span><span class="tok response">trained response</span>'
          '<span class="tok masked">masked</span><span class="turn">turn</span> hover a token for advantage, '
          'log-probs and ratio</div>')


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def _per_token(value: Any, n: int, name: str) -> list[float | None]:
    """A scalar (broadcast to the response tokens), a list aligned with input_ids, or None."""
    if value is None:
        return [None] * n
    if isinstance(value, (int, float)):
        return [float(value)] * n
    values = [None if v is None else float(v) for v in value]
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} values, the sample has {n} tokens")
    return values


def _token_text(tokenizer: Any, token_id: int) -> str:
    if tokenizer is None:
        return f"<{token_id}>"
    return tokenizer.decode([token_id])


def token_rows(sample: Any, tokenizer: Any = None, *, advantages: Any = None, trainer_logprobs: Any = None,
               mask_abnormal: bool = False) -> list[dict[str, Any]]:
    """One dict per token: index, id, text, role, turn, advantage, engine_logprob, trainer_logprob,
    ratio (the last four None where they do not apply)."""
    ids, mask, engine = list(sample.input_ids), list(sample.response_mask), list(sample.old_logprobs)
    n = len(ids)
    if advantages is None:
        advantages = (sample.info or {}).get("advantages", (sample.info or {}).get("advantage"))
    adv = _per_token(advantages, n, "advantages")
    trainer = _per_token(trainer_logprobs, n, "trainer_logprobs")
    dropped = mask_abnormal and not getattr(sample, "ok", True)
    rows, seen_response, turn, prev = [], False, -1, 0
    for i, (tok, m) in enumerate(zip(ids, mask, strict=True)):
        if m and not prev:
            turn += 1
        prev = m
        seen_response = seen_response or bool(m)
        role = "response" if m and not dropped else ("prompt" if not seen_response else "masked")
        generated = bool(m)
        t_lp = trainer[i] if generated else None
        rows.append({
            "index": i, "id": int(tok), "text": _token_text(tokenizer, int(tok)), "role": role,
            "turn": turn if generated else None, "turn_start": bool(m) and (i == 0 or not mask[i - 1]),
            "advantage": adv[i] if generated else None,
            "engine_logprob": float(engine[i]) if generated else None,
            "trainer_logprob": t_lp,
            "ratio": math.exp(t_lp - float(engine[i])) if generated and t_lp is not None else None,
        })
    return rows


def image_spans(sample: Any) -> dict[int, tuple[int, int, Any]]:
    """Where ``sample.rendered``'s images stand in ``sample.input_ids``: first position -> (its number
    of image tokens, the image's index, the image). Empty for a text sample. The k-th image owns the
    next ``grid_t * grid_h * grid_w / merge**2`` image tokens in order (its ``image_grid_thw`` row),
    the rendered prompt's own count.

    >>> import numpy as np
    >>> from arl.engine.image_prompt import ImagePrompt, RenderedPrompt
    >>> r = RenderedPrompt(ImagePrompt([5, 9, 6, 9], ["a", "b"]), (5, 9, 9, 6, 9, 9), np.zeros((16, 3)),
    ...                    np.array([[1, 2, 4], [1, 2, 4]]), ("a", "b"), 9)
    >>> class S: input_ids, rendered = [5, 9, 9, 6, 9, 9, 7], r
    >>> {k: v[:2] for k, v in image_spans(S).items()}
    {1: (2, 0), 4: (2, 1)}
    """
    rendered = getattr(sample, "rendered", None)
    if rendered is None:
        return {}
    token = int(rendered.image_token_id)
    patches = np.asarray(rendered.image_grid_thw).prod(axis=1)  # per image, before the merge
    tokens = int(np.sum(np.asarray(rendered.input_ids) == token))  # after it, all images
    merged = int(patches.sum()) // tokens if tokens else 1  # merge**2 patches per image token
    sizes = [int(p) // merged for p in patches]
    positions = [i for i, t in enumerate(sample.input_ids) if int(t) == token]
    spans, at = {}, 0
    for k, n in enumerate(sizes):
        if at + n > len(positions):
            break
        spans[positions[at]] = (n, k, rendered.images[k])
        at += n
    return spans


def _image_span(index: int, n: int, k: int, image: Any) -> str:
    from arl.engine.images import to_data_url

    title = f"#{index}-#{index + n - 1}: image {k} ({n} image tokens)"
    return (f'<span class="tok image" title="{html.escape(title)}">'
            f'<img src="{to_data_url(image)}" alt="image {k}"></span>')


def _title(row: dict[str, Any]) -> str:
    parts = [f"#{row['index']} id={row['id']} {row['text']!r}", row["role"]]
    if row["turn"] is not None:
        parts.append(f"turn={row['turn']}")
    for key, label in (("advantage", "adv"), ("engine_logprob", "engine_lp"), ("trainer_logprob", "trainer_lp"),
                       ("ratio", "ratio")):
        if row[key] is not None:
            parts.append(f"{label}={_fmt(row[key])}")
    return " | ".join(parts)


def _anchor_colour(state_key: str | None) -> str:
    if not state_key:
        return "#999"
    try:
        hue = int(state_key[:6], 16) % 360
    except ValueError:
        hue = sum(map(ord, state_key)) % 360
    return f"hsl({hue},55%,40%)"


def _header(sample: Any, anchor_size: int | None) -> str:
    e = html.escape
    key = sample.state_key
    anchor = (f'<span class="anchor" style="background:{_anchor_colour(key)}" title="anchor group (state key)">'
              f'anchor {e(str(key))}{"" if anchor_size is None else f" ×{anchor_size}"}</span>')
    fields = [("traj", sample.traj_id), ("group", sample.group_id), ("step", sample.step), ("env", sample.env_id),
              ("step score", _fmt(sample.step_score)), ("episode", _fmt(sample.episode_score)),
              ("exit", sample.exit_reason), ("valid", sample.action_valid), ("policy", sample.policy_version),
              ("tokens", f"{len(sample.input_ids)} ({sample.num_response_tokens} trained)")]
    return '<div class="head">' + " ".join(f"{k} <b>{e(str(v))}</b>" for k, v in fields) + f" {anchor}</div>"


def sample_text(tokenizer: Any, sample: Any) -> str:
    """The sample's text with its engine-generated (trained) spans in ``[[...]]``: the plain-text view."""
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


def sample_html(sample: Any, tokenizer: Any = None, *, advantages: Any = None, trainer_logprobs: Any = None,
                frames: Sequence[str] | None = None, mask_abnormal: bool = False, anchor_size: int | None = None,
                standalone: bool = True) -> str:
    """One sample as HTML. ``advantages``/``trainer_logprobs``: a scalar or one value per input token;
    ``frames``: the game frame of each turn in the sample (default ``sample.info["observation"]``);
    ``standalone``: wrap in the stylesheet (False: the bare ``<div class="sample">``)."""
    if frames is None and (sample.info or {}).get("observation") is not None:
        frames = [sample.info["observation"]]
    frames = list(frames or [])
    parts = [_header(sample, anchor_size), '<div class="toks">']
    images, skip = image_spans(sample), 0
    for row in token_rows(sample, tokenizer, advantages=advantages, trainer_logprobs=trainer_logprobs,
                          mask_abnormal=mask_abnormal):
        if row["index"] in images:  # the image drawn once, in place of its image tokens
            n, k, image = images[row["index"]]
            parts.append(_image_span(row["index"], n, k, image))
            skip = n
        if skip:
            skip -= 1
            continue
        if row["turn_start"]:
            k = row["turn"]
            parts.append(f'<b class="turn" title="turn {k} starts">turn {sample.step + k if len(frames) <= 1 else k}</b>')
            if k < len(frames):
                parts.append(f'<pre class="frame" title="game frame">{html.escape(frames[k])}</pre>')
        cls = row["role"]
        if row["advantage"] is not None and row["role"] == "response":
            cls += " adv-pos" if row["advantage"] > 0 else (" adv-neg" if row["advantage"] < 0 else "")
        text = row["text"] or "·"
        parts.append(f'<span class="tok {cls}" title="{html.escape(_title(row))}">{html.escape(text)}</span>')
    parts.append("</div>")
    body = '<div class="sample">' + "".join(parts) + "</div>"
    return wrap(body) if standalone else body


def wrap(body: str, legend: bool = True) -> str:
    return f'<div class="arl-viz"><style>{CSS}</style>{LEGEND if legend else ""}{body}</div>'


def episode_html(samples: Sequence[Any], tokenizer: Any = None, *, trajectory: Any = None,
                 advantages: Sequence[Any] | None = None, trainer_logprobs: Sequence[Any] | None = None,
                 mask_abnormal: bool = False, standalone: bool = True) -> str:
    """The samples of one episode (or any list of samples), in order. ``trajectory``: its Trajectory,
    whose turns' observations are shown as each step's frame; ``advantages``/``trainer_logprobs``:
    one entry per sample (see `sample_html`). Anchor groups are counted over ``samples``."""
    sizes = Counter((s.group_id, s.state_key) for s in samples)
    turns = list(getattr(trajectory, "turns", None) or [])
    out = []
    for i, s in enumerate(samples):
        frames = None
        if turns:
            if (s.info or {}).get("mode") == "step" or len(samples) > 1:
                frames = [turns[s.step].observation] if s.step < len(turns) else None
            else:
                frames = [t.observation for t in turns]
        out.append(sample_html(s, tokenizer, advantages=None if advantages is None else advantages[i],
                               trainer_logprobs=None if trainer_logprobs is None else trainer_logprobs[i],
                               frames=frames, mask_abnormal=mask_abnormal,
                               anchor_size=sizes[(s.group_id, s.state_key)] if s.state_key else None,
                               standalone=False))
    body = "".join(out) or "<p>no samples</p>"
    return wrap(body) if standalone else body


class SampleView:
    """A sample that renders itself in a notebook cell; the arguments are `sample_html`'s."""

    def __init__(self, sample: Any, tokenizer: Any = None, **kwargs: Any) -> None:
        self.sample, self.tokenizer, self.kwargs = sample, tokenizer, kwargs

    def _repr_html_(self) -> str:
        return sample_html(self.sample, self.tokenizer, **self.kwargs)


class EpisodeView:
    """Samples of an episode that render themselves in a notebook cell; the arguments are `episode_html`'s."""

    def __init__(self, samples: Sequence[Any], tokenizer: Any = None, **kwargs: Any) -> None:
        self.samples, self.tokenizer, self.kwargs = list(samples), tokenizer, kwargs

    def _repr_html_(self) -> str:
        return episode_html(self.samples, self.tokenizer, **self.kwargs)
