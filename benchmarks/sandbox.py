"""Sandbox overhead: start-up and per-command cost next to a plain subprocess.

    .venv/bin/python benchmarks/sandbox.py            # 200 repeats per row (~1-2 min on 2 cores)
    .venv/bin/python benchmarks/sandbox.py --quick    # CI smoke size (a few seconds)

Rows, each timed end to end from the caller's event loop (median and p95 in ms over `--repeats`,
variants interleaved A/B/C in a rotating order, so load drifts hit them alike):

- ``true`` and ``python -c pass``: `asyncio.create_subprocess_exec("bash", "-c", ...)` with pipes
  (plain), `Sandbox.run` with isolation "none" (the limits wrapper, pipes read under the output
  cap), with "none" in a pull-mode agent given tool uids (as root: each command dropped with
  ``setpriv`` to a uid of the block, its leftovers reaped by uid; `arl.sandbox.uid_delegation`) and
  with "bwrap" (new namespaces per command, binds, the uid drop as root), and with "podman" and
  "docker" where each starts (`arl.sandbox.oci`: a ``<runtime> exec`` into the sandbox's container
  per command);
- start-up: `Sandbox(...)` + ``start()`` + `close()` (work dir made, chowned, removed; bwrap's probe
  is cached; a container created and removed);
- bug-fix evaluation: `BugFixEnv.reset` + ``submit()`` (the hidden tests run in the sandbox), and
  what its median makes of one episode after another: episodes per second.

Ratios are to the plain subprocess row of the same command. A backend that cannot start here has
its rows skipped, and said so; ``--backends`` names the ones to time (default: every one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import result_path, table, write_result  # noqa: E402

from arl.envs.bugfix import BugFixEnv, assistant_message  # noqa: E402
from arl.sandbox.backends import backend_problem, open_sandbox  # noqa: E402
from arl.sandbox.bwrap import fresh_uid_block  # noqa: E402
from arl.sandbox.sandbox import Sandbox, SandboxLimits  # noqa: E402
from arl.sandbox.uid_delegation import TOOL_UIDS_ENV, format_uids  # noqa: E402

TOOL_UID = "none (tool uid)"  # the variant: "none" in a process given a block of tool uids
ALL = ("none", TOOL_UID, "bwrap", "podman", "docker")  # the variants, in the table's order

# The distribution's python where there is one: a command dropped to a tool uid must be able to
# run it (an interpreter under a 0700 home, like pyenv's under /root, is closed to other uids).
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
COMMANDS = {"true": "true", "python -c pass": f"{PYTHON} -c pass"}


def stats(values_s: list[float]) -> dict[str, float]:
    ms = sorted(v * 1e3 for v in values_s)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return {"median_ms": statistics.median(ms), "p95_ms": p95, "n": len(ms)}


async def plain(command: str) -> None:
    proc = await asyncio.create_subprocess_exec("bash", "-c", command, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    await proc.communicate()
    assert proc.returncode == 0


@contextlib.contextmanager
def given_tool_uids(variant: str):
    """For the tool-uid variant, this process is a pull-mode agent given a block (what the
    launcher's environment says); the Sandbox reads it when it is made."""
    if variant != TOOL_UID:
        yield
        return
    os.environ[TOOL_UIDS_ENV] = format_uids(fresh_uid_block())
    try:
        yield
    finally:
        del os.environ[TOOL_UIDS_ENV]


def make_box(limits: SandboxLimits, variant: str, **kwargs) -> Sandbox:
    with given_tool_uids(variant):
        return open_sandbox(limits, backend="none" if variant == TOOL_UID else variant, **kwargs)


async def measure(repeats: int, isolations: list[str]) -> list[dict]:
    limits = SandboxLimits()
    boxes = {iso: make_box(limits, iso, python=True) for iso in isolations}
    variants = ["plain", *isolations]
    times: dict[tuple[str, str], list[float]] = {(c, v): [] for c in COMMANDS for v in variants}
    startup: dict[str, list[float]] = {iso: [] for iso in isolations}
    try:
        for i in range(repeats):
            order = variants[i % len(variants):] + variants[: i % len(variants)]
            for name, command in COMMANDS.items():
                for variant in order:
                    start = time.perf_counter()
                    if variant == "plain":
                        await plain(command)
                    else:
                        result = await boxes[variant].run(command)
                        assert result.ok, result
                    times[name, variant].append(time.perf_counter() - start)
            for iso in (v for v in order if v != "plain"):
                start = time.perf_counter()
                await (await make_box(limits, iso).start()).close()
                startup[iso].append(time.perf_counter() - start)
    finally:
        for box in boxes.values():
            await box.close()
    rows = []
    for name in COMMANDS:
        base = statistics.median(times[name, "plain"])
        for variant in variants:
            s = stats(times[name, variant])
            rows.append({"row": name, "variant": variant, **s,
                         "ratio": statistics.median(times[name, variant]) / base})
    for iso in isolations:
        rows.append({"row": "start-up (Sandbox + close)", "variant": iso, **stats(startup[iso]), "ratio": None})
    return rows


def evaluation(repeats: int, isolation: str) -> dict:
    env = BugFixEnv(isolation=isolation)
    durations = []
    for seed in range(repeats):
        start = time.perf_counter()
        env.reset(seed=seed)
        _, _, terminated, _, _ = env.step(assistant_message("submit", {}))
        assert terminated
        durations.append(time.perf_counter() - start)
    env.close()
    row = {"row": "bug-fix reset + submit", "variant": isolation, **stats(durations), "ratio": None}
    return {**row, "episodes_per_s": 1e3 / row["median_ms"]}  # one episode after another


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke size")
    parser.add_argument("--repeats", type=int, default=None, help="default 200 (quick: 10)")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/sandbox.json")
    parser.add_argument("--backends", default=",".join(ALL), help=f"comma-separated, of {','.join(ALL)}")
    args = parser.parse_args()
    started = time.perf_counter()
    repeats = args.repeats or (10 if args.quick else 200)
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    if unknown := sorted(set(wanted) - set(ALL)):
        parser.error(f"unknown backends {unknown} (of {ALL})")
    problems = {b: backend_problem("none" if b == TOOL_UID else b) for b in ALL}
    if os.geteuid() != 0:
        problems[TOOL_UID] = "not root (only root can drop a command to another uid)"
    isolations = [b for b in ALL if b in wanted and problems[b] is None]
    for b in wanted:
        if problems[b] is not None:
            print(f"{b} rows skipped: {problems[b]}")
    rows = asyncio.run(measure(repeats, isolations))
    rows += [evaluation(max(3, repeats // 4), iso) for iso in isolations if iso != TOOL_UID]
    print(table(["what", "variant", "median ms", "p95 ms", "x plain", "episodes/s"],
                [[r["row"], r["variant"], f"{r['median_ms']:.1f}", f"{r['p95_ms']:.1f}",
                  "" if r["ratio"] is None else f"{r['ratio']:.1f}",
                  f"{r['episodes_per_s']:.2f}" if "episodes_per_s" in r else ""] for r in rows]))
    write_result(args.out or result_path("sandbox", args.quick), args,
                 {"rows": rows, "bwrap_problem": problems["bwrap"], "podman_problem": problems["podman"],
                  "docker_problem": problems["docker"]}, started)


if __name__ == "__main__":
    main()
