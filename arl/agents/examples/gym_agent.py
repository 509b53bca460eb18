"""An agent program for push and pull mode: plays a TextEnv through any OpenAI-compatible server.

It uses the stock `openai` client configured from the environment (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``), plays one episode of ``--env-id`` with seed ``ARL_SEED`` using arl's
`GymRunner` (the very runner the in-process tests use), and writes the episode result as JSON to
``ARL_RESULT_PATH``. Under `PullModeRunner` (``ARL_TRANSPORT=pipe``) the same client talks over
its stdin/stdout through `AsyncPipeTransport` and the result ends the session instead. Run it
under either runner, or by hand against a server::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=<episode key> ARL_SEED=3 \\
    ARL_RESULT_PATH=/tmp/r.json python -m arl.agents.examples.gym_agent --env-id arl/FrozenLake-v0

Defaults come from the environment `PushModeRunner` sets when arl's rollout factory starts it
(``ARL_ENV_ID``, ``ARL_MAX_TOKENS``, ``ARL_TEMPERATURE``, ``ARL_TOP_P``, ``ARL_MAX_TURNS``), so a
config's sampling settings reach the agent; flags override them. ``--conversation step
--prompt-style compact`` sends the step manager's prompts (what the tiny model is trained on).
``--hang-s`` sleeps before playing (used by the timeout tests). `agent_args`, `sampling` and
`play` are the parts any such program shares (``bugfix_agent.py`` reuses them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from typing import Any

import openai

from arl.agents.gym_runner import GymRunner
from arl.agents.pipe_transport import AsyncPipeTransport, end_session, in_pull_mode
from arl.agents.process import write_result
from arl.agents.runner import AgentRunner


def agent_args(p: argparse.ArgumentParser, env_id: str) -> None:
    """The options every example agent takes, defaulting to the ``ARL_*`` settings arl passes."""
    env = os.environ.get
    p.add_argument("--env-id", default=env("ARL_ENV_ID", env_id))
    p.add_argument("--max-tokens", type=int, default=int(env("ARL_MAX_TOKENS", "64")))
    p.add_argument("--temperature", type=float, default=float(env("ARL_TEMPERATURE", "1.0")))
    p.add_argument("--top-p", type=float, default=float(env("ARL_TOP_P", "1.0")))
    p.add_argument("--max-turns", type=int, default=int(env("ARL_MAX_TURNS")) if env("ARL_MAX_TURNS") else None)
    p.add_argument("--hang-s", type=float, default=0.0)


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The runner keyword arguments `agent_args` gives (and the model name arl sends)."""
    return {"model": os.environ.get("ARL_MODEL", "arl"), "max_tokens": args.max_tokens,
            "temperature": args.temperature, "top_p": args.top_p, "max_turns": args.max_turns}


async def play(make_runner: Callable[[openai.AsyncOpenAI], AgentRunner], hang_s: float = 0.0) -> None:
    """Play episode ``ARL_SEED`` with ``make_runner(client)`` and hand its result back: over the
    pipes in pull mode (``ARL_TRANSPORT=pipe``), else to ``ARL_RESULT_PATH``."""
    if hang_s:
        await asyncio.sleep(hang_s)
    pull = in_pull_mode()
    # pull mode: no network, the model calls go over the process's pipes
    http = {"http_client": openai.DefaultAsyncHttpxClient(transport=AsyncPipeTransport())} if pull else {}
    # max_retries=0: a refused call ends the episode instead of being replayed.
    async with openai.AsyncOpenAI(max_retries=0, **http) as client:
        result = await make_runner(client).run_job(int(os.environ.get("ARL_SEED", "0")))
    (end_session if pull else write_result)(result)


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    agent_args(p, "arl/FrozenLake-v0")
    p.add_argument("--format-penalty", type=float, default=None)
    p.add_argument("--conversation", choices=["traj", "step"], default="traj")
    p.add_argument("--prompt-style", choices=["full", "compact"], default="full")
    p.add_argument("--history-len", type=int, default=2)
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    await play(lambda client: GymRunner(
        client, args.env_id, format_penalty=args.format_penalty, conversation=args.conversation,
        prompt_style=args.prompt_style, history_len=args.history_len, **sampling(args),
    ), args.hang_s)


if __name__ == "__main__":
    asyncio.run(main())
