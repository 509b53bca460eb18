"""OpenAI ``image_url`` content parts through arl's chat API (issue 46 item 4, proxy mode), on the zoo's
tiny-vl: the same image chat sent in process and over HTTP with the ``openai`` client gives the
same samples, whose input ids are the expanded ids the engine ran, every image carried forward
(prefix extension across turns like text), the loss mask never on an image token, and the
trainer-side log-probs the engine's. Each bad input gets its 400. GymRunner sends the game's frames
so, and its proxy samples equal the traj and step managers' token for token.
"""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
import torch

import arl.envs  # noqa: F401  (registers the ids)
from arl.config import ManagerConfig
from arl.engine.images import to_data_url
from arl.intercept import BadRequest, ChatHandler, InProcessClient, MessageTracker, ProxyServer, parse_request
from arl.rollout.records import EpisodeSpec, Sample
from tests.vision_support import MERGE_AREA, pad_id

pytestmark = pytest.mark.anyio


def image(value: int, size: int = 28) -> dict:
    frame = np.zeros((size, size, 3), np.uint8)
    frame[: size // 2] = value
    return {"type": "image_url", "image_url": {"url": to_data_url(frame), "detail": "low"}}


def user(*parts) -> dict:
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}


async def play_chat(client, *, seed: int = 3) -> None:
    """Two turns, an image in each user message: the second request re-sends the first turn."""
    messages = [{"role": "system", "content": "Play."}, user(image(40), "Where next?")]
    r = await client.chat.completions.create(model="arl", messages=messages, max_tokens=6, seed=seed)
    messages += [{"role": "assistant", "content": r.choices[0].message.content}, user("And now?", image(200))]
    await client.chat.completions.create(model="arl", messages=messages, max_tokens=6, seed=seed + 1)


async def both_ways(engine_factory, granularity: str = "traj"):
    """The same chat in process and over HTTP: each way's tracker."""
    trackers = []
    for transport in ("inprocess", "http"):
        engine = engine_factory()
        tracker = MessageTracker(engine.tokenizer, granularity=granularity)
        handler = ChatHandler(engine, tracker)
        if transport == "inprocess":
            await play_chat(InProcessClient(handler, "e"))
        else:
            async with ProxyServer() as server:
                server.register("tok", handler)
                async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
                    await play_chat(client)
        assert handler.fault is None, handler.fault
        trackers.append(tracker)
    return trackers


def as_sample(t) -> Sample:
    """A tracker sample as the proxy manager makes it: `Sample` runs `check_images` on it."""
    return Sample(t.input_ids, t.response_mask, t.logprobs, 0.0, 0.0, "g", "t", sampled_with=t.sampled_with,
                  rendered=t.rendered)


def check_image_sample(t, tok, n_images: int) -> None:
    r = t.rendered
    assert r is not None and len(r.images) == n_images
    assert list(t.input_ids[: len(r.input_ids)]) == list(r.input_ids)
    assert t.input_ids.count(pad_id(tok)) == int(r.image_grid_thw.prod(axis=1).sum()) // MERGE_AREA
    assert not any(m and x == pad_id(tok) for x, m in zip(t.input_ids, t.response_mask, strict=True))
    as_sample(t)


# -- the wire format ----------------------------------------------------------------------------------
def test_image_parts_are_normalized_and_text_parts_stay_a_string():
    url = image(9)["image_url"]["url"]
    req = parse_request({"messages": [
        {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": "high"}},
                                     {"type": "text", "text": "hi"}]},
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
    ]})
    assert req.messages[0] == {"role": "system", "content": "ab"}
    assert req.messages[1]["content"] == [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]
    assert req.messages[2] == {"role": "user", "content": "x"}  # text-only parts: today's string


@pytest.mark.parametrize(("part", "message"), [
    ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "fetches nothing from the network"),
    ({"type": "image_url", "image_url": {"url": "http://x/a.png"}}, "fetches nothing from the network"),
    ({"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lGOD"}}, "PNG or JPEG data URL"),
    ({"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}}, "must be base64"),
    ({"type": "image_url", "image_url": {}}, "must be an object"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==", "detail": "max"}}, "detail"),
    ({"type": "input_audio", "input_audio": {}}, "or an image part"),
])
def test_bad_image_parts_are_refused_with_a_400(part, message):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}
    if part["type"] == "input_audio":  # a part of another kind beside an image
        body["messages"][0]["content"].append(image(1))
    with pytest.raises(BadRequest, match=message) as info:
        parse_request(body)
    assert info.value.status == 400


def test_image_parts_only_in_user_messages():
    for role in ("system", "assistant", "tool"):
        msg = {"role": role, "content": [image(1)], **({"tool_call_id": "c"} if role == "tool" else {})}
        with pytest.raises(BadRequest, match="user messages only"):
            parse_request({"messages": [{"role": "user", "content": "hi"}, msg]})


