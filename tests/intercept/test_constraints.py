"""Constrained decoding: response_format json_object / json_schema and tool_choice required / named are
enforced by the engine (vLLM structured outputs), refused with a 400 where the engine cannot enforce them,
and never answered with a reply that breaks them (the scripted engine checks its script)."""

from __future__ import annotations

import json

import openai
import pytest

from arl.engine import OutputConstraint, SamplingParams
from arl.engine.base import EngineUnsupportedError
from arl.engine.scripted import ScriptedEngine
from arl.intercept import BadRequest, ChatHandler, InProcessClient, MessageTracker, parse_request
from arl.intercept.protocol import output_constraint
from arl.intercept.toolcalls import tool_call_tag

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "Where to?"}]
MOVE = {"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "properties": {"direction": {"enum": ["Left", "Right", "Up", "Down"]}},
    "required": ["direction"], "additionalProperties": False}}}
LOOK = {"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}


def call(name: str, arguments: dict) -> str:
    """A tool call in the canonical form the chat templates render and the constraint forces."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


class Episode:
    def __init__(self, tokenizer, script, engine_cls=ScriptedEngine):
        self.engine = engine_cls(tokenizer, responses=script)
        self.tracker = MessageTracker(tokenizer)
        self.params: list[SamplingParams] = []
        self.handler = ChatHandler(self.engine, self.tracker, generate=self._generate)
        self.client = InProcessClient(self.handler, "e")

    async def _generate(self, prompt_ids, params):
        self.params.append(params)
        return await self.engine.generate(prompt_ids, params)


class NoConstraintsEngine(ScriptedEngine):
    name = "no-constraints"
    supports_constraints = False


# -- what each request asks the engine for ----------------------------------------------------------


def constraint(**fields):
    return output_constraint(parse_request({"messages": MESSAGES, **fields}))


def test_each_field_becomes_its_constraint():
    assert constraint() is None
    assert constraint(response_format={"type": "text"}) is None
    assert constraint(tools=[MOVE], tool_choice="auto") is None
    assert constraint(response_format={"type": "json_object"}) == OutputConstraint("json_object")
    c = constraint(response_format=JSON_SCHEMA)
    assert c.kind == "json_schema" and c.spec == SCHEMA
    c = constraint(tools=[MOVE, LOOK], tool_choice="required")
    assert c.kind == "structural_tag" and c.spec == tool_call_tag([MOVE, LOOK])
    assert c.spec["format"]["stop_after_first"] is False
    c = constraint(tools=[MOVE, LOOK], tool_choice="required", parallel_tool_calls=False)
    assert c.spec["format"]["stop_after_first"] is True
    c = constraint(tools=[MOVE, LOOK], tool_choice={"type": "function", "function": {"name": "look"}})
    assert c.spec == tool_call_tag([MOVE, LOOK], "look")
    assert c.spec["format"]["begin"] == '<tool_call>\n{"name": "look", "arguments": '


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "required"}, "tool_choice"),  # nothing to call
    ({"tools": [MOVE], "tool_choice": {"type": "function", "function": {"name": "jump"}}}, "tool_choice"),
    ({"tools": [MOVE], "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}},
     "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, "response_format"),  # no name
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": "int"}}}, "response_format"),
    ({"guided_json": SCHEMA}, "guided_json"),
])
def test_malformed_or_unsupported_constraints_are_400s(fields, param):
    with pytest.raises(BadRequest) as info:
        parse_request({"messages": MESSAGES, **fields})
    assert info.value.param == param and info.value.status == 400


def test_a_json_reply_and_a_forced_tool_call_at_once_is_a_400():
    request = parse_request({"messages": MESSAGES, "tools": [MOVE], "tool_choice": "required",
                             "response_format": {"type": "json_object"}})
    with pytest.raises(BadRequest, match="contradict") as info:
        output_constraint(request)
    assert info.value.param == "response_format"


def test_the_tool_call_tag_is_xgrammars_own_qwen_format():
    """Ours has no xgrammar dependency at parse time; it must say what xgrammar's builtin says."""
    xgr = pytest.importorskip("xgrammar")
    for choice, parallel in (("required", True), ("required", False),
                             ({"type": "function", "function": {"name": "move"}}, True)):
        theirs = json.loads(xgr.get_model_structural_tag("qwen_3", [MOVE, LOOK], choice, reasoning=False,
                                                         parallel_tool_calls=parallel).model_dump_json())
        name = choice["function"]["name"] if isinstance(choice, dict) else None
        ours = tool_call_tag([MOVE, LOOK], name, parallel=parallel)
        fmt, their_fmt = ours["format"], theirs["format"]
        tags, their_tags = fmt.get("tags", [fmt]), their_fmt.get("tags", [their_fmt])
        assert [(t["begin"], t["end"], t["content"]["json_schema"]) for t in tags] == \
            [(t["begin"], t["end"], t["content"]["json_schema"]) for t in their_tags]
        for key in ("type", "triggers", "at_least_one", "stop_after_first"):
            assert fmt.get(key) == their_fmt.get(key), key


# -- an engine that cannot enforce them -------------------------------------------------------------


@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": JSON_SCHEMA}, "response_format"),
    ({"tools": [MOVE], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [MOVE], "tool_choice": {"type": "function", "function": {"name": "move"}}}, "tool_choice"),
])
async def test_an_engine_without_constrained_decoding_refuses_them_and_generates_nothing(tiny_tokenizer, fields,
                                                                                       param):
    ep = Episode(tiny_tokenizer, ['{"answer": 1}'], engine_cls=NoConstraintsEngine)
    with pytest.raises(openai.BadRequestError, match="no constrained decoding") as info:
        await ep.client.chat.completions.create(model="m", messages=MESSAGES, **fields)
    assert info.value.body["param"] == param
    assert ep.params == [] and ep.engine.requests == 0 and ep.tracker.requests == []


