"""The agent's side of pull mode: an `httpx` transport that carries HTTP over the process's pipes.

An agent that cannot open a connection to the trainer (pull mode, `arl/agents/pull.py`) keeps its
stock `openai` client and swaps the transport underneath it::

    client = openai.AsyncOpenAI(http_client=openai.DefaultAsyncHttpxClient(transport=AsyncPipeTransport()))
    client = openai.OpenAI(http_client=httpx.Client(transport=PipeTransport()))        # sync
    ...
    end_session(result)   # the episode result; the trainer ends the session on it

Each request becomes one frame on the process's stdout; the trainer answers it through the
episode's handler and writes the response frame to the process's stdin. Frames (one header line,
then exactly ``n`` raw bytes, so bodies need no escaping and a frame is parseable whatever its
body holds)::

    agent -> trainer   @arl-pull/1 req <id> <METHOD> <path> <n>\\n<body>      a model request
                       @arl-pull/1 end <n>\\n<EpisodeResult JSON>              the session ended
    trainer -> agent   @arl-pull/1 res <id> <status> <n>\\n<JSON body>        its response

Why stdin/stdout and not extra fds: a sandbox hands a process exactly its three standard streams
(`arl.sandbox.sandbox.Sandbox.spawn`), nothing else. To keep them from being corrupted by the agent's
own output, the first use *claims* them: the protocol moves to private duplicates, fd 1 is pointed
at stderr (so the agent's prints and its children's output still reach the trainer's log, as
stderr) and fd 0 at /dev/null. Output printed before the claim is harmless: the trainer skips
lines that are not frames, and the claim starts a fresh line.

Requests may overlap (``asyncio.gather`` of several calls): each has an id, one reader thread
hands responses to their waiters. The transports work with `httpx` and its fork `httpx2` (the one
`openai` ships): responses and errors are built from the module of the request they answer.
Async waits need asyncio (what `openai.AsyncOpenAI` runs on).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

MAGIC = b"@arl-pull/1"
MAX_BODY = 4 * 2**20  # the largest frame body the trainer accepts (the proxy's request limit)
MAX_HEADER = 4096  # a header line is short; a longer line is not a frame
TRANSPORT_ENV = "ARL_TRANSPORT"  # "pipe" when the agent runs under PullModeRunner
PIPE = "pipe"


def in_pull_mode() -> bool:
    """Whether this process was started by `PullModeRunner` (its model calls go over the pipes)."""
    return os.environ.get(TRANSPORT_ENV) == PIPE


def header(*fields: object) -> bytes:
    """One frame header line: ``@arl-pull/1 field field ...\\n``."""
    return b" ".join([MAGIC, *(str(f).encode() for f in fields)]) + b"\n"


class PipeChannel:
    """The agent's end of the pipes: frames out on ``wfd``, responses in on ``rfd``."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self._rfile = os.fdopen(rfd, "rb")
        self._wfd = wfd
        self._write_lock = threading.Lock()  # a frame's header and body go out together
        self._lock = threading.Lock()  # guards _pending, _closed, _reader
        self._pending: dict[int, concurrent.futures.Future[tuple[int, bytes]]] = {}
        self._ids = itertools.count(1)
        self._reader: threading.Thread | None = None
        self._closed: str | None = None

    @classmethod
    def claim_stdio(cls) -> PipeChannel:
        """Move the protocol off fds 0/1 (see the module doc) and return the channel on them."""
        for stream in (sys.stdout, sys.__stdout__):
            if stream is not None:
                stream.flush()
        rfd, wfd = os.dup(0), os.dup(1)  # dups are non-inheritable: the agent's children never get them
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)
        channel = cls(rfd, wfd)
        channel._write(b"\n")  # ends a partial line the agent printed before: a frame starts a line
        return channel

    def _write(self, *parts: bytes) -> None:
        with self._write_lock:
            for part in parts:
                view = memoryview(part)
                while view:
                    view = view[os.write(self._wfd, view):]

    def submit(self, method: str, path: str, body: bytes) -> tuple[int, concurrent.futures.Future[tuple[int, bytes]]]:
        """Send a request frame; the future gets ``(status, body)`` or `ConnectionError`."""
        future: concurrent.futures.Future[tuple[int, bytes]] = concurrent.futures.Future()
        with self._lock:
            if self._closed is not None:
                raise ConnectionError(self._closed)
            request_id = next(self._ids)
            self._pending[request_id] = future
            if self._reader is None:
                self._reader = threading.Thread(target=self._read_loop, name="arl-pull-reader", daemon=True)
                self._reader.start()
        try:
            self._write(header("req", request_id, method, path, len(body)), body)
        except OSError as exc:  # the trainer is gone
            self.forget(request_id)
            raise ConnectionError(f"cannot write to the trainer: {exc}") from exc
        return request_id, future

    def forget(self, request_id: int) -> None:
        """The waiter gave up (timeout, cancellation): a late response is dropped."""
        with self._lock:
            self._pending.pop(request_id, None)

    def end(self, result: bytes) -> None:
        """Send the session's end frame carrying the episode result (JSON)."""
        self._write(header("end", len(result)), result)

    def _read_loop(self) -> None:
        reason = "the trainer closed the pipe"
        try:
            while line := self._rfile.readline(MAX_HEADER):
                fields = line.split()
                if len(fields) != 5 or fields[0] != MAGIC or fields[1] != b"res":
                    continue  # not a response frame: nothing the trainer sends, skip the line
                try:
                    request_id, status, size = int(fields[2]), int(fields[3]), int(fields[4])
                except ValueError:
                    continue
                body = self._rfile.read(size)
                if len(body) < size:
                    break
                with self._lock:
                    future = self._pending.pop(request_id, None)
                if future is not None:
                    try:
                        future.set_result((status, body))
                    except concurrent.futures.InvalidStateError:  # its waiter was cancelled meanwhile
                        pass
        except (OSError, ValueError) as exc:
            reason = f"reading from the trainer failed: {exc}"
        with self._lock:
            self._closed = reason
            pending, self._pending = list(self._pending.values()), {}
        for future in pending:
            try:
                future.set_exception(ConnectionError(reason))
            except concurrent.futures.InvalidStateError:
                pass


