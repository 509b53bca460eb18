"""`arl doctor`: the chat-template report on the tiny and SmolLM2 tokenizers and on hand-written
templates that behave like Qwen2.5's, Qwen3's and Llama 3.1's; the CLI; the trainer's refusal."""

from __future__ import annotations

import copy
import doctest
import json

import pytest

from arl.intercept import doctor
from arl.intercept.doctor import TemplateDriftError, check_setting, diagnose

# -- templates like the real ones (written from their documented behaviour) ---------------------

_TOOLS_SYSTEM = (
    r"""{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"""
    r"""You are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}"""
    r"""{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}"""
    r"""{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within """
    r"""<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": """
    r"""<args-json-object>}\n</tool_call><|im_end|>\n" }}"""
)

# Qwen2.5: ChatML; a default system prompt when none is given; tool calls in <tool_call> tags;
# tool results as user turns in <tool_response> tags, consecutive ones merged into one turn.
QWEN25 = (
    r"""{%- if tools %}{{- '<|im_start|>system\n' }}"""
    r"""{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"""
    r"""{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"""
    r"""{{- '\n\n' }}""" + _TOOLS_SYSTEM +
    r"""{%- else %}{%- if messages[0]['role'] == 'system' %}"""
    r"""{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"""
    r"""{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}"""
    r"""{%- endif %}{%- endif %}"""
    r"""{%- for message in messages %}"""
    r"""{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}"""
    r"""{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"""
    r"""{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"""
    r"""{%- if message.content %}{{- '\n' + message.content }}{%- endif %}"""
    r"""{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"""
    r"""{{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}"""
    r"""{%- endfor %}{{- '<|im_end|>\n' }}"""
    r"""{%- elif message.role == 'tool' %}"""
    r"""{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"""
    r"""{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}"""
    r"""{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\n' }}{%- endif %}"""
    r"""{%- endif %}{%- endfor %}"""
    r"""{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""
)

# Qwen3: like Qwen2.5 without the default system prompt; assistant turns before the last user
# query lose their <think> block, later ones (and the last message) always get one (empty if
# need be); enable_thinking=False puts an empty think block into the generation prompt.
QWEN3 = (
    r"""{%- if tools %}{{- '<|im_start|>system\n' }}"""
    r"""{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}""" + _TOOLS_SYSTEM +
    r"""{%- else %}{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}{%- endif %}"""
    r"""{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"""
    r"""{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"""
    r"""{%- if ns.multi_step_tool and message.role == 'user' and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"""
    r"""{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"""
    r"""{%- for message in messages %}"""
    r"""{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}"""
    r"""{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"""
    r"""{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}"""
    r"""{%- elif message.role == 'assistant' %}{%- set reasoning_content = '' %}"""
    r"""{%- if '</think>' in content %}"""
    r"""{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}"""
    r"""{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"""
    r"""{%- if loop.index0 > ns.last_query_index %}"""
    r"""{%- if loop.last or (not loop.last and reasoning_content) %}"""
    r"""{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}"""
    r"""{%- else %}{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}"""
    r"""{%- else %}{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}"""
    r"""{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"""
    r"""{%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}"""
    r"""{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"""
    r"""{{- '<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}"""
    r"""{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"""
    r"""{{- '}\n</tool_call>' }}{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}"""
    r"""{%- elif message.role == 'tool' %}"""
    r"""{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"""
    r"""{{- '\n<tool_response>\n' }}{{- content }}{{- '\n</tool_response>' }}"""
    r"""{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\n' }}{%- endif %}"""
    r"""{%- endif %}{%- endfor %}"""
    r"""{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"""
    r"""{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"""
)

# Llama 3.1: headers and <|eot_id|>; a system block with knowledge and today's dates always (also
# when the conversation has no system message); tools go into the first user message; one tool
# call per message, rendered as JSON without the message's content; tool results as "ipython".
LLAMA31 = (
    r"""{{- bos_token }}{%- set date_string = "26 Jul 2024" %}"""
    r"""{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"""
    r"""{%- else %}{%- set system_message = "" %}{%- endif %}"""
    r"""{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}{%- if tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}"""
    r"""{{- "Cutting Knowledge Date: December 2023\n" }}{{- "Today Date: " + date_string + "\n\n" }}{{- system_message }}{{- "<|eot_id|>" }}"""
    r"""{%- if tools is not none %}{%- set first_user_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"""
    r"""{{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}"""
    r"""{{- "Given the following functions, please respond with a JSON for a function call with its proper arguments.\n\n" }}"""
    r"""{%- for t in tools %}{{- t | tojson }}{{- "\n\n" }}{%- endfor %}{{- first_user_message + "<|eot_id|>" }}{%- endif %}"""
    r"""{%- for message in messages %}"""
    r"""{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}"""
    r"""{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"""
    r"""{%- elif 'tool_calls' in message %}{%- if not message.tool_calls|length == 1 %}"""
    r"""{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}"""
    r"""{%- set tool_call = message.tool_calls[0].function %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}"""
    r"""{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}{{- "<|eot_id|>" }}"""
    r"""{%- elif message.role == 'tool' or message.role == 'ipython' %}"""
    r"""{{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}{{- message.content }}{{- "<|eot_id|>" }}{%- endif %}{%- endfor %}"""
    r"""{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"""
)
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# SmolLM2-135M-Instruct's template (its GGUF's, verbatim): ChatML, a default system prompt when
# none is given, and only each message's content: assistant tool_calls are dropped.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _with_template(tokenizer, template, special=()):
    tok = copy.deepcopy(tokenizer)
    if special:
        tok.add_special_tokens({"bos_token": special[0], "additional_special_tokens": list(special)})
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def qwen25(tiny_tokenizer):
    return _with_template(tiny_tokenizer, QWEN25)


@pytest.fixture(scope="module")
def qwen3(tiny_tokenizer):
    return _with_template(tiny_tokenizer, QWEN3)


@pytest.fixture(scope="module")
def smollm2_like(tiny_tokenizer):
    return _with_template(tiny_tokenizer, SMOLLM2)


@pytest.fixture(scope="module")
def llama31(tiny_tokenizer):
    tok = _with_template(tiny_tokenizer, LLAMA31, LLAMA_SPECIAL)
    assert tok.convert_tokens_to_ids("<|eot_id|>") in tok.all_special_ids
    return tok


def _train_config(tmp_path, mode: str, *overrides: str):
    """A small FrozenLake run (as tests/train's `small_config`) in rollout ``mode``."""
    from arl.config import load_config

    return load_config(None, [
        f"out_dir={tmp_path}", "name=t", "steps=1", "tensorboard=false", f"rollout.mode={mode}",
        "rollout.num_groups=1", "rollout.group_size=2", "rollout.manager.max_tokens=8", "eval.num_seeds=2",
        "eval.every=0", "eval.at_start=false", "engine.max_model_len=1024", *overrides,
    ])


def _verdicts(report) -> dict[str, bool]:
    return {v.setting: v.exact for v in report.verdicts}


# -- the report -----------------------------------------------------------------------------------


def test_doctests():
    failures, tried = doctest.testmod(doctor)
    assert tried >= 3 and failures == 0


def test_tiny_chatml_is_exact_in_every_setting(tiny_tokenizer):
    report = diagnose(tiny_tokenizer)
    assert report.exact and not report.breaks and not report.notes
    assert report.generation_prompt == "<|im_start|>assistant\n"
    assert (report.end_of_turn, report.separator) == ("<|im_end|>", "\n")
    assert report.bridge_user == "\n<|im_start|>user\nnext observation<|im_end|>\n<|im_start|>assistant\n"
    assert report.bridge_tool == ("\n<|im_start|>user\n<tool_response>\ntool result\n</tool_response><|im_end|>\n"
                                  "<|im_start|>assistant\n")
    assert report.default_system is None and report.think_stripped == () and report.tool_calls_rendered
    assert not report.empty_think_in_turns and report.generation_prompt_think == ""
    assert report.conversation[2] == "assistant+tool_calls" and report.conversation.count("tool") == 3
    assert diagnose(tiny_tokenizer) is report  # cached per tokenizer
    text = report.format()
    assert "stable at all 5 assistant turns" in text and text.count(" exact") == 6
    assert [v.label for v in report.verdicts] == ["traj", "step", "proxy-traj  text agent", "proxy-step  text agent",
                                                  "proxy-traj  tool agent", "proxy-step  tool agent"]
    assert json.loads(json.dumps(report.to_dict()))["exact"] is True


@pytest.mark.slow
def test_smollm2_drops_tool_calls_and_injects_its_system_prompt():
    from transformers import AutoTokenizer

    from arl.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    report = diagnose(tok)
    assert "You are a helpful AI assistant named SmolLM" in report.default_system
    assert report.tool_calls_rendered is False
    assert report.bridge_tool == "\n<|im_start|>tool\ntool result<|im_end|>\n<|im_start|>assistant\n"
    # the proxy is exact for text agents (GymRunner), not for tool agents
    assert _verdicts(report) == {"traj": True, "step": True, "proxy-traj": True, "proxy-step": True,
                                 "proxy-traj+tools": False, "proxy-step+tools": False}
    assert "drops assistant tool_calls" in report.verdict("proxy-step+tools").reason
    assert "proxy-step  tool agent  NOT exact: the template drops assistant tool_calls" in report.format()
    assert any("ignores the tools list" in n for n in report.notes)
    assert diagnose(tok, tools=False).exact


def test_a_template_that_drops_tool_calls_is_exact_for_text_agents_not_for_tool_agents(smollm2_like):
    report = diagnose(smollm2_like)
    assert report.tool_calls_rendered is False
    assert _verdicts(report) == {"traj": True, "step": True, "proxy-traj": True, "proxy-step": True,
                                 "proxy-traj+tools": False, "proxy-step+tools": False}
    assert "drops assistant tool_calls" in report.verdict("proxy-step+tools").reason
    assert not report.exact  # a tool agent was asked about
    text = report.format()
    assert "proxy-traj  text agent  exact" in text and "proxy-step  text agent  exact" in text
    assert "proxy-step  tool agent  NOT exact: the template drops assistant tool_calls" in text
    assert diagnose(smollm2_like, tools=False).exact  # text agents only: every row exact
    assert [v.setting for v in diagnose(smollm2_like, tools=False).verdicts] == list(doctor.SETTINGS[:4])


def test_qwen25_injects_its_default_system_prompt_and_merges_tool_results(qwen25):
    report = diagnose(qwen25)
    assert report.default_system == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
                                     "You are a helpful assistant.<|im_end|>\n")
    assert report.tool_calls_rendered and report.think_stripped == ()
    # traj conversations are text only: exact; the tracker tokenizes the two tool results apart
    assert _verdicts(report) == {"traj": True, "step": True, "proxy-traj": True, "proxy-step": True,
                                 "proxy-traj+tools": False, "proxy-step+tools": False}
    reason = report.verdict("proxy-step+tools").reason
    assert "messages[6] (tool)" in reason and "merges consecutive tool messages" in reason
    assert not report.breaks  # rendering with more messages keeps every earlier token
    assert diagnose(qwen25, tools=False).exact


def test_qwen3_strips_earlier_think_blocks(qwen3):
    report = diagnose(qwen3)
    # before the last user query (messages[10]); a tool result is not a query
    assert report.think_stripped == (2, 4, 7, 9)
    assert report.empty_think_in_turns  # the last assistant turn always gets one
    assert report.default_system is None
    v = _verdicts(report)
    assert v["step"] and not any(exact for setting, exact in v.items() if setting != "step")
    for setting in ("traj", "proxy-traj", "proxy-step"):
        assert "drops <think> blocks of earlier turns" in report.verdict(setting).reason
    assert "merges consecutive tool messages" in report.verdict("proxy-step+tools").reason
    assert report.verdict("proxy-traj").reason.startswith("text game: ")
    # the first break: the user at messages[8] strips every earlier turn's think block
    first = report.breaks[0]
    assert (first.turn, first.kind, first.message) == (7, "next prompt", 2)
    assert "<think>" in first.was and "<think>" not in first.now
    assert "NOT exact" in report.format() and "stripped from messages[2], messages[4]" in report.format()
    game = diagnose(qwen3, tools=False)
    assert not game.verdict("traj").exact and game.verdict("step").exact


def test_qwen3_without_thinking_adds_an_empty_think_block_to_the_generation_prompt(qwen3):
    report = diagnose(qwen3, chat_template_kwargs={"enable_thinking": False})
    assert report.generation_prompt == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert report.generation_prompt_think == "empty"
    assert report.verdict("step").exact and not report.verdict("traj").exact
    assert diagnose(qwen3).generation_prompt_think == ""
    assert "{'enable_thinking': False}" in report.format()


def test_llama31_bridge_dates_and_tools_in_the_first_user_message(llama31):
    report = diagnose(llama31)
    assert report.end_of_turn == "<|eot_id|>" and report.separator == ""
    assert report.generation_prompt == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert report.bridge_user == ("<|start_header_id|>user<|end_header_id|>\n\nnext observation<|eot_id|>"
                                  "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert report.bridge_tool.startswith("<|start_header_id|>ipython<|end_header_id|>\n\ntool result<|eot_id|>")
    assert "Cutting Knowledge Date: December 2023" in report.default_system
    assert not report.default_system.startswith("<|begin_of_text|>")  # the BOS is no system prompt
    # parallel calls are refused: checked with one call per turn
    assert any("parallel tool calls" in n for n in report.notes)
    assert report.conversation.count("tool") == 1
    v = _verdicts(report)
    assert v["traj"] and v["step"] and v["proxy-step"] and v["proxy-traj"]
    assert not v["proxy-step+tools"] and not v["proxy-traj+tools"]
    assert diagnose(llama31, tools=False).exact


def test_a_tokenizer_without_chat_template_is_exact_nowhere(tiny_tokenizer):
    tok = _with_template(tiny_tokenizer, None)
    report = diagnose(tok)
    assert not any(_verdicts(report).values())
    assert "plain conversation" in report.verdict("step").reason


def test_a_template_without_end_of_turn_token_breaks_traj_not_step(tiny_tokenizer):
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    report = diagnose(_with_template(tiny_tokenizer, plain), tools=False)
    assert report.generation_prompt == "assistant: " and report.end_of_turn == "<|im_end|>"  # EOS, the fallback
    assert report.verdict("step").exact and not report.verdict("traj").exact
    assert "renders no end-of-turn token" in report.verdict("traj").reason


# -- the trainer's check --------------------------------------------------------------------------


def test_check_setting_names_the_problem_and_the_exact_settings(qwen3, tiny_tokenizer):
    with pytest.raises(TemplateDriftError, match="rollout.mode=traj is not token-exact") as info:
        check_setting(qwen3, "traj", model="qwen3-like")
    message = str(info.value)
    assert "<think>" in message and "Exact with this template: rollout.mode=step" in message
    assert "arl doctor qwen3-like" in message
    assert isinstance(info.value, ValueError)
    assert check_setting(qwen3, "step").verdict("step").exact
    assert check_setting(tiny_tokenizer, "proxy-traj").exact and check_setting(tiny_tokenizer, "proxy-traj+tools").exact
    with pytest.raises(ValueError, match="unknown setting"):
        check_setting(tiny_tokenizer, "proxy")


def test_check_rollout_reads_the_config_or_the_injected_manager(qwen25, qwen3):
    from arl.config import ProxyConfig, RolloutConfig
    from arl.engine.scripted import ScriptedEngine
    from arl.rollout.factory import check_rollout
    from arl.rollout.proxy import ProxyEnvManager
    from arl.rollout.step import StepEnvManager
    from arl.rollout.traj import TrajEnvManager

    # Qwen2.5 (the qwen*_frozenlake configs): traj and the text agent through the proxy are exact
    assert check_rollout(qwen25, RolloutConfig(mode="traj")) is not None
    assert check_rollout(qwen25, RolloutConfig(mode="proxy", proxy=ProxyConfig(granularity="traj")))
    with pytest.raises(TemplateDriftError, match="granularity=step"):  # a tool-calling runner
        check_rollout(qwen25, RolloutConfig(mode="proxy", proxy=ProxyConfig(runner="tool")))
    engine = ScriptedEngine(qwen3)
    assert check_rollout(qwen3, RolloutConfig(mode="traj"), StepEnvManager(engine)) is not None
    with pytest.raises(TemplateDriftError):
        check_rollout(qwen3, RolloutConfig(mode="step"), TrajEnvManager(engine))
    with pytest.raises(TemplateDriftError, match="granularity=traj"):
        check_rollout(qwen3, RolloutConfig(), ProxyEnvManager(engine, granularity="traj"))
    assert check_rollout(qwen3, RolloutConfig(), object()) is None  # not arl's: not checked


def test_check_rollout_refuses_only_what_the_agent_needs(smollm2_like):
    """SmolLM2's template drops tool calls: a text agent through the proxy starts, a tool agent
    is refused, saying how to declare a text agent."""
    from arl.config import ProxyConfig, RolloutConfig
    from arl.engine.scripted import ScriptedEngine
    from arl.rollout.factory import check_rollout
    from arl.rollout.proxy import ProxyEnvManager

    def proxy(**kwargs):
        return RolloutConfig(mode="proxy", proxy=ProxyConfig(**kwargs))

    agent = ["{python}", "-m", "arl.agents.examples.gym_agent"]
    for tracker in ("traj", "step"):
        # text agents: gym (auto), gym by import path (auto), an agent program declared text
        assert check_rollout(smollm2_like, proxy(granularity=tracker))
        assert check_rollout(smollm2_like, proxy(granularity=tracker, runner="arl.rollout.runners:gym_runner"))
        assert check_rollout(smollm2_like, proxy(granularity=tracker, runner="push", transport="http",
                                                 runner_kwargs={"command": agent}, tools=False))
        # tool agents: tool and bugfix (auto), an agent program (auto: not known, so a tool agent)
        for kwargs in ({"runner": "tool"}, {"runner": "arl.agents.bugfix:bugfix_runner"},
                       {"runner": "push", "transport": "http", "runner_kwargs": {"command": agent}},
                       {"runner": "gym", "tools": True}):
            with pytest.raises(TemplateDriftError, match=f"granularity={tracker} with a tool agent") as info:
                check_rollout(smollm2_like, proxy(granularity=tracker, **kwargs), model="smollm2-135m")
            message = str(info.value)
            assert "drops assistant tool_calls" in message
            assert f"rollout.mode=proxy rollout.proxy.granularity={tracker} with a text agent" in message
            assert "rollout.proxy.tools=false" in message and "arl doctor smollm2-135m" in message
    # an injected proxy manager: its agent is not known, so the config says (default: text)
    engine = ScriptedEngine(smollm2_like)
    assert check_rollout(smollm2_like, RolloutConfig(), ProxyEnvManager(engine, granularity="traj"))
    with pytest.raises(TemplateDriftError, match="with a tool agent"):
        check_rollout(smollm2_like, proxy(tools=True), ProxyEnvManager(engine, granularity="traj"))


@pytest.mark.anyio
async def test_trainer_starts_a_text_agent_proxy_run_and_refuses_a_tool_agent_one(tmp_path, smollm2_like):
    from arl.engine.scripted import ScriptedEngine
    from arl.train import Trainer

    config = _train_config(tmp_path, "proxy")
    engine = ScriptedEngine(smollm2_like, max_model_len=1024)
    async with Trainer(config, engine=engine) as trainer:  # gym: a text agent
        await trainer.setup()
        assert trainer.model is not None
    config = _train_config(tmp_path / "tool", "proxy", "rollout.proxy.runner=tool")
    async with Trainer(config, engine=engine) as trainer:
        with pytest.raises(TemplateDriftError, match="with a tool agent"):
            await trainer.setup()
        assert not hasattr(trainer, "model") and trainer.manager is None


@pytest.mark.anyio
async def test_trainer_refuses_a_drifting_traj_rollout_before_training(tmp_path, qwen3):
    from arl.engine.scripted import ScriptedEngine
    from arl.train import Trainer

    config = _train_config(tmp_path, "traj")
    engine = ScriptedEngine(qwen3, max_model_len=1024)
    async with Trainer(config, engine=engine) as trainer:
        with pytest.raises(TemplateDriftError, match="rollout.mode=traj is not token-exact"):
            await trainer.setup()
        assert not hasattr(trainer, "model") and trainer.manager is None and engine.requests == 0


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["traj", "step"])
async def test_trainer_starts_with_the_tiny_template(tmp_path, mode):
    from arl.engine import make_engine
    from arl.train import Trainer

    config = _train_config(tmp_path, mode)
    async with Trainer(config, engine=make_engine(backend="scripted", model=config.model, max_model_len=1024)) as trainer:
        await trainer.setup()
        assert trainer.model is not None


# -- the command line -----------------------------------------------------------------------------


def test_cli_doctor_tiny(capsys):
    from arl.cli import main

    assert main(["doctor", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "generation prompt   '<|im_start|>assistant\\n'" in out
    assert "  traj                    exact" in out and "  proxy-step  tool agent  exact" in out
    assert main(["doctor", "tiny", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exact"] is True and report["end_of_turn"] == "<|im_end|>"


def test_cli_doctor_exit_code_judges_what_was_asked(tmp_path, smollm2_like, capsys):
    from arl.cli import main

    path = str(tmp_path / "smollm2-like")
    smollm2_like.save_pretrained(path)
    assert main(["doctor", path]) == 1  # a tool agent through the proxy is not exact
    out = capsys.readouterr().out
    assert "proxy-step  text agent  exact" in out and "proxy-step  tool agent  NOT exact" in out
    assert main(["doctor", path, "--no-tools"]) == 0  # text agents only
    assert "  tool agent" not in capsys.readouterr().out  # no tool agent rows
    for mode in ("traj", "step"):
        assert main(["doctor", path, "--mode", mode]) == 0
        out = capsys.readouterr().out
        assert f"  {mode}  " in out and "proxy" not in out.split("verdict")[1]
    assert main(["doctor", path, "--mode", "proxy"]) == 1
    capsys.readouterr()
    assert main(["doctor", path, "--mode", "proxy", "--no-tools", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exact"] is True and [v["setting"] for v in report["verdicts"]] == ["proxy-traj", "proxy-step"]


def test_cli_doctor_exit_code_1_when_a_setting_is_not_exact(tmp_path, qwen3, capsys):
    from arl.cli import main

    qwen3.save_pretrained(tmp_path / "qwen3-like")
    assert main(["doctor", str(tmp_path / "qwen3-like")]) == 1
    out = capsys.readouterr().out
    assert "  traj                    NOT exact" in out and "  step                    exact" in out
    assert main(["doctor", str(tmp_path / "qwen3-like"), "--template-kwargs", '{"enable_thinking": false}']) == 1
    assert "(an empty think block)" in capsys.readouterr().out
