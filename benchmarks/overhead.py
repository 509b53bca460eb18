"""Env-manager overhead: framework cost per agent turn with an (almost) free scripted engine.

    .venv/bin/python benchmarks/overhead.py                  # every manager, full size (6 min on 2 idle cores, 2026-12-04)
    .venv/bin/python benchmarks/overhead.py --quick          # CI smoke size (~25 s)
    .venv/bin/python benchmarks/overhead.py --managers traj proxy-inprocess --concurrency 1 16 128

For each manager and concurrency c, plays `--episodes` Sokoban episodes with at most c running at
once and reports wall time / number of agent turns (and / number of training samples) in
microseconds: median over repeats, min-max in brackets, and the ratio to TrajEnvManager's median
at the same concurrency (measured in the same run; a full garbage collection, untimed, before each
run, see `_settle`). The scripted engine still tokenizes its reply and hashes the prompt, so the
"engine only" row (one scripted generate() on a first-turn prompt) is part of every figure.

Breakdown (`--breakdown`, on by default): one more pass per manager at concurrency 1 with timers
around the pieces, exclusive time (a piece nested in another is charged to the inner one only):
engine (the scripted generate, opaque), env (TextEnv construction, reset, step), tokenization
(tokenizer calls outside the engine), tracker (MessageTracker's own Python), http/json (the
openai client, InProcessClient's request building and validation, the proxy's routing, JSON and
response objects, the Responses API's conversion, the stream's events as the openai client
parses them, aiohttp and the sockets), agent (GymRunner's own Python), manager (the
manager's own Python: prompts, turns, samples, the proxy handler) and scheduling (the rest: task
group, capacity limiter, rollout metrics). The timers cost ~1-2 us per timed call, so the
instrumented total is a little above the clean figure.

Physical floor: per turn, a bare `TextEnv.step` on an answer string + tokenizing the new user
message (`tokenizer.encode`), no engine: what any manager must at least spend.

Managers (MANAGERS: a factory `(engine, config) -> EnvManager`, arl's rollout factory through
`_util.manager_for`, the proxy rows with the "traj" tracker; an async context manager is entered
around the runs and what `__aenter__` returns is used):

- traj / step: TrajEnvManager, StepEnvManager (tokens built by the manager);
- proxy-inprocess: GymRunner through `InProcessClient` (a plain function call);
- proxy-openai-inproc: proxy-http's manager, but its stock `openai.AsyncOpenAI` clients share an
  httpx client over `arl.intercept.transport.InProcessTransport`, which calls the `ProxyServer`'s
  request handling in-process (JSON, routing, validation, the openai
  client's own machinery, but no sockets and no aiohttp HTTP parsing);
- proxy-http: GymRunner through `openai.AsyncOpenAI` and the aiohttp proxy on loopback;
- proxy-responses-inproc / proxy-responses-http: the same turns through the Responses API
  (``client.responses.create``, `ResponsesGymRunner`: the conversation as ``input`` items, the
  reply's ``output_text``), over the in-process transport as proxy-openai-inproc, or over
  loopback HTTP as proxy-http; the server converts each request to the chat request it answers
  and renders the reply as a ``Response`` (`arl.intercept.responses`);
- proxy-stream-inproc / proxy-stream-http: the same turns as streamed chat completions
  (``stream=True``, `StreamingGymRunner` joining the content deltas), in-process or over HTTP:
  the reply is generated whole, then sent as server-sent events the openai client parses.

Every proxy row plays the same Sokoban episodes with the same replies, so the per-turn figures of
the last four compare directly with proxy-openai-inproc and proxy-http.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import inspect
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _util import cell, manager_for, result_path, summary, table, write_result  # noqa: E402

from arl.agents.gym_runner import GymRunner  # noqa: E402
from arl.config import ManagerConfig  # noqa: E402
from arl.engine import SamplingParams, make_engine  # noqa: E402
from arl.intercept.server import ProxyServer  # noqa: E402
from arl.intercept.transport import InProcessTransport, transport_client  # noqa: E402
from arl.rollout import GroupScheduler  # noqa: E402
from arl.rollout.proxy import ProxyEnvManager  # noqa: E402
from arl.rollout.runners import gym_runner, make_runner_factory  # noqa: E402

ENV_ID = "arl/Sokoban-v0"
CLOCK = time.thread_time  # CPU time of the event-loop thread: other tenants of a shared machine do not count
CATEGORIES = ("engine", "env", "tokenization", "tracker", "http/json", "agent code", "manager code", "scheduling")


# -- the openai client over an in-process transport ----------------------------------------------


class InProcessServer(ProxyServer):
    """A `ProxyServer` that never listens: its handlers are called through arl's `InProcessTransport`."""

    running = True  # so the manager never starts it
    base_url = "http://arl.inprocess/v1"


