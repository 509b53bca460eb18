"""mini-swe-agent as it ships: ``DefaultAgent`` over ``LocalEnvironment`` with one of the package's
configs (its agent, model and environment sections, as ``mini -c <config>`` loads them), and
``agent.run(task)``: ``run`` is ``default.yaml`` with ``LitellmModel`` (LiteLLM, chat completions,
its ``bash`` tool), ``run_textbased`` is ``mini_textbased.yaml`` with ``LitellmTextbasedModel`` (no
tools: the command in a fenced ``mswea_bash_command`` block). It has no streaming entry point.

Its defaults that need a switch in push mode, set by arl (`arl.agents.process.NETWORK_OFF`):
``MSWEA_COST_TRACKING=ignore_errors`` (else the first call raises: LiteLLM has no price for an arl
model) and ``MSWEA_CONFIGURED=true`` (else the first import opens its interactive setup).

The model runs ``expr 2 + 3`` in bash, then submits the answer the way the config says (a command
whose output starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``); neither writes a file."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ANSWER, main  # noqa: E402

ENTRIES = ("run", "run_textbased")
TASK = "What is 2 + 3? Compute it in bash, then submit the sentence 'The answer is <sum>.'."


def _bash(command: str) -> str:
    return '<tool_call>{"name": "bash", "arguments": ' + json.dumps({"command": command}) + "}</tool_call>"


def _fenced(command: str) -> str:
    return f"THOUGHT: I run it.\n\n```mswea_bash_command\n{command}\n```"


COMMANDS = ("expr 2 + 3", f"printf 'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\n{ANSWER}\\n'")
SCRIPTS = {"run": [_bash(c) for c in COMMANDS], "run_textbased": [_fenced(c) for c in COMMANDS]}
SCRIPT = SCRIPTS["run"]


def play_sync(entry: str, base_url: str | None = None, api_key: str | None = None) -> dict[str, Any]:
    """One episode. Push mode: defaults only (LiteLLM reads OPENAI_BASE_URL / OPENAI_API_KEY). In
    process: ``model_kwargs`` ``api_base`` / ``api_key``, the address and episode key of arl's HTTP
    proxy (mini-swe-agent serializes its model config, ``model_kwargs`` included, as JSON after
    every step, so it cannot carry a client object such as arl's httpx transport)."""
    import re
    from pathlib import Path

    import yaml
    from minisweagent import package_dir
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    textbased = entry == "run_textbased"
    name = "mini_textbased.yaml" if textbased else "default.yaml"
    config = yaml.safe_load(Path(package_dir / "config" / name).read_text())
    model_config = dict(config.get("model", {}))
    if base_url is not None:
        model_config["model_kwargs"] = {**model_config.get("model_kwargs", {}), "api_base": base_url,
                                        "api_key": api_key}
    cls = LitellmTextbasedModel if textbased else LitellmModel
    model = cls(model_name="openai/" + os.environ.get("ARL_MODEL", "arl"), **model_config)
    env = LocalEnvironment(**config.get("environment", {}))
    agent = DefaultAgent(model, env, **{**config["agent"], "step_limit": 4})  # bounded: 2 steps
    result = agent.run(TASK)
    # the command's output, as the observation the model got next (a tool message, or a user one)
    outputs = [m.get("content") for m in agent.messages[2:] if m.get("role") in ("tool", "user")]
    computed = bool(outputs) and re.search(r"<output>\s*5\s*</output>", str(outputs[0])) is not None
    submission = str(result.get("submission", "")).strip()
    ok = result.get("exit_status") == "Submitted" and submission == ANSWER and computed
    return {"score": float(ok), "success": ok, "exit_reason": "terminated",
            "metrics": {"steps": float(agent.n_calls), "answer_ok": float(submission == ANSWER)},
            "error": None if ok else f"exit {result.get('exit_status')!r}, submission {submission[:300]!r}, "
                                     f"first output {str(outputs[:1])[:300]}"}


async def play(entry: str) -> dict[str, Any]:
    return play_sync(entry)


if __name__ == "__main__":
    main(play, ENTRIES)
