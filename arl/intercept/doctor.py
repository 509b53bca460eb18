"""`arl doctor`: does a chat template render what arl's rollouts feed the model?

Chat-template drift is the most reported bug of agent RL: a template that drops a separator at
each assistant -> tool boundary, strips earlier ``<think>`` blocks (Qwen3), adds empty think
blocks or injects a default system prompt renders a conversation differently from the token
stream a rollout built turn by turn. arl never decodes and re-encodes what the engine sampled,
so its samples are always the tokens the engine was prompted with; what can drift is whether
those tokens are the template's rendering of the same messages, i.e. whether the policy is
trained in the contexts it gets when it is served through its chat template.

`diagnose(tokenizer)` answers that for one tokenizer, on a fixed realistic agent conversation
(system, user, an assistant with a tool call, its tool result, an assistant with two parallel
calls and their two results, then user / assistant turns; every assistant turn holds a
``<think>`` block) and on its text-game part (the same without tool calls: what
`TrajEnvManager` and a text agent such as `GymRunner` play). It reports:

- **prefix stability**: at every assistant turn, is the rendering of the conversation up to the
  generation prompt a token prefix of its rendering with that turn, and is the rendering with
  the turn a token prefix of the next request's prompt? Where not: which message changed, and
  the tokens before and after (`Break`).
- the **bridge** after an assistant turn (`bridge_ids`) for a user and for a tool message, the
  **generation prompt**, **end-of-turn** and **separator** (template.py's probe);
- **think blocks**: dropped from earlier assistant turns, empty ones added to assistant turns or
  to the generation prompt; whether assistant **tool calls** are rendered at all; the **default
  system prompt** rendered for a conversation without one;
- a **verdict** per setting (`Verdict`): each setting's token construction is replayed with the
  functions the managers use and compared with ``apply_chat_template`` of the same messages:

  - ``traj`` (`TrajEnvManager`): first prompt + engine tokens + `bridge_ids` per turn, on the
    text-game conversation;
  - ``step`` (`StepEnvManager`): a fresh templated prompt per turn, exact unless the template
    has no generation prompt that extends the conversation;
  - ``proxy-traj`` / ``proxy-step`` (`ProxyEnvManager`'s ``granularity``) with a **text agent**,
    one that never sends tools nor gets tool calls back (`GymRunner`): a `MessageTracker` fed the
    text game request by request: every request's prompt, and the branch's sample;
  - ``proxy-traj+tools`` / ``proxy-step+tools``: the same with a **tool agent** (`ToolCallRunner`,
    the bug-fix agent), fed the agent conversation with its tool calls and the tools list. A
    template that drops tool calls (SmolLM2's) or cannot render them is exact for text agents only.

  The engine's tokens for an assistant turn are the template's own rendering of that turn as the
  last message (what a model following its template emits), up to its end-of-turn.

`check_setting` raises `TemplateDriftError` for a setting that is not exact for the tokenizer: the
trainer's start-up check (`arl.rollout.factory.check_rollout` picks the setting the run needs:
its mode, tracker mode and whether its agent uses tools). Everything is tokenizer-only and cached
per tokenizer; the report renders as text (`TemplateReport.format`), which only the CLI prints.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import attrs

from arl.config import MODES
from arl.intercept.template import _DUMMY, _render, _template, _turn_end, bridge_ids, chat_ids
from arl.intercept.tracker import MessageTracker

# arl's own managers (text games); the proxy's tracker modes with a text agent (one that never
# sends tools and never gets tool calls back: GymRunner); the same with a tool agent ("+tools").
SETTINGS = ("traj", "step", "proxy-traj", "proxy-step", "proxy-traj+tools", "proxy-step+tools")
# How a config selects each setting (for messages that say what to change).
SETTING_CONFIG = {
    "traj": "rollout.mode=traj",
    "step": "rollout.mode=step",
    "proxy-traj": "rollout.mode=proxy rollout.proxy.granularity=traj with a text agent",
    "proxy-step": "rollout.mode=proxy rollout.proxy.granularity=step with a text agent",
    "proxy-traj+tools": "rollout.mode=proxy rollout.proxy.granularity=traj with a tool agent",
    "proxy-step+tools": "rollout.mode=proxy rollout.proxy.granularity=step with a tool agent",
}
TEXT_AGENT_CONFIG = "rollout.proxy.tools=false"  # declares an agent program a text agent (factory.agent_tools)

TOOLS = (
    {"type": "function", "function": {
        "name": "look", "description": "Look at a thing.",
        "parameters": {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"]},
    }},
)


def _call(call_id: str, target: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "look", "arguments": json.dumps({"target": target})}}


_SYSTEM = {"role": "system", "content": "You are an agent in a text game. Think in <think></think>, then act."}
# Indices 4-6 are the parallel-call turn (dropped for templates that refuse parallel calls, as
# Llama 3.1's does); 2-6 are the tool part (dropped for the text-game conversation).
AGENT_CONVERSATION: tuple[dict[str, Any], ...] = (
    _SYSTEM,
    {"role": "user", "content": "Task: open the door. You stand in a dark room."},
    {"role": "assistant", "content": "<think>\nI cannot see anything yet.\n</think>\nLet me look around.",
     "tool_calls": [_call("call_1", "room")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "A locked door and a table."},
    {"role": "assistant", "content": "<think>\nThe door is locked; the table may hold a key.\n</think>\nI look at both.",
     "tool_calls": [_call("call_2", "door"), _call("call_3", "table")]},
    {"role": "tool", "tool_call_id": "call_2", "content": "The door has a keyhole."},
    {"role": "tool", "tool_call_id": "call_3", "content": "A brass key lies on the table."},
    {"role": "assistant", "content": "<think>\nTake the key first.\n</think>\n<answer>take key</answer>"},
    {"role": "user", "content": "You hold the brass key."},
    {"role": "assistant", "content": "<think>\nNow unlock the door.\n</think>\n<answer>unlock door</answer>"},
    {"role": "user", "content": "The door opens."},
    {"role": "assistant", "content": "<think>\nWalk through it.\n</think>\n<answer>go north</answer>"},
)
SINGLE_CALL_CONVERSATION = AGENT_CONVERSATION[:4] + AGENT_CONVERSATION[7:]
GAME_CONVERSATION = AGENT_CONVERSATION[:2] + AGENT_CONVERSATION[7:]
_BRIDGE_USER = {"role": "user", "content": "next observation"}
_BRIDGE_TOOL = {"role": "tool", "tool_call_id": "call_1", "content": "tool result"}

Kwargs = tuple[tuple[str, Any], ...]


class TemplateDriftError(ValueError):
    """The configured rollout would train on token streams its chat template does not render."""


@attrs.frozen
class Break:
    """Re-rendering with more messages changed earlier tokens.

    ``turn``: the assistant message at whose boundary it broke; ``kind``: ``"generation prompt"``
    (the prompt for ``turn`` is not the start of the rendering with it) or ``"next prompt"`` (the
    rendering with ``turn`` is not the start of the next request's prompt); ``message``: the
    message whose tokens changed (``len(conversation)``: the generation prompt); ``token``: the
    first differing position; ``was`` / ``now``: the tokens from there, decoded and shortened.
    """

    turn: int
    kind: str
    message: int
    token: int
    was: str
    now: str


@attrs.frozen
class Verdict:
    """Is ``setting`` token-exact for the tokenizer? ``reason``: one line when it is not."""

    setting: str
    exact: bool
    reason: str = ""

    @property
    def mode(self) -> str:
        """The ``rollout.mode`` of the setting: traj, step or proxy."""
        return self.setting.split("-", 1)[0]

    @property
    def label(self) -> str:
        """The report's row name: the setting, and for proxy which agent.

        >>> Verdict("proxy-step+tools", False).label, Verdict("traj", True).label
        ('proxy-step  tool agent', 'traj')
        """
        if self.mode != "proxy":
            return self.setting
        return f"{self.setting.removesuffix('+tools'):<11} " + ("tool agent" if self.setting.endswith("+tools")
                                                                else "text agent")


@attrs.frozen
class TemplateReport:
    """What `diagnose` found for one tokenizer (see the module docstring). Text: `format()`."""

    model: str
    tools: bool  # whether tool agents were checked (the "+tools" verdicts)
    chat_template_kwargs: Kwargs
    conversation: tuple[str, ...]  # role of each message of the agent conversation checked
    generation_prompt: str
    end_of_turn: str
    separator: str
    bridge_user: str | None  # None: the template could not render it
    bridge_tool: str | None
    default_system: str | None  # what a conversation without a system message gets before it
    think_stripped: tuple[int, ...]  # assistant messages whose <think> block the rendering drops
    empty_think_in_turns: bool  # a think block rendered into assistant turns that had none
    generation_prompt_think: str  # "" | "empty" (an empty block) | "open" (starts one)
    tool_calls_rendered: bool | None  # None: no tool calls checked
    breaks: tuple[Break, ...]
    verdicts: tuple[Verdict, ...]
    notes: tuple[str, ...] = ()  # what could not be checked as planned, and why
    rendered: bool = True  # False: the template failed on a plain conversation, nothing else was checked

    @property
    def exact(self) -> bool:
        """Every setting checked token-exact."""
        return all(v.exact for v in self.verdicts)

    def verdict(self, setting: str) -> Verdict:
        for v in self.verdicts:
            if v.setting == setting:
                return v
        raise KeyError(f"unknown setting {setting!r}; known: {', '.join(SETTINGS)}")

    def exact_settings(self) -> list[str]:
        return [v.setting for v in self.verdicts if v.exact]

    def select(self, mode: str | None = None) -> TemplateReport:
        """The report with only the verdicts of rollout ``mode`` (traj, step, proxy; None: all):
        what `exact`, `format` and `to_dict` then judge."""
        if mode is None:
            return self
        if mode not in MODES:
            raise ValueError(f"unknown rollout mode {mode!r}; known: {', '.join(MODES)}")
        return attrs.evolve(self, verdicts=tuple(v for v in self.verdicts if v.mode == mode))

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        out["exact"] = self.exact
        return out

    def format(self) -> str:
        """The report as the terminal shows it."""
        conv = ", ".join(f"{i} {role}" for i, role in enumerate(self.conversation))
        game = ", ".join(f"{i} {m['role']}" for i, m in enumerate(GAME_CONVERSATION))
        kwargs = f" with {dict(self.chat_template_kwargs)}" if self.chat_template_kwargs else ""
        think = ("kept in earlier turns" if not self.think_stripped
                 else "stripped from " + ", ".join(f"messages[{i}]" for i in self.think_stripped))
        think += "; " + ("an empty think block is added to assistant turns without one" if self.empty_think_in_turns
                         else "no empty think block added to turns")
        gen_think = {"": "", "empty": " (an empty think block)", "open": " (opens a think block)"}
        if not self.rendered:
            return "\n".join([f"chat template of {self.model}{kwargs}: not checked",
                              *(f"  {v.label:<23} NOT exact" for v in self.verdicts), f"note: {self.notes[0]}"])
        with_calls = any(r.endswith("+tool_calls") for r in self.conversation)
        lines = [
            f"chat template of {self.model}{kwargs}",
            f"  conversation checked: {conv}" + (f"; tools: {len(TOOLS)} function" if with_calls else ""),
            f"  text game (traj, proxy text agent): {game}",
            f"  generation prompt   {_lit(self.generation_prompt)}{gen_think[self.generation_prompt_think]}",
            f"  end of turn         {_lit(self.end_of_turn)}   separator {_lit(self.separator)}",
            f"  bridge + user       {_lit(self.bridge_user, 120)}",
            f"  bridge + tool       {_lit(self.bridge_tool, 120)}",
            f"  default system      {'none' if self.default_system is None else _lit(self.default_system, 120)}",
            f"  think blocks        {think}",
        ]
        if self.tool_calls_rendered is not None:
            lines.append("  tool calls          " + ("rendered" if self.tool_calls_rendered
                                                     else "NOT rendered: the template drops assistant tool_calls"))
        turns = sum(1 for r in self.conversation if r.startswith("assistant"))
        if not self.breaks:
            lines.append(f"  prefix stability    stable at all {turns} assistant turns")
        else:
            lines.append(f"  prefix stability    {len(self.breaks)} break(s):")
            for b in self.breaks:
                where = "the generation prompt" if b.message >= len(self.conversation) else (
                    f"messages[{b.message}] ({self.conversation[b.message]})")
                lines.append(f"    {b.kind} of messages[{b.turn}]: {where} changes at token {b.token}: "
                             f"was {b.was}, now {b.now}")
        lines.append("verdict (token-exact: every prompt and sample is the template's rendering of its messages; "
                     "a text agent never sends tools nor gets tool calls back, a tool agent does)")
        for v in self.verdicts:
            lines.append(f"  {v.label:<23} " + ("exact" if v.exact else f"NOT exact: {v.reason}"))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _lit(text: str | None, width: int = 90) -> str:
    """`text` as a one-line Python literal, cut to about `width` characters ("-" for None).

    >>> print(_lit("<|im_start|>user\\nhi"))
    '<|im_start|>user\\nhi'
    >>> print(_lit("x" * 20, width=8))
    'xxxxxxxx'…
    """
    if text is None:
        return "-"
    return repr(text[:width]) + ("…" if len(text) > width else "")


# -- the checks ---------------------------------------------------------------------------------


def diagnose(tokenizer: Any, *, tools: bool = True, chat_template_kwargs: dict[str, Any] | None = None) -> TemplateReport:
    """The chat-template report of `tokenizer` (see the module docstring), cached per tokenizer.

    The verdicts cover every setting of `SETTINGS`; ``tools=False`` leaves out the tool agents
    (``+tools``), and the findings are then those of the text game. ``chat_template_kwargs`` go to
    every rendering (e.g. ``{"enable_thinking": False}``); arl's traj and step managers pass none.
    A template that fails on some conversation is reported (``notes``, the verdicts' reasons),
    never raised. Cached per tokenizer object, like template.py's probe: a chat template changed
    on the same object afterwards is not seen.

    >>> from transformers import AutoTokenizer
    >>> from arl.models import resolve_model
    >>> report = diagnose(AutoTokenizer.from_pretrained(resolve_model("tiny")))
    >>> report.exact, report.generation_prompt, report.default_system
    (True, '<|im_start|>assistant\\n', None)
    """
    kwargs: Kwargs = tuple(sorted((chat_template_kwargs or {}).items()))
    try:
        hash(kwargs)
    except TypeError:  # unhashable kwargs values: not cached
        return _diagnose.__wrapped__(tokenizer, kwargs, bool(tools))
    return _diagnose(tokenizer, kwargs, bool(tools))


def _label(message: dict[str, Any]) -> str:
    return message["role"] + ("+tool_calls" if message.get("tool_calls") else "")


def _reasoning(content: str) -> str | None:
    if "<think>" not in content or "</think>" not in content:
        return None
    return content.split("<think>", 1)[1].split("</think>", 1)[0].strip()


def _markers(message: dict[str, Any]) -> list[str]:
    """Texts that end a message in its rendering, in order (to find where a token lies)."""
    tail = message["content"].split("</think>")[-1].strip()
    out = [tail] if tail else []
    for call in message.get("tool_calls") or ():
        out += [str(v) for v in json.loads(call["function"]["arguments"]).values()]
    return out


def _locate(tokenizer: Any, ids: Sequence[int], pos: int, messages: Sequence[dict[str, Any]]) -> int:
    """The message whose rendering holds token `pos` of `ids` (`len(messages)`: after the last
    one, the generation prompt). A message spans from the end of the previous one to the end of
    its last marker text; a message whose markers the rendering lacks has no span."""
    text = tokenizer.decode(list(ids))
    at = len(tokenizer.decode(list(ids[:pos])))
    end = 0
    for i, message in enumerate(messages):
        for mark in _markers(message):
            found = text.find(mark, end)
            if found >= 0:
                end = found + len(mark)
        if at < end:
            return i
    return len(messages)


def _first_diff(ours: Sequence[int], want: Sequence[int], prefix: bool) -> int | None:
    """First position where `ours` and `want` differ; None when equal (``prefix``: when `ours`
    is a prefix of `want`)."""
    for i, (a, b) in enumerate(zip(ours, want, strict=False)):  # lengths may differ
        if a != b:
            return i
    if len(ours) == len(want) or (prefix and len(ours) < len(want)):
        return None
    return min(len(ours), len(want))


class _Checker:
    """One tokenizer's renderings and findings, shared by the checks of one `diagnose` call."""

    def __init__(self, tokenizer: Any, kwargs: Kwargs):
        self.tok = tokenizer
        self.kwargs = kwargs
        self.kw = dict(kwargs) or None
        self.tool_calls_rendered: bool | None = None
        eot, sep = _turn_end(tokenizer, "[]", kwargs)
        self.eot, self.sep = list(eot), list(sep)

    def ids(self, messages: Sequence[dict[str, Any]], gen: bool, tools: Any) -> list[int]:
        return chat_ids(self.tok, messages, gen, tools=tools, chat_template_kwargs=self.kw)

    def text(self, messages: Sequence[dict[str, Any]], gen: bool, tools: Any) -> str:
        return _render(self.tok, messages, tools, gen, self.kwargs)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))

    def response(self, conv: Sequence[dict[str, Any]], k: int, tools: Any) -> list[int]:
        """The engine's tokens for assistant message k: the template's rendering of that turn as
        the last message after its generation prompt, through the end-of-turn (the message's
        content where the rendering does not start with the generation prompt)."""
        head, full = self.text(conv[:k], True, tools), self.text(conv[: k + 1], False, tools)
        body = full[len(head):] if full.startswith(head) else conv[k]["content"]
        eot = self.decode(self.eot)
        if eot and eot in body:
            body = body[: body.index(eot)]
        return list(self.tok.encode(body, add_special_tokens=False)) + self.eot

    def mismatch(self, what: str, ours: Sequence[int], want: Sequence[int], conv: Sequence[dict[str, Any]],
                 prefix: bool = False, tools: Any = None) -> str | None:
        """None when `ours` is the template's `want` (of `conv` with `tools`), else one line: where
        and which tokens differ, and the cause when a finding explains it."""
        i = _first_diff(ours, want, prefix)
        if i is None:
            return None
        m = _locate(self.tok, want, i, conv)
        where = "the generation prompt" if m >= len(conv) else f"messages[{m}] ({_label(conv[m])})"
        cause = ""
        if m < len(conv):
            msg = conv[m]
            try:  # the finding, for this conversation (the report's is the agent conversation's)
                stripped = self.stripped(conv, tools)
            except Exception:  # noqa: BLE001 -- already in the notes
                stripped = ()
            if m in stripped:
                cause = " (the template drops <think> blocks of earlier turns)"
            elif msg["role"] == "tool" and m > 0 and conv[m - 1]["role"] == "tool":
                cause = " (the template merges consecutive tool messages into one turn)"
            elif msg.get("tool_calls") and self.tool_calls_rendered is False:
                cause = " (the template drops assistant tool_calls)"
        eot = self.decode(self.eot)
        if not cause and eot and eot not in self.decode(want):
            cause = f" (the template renders no end-of-turn token; arl ends turns with EOS {eot!r})"
        return (f"{what} differs from the template at {where}: arl has {_lit(self.decode(ours[i:i + 6]), 32)}, "
                f"the template {_lit(self.decode(want[i:i + 6]), 32)}{cause}")

    # -- findings ---------------------------------------------------------------------------------
    def breaks(self, conv: Sequence[dict[str, Any]], tools: Any) -> list[Break]:
        turns = [k for k, m in enumerate(conv) if m["role"] == "assistant"]
        out = []
        for n, k in enumerate(turns):
            with_turn = self.ids(conv[: k + 1], False, tools)
            pairs = [("generation prompt", self.ids(conv[:k], True, tools), with_turn)]
            if n + 1 < len(turns):
                pairs.append(("next prompt", with_turn, self.ids(conv[: turns[n + 1]], True, tools)))
            for kind, shorter, longer in pairs:
                i = _first_diff(shorter, longer, prefix=True)
                if i is not None:
                    out.append(Break(turn=k, kind=kind, message=_locate(self.tok, shorter, i, conv), token=i,
                                     was=_lit(self.decode(shorter[i:i + 6]), 32),
                                     now=_lit(self.decode(longer[i:i + 6]), 32)))
        return out

    def stripped(self, conv: Sequence[dict[str, Any]], tools: Any) -> tuple[int, ...]:
        text = self.text(conv, False, tools)
        return tuple(k for k, m in enumerate(conv)
                     if m["role"] == "assistant" and (r := _reasoning(m["content"])) and r not in text)

    def renders_tool_calls(self, conv: Sequence[dict[str, Any]], tools: Any) -> bool | None:
        calls = [k for k, m in enumerate(conv) if m.get("tool_calls")]
        if not calls:
            return None
        for k in calls:
            bare = {key: v for key, v in conv[k].items() if key != "tool_calls"}
            if self.text(conv[: k + 1], False, tools) == self.text([*conv[:k], bare], False, tools):
                return False
        return True

    def ignores_tools(self, conv: Sequence[dict[str, Any]], tools: Any) -> bool:
        return self.text(conv, False, tools) == self.text(conv, False, None)

    def empty_think(self) -> bool:
        plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                 {"role": "assistant", "content": "<answer>a</answer>"}, {"role": "user", "content": "b"},
                 {"role": "assistant", "content": "<answer>b</answer>"}]
        return "<think>" in self.text(plain, False, None)

    def default_system(self) -> str | None:
        user = {"role": "user", "content": "arl doctor user"}
        alone = self.text([user], False, None)
        prefix = _template(self.tok, "[]", self.kwargs).prefix_text
        full = self.text([*_DUMMY, user], False, None)
        segment = full[len(prefix):] if full.startswith(prefix) else ""
        if segment and alone.endswith(segment):
            head = alone[: len(alone) - len(segment)]
        else:  # the user turn renders differently first: what precedes its content
            head = alone[: alone.find(user["content"])]
        # A document-start BOS is not a system prompt; a "BOS" that opens every turn is (SmolLM2's
        # is <|im_start|>), and there the user turn starts with it too.
        bos = self.tok.bos_token or ""
        if bos and head.startswith(bos) and not segment.startswith(bos):
            head = head[len(bos):]
        return head or None

    def bridge(self, message: dict[str, Any]) -> str:
        return self.decode(bridge_ids(self.tok, [message], chat_template_kwargs=self.kw))

    # -- settings ---------------------------------------------------------------------------------
    def traj_manager(self, conv: Sequence[dict[str, Any]]) -> str | None:
        """TrajEnvManager's construction on `conv`: why it is not the template's, or None."""
        turns = [k for k, m in enumerate(conv) if m["role"] == "assistant"]
        ids = self.ids(conv[: turns[0]], True, None)
        for n, k in enumerate(turns):
            if (why := self.mismatch(f"text game: the prompt of messages[{k}]", ids, self.ids(conv[:k], True, None),
                                     conv)):
                return why
            ids += self.response(conv, k, None)
            if n + 1 < len(turns):
                ids += bridge_ids(self.tok, conv[k + 1: turns[n + 1]], chat_template_kwargs=self.kw)
        return self.mismatch("text game: the episode's sample", ids + self.sep, self.ids(conv, False, None), conv)

    def proxy(self, conv: Sequence[dict[str, Any]], tools: Any, where: str = "") -> tuple[str | None, str | None]:
        """A MessageTracker fed `conv` request by request: (why step samples, why the traj
        sample is not the template's), None where it is. `where`: the reasons' prefix."""
        tracker = MessageTracker(self.tok, chat_template_kwargs=self.kw)
        step: str | None = None
        for k, m in enumerate(conv):
            if m["role"] != "assistant":
                continue
            try:
                prompt = tracker.prepare(conv[:k], tools)
            except Exception as exc:  # noqa: BLE001 -- TemplateError and what a template raises
                why = f"{where}the tracker cannot tokenize messages[:{k}]: {exc}"
                return why, why
            step = step or self.mismatch(f"{where}the prompt of messages[{k}]", list(prompt.prompt_ids),
                                         self.ids(conv[:k], True, tools), conv, tools=tools)
            resp = self.response(conv, k, tools)
            tracker.commit(prompt, resp, [0.0] * len(resp), "stop", m)
        if step is not None:
            return step, step
        samples = tracker.traj_samples()
        if len(samples) != 1:  # the agent re-sends what the engine generated: one branch
            return None, f"{where}the episode forked into {len(samples)} branches"
        return None, self.mismatch(f"{where}the episode's sample", samples[0].input_ids + self.sep,
                                   self.ids(conv, False, tools), conv, tools=tools)


