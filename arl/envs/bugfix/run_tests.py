"""Hidden test cases, run inside a judge sandbox: call functions, print what they returned.

    python -I -S -B run_tests.py MODULE_DIR
        stdin: one JSON line, {"module": M, "cases": [{"function": F, "args": ARGS, "wait_s": W}, ...]}

Writes `READY` to the stdout it started with, then imports M from MODULE_DIR (last on
``sys.path``: a module of the agent's cannot shadow the standard library) and, for each case in
order, calls F on the decoded ARGS and writes one JSON line: ``["value", <encoded result>]``,
``["raises", "<type name>"]`` (an ``Exception``, as the hidden tests catch them) or ``["error",
"<why>"]``. The judge sends one case per process by default (`arl.envs.bugfix.judge`).

A case with ``wait_s`` (optional, seconds) is a slow test: it sleeps that long before its call,
as a test waiting on a slow fixture does (the env's ``test_latency``, `arl.envs.bugfix.env`); a
module that failed to import fails its cases at once, without the wait, as pytest fails a test
file that cannot import. The sleep is bound before the code under test is imported, so patching
``time.sleep`` does not skip it (code that reaches into this process could; it would change only
how long the run takes, never a result).

Why it decides nothing: the code under test runs in this process, so anything here it can read or
change (a nonce, the reporting calls, the expected values) it can forge. This process therefore
holds no secret and no expectation: it only says what the code did, and the host
(`arl.envs.bugfix.judge`) compares that with the expected value it never sent. Whatever the code
prints instead, it passes only by producing the right value. The `READY` line is written before
the code under test is imported, so the host can tell "the judge could not start" (no line: a
broken sandbox or interpreter, an error of the run) from "the code failed" (a 0 for the agent).

Standard library only, without ``site`` (``-S``): this file is bound into the sandbox and must run
without arl or a venv. `encode` / `decode` are shared with the host: exact built-in types only, so a
result cannot smuggle in an object whose ``__eq__`` says yes to anything.
"""

import json
import os
import sys
import time

READY = "arl-judge-ready"
_PLAIN = (type(None), bool, int, float, str)


def encode(value, depth=0):
    """A JSON-able form of ``value`` built from exact built-in types (TypeError otherwise)."""
    if depth > 100:
        raise TypeError("nested too deeply")
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(f"unsupported type {kind.__name__}")


def decode(data, depth=0):
    """The value `encode` gave ``data`` for (TypeError / ValueError on anything else)."""
    if depth > 100:
        raise ValueError("nested too deeply")
    if type(data) in _PLAIN:
        return data
    if type(data) is list:
        return [decode(v, depth + 1) for v in data]
    if type(data) is dict and len(data) == 1:
        if type(data.get("tuple")) is list:
            return tuple(decode(v, depth + 1) for v in data["tuple"])
        if type(data.get("dict")) is list:
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in data["dict"]}
    raise ValueError("not an encoded value")


def main() -> None:
    job = json.loads(sys.stdin.readline())
    module_dir = sys.argv[1]
    calls = [(case["function"], decode(case["args"])) for case in job["cases"]]
    waits = [float(case.get("wait_s", 0.0)) for case in job["cases"]]
    sleep = time.sleep  # before the code under test can replace it
    report = os.dup(1)
    os.write(report, (READY + "\n").encode())
    # The code under test's prints (even os.write(1, ...)) go nowhere; only `report` is read.
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    sys.path.append(module_dir)
    try:  # like the hidden tests' ``from M import F, ...``: any failure here fails every case
        module = __import__(job["module"])
        for function, _ in calls:
            if not callable(getattr(module, function, None)):
                raise ImportError(f"cannot import {function}")
    except BaseException as exc:  # noqa: BLE001 -- the module under test may raise anything
        module, failed = None, json.dumps(["error", f"import: {type(exc).__name__}"])
    for (function, args), wait in zip(calls, waits, strict=True):
        if module is None:
            os.write(report, (failed + "\n").encode())
            continue
        if wait > 0:
            sleep(wait)
        try:
            value = getattr(module, function)(*args)
        except Exception as exc:  # noqa: BLE001 -- what the hidden tests accept as "raises"
            line = ["raises", type(exc).__name__]
        except BaseException as exc:  # noqa: BLE001 -- SystemExit and the like: a failure, said so
            line = ["error", type(exc).__name__]
        else:
            line = ["value", value]
        try:
            text = json.dumps([line[0], encode(line[1])] if line[0] == "value" else line)
        except (TypeError, ValueError, RecursionError) as exc:  # a huge int, a custom object, ...
            text = json.dumps(["error", f"result not plain data: {type(exc).__name__}"])
        os.write(report, (text + "\n").encode())


if __name__ == "__main__":
    main()
