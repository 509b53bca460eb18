"""An agent program for push mode: plays a TextEnv through any OpenAI-compatible server.

It uses the stock `openai` client configured from the environment (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``), plays one episode of ``--env-id`` with seed ``ARL_SEED`` using arl's
`GymRunner` (the very runner the in-process tests use), and writes the episode result as JSON to
``ARL_RESULT_PATH``. Run it under `PushModeRunner`, or by hand against a server::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=<env id> ARL_SEED=3 \\
    ARL_RESULT_PATH=/tmp/r.json python -m arl.agents.examples.gym_agent --env-id arl/FrozenLake-v0

``--hang-s`` sleeps before playing (used by the timeout tests).
"""

from __future__ import annotations

import argparse
import asyncio
import os

import openai

from arl.agents.gym_runner import GymRunner
from arl.agents.process import write_result


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="arl/FrozenLake-v0")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--format-penalty", type=float, default=None)
    p.add_argument("--hang-s", type=float, default=0.0)
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    if args.hang_s:
        await asyncio.sleep(args.hang_s)
    # max_retries=0: a refused call ends the episode instead of being replayed.
    async with openai.AsyncOpenAI(max_retries=0) as client:
        runner = GymRunner(
            client, args.env_id, model=os.environ.get("ARL_MODEL", "arl"), max_tokens=args.max_tokens,
            temperature=args.temperature, top_p=args.top_p, max_turns=args.max_turns,
            format_penalty=args.format_penalty,
        )
        result = await runner.run_job(int(os.environ.get("ARL_SEED", "0")))
    write_result(result)


if __name__ == "__main__":
    asyncio.run(main())
