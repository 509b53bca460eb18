"""Agent frameworks, unchanged and with their default settings, play an episode against arl:
langchain-openai, LangGraph, LiteLLM, DSPy, mini-swe-agent, openai-agents, pydantic-ai and
smolagents (versions: setup.cfg's ``interop`` extra), each through its plain and its streaming
entry point (mini-swe-agent has none), over both transports:

- ``http``: push mode (`ProxyEnvManager(transport="http")`, `PushModeRunner`): the agent program
  (``agents/<framework>_agent.py``) is its own OS process under the interop venv's python, its
  framework finding arl through OPENAI_BASE_URL / OPENAI_API_KEY alone;
- ``inprocess``: the same program's ``play`` in this process, given arl's httpx transport
  (`InProcessTransport`; `SyncInProcessTransport` for smolagents, run in a worker thread) the
  framework's own way of taking a client; DSPy, mini-swe-agent and LiteLLM's Responses API, which
  cannot carry one, get the HTTP proxy's address and episode key as their own settings
  (``over_http``). autogen installs in the interop venv only: push mode alone.

The model is arl's scripted engine answering with the tool call, then the final answer, in the
format the framework expects. Checked per case: the framework ran the tool once and returned the
answer (the agent's own verdict, its score); every call reached the API the framework uses by
default (chat completions or the Responses API), streamed when the entry point streams, with the
framework's default stop strings; and every sample's response tokens (mask 1) and log-probs are
exactly the ones the engine sampled (a prefix of them where a stop string cut the reply, ending
at the token that completed it). History: the frameworks that send the model's replies back as
they got them chain into one trajectory (no fork); smolagents rewrites them (counted as history
rewrites, one step sample per call); DSPy sends each call as a new prompt (a fork per call).
DSPy also plays a whole group (same seed, same prompts): every episode must reach arl.

Run under `make interop` (the venvs, then these tests in a loopback-only network namespace).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from arl.agents import PushModeRunner
from arl.agents.runner import AgentRunner, EpisodeResult
from arl.config import ManagerConfig
from arl.engine.scripted import ScriptedEngine
from arl.intercept import exchange as exchange_mod
from arl.intercept.handler import ChatHandler
from arl.intercept.protocol import output_constraint
from arl.intercept.transport import (
    BASE_URL,
    InProcessTransport,
    SyncInProcessTransport,
    sync_transport_client,
    transport_client,
)
from arl.rollout import EpisodeSpec
from arl.rollout.proxy import ProxyEnvManager

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

AGENTS = Path(__file__).resolve().parent / "agents"
SMOL_STOPS = ("Observation:", "Calling tools:")


@attrs.frozen
class Case:
    module: str  # agents/<module>.py
    package: str  # what must import for the in-process variant
    api: str  # "chat" | "responses": the endpoint the framework calls by default
    stream: bool
    stop: tuple[str, ...] = ()  # the framework's default stop strings
    # how the framework sends the history: "chain" (the model's replies back as they came: one
    # trajectory), "rewrites" (re-sent in its own form: a history rewrite per call after the first),
    # "fresh" (each call a new prompt holding no assistant message: a fork per call, no rewrite)
    history: str = "chain"
    sync: bool = False  # a synchronous framework (in process: a worker thread, the sync transport)
    tools: bool = True  # sends the tools in the request (not: smolagents' CodeAgent, DSPy's text format)
    # in process over arl's HTTP proxy (its base_url and episode key as the framework's own settings),
    # for a framework that cannot take a client object (DSPy deep-copies each call's request)
    over_http: bool = False
    in_process: bool = True  # installs in arl's venv (not: setup.cfg's interop-push extra, push mode only)


CASES = {
    "langchain-ainvoke": Case("langchain_agent", "langchain_openai", "chat", False),
    "langchain-astream": Case("langchain_agent", "langchain_openai", "chat", True),
    "openai_agents-run": Case("openai_agents_agent", "agents", "responses", False),
    "openai_agents-run_streamed": Case("openai_agents_agent", "agents", "responses", True),
    "pydantic_ai-run": Case("pydantic_ai_agent", "pydantic_ai", "responses", False),
    "pydantic_ai-run_stream": Case("pydantic_ai_agent", "pydantic_ai", "responses", True),
    "smolagents-tool_calling": Case("smolagents_agent", "smolagents", "chat", False, SMOL_STOPS, "rewrites", True),
    "smolagents-tool_calling_stream": Case("smolagents_agent", "smolagents", "chat", True, SMOL_STOPS, "rewrites",
                                           True),
    "smolagents-code": Case("smolagents_agent", "smolagents", "chat", False, (*SMOL_STOPS, "</code>"), "rewrites",
                            True, tools=False),
    "smolagents-code_stream": Case("smolagents_agent", "smolagents", "chat", True, (*SMOL_STOPS, "</code>"),
                                   "rewrites", True, tools=False),
    "langgraph-ainvoke": Case("langgraph_agent", "langgraph", "chat", False),
    "langgraph-astream": Case("langgraph_agent", "langgraph", "chat", True),
    "litellm-acompletion": Case("litellm_agent", "litellm", "chat", False),
    "litellm-acompletion_stream": Case("litellm_agent", "litellm", "chat", True),
    "litellm-aresponses": Case("litellm_agent", "litellm", "responses", False, over_http=True),
    # stream=True, but LiteLLM fakes the stream for a model missing from its model map: plain calls
    "litellm-aresponses_stream": Case("litellm_agent", "litellm", "responses", False, over_http=True),
    "dspy-acall": Case("dspy_agent", "dspy", "chat", False, history="fresh", tools=False, over_http=True),
    "dspy-streamify": Case("dspy_agent", "dspy", "chat", True, history="fresh", tools=False, over_http=True),
    "minisweagent-run": Case("minisweagent_agent", "minisweagent", "chat", False, sync=True, over_http=True),
    "minisweagent-run_textbased": Case("minisweagent_agent", "minisweagent", "chat", False, sync=True, tools=False,
                                       over_http=True),
    "autogen-run": Case("autogen_agent", "autogen_agentchat", "chat", False, in_process=False),
    "autogen-run_stream": Case("autogen_agent", "autogen_agentchat", "chat", True, in_process=False),
}
# smolagents' ToolCallingAgent sends tool_choice "required" with every call: enforced by
# constrained decoding (`arl.intercept.protocol.output_constraint`), checked by the scripted engine
FORCES_TOOLS = ("smolagents-tool_calling", "smolagents-tool_calling_stream")


def load(module: str) -> Any:
    """The agent program as a module (it imports its framework only when it plays)."""
    spec = importlib.util.spec_from_file_location(f"arl_interop_{module}", AGENTS / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def script_of(case: str) -> list[str]:
    mod, entry = load(CASES[case].module), case.split("-", 1)[1]
    return list(getattr(mod, "SCRIPTS", {}).get(entry) or mod.SCRIPT)


class RecordingEngine(ScriptedEngine):
    """The scripted engine, keeping every generation it returned (the sampled tokens)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.generations: list[Any] = []

    async def _generate_n(self, prompt: list[int], params: Any) -> list[Any]:
        out = await super()._generate_n(prompt, params)
        self.generations += out
        return out


