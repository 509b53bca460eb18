"""langchain-openai as it ships: ``ChatOpenAI`` (chat completions), ``bind_tools``, and
``ainvoke`` or ``astream()`` (its streaming entry point) in the usual tool loop."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ANSWER, CALL_ADD, INSTRUCTIONS, TASK, Calls, main, verdict  # noqa: E402

ENTRIES = ("ainvoke", "astream")
SCRIPT = [CALL_ADD, ANSWER]  # the model's replies, in order


async def play(entry: str, http_client: Any = None, base_url: str | None = None) -> dict[str, Any]:
    """One episode. Push mode: defaults only (ChatOpenAI reads OPENAI_BASE_URL / OPENAI_API_KEY).
    In process: ``http_client`` (arl's httpx transport) as ChatOpenAI's own ``http_async_client``."""
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    calls = Calls()

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return calls.add(a, b)

    kwargs: dict[str, Any] = {}
    if http_client is not None:
        kwargs = {"http_async_client": http_client, "base_url": base_url, "api_key": "arl"}
    llm = ChatOpenAI(model=os.environ.get("ARL_MODEL", "arl"), **kwargs).bind_tools([add])
    messages: list[Any] = [SystemMessage(INSTRUCTIONS), HumanMessage(TASK)]
    reply = None
    for _ in range(4):  # bounded: the script answers on the second call
        if entry == "ainvoke":
            reply = await llm.ainvoke(messages)
        else:
            reply = None
            async for chunk in llm.astream(messages):
                reply = chunk if reply is None else reply + chunk
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append(ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"]))
    return verdict(calls, reply.content if reply is not None else None)


if __name__ == "__main__":
    main(play, ENTRIES)