# -- in process and over HTTP: the same samples, token-exact ------------------------------------------
@pytest.mark.parametrize("granularity", ["traj", "step"])
async def test_scripted_same_chat_both_ways_gives_the_same_exact_samples(vl_tokenizer, granularity):
    from arl.engine.scripted import ScriptedEngine

    tok = vl_tokenizer
    inproc, http = await both_ways(lambda: ScriptedEngine(tok, image_tokens=3, max_model_len=4096), granularity)
    if granularity == "traj":
        [a], [b] = inproc.traj_samples(), http.traj_samples()
        check_image_sample(a, tok, 2)  # both turns' images, carried forward in one sample
        assert a.input_ids.count(pad_id(tok)) == 6 and len(a.rendered.images) == 2
        assert inproc.stats["forks"] == 0  # the second request extends the first (prefix extension)
        assert inproc.requests[0].rendered is None  # its branch's last request holds every image
        with pytest.raises(ValueError, match="let go"):  # so no step sample without its pixels
            inproc.step_samples()
    else:
        a, b = inproc.step_samples(), http.step_samples()
        for t, n in zip(a, (1, 2), strict=True):
            check_image_sample(t, tok, n)
    for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b], strict=True):
        assert x.input_ids == y.input_ids and x.response_mask == y.response_mask and x.logprobs == y.logprobs
        assert np.array_equal(x.rendered.pixel_values, y.rendered.pixel_values)


async def test_hf_ids_images_and_trainer_logprobs_are_the_engines(hf_vl):
    from arl.rollout import collate
    from arl.train.update import sequence_logprobs

    tok = hf_vl.tokenizer
    inproc, http = await both_ways(lambda: hf_vl, "step")
    samples = []
    for a, b in zip(inproc.step_samples(), http.step_samples(), strict=True):
        assert a.input_ids == b.input_ids and a.logprobs == b.logprobs  # seeded: the same reply both ways
        check_image_sample(a, tok, len(a.rendered.images))
        fresh = hf_vl.image_renderer.render(a.rendered.prompt)  # what the engine ran for it
        assert fresh.input_ids == a.rendered.input_ids and np.array_equal(fresh.pixel_values, a.rendered.pixel_values)
        samples.append(as_sample(a))
    [traj] = inproc.traj_samples()
    assert traj.input_ids[: len(samples[-1].input_ids)] == samples[-1].input_ids[: len(traj.input_ids)]
    samples.append(as_sample(traj))
    batch = collate(samples, pad_id=tok.pad_token_id or 0)
    with torch.no_grad():
        lp = sequence_logprobs(hf_vl.model, batch, range(len(samples)), None, micro_batch_size=3)
    on = batch["response_mask"].bool()
    assert on.sum() > 0
    assert (lp[on] - batch["logprobs"][on]).abs().max().item() < 1e-3


# -- bad input through the handler ------------------------------------------------------------------------
async def test_unreadable_image_text_model_and_too_many_images_get_their_400(vl_tokenizer, tiny_tokenizer):
    from arl.engine.scripted import ScriptedEngine

    garbage = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"not a png").decode()}}
    tracker = MessageTracker(vl_tokenizer)
    handler = ChatHandler(ScriptedEngine(vl_tokenizer, image_tokens=3, max_model_len=4096), tracker)
    client = InProcessClient(handler, "e")
    with pytest.raises(openai.BadRequestError, match="cannot decode") as info:
        await client.chat.completions.create(model="arl", messages=[user(garbage, "hi")])
    assert info.value.code == "unreadable_image" and handler.fault is None  # the episode goes on
    await client.chat.completions.create(model="arl", messages=[user(image(5), "hi")], max_tokens=4)
    assert len(tracker.requests) == 1

    text_only = ChatHandler(ScriptedEngine(tiny_tokenizer), MessageTracker(tiny_tokenizer))
    with pytest.raises(openai.BadRequestError, match="no vision tower") as info:
        await InProcessClient(text_only, "t").chat.completions.create(model="arl", messages=[user(image(5), "hi")])
    assert info.value.code == "no_vision_tower"

    # 40 image tokens an image: four fill a context of 128 before the text does
    small = ChatHandler(ScriptedEngine(vl_tokenizer, image_tokens=40, max_model_len=128), MessageTracker(vl_tokenizer))
    with pytest.raises(openai.BadRequestError, match="fewer or smaller images") as info:
        await InProcessClient(small, "s").chat.completions.create(
            model="arl", messages=[user(*[image(k) for k in range(4)], "hi")], max_tokens=4)
    assert info.value.code == "context_length_exceeded" and small.fault[1] == "max_length"