class InProcessAgent(AgentRunner):
    """The agent program's ``play`` in this process, on the episode's handler through arl's
    httpx transport (the async one, or for a synchronous framework the sync one in a thread), or
    for an ``over_http`` case given the HTTP proxy's address and the episode's key."""

    def __init__(self, client: Any, case: Case, entry: str, **options: Any) -> None:
        super().__init__(client)
        self.case, self.entry, self.program, self.options = case, entry, load(case.module), options

    async def run_job(self, seed: int) -> EpisodeResult:
        if self.case.over_http:  # client: the episode's openai.AsyncOpenAI on arl's HTTP proxy
            address = {"base_url": str(self.client.base_url), "api_key": self.client.api_key, **self.options}
            if self.case.sync:
                play = functools.partial(self.program.play_sync, self.entry, **address)
                result = await anyio.to_thread.run_sync(play)
            else:
                result = await self.program.play(self.entry, **address)
            return EpisodeResult.from_json(result)
        handler, episode_key = self.client.handler, self.client.episode_key
        if self.case.sync:
            with sync_transport_client(SyncInProcessTransport.for_handler(handler, episode_key)) as http:
                play = functools.partial(self.program.play_sync, self.entry, http_client=http, base_url=BASE_URL)
                result = await anyio.to_thread.run_sync(play)
        else:
            async with transport_client(InProcessTransport.for_handler(handler, episode_key)) as http:
                result = await self.program.play(self.entry, http_client=http, base_url=BASE_URL)
        return EpisodeResult.from_json(result)


