"""DSPy as it ships: ``dspy.ReAct("question -> answer", tools=[add])`` over ``dspy.LM("openai/...")``
(its default ChatAdapter text format, default cache on), ``acall`` or ``dspy.streamify`` (its
streaming entry point: every LM call of the program streams).

DSPy caches replies in memory and on disk by request: a group's episodes share a seed, hence their
prompts, so a cache that outlives an episode answers the later ones without a call (they would end
NoData). Push mode gives each agent process its own cache dir inside the episode's work dir
(``DSPY_CACHEDIR``, `arl.agents.process.RESPONSE_CACHE_DIRS`), so DSPy's default stays on.

The replies are ChatAdapter's ``[[ ## field ## ]]`` sections: ReAct's step (``add``), its step
``finish``, then its ChainOfThought extract (``reasoning``, ``answer``): three calls, each a new
prompt DSPy builds from the trajectory so far, holding no assistant message (a fork per call)."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ANSWER, TASK, Calls, main, verdict  # noqa: E402

ENTRIES = ("acall", "streamify")


def _fields(**fields: str) -> str:
    return "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in fields.items()) + "[[ ## completed ## ]]"


SCRIPT = [
    _fields(next_thought="I add the numbers.", next_tool_name="add", next_tool_args='{"a": 2, "b": 3}'),
    _fields(next_thought="I have the sum.", next_tool_name="finish", next_tool_args="{}"),
    _fields(reasoning="The add tool returned 5.", answer=ANSWER),
]


async def play(entry: str, base_url: str | None = None, api_key: str | None = None,
               cache: bool = True) -> dict[str, Any]:
    """One episode. Push mode: defaults only (LiteLLM, under DSPy, reads OPENAI_BASE_URL /
    OPENAI_API_KEY). In process: ``dspy.LM``'s own ``api_base`` / ``api_key``, the address and
    episode key of arl's HTTP proxy (DSPy deep-copies each call's request, so it cannot carry a
    client object such as arl's httpx transport); ``cache`` is ``dspy.LM``'s."""
    import dspy

    calls = Calls()

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return calls.add(a, b)

    kwargs: dict[str, Any] = {}
    if base_url is not None:
        kwargs = {"api_base": base_url, "api_key": api_key}
    lm = dspy.LM("openai/" + os.environ.get("ARL_MODEL", "arl"), cache=cache, **kwargs)
    program = dspy.ReAct("question -> answer", tools=[add], max_iters=4)
    chunks = 0
    with dspy.context(lm=lm):
        if entry == "acall":
            prediction = await program.acall(question=TASK)
        else:
            prediction = None
            async for item in dspy.streamify(program)(question=TASK):
                if isinstance(item, dspy.Prediction):
                    prediction = item
                else:
                    chunks += 1
    answer = getattr(prediction, "answer", None)
    return verdict(calls, answer, stream_chunks=float(chunks))


if __name__ == "__main__":
    main(play, ENTRIES)