def in_process(manager: ProxyEnvManager) -> ProxyEnvManager:
    """An HTTP-transport manager whose openai clients reach the server's handler in-process."""
    manager.server = InProcessServer()  # given, not owned: `aclose` leaves it alone
    manager._http_client = transport_client(InProcessTransport(manager.server))
    return manager


def openai_inprocess_manager(engine: Any, config: ManagerConfig) -> ProxyEnvManager:
    """proxy-http's manager whose openai clients reach the server's handler in-process."""
    return in_process(manager_for("proxy-http", engine, config))


# -- GymRunner's turns through the Responses API and through streamed chat completions ------------


class ResponsesGymRunner(GymRunner):
    """GymRunner calling ``client.responses.create``: its conversation as the ``input`` items, the
    same sampling settings (``max_output_tokens``), the reply's ``output_text`` as its answer."""

    async def complete(self, messages: list[dict[str, Any]], extra: dict[str, Any]) -> Any:
        response = await self.client.responses.create(
            model=self.model, input=messages, max_output_tokens=self.max_tokens, temperature=self.temperature,
            top_p=self.top_p, extra_body=self.extra_body, **extra,
        )
        return types.SimpleNamespace(content=response.output_text, tool_calls=None)


class StreamingGymRunner(GymRunner):
    """GymRunner calling ``client.chat.completions.create(stream=True)``, joining the content deltas."""

    async def complete(self, messages: list[dict[str, Any]], extra: dict[str, Any]) -> Any:
        stream = await self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=self.temperature,
            top_p=self.top_p, extra_body=self.extra_body, stream=True, **extra,
        )
        parts = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        return types.SimpleNamespace(content="".join(parts), tool_calls=None)


def agent_manager(runner_cls: type, transport: str, engine: Any, config: ManagerConfig) -> ProxyEnvManager:
    """proxy-http's manager (the "traj" tracker) playing ``runner_cls``: over loopback HTTP
    (``transport="http"``), or with its openai clients in-process (``"inproc"``, as proxy-openai-inproc)."""
    manager = ProxyEnvManager(engine, config, make_runner_factory(gym_runner, runner_cls=runner_cls),
                              transport="http", granularity="traj")
    return in_process(manager) if transport == "inproc" else manager


AGENT_ROWS = {  # name -> (runner, transport)
    "proxy-responses-inproc": (ResponsesGymRunner, "inproc"), "proxy-responses-http": (ResponsesGymRunner, "http"),
    "proxy-stream-inproc": (StreamingGymRunner, "inproc"), "proxy-stream-http": (StreamingGymRunner, "http"),
}

# name -> factory(engine, config) -> EnvManager (or an async context manager yielding one); the
# proxy rows run GymRunner agents: the same episodes as "traj", through InProcessClient / openai / HTTP,
# the last four through the Responses API or streamed chat completions
MANAGERS: dict[str, Callable[[Any, ManagerConfig], Any]] = {
    **{name: functools.partial(manager_for, name) for name in ("traj", "step", "proxy-inprocess")},
    "proxy-openai-inproc": openai_inprocess_manager,
    "proxy-http": functools.partial(manager_for, "proxy-http"),
    **{name: functools.partial(agent_manager, *row) for name, row in AGENT_ROWS.items()},
}


@contextlib.asynccontextmanager
async def _entered(obj: Any):
    if hasattr(obj, "__aenter__"):
        async with obj as manager:
            yield manager
    else:
        yield obj


# -- exclusive-time instrumentation --------------------------------------------------------------