@pytest.fixture
def wire(monkeypatch):
    """What reached arl: each call's `ChatRequest` and, per Responses-API call, its ``stream``."""
    seen: dict[str, list[Any]] = {"chat": [], "responses": []}
    call, respond = ChatHandler.__call__, exchange_mod.respond

    async def recording_call(self, episode_key, request):
        seen["chat"].append(request)
        return await call(self, episode_key, request)

    async def recording_respond(handler, episode_key, body):
        seen["responses"].append(body.get("stream") if isinstance(body, dict) else None)
        return await respond(handler, episode_key, body)

    monkeypatch.setattr(ChatHandler, "__call__", recording_call)
    monkeypatch.setattr(exchange_mod, "respond", recording_respond)
    return seen


def spec() -> EpisodeSpec:
    return EpisodeSpec(env_id="interop", seed=0, group_id="interop_0", episode_id=0)


def check_samples(episode: Any, engine: RecordingEngine, tokenizer: Any, case: Case) -> None:
    """One step sample per call; its masked tokens and log-probs are the sampled ones (a prefix
    ending at the token that completed a stop string, where one cut the reply)."""
    generations = engine.generations
    assert len(episode.samples) == len(generations)
    for sample, gen in zip(episode.samples, generations, strict=True):
        picked = [k for k, m in enumerate(sample.response_mask) if m]
        tokens = [sample.input_ids[k] for k in picked]
        assert picked and picked == list(range(picked[0], picked[0] + len(tokens)))  # one contiguous reply
        sampled = list(gen.token_ids)
        assert tokens == sampled[: len(tokens)], "the sample's reply is not the sampled tokens"
        assert [sample.old_logprobs[k] for k in picked] == pytest.approx(list(gen.logprobs[: len(tokens)]))
        if len(tokens) < len(sampled):  # cut by a stop string: at the token that completed it
            text, before = tokenizer.decode(tokens), tokenizer.decode(tokens[:-1])
            assert any(s in text for s in case.stop) and not any(s in before for s in case.stop)
    tracker = episode.samples[-1].info["tracker"]
    if case.history == "rewrites":
        assert tracker["history_rewrites"] == len(generations) - 1
    elif case.history == "fresh":
        assert (tracker["forks"], tracker["history_rewrites"]) == (len(generations) - 1, 0)
    else:  # the model's replies came back as they were sent: one trajectory, no fork
        assert tracker["forks"] == tracker["history_rewrites"] == tracker["untracked_assistant"] == 0


def fresh_dspy_cache(tmp_path: Path) -> None:
    """DSPy's process-wide response cache, new and empty, its disk part under ``tmp_path``: what a
    fresh process has (and none of it in the user's ~/.dspy_cache)."""
    import dspy

    dspy.configure_cache(disk_cache_dir=str(tmp_path / "dspy_cache"))


@pytest.mark.parametrize(("name", "transport"), [(name, transport) for name, case in CASES.items()
                                                for transport in ("http", "inprocess")
                                                if transport == "http" or case.in_process])
