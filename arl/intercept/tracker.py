"""MessageTracker: the token view of an agent's chat-completions calls (docs/reference.md §4).

An agent sends whole message lists; the engine wants token ids, and training wants the exact
tokens the engine sampled. The tracker bridges the two for one episode:

- **Hash chain.** Message i of a request gets the key h_i = sha256(i, role, content, tool_calls,
  tool_call_id, name, h_{i-1}); h_{-1} hashes the request's tools, so changing the tools is a
  different conversation. A key names a message *in its context*: equal keys mean equal prefixes.
- **Incremental tokenization.** Each key is tokenized once, the first time it is seen: message 0
  by rendering it alone (with the tools, so a tools block or default system prompt the template
  adds belongs to it), every later message by rendering [dummy system, dummy user, message] and
  slicing off the rendering of the dummy pair (cached per tools). Segments are cut where the
  chat template starts a new message, so their concatenation is the template's rendering of the
  whole conversation (exact for templates that render each message on its own, e.g. ChatML and
  SmolLM2's; templates that merge consecutive tool messages are not).
- **Engine tokens.** An assistant message the engine generated is stored as the generation prompt
  (``<|im_start|>assistant\\n``) + the engine's token ids with their log-probs + the template's
  end-of-turn if the engine was cut at max_tokens + the inter-message separator (ChatML: "\\n").
  When the agent sends it back, its key finds those tokens: generated output is never decoded
  and re-encoded. An assistant message the tracker did not generate (the agent wrote or edited
  it) is rendered like any other message, carries no log-probs, and counts in
  ``stats["untracked_assistant"]`` (the tracker's warning; it never prints).
- **Branches** (what a fork is; the fork tests check exactly this). Every request that got a
  response becomes a *path*: its messages' keys plus the response's key. Requests are assigned to
  branches in the order their responses are committed:

  1. A request *continues* a branch when that branch's whole path (all its messages and its last
     response) is a prefix of the request's path; among several such branches the longest wins,
     then the most recently extended. The branch's path becomes the request's path.
  2. Otherwise the request *forks*: a new branch starts whose path is the request's path. This
     happens whenever the agent drops, edits, reorders, truncates or summarises earlier
     messages, edits or omits the model's last response, or re-sends an old prefix (a retry).
     Earlier branches are kept unchanged. A fork whose request holds an assistant message the
     engine did not generate is a *history rewrite* (``stats["history_rewrites"]``): the agent
     re-sends past turns in its own form (smolagents writes the model's output back in its own
     text format, so every call forks). Traj samples of such an agent are one short branch per
     call; ``granularity="step"`` (one sample per call, its prompt as the agent sent it) fits
     it. The first rewrite is logged once per process as a warning that says so
     (``logging.getLogger("arl.intercept.tracker")``), unless the tracker was built with
     ``granularity="step"``.
  3. A response that repeats word for word a message the engine already generated at the same
     place (same key) *is* that message: the first recorded tokens stand for it, the repeat adds
     no tokens to traj samples (step mode keeps its own sample), and a branch left with no
     response of its own yields no traj sample.

- **Samples.** ``traj_samples()``: one per branch (``keep="all"``) or only the longest
  (``keep="longest"``: most requests, then most tokens, then the latest). A branch sample is its
  path's tokens, ending at its last response's end-of-turn (no trailing separator). The loss mask
  is 1 only on engine tokens, and in ``keep="all"`` only on the responses *this* branch
  generated: tokens a fork inherits from an earlier branch appear as context with mask 0, so no
  generated token is trained twice. With ``keep="longest"`` every engine token on the path is
  masked. ``step_samples()``: one per request, its full prompt + the engine's response tokens.
  Both carry ``state_key`` = the hash (`arl.envs.game.state_hash`) of the request's latest
  observation message (the last user or tool message): the tracker sees messages only, not the game. It is proxy mode's last
  fallback: `ProxyEnvManager` keys a step on the game's ``state_key()`` the runner reports (arl's
  runners do), or the observation text it reports, before this message hash.

- **Images.** A user message's ``image_url`` parts (`arl.intercept.protocol`) render as one image
  placeholder token each in its segment; the node keeps their data URLs, so a prompt's images are
  its nodes' in order (``Prompt.images``) and a message's key names its images too. The handler
  has the engine render such a prompt and commits its `RenderedPrompt` (``Request.rendered``): a
  step sample's input ids are those expanded ids, a traj sample's begin with its last request's
  (`expand_images`: the image tokens are context, every other token keeps its mask and log-prob),
  and each carries that rendering (``TrackedSample.rendered``). A reply holds no image, so a branch's
  last request shows every image of its sample; with ``granularity="traj"`` an earlier request's
  rendering is let go when its branch is extended, so the pixels stay linear in the episode too.
- **Memory linear in the episode.** Every request re-sends the whole history, so a committed
  request that kept its own prompt (ids and message list) would make an episode's memory
  quadratic in its length. Each branch instead keeps its path's tokens as one append-only list,
  and a committed request keeps a `PromptView` of the prefix it was prompted with (its prompt is
  always a prefix: the path's tokens up to the response, whose segment starts with the generation
  prompt) and no message list of its own (the branch holds the nodes). Matching a request to a
  branch compares one key, not the path: a chain key names its whole prefix.

The keys live in `chain_keys.py`, the chat-template probing in `template.py`; this module is the
tracker's state: nodes, requests, branches and the samples cut from them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, get_args

import attrs

from arl._renamed import old_names, renamed_fields
from arl.config import KeepBranches
from arl.engine.base import SampledWith
from arl.engine.prompt import PromptView
from arl.engine.tokens import TokenRow
from arl.envs.game import state_hash
from arl.intercept.chain_keys import _memo_key, _tools_json, _tools_key, chain_key
from arl.intercept.protocol import message_images, message_text, normalize_message
from arl.intercept.template import _DUMMY, TemplateError, _render, _Template, _template

_log = logging.getLogger(__name__)
_REWRITE_WARNED: list[bool] = []  # the history-rewrite warning is logged once per process

@attrs.define(eq=False)
class Node:
    """One message in context: its token segment as it appears in the conversation."""

    key: str
    index: int
    role: str
    ids: list[int]
    mask: list[int]  # 1 on engine-generated tokens
    logprobs: list[float]
    generated: bool = False
    separator: int = 0  # trailing inter-message tokens (dropped at the end of a sample)
    owner: int | None = None  # branch that generated it
    request: int | None = None  # request that generated it
    sampled_with: SampledWith | None = None  # how its generated tokens were drawn
    images: tuple[str, ...] = ()  # its image parts' data URLs: one image placeholder token each in `ids`


@renamed_fields(state_hash="state_key")
@attrs.define(eq=False)
class Prompt:
    """A request's messages resolved to nodes, and the prompt the engine gets.

    What `prepare` returns holds its own lists; the copy a committed `Request` keeps holds no
    nodes (its branch's first `depth` nodes are its messages) and its ids are a view of its
    branch's tokens.
    """

    nodes: list[Node]
    prompt_ids: list[int] | PromptView
    tools: list[dict[str, Any]] | None
    root: str
    known: int  # how many leading messages were already tracked
    observation: str | None
    state_key: str | None  # the message-source state key: the hash of `observation`
    depth: int = 0  # number of messages
    images: tuple[str, ...] = ()  # every image of its messages in order (one placeholder each in prompt_ids)


@attrs.define(eq=False)
class Request:
    """One committed model call."""

    index: int
    prompt: Prompt
    response: Node
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    closing: list[int] = attrs.Factory(list)  # end-of-turn added after a response cut at max_tokens
    branch: int = -1
    sampled_with: SampledWith | None = None  # how response_ids were drawn
    # the engine's rendering of an image prompt (`arl.engine.image_prompt.RenderedPrompt`): the expanded
    # ids it ran and their pixels; None for a text prompt, or once a later request of its branch holds
    # every image (granularity "traj", see `_assign`)
    rendered: Any = None


@attrs.define(eq=False)
class ConversationBranch:
    """A path of nodes that requests extended, with its tokens as one append-only list (a branch
    of the module doc; ``keep_branches`` chooses among them)."""

    id: int
    nodes: list[Node]
    requests: list[int]
    ids: list[int] = attrs.Factory(list)  # the concatenation of the nodes' ids

    @classmethod
    def start(cls, id: int, path: Sequence[Node]) -> ConversationBranch:
        branch = cls(id, [], [])
        branch.extend(path)
        return branch

    def extend(self, nodes: Sequence[Node]) -> None:
        self.nodes.extend(nodes)
        for n in nodes:  # list += runs in C
            self.ids += n.ids

    def continued_by(self, keys: Sequence[str]) -> bool:
        """Is this branch's whole path a prefix of `keys`? One comparison: equal chain keys at the
        same index mean equal prefixes (each key hashes its parent's)."""
        n = len(self.nodes)
        return n <= len(keys) and keys[n - 1] == self.nodes[-1].key

    @property
    def keys(self) -> list[str]:
        return [n.key for n in self.nodes]


@renamed_fields(state_hash="state_key")
@attrs.frozen
class TrackedSample:
    """A token sequence for training; the manager adds scores and ids. (``state_hash``, the old
    name of ``state_key``, still works as a keyword and an attribute, with a DeprecationWarning.)"""

    input_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    requests: tuple[int, ...]  # the requests whose responses this sample holds
    branch: int
    state_key: str | None
    observation: str | None
    policy_version: int
    finish_reason: str
    sampled_with: tuple[SampledWith, ...] = ()  # one per run of response_mask (empty: not recorded)
    # the policy version that sampled each token, -1 on context tokens (empty: not recorded);
    # `policy_version` is the oldest response token's
    token_versions: tuple[int, ...] = ()
    # an image sample: the RenderedPrompt of its last request, whose expanded ids begin input_ids
    # (every image of the sample expanded to its image tokens); None: a text sample
    rendered: Any = None


class MessageTracker:
    """Tokens, branches and samples of one episode's chat-completions calls (see module doc).

    ``tools``: the default tool list for requests that send none. ``chat_template_kwargs`` go to
    `apply_chat_template`. Use: ``prompt = tracker.prepare(messages, tools)`` -> generate on
    ``prompt.prompt_ids`` -> ``tracker.commit(prompt, token_ids, logprobs, finish_reason, message)``.
    """

    def __init__(
        self, tokenizer: Any, tools: Sequence[dict[str, Any]] | None = None,
        *, chat_template_kwargs: dict[str, Any] | None = None, granularity: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.granularity = granularity  # the samples' mode, when known: "step" silences the rewrite warning
        self._kwargs = tuple(sorted((chat_template_kwargs or {}).items()))
        self._nodes: dict[str, Node] = {}
        # chain_key memo: every request re-sends the whole history, so without it each call would
        # re-hash every earlier message (O(turns) sha256 per call). Grows like `_nodes`.
        self._keys: dict[tuple[Any, ...], str] = {}
        self.requests: list[Request] = []
        self.branches: list[ConversationBranch] = []
        self.stats: dict[str, int] = {
            "requests": 0, "messages_reused": 0, "messages_tokenized": 0, "tokens_tokenized": 0,
            "untracked_assistant": 0, "forks": 0, "history_rewrites": 0,
        }

    # -- template parts --------------------------------------------------------------------------
    def template(self, tools: Sequence[dict[str, Any]] | None = None) -> _Template:
        tools = list(tools) if tools else self.tools
        return self._template(_tools_json(tools))

    def _template(self, tools_json: str) -> _Template:
        try:
            return _template(self.tokenizer, tools_json, self._kwargs)
        except TemplateError:
            raise
        except Exception as exc:  # jinja errors, templates that reject the dummy messages
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    def _chain_key(self, index: int, message: dict[str, Any], parent: str) -> str:
        """`chain_key`, memoized per tracker (see `_memo_key`)."""
        memo = _memo_key(index, message, parent)
        key = self._keys.get(memo)
        if key is None:
            key = self._keys[memo] = chain_key(index, message, parent)
        return key

    @property
    def end_of_turn_ids(self) -> list[int]:
        return list(self.template().end_of_turn_ids)

    def _segment(self, index: int, message: dict[str, Any], tools: Any, tpl: _Template) -> list[int]:
        try:
            if index == 0:
                text = _render(self.tokenizer, [message], tools, False, self._kwargs)
            else:
                full = _render(self.tokenizer, [*_DUMMY, message], tools, False, self._kwargs)
                if not full.startswith(tpl.prefix_text):
                    raise TemplateError(f"chat template renders messages[{index}] into earlier messages")
                text = full[len(tpl.prefix_text) :]
        except TemplateError:
            raise
        except Exception as exc:
            raise TemplateError(f"chat template failed on messages[{index}]: {type(exc).__name__}: {exc}") from exc
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # -- requests --------------------------------------------------------------------------------
    def prepare(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
        *, normalized: bool = False,
    ) -> Prompt:
        """Resolve a request's messages to nodes (tokenizing the new ones) and build its prompt.

        ``normalized=True``: the messages are `normalize_message` output already (a `ChatRequest`'s
        are), so they are not validated again. Raises `TemplateError` (a `BadRequest`) when the
        template cannot render them.
        """
        tools = list(tools) if tools else self.tools
        tools_json = _tools_json(tools)
        tpl = self._template(tools_json)
        root = _tools_key(tools_json)
        key, nodes, known = root, [], None
        observation: str | None = None
        tokenized = 0
        images: list[str] = []
        for i, raw in enumerate(messages):
            message = raw if normalized else normalize_message(raw, i)
            key = self._chain_key(i, message, key)
            node = self._nodes.get(key)
            if node is None:
                known = i if known is None else known
                ids = self._segment(i, message, tools, tpl)
                node = Node(key, i, message["role"], ids, [0] * len(ids), [0.0] * len(ids),
                            images=message_images(message))
                self._nodes[key] = node
                tokenized += 1
                self.stats["tokens_tokenized"] += len(ids)
                if message["role"] == "assistant":
                    self.stats["untracked_assistant"] += 1
            if message["role"] in ("user", "tool"):
                content = message["content"]
                observation = content if type(content) is str else message_text(message)
            if node.images:
                images += node.images
            nodes.append(node)
        self.stats["messages_tokenized"] += tokenized
        self.stats["messages_reused"] += len(nodes) - tokenized
        prompt_ids: list[int] = []
        for n in nodes:  # list.extend runs in C: a per-token comprehension costs ~10x more
            prompt_ids += n.ids
        prompt_ids += tpl.gen_prompt_ids
        return Prompt(
            nodes=nodes, prompt_ids=prompt_ids, tools=tools, root=root, known=len(nodes) if known is None else known,
            observation=observation, state_key=None if observation is None else state_hash(observation),
            depth=len(nodes), images=tuple(images),
        )

    def commit(
        self, prompt: Prompt, token_ids: Sequence[int], logprobs: Sequence[float], finish_reason: str,
        message: dict[str, Any], policy_version: int = 0, sampled_with: SampledWith | None = None,
        rendered: Any = None,
    ) -> Request:
        """Record the engine's response to `prompt` (``message`` is what the agent receives;
        ``sampled_with``: how the engine drew ``token_ids``, which the samples carry to the trainer;
        ``rendered``: for a prompt with images, the engine's `RenderedPrompt` of it, whose expanded
        ids and pixels its samples carry)."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} log-probs")
        if (rendered is None) != (not prompt.images) or (
                rendered is not None and list(rendered.prompt.token_ids) != list(prompt.prompt_ids)):
            raise ValueError(f"a prompt with {len(prompt.images)} image(s) is committed with the engine's rendering "
                             "of exactly it (rendered=), a text prompt without one")
        tpl = self.template(prompt.tools)
        parent = prompt.nodes[-1].key if prompt.nodes else prompt.root
        message = normalize_message(message, len(prompt.nodes))
        key = self._chain_key(len(prompt.nodes), message, parent)
        eot = list(tpl.end_of_turn_ids)
        ids = list(token_ids)
        close = [] if eot and ids[-len(eot) :] == eot else eot
        head, sep = list(tpl.gen_prompt_ids), list(tpl.separator_ids)
        lps = [float(x) for x in logprobs]
        node = self._nodes.get(key)
        if node is None or not node.generated:  # a repeat of a generated message is that message
            row = TokenRow().context(head).generated(ids, lps).context(close + sep)
            node = Node(
                key, len(prompt.nodes), "assistant", ids=row.ids, mask=row.mask, logprobs=row.logprobs,
                generated=True, separator=len(sep), request=len(self.requests), sampled_with=sampled_with,
            )
            self._nodes[key] = node
        request = Request(len(self.requests), prompt, node, ids, lps, finish_reason, policy_version,
                          closing=list(close), sampled_with=sampled_with, rendered=rendered)
        self.requests.append(request)
        self.stats["requests"] += 1
        self._assign(request)
        return request

    def _assign(self, request: Request) -> None:
        path = [*request.prompt.nodes, request.response]
        keys = [n.key for n in path]
        best: ConversationBranch | None = None
        for branch in self.branches:  # later branches win ties: they are the most recent
            if branch.continued_by(keys) and (best is None or len(branch.nodes) >= len(best.nodes)):
                best = branch
        if best is None:
            best = ConversationBranch.start(len(self.branches), path)
            if self.branches:
                self.stats["forks"] += 1
                if any(n.role == "assistant" and not n.generated for n in request.prompt.nodes):
                    self._history_rewrite()
            self.branches.append(best)
        else:
            if self.granularity == "traj":  # only a branch's last request makes a traj sample: its pixels suffice
                self.requests[best.requests[-1]].rendered = None
            best.extend(path[len(best.nodes) :])
            # most recently extended goes last, so it wins the next tie
            self.branches.remove(best)
            self.branches.append(best)
        best.requests.append(request.index)
        request.branch = best.id
        if request.response.owner is None:
            request.response.owner = best.id
        # keep the prompt as a view of the branch's tokens (a prefix of them: see the module doc)
        prompt = request.prompt
        request.prompt = attrs.evolve(prompt, nodes=[], prompt_ids=PromptView(best.ids, len(prompt.prompt_ids)))

    def _history_rewrite(self) -> None:
        self.stats["history_rewrites"] += 1
        if self.granularity == "step" or _REWRITE_WARNED:
            return
        _REWRITE_WARNED.append(True)
        _log.warning(
            "the agent re-sends earlier turns rewritten (an assistant message the engine did not generate, in a "
            "request that forks: e.g. smolagents' own text format), so its calls do not chain into one trajectory; "
            "granularity='step' fits this agent (rollout.proxy.granularity=step: one exact sample per call). "
            "Counted per episode in MessageTracker.stats['history_rewrites'] (a proxy sample's info['tracker']); "
            "logged once.")

    # -- samples ---------------------------------------------------------------------------------
    def traj_samples(self, keep: KeepBranches = "all") -> list[TrackedSample]:
        """One sample per branch, in the order branches started (or the longest only)."""
        branches = sorted(self.branches, key=lambda b: b.id)
        if keep == "longest" and branches:
            branches = [max(branches, key=lambda b: (len(b.requests), len(b.ids), b.id))]
        elif keep not in get_args(KeepBranches):
            raise ValueError(f"keep must be {' or '.join(map(repr, get_args(KeepBranches)))}, got {keep!r}")
        out = []
        for branch in branches:
            row = TokenRow()
            for node in branch.nodes:
                if node.generated and (keep == "longest" or node.owner == branch.id):
                    row.add(node.ids, node.mask, node.logprobs, node.sampled_with,
                            self.requests[node.request].policy_version)  # the version of the request that generated it
                else:  # context: a user/tool message, or a repeat of another branch's reply
                    row.context(node.ids)
            if not any(row.mask):  # nothing of its own to train on (only repeats of other branches)
                continue
            row = row.cut(len(row.ids) - branch.nodes[-1].separator)
            oldest = min(v for v, m in zip(row.versions, row.mask, strict=True) if m)  # its oldest token's version
            last = self.requests[branch.requests[-1]]
            if last.rendered is not None:
                row = expand_images(row, len(last.prompt.prompt_ids), last.rendered)
            out.append(TrackedSample(
                input_ids=row.ids, response_mask=row.mask, logprobs=row.logprobs,
                requests=tuple(branch.requests), branch=branch.id, state_key=last.prompt.state_key,
                observation=last.prompt.observation,
                policy_version=oldest,
                finish_reason=last.finish_reason, sampled_with=row.sampled_with, rendered=last.rendered,
                token_versions=tuple(row.token_versions),
            ))
        return out

    def step_samples(self) -> list[TrackedSample]:
        """One sample per request: its full prompt + the engine's response tokens (+ the template's
        end-of-turn, mask 0, when the engine was cut at max_tokens)."""
        out = []
        for r in self.requests:
            if r.rendered is None and r.prompt.images:
                raise ValueError(f"request {r.index}'s images were let go (granularity='traj' keeps a branch's last "
                                 "request's only): step samples need MessageTracker(granularity='step')")
            prompt_ids = r.prompt.prompt_ids if r.rendered is None else r.rendered.input_ids
            row = TokenRow.turn(prompt_ids, r.response_ids, r.logprobs, r.closing, r.sampled_with, r.policy_version)
            out.append(TrackedSample(
                input_ids=row.ids, response_mask=row.mask, logprobs=row.logprobs, requests=(r.index,), branch=r.branch,
                state_key=r.prompt.state_key, observation=r.prompt.observation,
                policy_version=r.policy_version, finish_reason=r.finish_reason, sampled_with=row.sampled_with,
                rendered=r.rendered, token_versions=tuple(row.token_versions),
            ))
        return out


def expand_images(row: TokenRow, prompt_len: int, rendered: Any) -> TokenRow:
    """``row`` with its first ``prompt_len`` tokens (a prompt with one image placeholder per image)
    replaced by ``rendered.input_ids``, the engine's expansion of them: each image's tokens are
    context (mask 0, log-prob 0, version -1), every other token keeps its mask, log-prob and policy
    version in order.

    >>> import numpy as np
    >>> from arl.engine.image_prompt import ImagePrompt, RenderedPrompt
    >>> r = RenderedPrompt(ImagePrompt([5, 9], [None]), (5, 9, 9, 9), np.zeros((12, 3)), np.array([[1, 2, 6]]), (None,), 9)
    >>> row = expand_images(TokenRow().context([5, 9]).generated([7], [-0.5], version=3), 2, r)
    >>> row.ids, row.mask, row.logprobs, row.token_versions
    ([5, 9, 9, 9, 7], [0, 0, 0, 0, 1], [0.0, 0.0, 0.0, 0.0, -0.5], [-1, -1, -1, -1, 3])
    """
    pad = rendered.image_token_id
    if list(rendered.prompt.token_ids) != row.ids[:prompt_len]:
        raise ValueError("the rendered prompt is not the sample's prompt: its images cannot be placed")
    versions = row.versions if len(row.versions) == len(row.ids) else [-1] * len(row.ids)
    head = zip(row.ids[:prompt_len], row.mask[:prompt_len], row.logprobs[:prompt_len], versions[:prompt_len],
               strict=True)
    text = iter([(m, lp, v) for t, m, lp, v in head if t != pad])
    out = TokenRow(draws=list(row.draws))
    for t in rendered.input_ids:
        m, lp, v = (0, 0.0, -1) if t == pad else next(text)
        out.ids.append(int(t))
        out.mask.append(m)
        out.logprobs.append(lp)
        out.versions.append(v)  # an image's tokens are context (-1); a carried episode's replies keep their own
    out.ids += row.ids[prompt_len:]
    out.mask += row.mask[prompt_len:]
    out.logprobs += row.logprobs[prompt_len:]
    out.versions += versions[prompt_len:]
    return out


# Keep, this module's old name of arl.config.KeepBranches; Branch, its old name of ConversationBranch
__getattr__ = old_names(__name__, globals(), Keep="arl.config:KeepBranches", Branch="ConversationBranch")