async def test_the_engine_contract_refuses_a_constraint_it_cannot_enforce(tiny_tokenizer):
    engine = NoConstraintsEngine(tiny_tokenizer, responses=["x"])
    with pytest.raises(EngineUnsupportedError, match="json_object"):
        await engine.generate([1, 2, 3], SamplingParams(constraint=OutputConstraint("json_object")))


# -- the scripted engine: the reply meets the constraint, or the request fails ------------------------


async def test_a_reply_that_meets_the_schema_is_answered_and_tracked(tiny_tokenizer):
    pytest.importorskip("xgrammar")
    ep = Episode(tiny_tokenizer, ['{"answer": 42}'])
    out = await ep.client.chat.completions.create(model="m", messages=MESSAGES, response_format=JSON_SCHEMA)
    assert json.loads(out.choices[0].message.content) == {"answer": 42}
    assert ep.params[0].constraint == OutputConstraint("json_schema", SCHEMA)
    assert ep.handler.stats["constrained_calls"] == 1 and len(ep.tracker.step_samples()) == 1


@pytest.mark.parametrize("reply, fields", [
    ('{"answer": "forty-two"}', {"response_format": JSON_SCHEMA}),  # wrong type
    ("Sure! {}", {"response_format": {"type": "json_object"}}),  # text before the object
    ("I will go left.", {"tools": [MOVE], "tool_choice": "required"}),  # no call
    (call("move", {"direction": "North"}), {"tools": [MOVE], "tool_choice": "required"}),  # not in the enum
    (call("look", {}), {"tools": [MOVE, LOOK], "tool_choice": {"type": "function", "function": {"name": "move"}}}),
    (call("move", {"direction": "Up"}) + call("look", {}),
     {"tools": [MOVE, LOOK], "tool_choice": "required", "parallel_tool_calls": False}),  # a second call
])
async def test_a_scripted_reply_that_breaks_the_constraint_fails_the_request(tiny_tokenizer, reply, fields):
    pytest.importorskip("xgrammar")
    ep = Episode(tiny_tokenizer, [reply])
    with pytest.raises(openai.InternalServerError, match="breaks the request's"):
        await ep.client.chat.completions.create(model="m", messages=MESSAGES, **fields)
    assert ep.tracker.step_samples() == [] and ep.handler.fault[1] == "engine_error"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "move"}}])
