"""A command's stdout and stderr, read concurrently under one shared byte budget.

Why a module of its own: `Sandbox.run` must never hold more of a command's output than the caller
asked for, yet must keep reading (an unread pipe blocks the command and hides its end), and must
tell a command that only prints a lot from one that floods. Those reading rules are separate
from starting, limiting and timing the command, which is `arl.sandbox.sandbox`'s business.

The rules, for a budget of ``keep`` bytes and ``drain`` more:

- the first ``keep`` bytes, across both streams in arrival order, are kept;
- up to ``drain`` bytes past them are read and dropped (counted in ``seen``);
- past ``keep + drain``, ``over`` is set (the caller kills the command) and whatever still comes
  is read and dropped uncounted, to EOF.
"""

from __future__ import annotations

import asyncio

_CHUNK = 1 << 16


class CappedOutput:
    """stdout and stderr of one command, read concurrently under one shared byte budget.

    >>> async def demo():
    ...     out = CappedOutput(keep=4, drain=3)
    ...     stream = asyncio.StreamReader()
    ...     stream.feed_data(b"abcdef")
    ...     stream.feed_eof()
    ...     await out.read("stdout", stream)
    ...     return out.text("stdout"), out.kept, out.seen, out.over.is_set()
    >>> asyncio.run(demo())  # 6 bytes: 4 kept, 2 dropped, within the drain
    ('abcd', 4, 6, False)
    """

    def __init__(self, keep: int, drain: int) -> None:
        self.keep, self.limit = keep, keep + drain
        self.kept = 0  # bytes kept, both streams
        self.seen = 0  # bytes read and counted, both streams (stops growing once over)
        self.chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self.over = asyncio.Event()  # more than keep + drain written: the command is to be killed

    async def read(self, name: str, stream: asyncio.StreamReader | None) -> None:
        """Read ``stream`` (``name``: "stdout" or "stderr") to EOF under the shared budget."""
        if stream is None:
            return
        # Read to EOF even past the limit (the command is killed then): asyncio reports a process
        # as ended only once its pipes are closed, and a paused pipe never sees its EOF.
        while chunk := await stream.read(_CHUNK):
            if self.over.is_set():
                continue
            self.seen += len(chunk)
            room = self.keep - self.kept
            if room > 0:
                self.chunks[name].append(chunk[:room])
                self.kept += min(room, len(chunk))
            if self.seen > self.limit:
                self.over.set()

    def text(self, name: str) -> str:
        """What was kept of one stream, decoded (invalid UTF-8 replaced)."""
        return b"".join(self.chunks[name]).decode("utf-8", errors="replace")

    @property
    def truncated(self) -> bool:
        """More was written than kept."""
        return self.seen > self.kept


__all__ = ["CappedOutput"]