def _failed(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


@functools.lru_cache(maxsize=64)
def _diagnose(tokenizer: Any, kwargs: Kwargs, tools: bool) -> TemplateReport:
    model = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    notes: list[str] = []
    base = dict(model=model, tools=tools, chat_template_kwargs=kwargs)
    settings = SETTINGS if tools else tuple(s for s in SETTINGS if not s.endswith("+tools"))
    try:
        tpl = _template(tokenizer, "[]", kwargs)
        check = _Checker(tokenizer, kwargs)
        check.ids(GAME_CONVERSATION, True, None)
    except Exception as exc:  # noqa: BLE001 -- no template, or one that cannot render a plain chat
        why = f"the chat template fails on a plain conversation or its generation prompt ({_failed(exc)})"
        return TemplateReport(
            **base, conversation=tuple(_label(m) for m in GAME_CONVERSATION), generation_prompt="",  # type: ignore[arg-type]
            end_of_turn="", separator="", bridge_user=None, bridge_tool=None, default_system=None,
            think_stripped=(), empty_think_in_turns=False, generation_prompt_think="", tool_calls_rendered=None,
            breaks=(), verdicts=tuple(Verdict(s, False, why) for s in settings), notes=(why,), rendered=False,
        )

    # The agent conversation: parallel tool calls, else one call per turn, else none (and the
    # tool agents are exact nowhere).
    conv: Sequence[dict[str, Any]] = GAME_CONVERSATION
    tool_list: Any = None
    tool_error = None
    if tools:
        for candidate, what in ((AGENT_CONVERSATION, "parallel tool calls"), (SINGLE_CALL_CONVERSATION, "tool calls")):
            try:
                check.ids(candidate, True, TOOLS)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"the template cannot render {what} ({_failed(exc)})")
                continue
            conv, tool_list = candidate, list(TOOLS)
            break
        else:
            tool_error = notes[-1]

    def attempt(fn: Any, *args: Any, failed: Any = None) -> Any:
        """fn(*args), or `failed` when the template raised (the error goes to the notes)."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 -- reported, not raised
            notes.append(f"{fn.__name__}: {_failed(exc)}")
            return failed

    think_stripped = attempt(check.stripped, conv, tool_list) or ()
    check.tool_calls_rendered = attempt(check.renders_tool_calls, conv, tool_list)
    if check.tool_calls_rendered is False:
        # The engine's tokens hold the calls the agent's messages carry; the template's rendering
        # of those messages does not, so no proxy prompt after a call can be the template's.
        tool_error = "the template drops assistant tool_calls: the calls the model generated are not in its rendering"
    if tool_list and attempt(check.ignores_tools, conv, tool_list, failed=False):
        notes.append("the template ignores the tools list: the model never sees the tool definitions")

    gen_text = tokenizer.decode(list(tpl.gen_prompt_ids))
    gen_think = ("empty" if "</think>" in gen_text else "open") if "<think>" in gen_text else ""

    if not tpl.gen_prompt_ids:
        step = Verdict("step", False, "the template renders no generation prompt (add_generation_prompt is ignored)")
    else:
        step = Verdict("step", True)
    failed = "the check failed (see the notes)"
    traj_why = attempt(check.traj_manager, GAME_CONVERSATION, failed=failed) if step.exact else step.reason
    traj = Verdict("traj", traj_why is None and step.exact, traj_why or "")
    # A text agent plays the text game through the proxy; a tool agent the agent conversation.
    text_step, text_traj = attempt(check.proxy, GAME_CONVERSATION, None, "text game: ", failed=(failed, failed))
    verdicts = [
        traj, step,
        Verdict("proxy-traj", text_traj is None, text_traj or ""),
        Verdict("proxy-step", text_step is None, text_step or ""),
    ]
    if tools:
        if tool_error is not None:
            tool_step = tool_traj = tool_error
        else:
            tool_step, tool_traj = attempt(check.proxy, conv, tool_list, failed=(failed, failed))
        verdicts += [Verdict("proxy-traj+tools", tool_traj is None, tool_traj or ""),
                     Verdict("proxy-step+tools", tool_step is None, tool_step or "")]
    return TemplateReport(
        **base,  # type: ignore[arg-type]
        conversation=tuple(_label(m) for m in conv),
        generation_prompt=gen_text,
        end_of_turn=tokenizer.decode(check.eot),
        separator=tokenizer.decode(check.sep),
        bridge_user=attempt(check.bridge, _BRIDGE_USER),
        bridge_tool=attempt(check.bridge, _BRIDGE_TOOL),
        default_system=attempt(check.default_system),
        think_stripped=think_stripped,
        empty_think_in_turns=bool(attempt(check.empty_think)),
        generation_prompt_think=gen_think,
        tool_calls_rendered=check.tool_calls_rendered,
        breaks=tuple(attempt(check.breaks, conv, tool_list) or ()),
        verdicts=tuple(verdicts),
        notes=tuple(notes),
    )


# -- the trainer's start-up check ----------------------------------------------------------------


def check_setting(tokenizer: Any, setting: str, *, chat_template_kwargs: dict[str, Any] | None = None,
                  model: str | None = None, agent: str = "") -> TemplateReport:
    """`diagnose`, then raise `TemplateDriftError` when ``setting`` (one of `SETTINGS`) is not
    token-exact for `tokenizer`; the message names the problem and the settings that are exact.
    ``model``: the name the message uses (default: the tokenizer's path); ``agent``: how the
    caller knows a proxy agent's kind, said after the setting (e.g. ``rollout.proxy.runner=tool``)."""
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; known: {', '.join(SETTINGS)}")
    report = diagnose(tokenizer, tools=setting.endswith("+tools"), chat_template_kwargs=chat_template_kwargs)
    verdict = report.verdict(setting)
    if not verdict.exact:
        name = model or report.model
        exact = [SETTING_CONFIG[s] for s in report.exact_settings()]
        text = setting.removesuffix("+tools")
        hint = (f" A text agent (one that never sends tools nor gets tool calls back) is exact: if yours is one, "
                f"say so with {TEXT_AGENT_CONFIG}." if text != setting and report.verdict(text).exact else "")
        raise TemplateDriftError(
            f"{SETTING_CONFIG[setting]}{f' ({agent})' if agent else ''} is not token-exact with the chat template "
            f"of {name}: {verdict.reason}. It would train the policy on token streams this template never renders "
            f"for the same messages. Exact with this template: {'; '.join(exact) or 'no setting'}.{hint} "
            f"`arl doctor {name}` shows the report."
        )
    return report


__all__ = [
    "AGENT_CONVERSATION",
    "GAME_CONVERSATION",
    "SETTINGS",
    "SETTING_CONFIG",
    "TEXT_AGENT_CONFIG",
    "Break",
    "TemplateDriftError",
    "TemplateReport",
    "Verdict",
    "check_setting",
    "diagnose",
]
