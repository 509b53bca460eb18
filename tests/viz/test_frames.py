"""`arl view` and the sample view draw the frames a VLM was shown (issue 46 item 7): each image
inline where its image tokens stand, and each recorded validation turn's picture beside its text
frame, as data URLs (the report stays one file); the pictures decode to the very frames shown."""

from __future__ import annotations

import base64
import io
import json
import re
import types

import attrs
import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

import arl.envs  # noqa: F401  (registers the ids)
from arl.engine.images import ImagePrompt, ImageRenderer
from arl.rollout.records import Sample
from arl.train.episodes import append_record, eval_record
from arl.viz import sample_html, write_report

IMG = re.compile(r'<img[^>]* src="(data:image/png;base64,[^"]+)"')


def frame(env_id: str, seed: int = 0) -> np.ndarray:
    env = gym.make(env_id).unwrapped
    env.reset(seed=seed)
    return env.frame()


def pixels(url: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))


@pytest.fixture(scope="module")
def renderer() -> ImageRenderer:
    from arl.models import resolve_model

    return ImageRenderer(resolve_model("tiny-vl"))


def _with(record, **extra):
    """``record``'s fields plus ``extra`` as a plain object (the views read attributes only)."""
    return types.SimpleNamespace(**{**{f.name: getattr(record, f.name) for f in attrs.fields(type(record))}, **extra})


def test_each_image_is_drawn_once_where_its_image_tokens_stand(renderer):
    tok = renderer.processor.tokenizer
    parts = [{"type": "image"}, {"type": "text", "text": "then"}, {"type": "image"}]
    out = tok.apply_chat_template([{"role": "user", "content": parts}], tokenize=True, add_generation_prompt=True)
    ids = list(out["input_ids"] if hasattr(out, "keys") else out)
    frames = [frame("arl/FrozenLake-v0"), frame("arl/Sokoban-v0", 3)]
    rendered = renderer.render(ImagePrompt(ids, frames))
    prompt = list(rendered.input_ids)
    base = Sample(input_ids=prompt + [20, 21], response_mask=[0] * len(prompt) + [1, 1],
                  old_logprobs=[0.0] * len(prompt) + [-0.5, -1.0], episode_score=1.0, step_score=1.0,
                  group_id="g", traj_id="t")
    sample = _with(base, rendered=rendered, num_response_tokens=2, ok=True)
    page = sample_html(sample, tok, standalone=False)
    urls = IMG.findall(page)
    assert len(urls) == 2
    for url, shown in zip(urls, frames, strict=True):
        assert np.array_equal(pixels(url), shown)  # lossless: the frame the model was shown
    image_token = rendered.image_token_id
    assert f"id={image_token} " not in page  # the image tokens are the pictures, not 52 spans
    assert "image 0 (16 image tokens)" in page and "image 1 (36 image tokens)" in page
    spans = re.findall(r'<span class="tok (prompt|response|masked)', page)
    assert len(spans) == len(base.input_ids) - 16 - 36  # every other token still one span
    assert IMG.findall(sample_html(base, tok, standalone=False)) == []  # a text sample: no picture


def test_arl_view_shows_each_recorded_turns_frame_beside_its_text(tmp_path, renderer):
    """Step mode: every turn's prompt carries its frame; traj mode: the last turn carries all of them."""
    frames = [frame("arl/Sokoban-v0", s) for s in (1, 2)]

    def turn(obs, rendered):
        return types.SimpleNamespace(observation=obs, response_ids=[5], action="Up", action_valid=True,
                                     reward=-0.1, rendered=rendered)

    def traj(seed, turns):
        return types.SimpleNamespace(seed=seed, success=False, episode_score=-0.2, status="ok",
                                     exit_reason="truncated", error=None, turns=turns)

    pad = renderer.image_token_id
    one = [renderer.render(ImagePrompt([1, pad], [f])) for f in frames]
    both = renderer.render(ImagePrompt([1, pad, 2, pad], frames))
    step_mode = traj(1, [turn("A", one[0]), turn("B", one[1])])
    traj_mode = traj(2, [turn("A", None), turn("B", both)])
    text_only = traj(3, [turn("A", None)])
    row = eval_record(5, [step_mode, traj_mode, text_only], keep=3, decode=lambda ids: "<answer>Up</answer>")
    for ep in row["episodes"][:2]:
        assert [np.array_equal(pixels(t["image"]), f) for t, f in zip(ep["turns"], frames, strict=True)] == [True] * 2
    assert "image" not in row["episodes"][2]["turns"][0]
    append_record(tmp_path, row)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 5, "eval/success_rate": 0.0}) + "\n")
    page = write_report(tmp_path, tmp_path / "r.html").read_text()
    urls = IMG.findall(page)
    assert len(urls) == 4 and all(np.array_equal(pixels(u), frames[i % 2]) for i, u in enumerate(urls))
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from anywhere