async def test_a_forced_tool_call_in_the_canonical_form_is_parsed(tiny_tokenizer, choice):
    pytest.importorskip("xgrammar")
    ep = Episode(tiny_tokenizer, [call("move", {"direction": "Left"})])
    out = await ep.client.chat.completions.create(model="m", messages=MESSAGES, tools=[MOVE, LOOK],
                                                  tool_choice=choice)
    (tool_call,) = out.choices[0].message.tool_calls
    assert tool_call.function.name == "move" and json.loads(tool_call.function.arguments) == {"direction": "Left"}
    assert out.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "wibble"}}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"$ref": "#/nope"}}}},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wibble"}}}],
     "tool_choice": "required"},
])
async def test_a_constraint_that_does_not_compile_is_a_400_and_the_episode_goes_on(tiny_tokenizer, fields):
    pytest.importorskip("xgrammar")
    ep = Episode(tiny_tokenizer, ['{"answer": 1}', "fine"])
    with pytest.raises(openai.BadRequestError, match="does not compile") as info:
        await ep.client.chat.completions.create(model="m", messages=MESSAGES, **fields)
    assert info.value.body["code"] == "invalid_constraint" and ep.engine.requests == 0
    assert info.value.body["param"] == ("tool_choice" if "tools" in fields else "response_format")
    out = await ep.client.chat.completions.create(model="m", messages=MESSAGES)
    assert out.choices[0].message.content == '{"answer": 1}' and ep.handler.fault is None


async def test_vllm_refuses_a_schema_that_does_not_compile_and_serves_on(vllm_engine, tiny_tokenizer):
    client = InProcessClient(ChatHandler(vllm_engine, MessageTracker(tiny_tokenizer)), "e")
    bad = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "wibble"}}}
    with pytest.raises(openai.BadRequestError, match="does not compile"):
        await client.chat.completions.create(model="m", messages=MESSAGES, response_format=bad, max_tokens=8)
    out = await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, seed=0)
    assert out.choices[0].message.content is not None


# -- vLLM enforces them while sampling ------------------------------------------------------------


async def test_vllm_replies_meet_each_constraint(vllm_engine, tiny_tokenizer):
    """The tiny model has never seen JSON or tool calls: whatever it would sample, the mask holds.
    Every sampled token is one the grammar allows (a reply cut by max_tokens inside a long JSON
    string is a valid prefix); a finished reply is what the request asked for."""
    from arl.engine.grammar import first_violation

    cases = [
        ({"response_format": {"type": "json_object"}}, lambda r: isinstance(json.loads(r.content), dict)),
        ({"response_format": JSON_SCHEMA}, lambda r: isinstance(json.loads(r.content)["answer"], int)),
        ({"tools": [MOVE, LOOK], "tool_choice": "required", "parallel_tool_calls": False},
         lambda r: len(r.tool_calls) == 1),
        ({"tools": [MOVE, LOOK], "tool_choice": {"type": "function", "function": {"name": "move"}}},
         lambda r: [c.function.name for c in r.tool_calls] == ["move"]
         and json.loads(r.tool_calls[0].function.arguments)["direction"] in ("Left", "Right", "Up", "Down")),
    ]
    finished = 0
    for seed in range(3):
        for fields, holds in cases:
            tracker = MessageTracker(tiny_tokenizer)
            handler = ChatHandler(vllm_engine, tracker)
            params: list[SamplingParams] = []

            async def generate(prompt_ids, p, handler=handler, params=params):
                params.append(p)
                return await handler._engine_generate(prompt_ids, p)

            handler._generate = generate
            out = await InProcessClient(handler, "e").chat.completions.create(
                model="m", messages=MESSAGES, seed=seed, max_tokens=120, temperature=1.0, **fields)
            (sample,) = tracker.step_samples()
            ids = [t for t, m in zip(sample.input_ids, sample.response_mask, strict=True) if m]
            stops = vllm_engine.stop_ids(params[0])
            assert first_violation(tiny_tokenizer, vllm_engine.vocab_size, params[0].constraint, ids, stops) is None
            choice = out.choices[0]
            if choice.finish_reason != "length":
                finished += 1
                assert holds(choice.message), (fields, choice.message)
    assert finished >= 6, finished  # of 12 (9 on CPU): the 6 forced tool calls finish (their arguments are an enum)


def test_doctests():
    import doctest

    from arl.engine import grammar
    from arl.intercept import toolcalls

    for module in (grammar, toolcalls):
        failures, tried = doctest.testmod(module)
        assert tried > 0 and failures == 0, module.__name__