async def test_http_refuses_a_web_address_and_responses_api_says_use_chat(vl_tokenizer):
    from arl.engine.scripted import ScriptedEngine

    handler = ChatHandler(ScriptedEngine(vl_tokenizer, image_tokens=3), MessageTracker(vl_tokenizer))
    async with ProxyServer() as server:
        server.register("tok", handler)
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="tok", max_retries=0) as client:
            web = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
            with pytest.raises(openai.BadRequestError, match="network"):
                await client.chat.completions.create(model="arl", messages=[user(web, "hi")])
            with pytest.raises(openai.BadRequestError, match="image_url parts"):
                await client.responses.create(model="arl", input=[{"role": "user", "content": [
                    {"type": "input_image", "image_url": image(3)["image_url"]["url"]}]}])


async def test_a_sampled_image_token_ends_the_episode(vl_tokenizer):
    from arl.engine.scripted import ScriptedEngine

    engine = ScriptedEngine(vl_tokenizer, image_tokens=3, responses=["<answer>Up</answer><|image_pad|>"])
    handler = ChatHandler(engine, MessageTracker(vl_tokenizer))
    with pytest.raises(openai.InternalServerError, match="image placeholder token"):
        await InProcessClient(handler, "e").chat.completions.create(model="arl", messages=[user(image(1), "hi")])
    assert handler.fault[1] == "engine_error" and not handler.tracker.requests


# -- GymRunner sends the frames: proxy samples == the managers' -------------------------------------
@pytest.mark.parametrize("transport", ["inprocess", "http"])
@pytest.mark.parametrize(("granularity", "observation"), [("traj", "image"), ("step", "both")])
async def test_gym_runner_frames_through_the_proxy_equal_the_managers(vl_tokenizer, transport, granularity,
                                                                     observation):
    from arl.engine.scripted import ScriptedEngine
    from arl.rollout.proxy import ProxyEnvManager
    from arl.rollout.runners import gym_runner, make_runner_factory
    from arl.rollout.step import StepEnvManager
    from arl.rollout.traj import TrajEnvManager

    tok = vl_tokenizer
    config = ManagerConfig(observation=observation, max_tokens=12, prompt_style="compact", max_turns=3)
    spec = EpisodeSpec(env_id="arl/Sokoban-v0", seed=0, group_id="g", episode_id=0)
    factory = make_runner_factory(gym_runner, conversation=granularity)
    async with ProxyEnvManager(ScriptedEngine(tok, image_tokens=3, max_model_len=4096), config, factory,
                               transport=transport, granularity=granularity) as proxy:
        ep = await proxy.run_episode(spec)
    manager = TrajEnvManager if granularity == "traj" else StepEnvManager
    ref = await manager(ScriptedEngine(tok, image_tokens=3, max_model_len=4096), config).run_episode(spec)
    assert ep.trajectory.ok, ep.trajectory.error
    assert len(ep.samples) == len(ref.samples) == (1 if granularity == "traj" else 3)
    for a, b in zip(ep.samples, ref.samples, strict=True):
        assert a.input_ids == b.input_ids and a.response_mask == b.response_mask
        assert a.rendered is not None and np.array_equal(a.rendered.pixel_values, b.rendered.pixel_values)
        if granularity == "step":  # GiGPO's anchor: the game's state, never the pixels
            assert a.state_key == b.state_key is not None
    assert ep.samples[-1].input_ids.count(pad_id(tok)) == 3 * (3 if granularity == "traj" else 1)


def test_proxy_mode_takes_image_observations_and_the_tool_runner_refuses_them():
    from arl.config import RolloutConfig
    from arl.rollout.runners import tool_runner

    RolloutConfig(mode="proxy", manager=ManagerConfig(observation="both"))  # refused before this change
    spec = EpisodeSpec(env_id="arl/Sokoban-v0", seed=0, group_id="g", episode_id=0)
    with pytest.raises(ValueError, match="tool runner sends text only"):
        tool_runner(None, spec, ManagerConfig(observation="image"))


@pytest.mark.vllm
async def test_vllm_image_chat_both_ways_is_what_the_trainer_scores(vllm_vl, hf_vl):
    """vLLM answers the image chat in process and over HTTP (seeded: the same reply both ways); the
    HF trainer-side forward (same weights) scores each sample's reply tokens as vLLM did."""
    from arl.rollout import collate
    from arl.train.update import sequence_logprobs

    inproc, http = await both_ways(lambda: vllm_vl, "step")
    samples = []
    for a, b in zip(inproc.step_samples(), http.step_samples(), strict=True):
        assert a.input_ids == b.input_ids
        check_image_sample(a, vllm_vl.tokenizer, len(a.rendered.images))
        samples.append(as_sample(a))
    batch = collate(samples, pad_id=vllm_vl.tokenizer.pad_token_id or 0)
    with torch.no_grad():
        lp = sequence_logprobs(hf_vl.model, batch, range(len(samples)), None, micro_batch_size=2)
    on = batch["response_mask"].bool()
    assert on.sum() > 0 and (lp[on] - batch["logprobs"][on]).abs().max().item() < 1e-3