class Timers:
    """Exclusive time per category over temporally nested calls (valid with one episode at a time).

    Time with no timer running is "scheduling". An opaque category (engine, env, tokenization)
    swallows the timers of what it calls."""

    def __init__(self) -> None:
        self.acc = dict.fromkeys(CATEGORIES, 0.0)
        self.stack: list[str] = []
        self.opaque = 0
        self.last = CLOCK()

    def _charge(self, now: float) -> None:
        self.acc[self.stack[-1] if self.stack else "scheduling"] += now - self.last
        self.last = now

    def enter(self, category: str, opaque: bool) -> bool:
        if self.opaque:
            return False
        self._charge(CLOCK())
        self.stack.append(category)
        self.opaque += opaque
        return True

    def exit(self, opaque: bool) -> None:
        self._charge(CLOCK())
        self.stack.pop()
        self.opaque -= opaque

    def wrap(self, fn: Callable, category: str, opaque: bool = False) -> Callable:
        """`fn` timed; a call that returns a coroutine stays timed until that coroutine is done."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            pushed = self.enter(category, opaque)
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                if pushed:
                    self.exit(opaque)
                raise
            if not inspect.iscoroutine(result):
                if pushed:
                    self.exit(opaque)
                return result

            async def finish() -> Any:
                try:
                    return await result
                finally:
                    if pushed:
                        self.exit(opaque)

            return finish()

        return timed

    def wrap_iter(self, fn: Callable, category: str) -> Callable:
        """`fn` returning an async iterator (a stream's ``__aiter__``), each step of it timed, the
        consumer's code between the steps not."""

        @functools.wraps(fn)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            steps = fn(*args, **kwargs).__aiter__()
            while True:
                pushed = self.enter(category, False)
                try:
                    item = await steps.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    if pushed:
                        self.exit(False)
                yield item

        return timed


@contextlib.contextmanager
def instrumented(timers: Timers, engine: Any, manager: Any):
    """Patch timers into the classes and instances a rollout goes through; undo on exit."""
    import openai.resources.chat.completions as oa
    import openai.resources.responses as oa_responses
    from openai import AsyncStream

    from arl.agents import gym_runner
    from arl.envs.text import TextEnv
    from arl.intercept import client as client_mod
    from arl.intercept import handler as handler_mod
    from arl.intercept.tracker import MessageTracker
    from arl.rollout.base import EnvManager

    patches: list[tuple[Any, str, str, bool]] = [
        (TextEnv, "__init__", "env", True), (TextEnv, "reset", "env", True), (TextEnv, "step", "env", True),
        (MessageTracker, "prepare", "tracker", False), (MessageTracker, "commit", "tracker", False),
        (MessageTracker, "traj_samples", "tracker", False), (MessageTracker, "step_samples", "tracker", False),
        (oa.AsyncCompletions, "create", "http/json", False), (client_mod._Completions, "create", "http/json", False),
        (oa_responses.AsyncResponses, "create", "http/json", False),
        (ProxyServer, "dispatch", "http/json", False), (handler_mod, "make_completion", "http/json", False),
        (AsyncStream, "__aiter__", "http/json", False),  # a streamed reply's events, parsed as the agent reads them
        (gym_runner._GameRunner, "run_job", "agent code", False),
        (EnvManager, "run_episode", "manager code", False), (ProxyEnvManager, "run_episode", "manager code", False),
        (handler_mod.ChatHandler, "__call__", "manager code", False),
    ]
    tok = engine.tokenizer
    instance_patches = [(engine, "generate", "engine", True)] + [
        (tok, name, "tokenization", True)
        for name in ("apply_chat_template", "encode", "decode", "convert_ids_to_tokens")
    ]
    saved = []
    try:
        for owner, name, category, opaque in patches:
            original = owner.__dict__[name] if name in vars(owner) else getattr(owner, name)
            saved.append((owner, name, original, name in vars(owner)))
            wrapped = timers.wrap_iter(original, category) if name == "__aiter__" else timers.wrap(
                original, category, opaque)
            setattr(owner, name, wrapped)
        for owner, name, category, opaque in instance_patches:
            saved.append((owner, name, None, False))
            setattr(owner, name, timers.wrap(getattr(owner, name), category, opaque))
        yield
    finally:
        for owner, name, original, own in reversed(saved):
            if original is None or not own:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, original)


# -- the benchmark -------------------------------------------------------------------------------


def _config() -> ManagerConfig:
    return ManagerConfig(max_tokens=32)


def _settle() -> None:
    """A full garbage collection before each timed run (untimed). A full collection walks every
    object of the process (torch, transformers, vLLM: ~0.25 s here) and CPython starts one when
    enough objects have survived since the last; without this it lands on whichever run crosses
    that line, charging ~200 us per turn to one manager for objects the others left. Each run
    still pays its own young-generation collections, and a full one if its own survivors cross
    the line."""
    gc.collect()


