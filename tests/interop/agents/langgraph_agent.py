"""LangGraph as it ships: its prebuilt ReAct agent (``langgraph.prebuilt.create_react_agent``)
over langchain-openai's ``ChatOpenAI`` (chat completions), ``ainvoke`` or ``astream`` with
``stream_mode="messages"`` (its token-streaming entry point: the graph's callback makes the chat
model stream)."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ANSWER, CALL_ADD, INSTRUCTIONS, TASK, Calls, main, verdict  # noqa: E402

ENTRIES = ("ainvoke", "astream")
SCRIPT = [CALL_ADD, ANSWER]


async def play(entry: str, http_client: Any = None, base_url: str | None = None) -> dict[str, Any]:
    """One episode. Push mode: defaults only (ChatOpenAI reads OPENAI_BASE_URL / OPENAI_API_KEY).
    In process: ``http_client`` (arl's httpx transport) as ChatOpenAI's ``http_async_client``."""
    from langchain_core.messages import AIMessage, AIMessageChunk
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    calls = Calls()

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return calls.add(a, b)

    kwargs: dict[str, Any] = {}
    if http_client is not None:
        kwargs = {"http_async_client": http_client, "base_url": base_url, "api_key": "arl"}
    llm = ChatOpenAI(model=os.environ.get("ARL_MODEL", "arl"), **kwargs)
    graph = create_react_agent(llm, [add], prompt=INSTRUCTIONS)
    inputs = {"messages": [("user", TASK)]}
    config = {"recursion_limit": 8}  # bounded: the script answers on the second call
    chunks = 0
    if entry == "ainvoke":
        state = await graph.ainvoke(inputs, config)
        final = state["messages"][-1]
    else:
        final = None
        async for message, _meta in graph.astream(inputs, config, stream_mode="messages"):
            if isinstance(message, AIMessageChunk):
                chunks += 1
                final = message if final is None or final.id != message.id else final + message
            elif isinstance(message, AIMessage):
                final = message
    text = final.content if final is not None else None
    return verdict(calls, text, stream_chunks=float(chunks))


if __name__ == "__main__":
    main(play, ENTRIES)