_STDIO: PipeChannel | None = None
_STDIO_LOCK = threading.Lock()


def stdio_channel() -> PipeChannel:
    """This process's channel over its stdin/stdout, claimed on first use."""
    global _STDIO
    with _STDIO_LOCK:
        if _STDIO is None:
            _STDIO = PipeChannel.claim_stdio()
        return _STDIO


def _httpx_of(request: Any) -> Any:
    """The module (httpx or httpx2) the request comes from: its Response and errors must match."""
    return sys.modules[type(request).__module__.partition(".")[0]]


def _read_timeout(request: Any) -> float | None:
    return (request.extensions.get("timeout") or {}).get("read")


def _response(request: Any, status: int, body: bytes) -> Any:
    return _httpx_of(request).Response(status, headers={"content-type": "application/json"}, content=body,
                                       request=request)


def _path(request: Any) -> str:
    return request.url.raw_path.decode("ascii")


class PipeTransport:
    """Sync `httpx` transport: ``httpx.Client(transport=PipeTransport())``. Thread-safe."""

    def __init__(self, channel: PipeChannel | None = None) -> None:
        self._channel = channel

    def handle_request(self, request: Any) -> Any:
        channel = self._channel or stdio_channel()
        httpx = _httpx_of(request)
        try:
            request_id, future = channel.submit(request.method, _path(request), request.read())
        except ConnectionError as exc:
            raise httpx.WriteError(str(exc), request=request) from exc
        try:
            status, body = future.result(_read_timeout(request))
        except TimeoutError as exc:
            channel.forget(request_id)
            raise httpx.ReadTimeout("no response from the trainer in time", request=request) from exc
        except ConnectionError as exc:
            raise httpx.ReadError(str(exc), request=request) from exc
        return _response(request, status, body)

    def close(self) -> None:
        pass  # the channel belongs to the process, not to one client

    def __enter__(self) -> PipeTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncPipeTransport:
    """Async `httpx` transport: ``httpx.AsyncClient(transport=AsyncPipeTransport())``, on asyncio.

    A frame is written from the event loop's thread without yielding: the trainer drains the pipe
    continuously, so the write returns as soon as the trainer has read it.
    """

    def __init__(self, channel: PipeChannel | None = None) -> None:
        self._channel = channel

    async def handle_async_request(self, request: Any) -> Any:
        channel = self._channel or stdio_channel()
        httpx = _httpx_of(request)
        body = await request.aread()
        try:
            request_id, future = channel.submit(request.method, _path(request), body)
        except ConnectionError as exc:
            raise httpx.WriteError(str(exc), request=request) from exc
        try:
            status, content = await asyncio.wait_for(asyncio.wrap_future(future), _read_timeout(request))
        except TimeoutError as exc:
            raise httpx.ReadTimeout("no response from the trainer in time", request=request) from exc
        except ConnectionError as exc:
            raise httpx.ReadError(str(exc), request=request) from exc
        finally:
            channel.forget(request_id)  # a no-op once answered; drops a timed-out or cancelled wait
        return _response(request, status, content)

    async def aclose(self) -> None:
        pass

    async def __aenter__(self) -> AsyncPipeTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def end_session(result: Any, channel: PipeChannel | None = None) -> None:
    """Tell the trainer the session ended, with the episode result (an `EpisodeResult` or the
    mapping of its fields) — pull mode's counterpart of push mode's `write_result`."""
    data = result if isinstance(result, Mapping) else result.to_json()
    (channel or stdio_channel()).end(json.dumps(dict(data)).encode())


__all__ = [
    "MAGIC", "MAX_BODY", "PIPE", "TRANSPORT_ENV", "AsyncPipeTransport", "PipeChannel", "PipeTransport",
    "end_session", "header", "in_pull_mode", "stdio_channel",
]