def _rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names)
    return names[k:] + names[:k]


async def bench_managers(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Every manager at every concurrency, the managers interleaved inside each repeat (their
    order rotating), so load drift on a shared machine hits them alike; then the breakdown pass."""
    engine = make_engine(backend="scripted", model="tiny", scripted={"invalid_rate": 0.2})
    names = list(args.managers)
    rows: list[dict] = []
    breakdowns: list[dict] = []
    async with engine, contextlib.AsyncExitStack() as stack:
        managers = {n: await stack.enter_async_context(_entered(MANAGERS[n](engine, _config()))) for n in names}
        for c in args.concurrency:
            sched = GroupScheduler(ENV_ID, num_groups=args.episodes // 4, group_size=4, max_concurrency=c)
            rec = {n: {"wall": [], "cpu": [], "wall_sample": [], "cpu_sample": [], "turns": 0, "samples": 0}
                   for n in names}
            for n in names:  # warm-up (tokenizer caches, env imports, connection pools)
                await sched.run(managers[n], sched.specs(0)[:8])
            for r in range(args.repeats):
                for n in _rotated(names, r):
                    _settle()
                    w0, c0 = time.perf_counter(), time.process_time()
                    batch = await sched.run(managers[n], sched.specs(r + 1))
                    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                    if batch.metrics["rollout/abnormal_rate"]:
                        raise RuntimeError(f"{n}: {batch.metrics['rollout/abnormal_rate']:.0%} abnormal episodes")
                    turns, samples = int(batch.metrics["rollout/num_turns"]), len(batch.samples)
                    rec[n].update(turns=turns, samples=samples)
                    rec[n]["wall"].append(wall / turns * 1e6)
                    rec[n]["cpu"].append(cpu / turns * 1e6)
                    rec[n]["wall_sample"].append(wall / samples * 1e6)
                    rec[n]["cpu_sample"].append(cpu / samples * 1e6)
            for n in names:
                row = {"manager": n, "concurrency": c, "cpu_us_per_turn": summary(rec[n]["cpu"]),
                       "us_per_turn": summary(rec[n]["wall"]), "cpu_us_per_sample": summary(rec[n]["cpu_sample"]),
                       "us_per_sample": summary(rec[n]["wall_sample"]), "turns": rec[n]["turns"],
                       "samples": rec[n]["samples"], "episodes": args.episodes}
                if "traj" in rec:  # per repeat, against traj's run of the same repeat
                    row["cpu_ratio_to_traj"] = summary([a / b for a, b in zip(rec[n]["cpu"], rec["traj"]["cpu"], strict=True)])
                    row["ratio_to_traj"] = summary([a / b for a, b in zip(rec[n]["wall"], rec["traj"]["wall"], strict=True)])
                rows.append(row)
        if args.breakdown:
            parts = {n: {k: [] for k in (*CATEGORIES, "total")} for n in names}
            sched = GroupScheduler(ENV_ID, num_groups=args.breakdown_episodes // 4, group_size=4, max_concurrency=1)
            for r in range(args.repeats):
                for n in _rotated(names, r):
                    _settle()
                    timers = Timers()
                    with instrumented(timers, engine, managers[n]):
                        timers.last = start = CLOCK()
                        batch = await sched.run(managers[n], sched.specs(r + 1))
                        timers._charge(CLOCK())
                        total = CLOCK() - start
                    turns = batch.metrics["rollout/num_turns"]
                    for k, v in timers.acc.items():
                        parts[n][k].append(v / turns * 1e6)
                    parts[n]["total"].append(total / turns * 1e6)
            for n in names:
                breakdowns.append({"manager": n, **{k: statistics.median(v) for k, v in parts[n].items()},
                                   "total_spread": (min(parts[n]["total"]), max(parts[n]["total"]))})
    return rows, breakdowns


async def bench_engine_only(args: argparse.Namespace) -> dict:
    """The scripted engine's own cost per call, on a first-turn-sized prompt."""
    async with make_engine(backend="scripted", model="tiny") as engine:
        prompt = list(range(3, 403))  # ~ a Sokoban first prompt
        n = 200 if args.quick else 1000
        runs = []
        for r in range(args.repeats):
            start = CLOCK()
            for i in range(n):
                await engine.generate(prompt, SamplingParams(max_tokens=32, seed=r * n + i))
            runs.append((CLOCK() - start) / n * 1e6)
    return {"manager": "engine only (scripted generate)", "us_per_turn": summary(runs)}


def bench_floor(args: argparse.Namespace) -> dict:
    """Per turn: a bare TextEnv.step on an answer string + tokenizing the new user message."""
    from transformers import AutoTokenizer

    from arl.envs.prompts import traj_user_message
    from arl.envs.text import TextEnv
    from arl.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    env = TextEnv(ENV_ID)
    answers = ["<answer>Up</answer>", "<answer>Left</answer>", "I think I will go up", "<answer>Down</answer>",
               "<answer>Right</answer>"]
    step_us, tok_us = [], []
    n_turns = 500 if args.quick else 3000
    for r in range(args.repeats):
        obs, _ = env.reset(seed=r)
        t_step = t_tok = 0.0
        for i in range(n_turns):
            t0 = CLOCK()
            obs, _, terminated, truncated, _ = env.step(answers[i % len(answers)])
            t1 = CLOCK()
            tok.encode(traj_user_message(i + 2, obs, 5, 32), add_special_tokens=False)
            t2 = CLOCK()
            t_step += t1 - t0
            t_tok += t2 - t1
            if terminated or truncated:
                env.reset(seed=r * n_turns + i)  # untimed
        step_us.append(t_step / n_turns * 1e6)
        tok_us.append(t_tok / n_turns * 1e6)
    total = [a + b for a, b in zip(step_us, tok_us, strict=True)]
    return {"manager": "physical floor (env.step + tokenize new message)", "us_per_turn": summary(total),
            "env_step_us": statistics.median(step_us), "tokenize_us": statistics.median(tok_us)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--managers", nargs="+", default=list(MANAGERS), choices=list(MANAGERS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--episodes", type=int, default=128, help="episodes per repeat (multiple of 4)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-breakdown", dest="breakdown", action="store_false")
    parser.add_argument("--breakdown-episodes", type=int, default=64, help="episodes per breakdown pass")
    parser.add_argument("--quick", action="store_true", help="smoke size: 8 episodes, 1 repeat, concurrency 1 8")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/overhead.json")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.repeats, args.concurrency, args.breakdown_episodes = 8, 1, [1, 8], 8
    args.episodes = max(4, args.episodes - args.episodes % 4)
    args.breakdown_episodes = max(4, args.breakdown_episodes - args.breakdown_episodes % 4)
    started = time.perf_counter()

    fixed = [bench_floor(args), asyncio.run(bench_engine_only(args))]
    rows, breakdowns = asyncio.run(bench_managers(args))

    print(f"\nscripted engine, {ENV_ID}, {args.episodes} episodes/repeat, max_tokens 32; microseconds, "
          f"median of {args.repeats} (min–max); CPU = process CPU time, wall = elapsed; "
          "vs traj = CPU ratio to traj's run in the same repeat")
    out_rows = [[f["manager"], "-", cell(f["us_per_turn"]), "-", "-", "-"] for f in fixed]
    for row in rows:
        ratio = row.get("cpu_ratio_to_traj")
        out_rows.append([row["manager"], row["concurrency"], cell(row["cpu_us_per_turn"]), cell(row["us_per_turn"]),
                         cell(row["cpu_us_per_sample"]), cell(ratio, "{:.2f}") if ratio else "-"])
    print(table(["manager", "concurrency", "CPU us / turn", "wall us / turn", "CPU us / sample", "vs traj"],
                out_rows))
    if breakdowns:
        print(f"\nbreakdown at concurrency 1 ({args.breakdown_episodes} episodes), CPU us per turn, exclusive time, "
              f"median of {args.repeats}")
        print(table(["manager", *CATEGORIES, "total (instrumented)"],
                    [[b["manager"], *(f"{b[k]:.0f}" for k in CATEGORIES), f"{b['total']:.0f}"] for b in breakdowns]))
    floor = fixed[0]
    print(f"physical floor: env.step {floor['env_step_us']:.1f} us + tokenize {floor['tokenize_us']:.1f} us "
          f"= {floor['us_per_turn']['median']:.1f} us per turn")
    write_result(args.out or result_path("overhead", args.quick), args,
                 {"fixed": fixed, "rows": rows, "breakdown": breakdowns}, started)


if __name__ == "__main__":
    main()
