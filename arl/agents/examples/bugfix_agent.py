"""An agent program for push and pull mode that fixes bugs with tool calls (``arl/BugFix-v0``).

`gym_agent.py`'s program with arl's `BugFixRunner` (the runner the in-process bug-fix tests use):
the stock `openai` client sends the env's tools, the replies' ``tool_calls`` run as ``bash``,
``editor`` and ``submit`` in the env's own sandbox, one episode of seed ``ARL_SEED``. Under
`PullModeRunner` that sandbox is nested in the agent's: bubblewrap does not nest, so the env
falls back to isolation "none" (inside the outer bubblewrap, which still holds the network
namespace and the read-only system). Its settings are `gym_agent.py`'s (``ARL_*`` variables or
flags) plus the env's keyword arguments as JSON (``--env-kwargs``, default ``ARL_ENV_KWARGS``,
which the push and pull runner factories set from the config's ``rollout.manager.env_kwargs``)::

    rollout.proxy.runner: pull
    rollout.proxy.runner_kwargs:
      command: ["{python}", "-m", "arl.agents.examples.bugfix_agent"]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from arl.agents.bugfix import BugFixRunner
from arl.agents.examples.gym_agent import agent_args, play, sampling


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    agent_args(p, "arl/BugFix-v0")
    p.add_argument("--env-kwargs", type=json.loads, default=os.environ.get("ARL_ENV_KWARGS", "{}"),
                   help="the env's keyword arguments as a JSON object")
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    if not isinstance(args.env_kwargs, dict):
        raise SystemExit(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
    await play(lambda client: BugFixRunner(client, args.env_id, env_kwargs=args.env_kwargs, **sampling(args)),
               args.hang_s)


if __name__ == "__main__":
    asyncio.run(main())