async def test_framework_plays_an_episode(name, transport, tiny_tokenizer, wire, request, require_module, tmp_path):
    case, entry = CASES[name], name.split("-", 1)[1]
    if transport == "http":
        python = request.getfixturevalue("interop_python")

        def factory(client, s, config):
            return PushModeRunner(client, [python, str(AGENTS / f"{case.module}.py"), entry], timeout_s=240)
    else:
        require_module(case.package)
        if case.package == "dspy":
            fresh_dspy_cache(tmp_path)

        def factory(client, s, config):
            return InProcessAgent(client, case, entry)

    script = script_of(name)
    engine = RecordingEngine(tiny_tokenizer, responses=script, max_model_len=1 << 16)
    config = ManagerConfig(max_tokens=256, episode_timeout_s=280)
    over = "http" if case.over_http else transport
    async with ProxyEnvManager(engine, config, factory, transport=over, granularity="step") as manager:
        episode = await manager.run_episode(spec())
    traj = episode.trajectory
    assert (traj.status, traj.exit_reason) == ("Finished", "terminated"), traj.error
    assert traj.episode_score == 1.0 and traj.success, traj.error
    assert len(engine.generations) == len(script)
    requests = wire["chat"]
    assert len(requests) == len(script)
    assert len(wire["responses"]) == (len(script) if case.api == "responses" else 0)
    assert all(r.stream == case.stream for r in requests)
    assert all(bool(r.tools) == case.tools for r in requests)
    assert all(tuple(r.stop) == case.stop for r in requests)
    assert [r.unknown for r in requests] == [()] * len(requests)  # every field it sends is one arl knows
    constrained = [output_constraint(r) is not None for r in requests]
    assert constrained == [name in FORCES_TOOLS] * len(requests)  # only tool_choice "required" forces a format
    check_samples(episode, engine, tiny_tokenizer, case)


def test_every_case_has_its_script_and_entry():
    """The table and the agent programs agree (runs without any framework)."""
    for name, case in CASES.items():
        mod, entry = load(case.module), name.split("-", 1)[1]
        assert entry in mod.ENTRIES and script_of(name)


@pytest.mark.parametrize("mode", ["push", "push-shared_cache", "inprocess", "inprocess-cache_off"])
async def test_dspy_every_episode_of_a_group_reaches_arl(mode, tiny_tokenizer, request, require_module, tmp_path):
    """A group's episodes share a seed, hence DSPy's prompts. Push mode, DSPy's defaults: each
    episode's process keeps its cache in the episode's work dir, so every episode's calls reach
    arl and train. In process, DSPy's default cache is the trainer process's: the first episode
    trains, the later ones are answered from the cache and end NoData with an error that names
    it and ``cache=False``; with ``dspy.LM(..., cache=False)`` (the guide's recipe) all train. A
    push-mode agent given one cache dir for all episodes (``env_extra``) fails as in process: the
    episode's own cache dir is what keeps DSPy's default working."""
    case, group = CASES["dspy-acall"], 2
    if mode.startswith("push"):
        python = request.getfixturevalue("interop_python")
        shared = {"DSPY_CACHEDIR": str(tmp_path / "shared")} if mode.endswith("shared_cache") else {}

        def factory(client, s, config):
            return PushModeRunner(client, [python, str(AGENTS / f"{case.module}.py"), "acall"], timeout_s=240,
                                  env_extra=shared)
    else:
        require_module(case.package)
        fresh_dspy_cache(tmp_path)
        options = {"cache": False} if mode.endswith("cache_off") else {}

        def factory(client, s, config):
            return InProcessAgent(client, case, "acall", **options)

    script = script_of("dspy-acall")
    engine = RecordingEngine(tiny_tokenizer, responses=script, max_model_len=1 << 16)
    config = ManagerConfig(max_tokens=256, episode_timeout_s=280)
    episodes = []
    async with ProxyEnvManager(engine, config, factory, transport="http", granularity="step") as manager:
        for k in range(group):
            episodes.append(await manager.run_episode(EpisodeSpec(env_id="interop", seed=0, group_id="interop_0",
                                                                  episode_id=k)))
    trained = 1 if mode in ("inprocess", "push-shared_cache") else group
    for episode in episodes[:trained]:
        traj = episode.trajectory
        assert (traj.status, traj.success, len(episode.samples)) == ("Finished", True, len(script)), traj.error
    for episode in episodes[trained:]:
        traj = episode.trajectory
        assert (traj.status, traj.exit_reason, traj.success) == ("NoData", "no_data", False)
        assert "client-side response cache" in traj.error and "dspy.LM(..., cache=False)" in traj.error
    assert len(engine.generations) == trained * len(script)
