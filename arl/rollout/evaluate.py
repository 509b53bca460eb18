"""Evaluation panels: seeds x attempts on an engine, pass@k, and a results directory that resumes.

    settings = EvalSettings(model="tiny", backend="hf", rollout=rollout, seeds=(1, 2, 3), attempts=4)
    report = await evaluate(engine, settings, out="evals/x", concurrency=32)   # or resume=True
    report.pass_at_k[1], report.success_rate, report.exits

A *task* is one env seed of the panel; each of its ``attempts`` episodes is a rollout of its own
(`EpisodeSpec` group ``val_{i}_{seed}``, ``episode_id`` = the attempt), so each attempt draws
its own sampling seeds (`arl.rollout.base.request_seed` hashes both in); attempt 0 of the
default panel is the episode the trainer's validation plays (`GroupScheduler.val_specs`).

With ``out``, the directory holds ``config.yaml`` (the resolved settings and their ``digest``),
``results.jsonl``, one line per finished rollout, appended and flushed as each ends (a crash
loses only the rollouts in flight), and at the end ``summary.json`` (the metrics, exit reasons
and one row per task: seed, n, c, mean score). ``resume=True`` re-reads it, refuses (`EvalDirError`) when
the settings' digest differs, and plays only the (seed, attempt) pairs that are missing or
whose last row ended in an error (`ERROR_EXITS`); the file stays append-only and the
aggregation reads the last row of each pair. Concurrency is not a setting of the results: it
may change between a run and its resume.

An errored rollout counts as a failure (score 0) in every rate and in pass@k, and is counted in
`EvalReport.errors`, so a flaky engine lowers the numbers visibly rather than shrinking the panel.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import yaml

from arl.config import RolloutConfig, unstructure
from arl.rollout.base import EnvManager, Episode, EpisodeSpec
from arl.rollout.factory import close_manager, make_manager
from arl.rollout.metrics import error_class, reward_extras
from arl.rollout.oracle import BUGFIX_ENV, REALBUGS_ENV
from arl.rollout.records import EXIT_REASONS
from arl.rollout.scheduler import VAL_BASE_SEED

CONFIG_FILE = "config.yaml"
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"  # the report of the last run or resume: metrics, exits, per-task rows

# Exit reasons (arl.rollout.records.EXIT_REASONS) that say the rollout failed to run, not that the
# model failed the task: `resume` plays them again. max_length, invalid_prompt and no_data are
# outcomes a rerun reproduces, so they are scored, not retried.
ERROR_EXITS = frozenset({"env_error", "engine_error", "timeout", "agent_error", "internal_error"})
assert ERROR_EXITS <= EXIT_REASONS


class EvalDirError(ValueError):
    """A results directory that cannot be written or resumed with these settings."""


# ----------------------------------------------------------------------------------------------
# pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from n attempts of which c succeeded (Chen et al. 2021, §2.1):

        pass@k = 1 - C(n - c, k) / C(n, k)

    the chance that k attempts drawn without replacement from the n include a success. Its mean
    over tasks estimates the chance that k fresh attempts solve a task, without the bias of
    1 - (1 - c/n)^k. Edge cases: c = 0 gives 0; n - c < k (fewer failures than k, so every draw
    of k holds a success) gives 1; k > n is undefined (ValueError).

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 0, 3), pass_at_k(4, 2, 3)
    (0.25, 0.5, 0.0, 1.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# ----------------------------------------------------------------------------------------------
# settings and the panel


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"A:B"``, the half-open range A .. B - 1.

    >>> parse_seeds("3:6")
    (3, 4, 5)
    """
    start, sep, stop = text.partition(":")
    try:
        seeds = tuple(range(int(start), int(stop))) if sep else ()
    except ValueError:
        seeds = ()
    if not seeds:
        raise ValueError(f"--seeds {text!r}: expected A:B with integers A < B (the seeds A .. B-1)")
    return seeds


def read_seeds_file(path: str | Path) -> tuple[int, ...]:
    """One integer per line; blank lines and ``#`` comments skipped; duplicates refused."""
    seeds = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            seeds.append(int(line))
        except ValueError:
            raise ValueError(f"{path}:{number}: {line!r} is not an integer seed") from None
    if not seeds:
        raise ValueError(f"{path}: no seeds in it")
    repeated = [s for s, n in Counter(seeds).items() if n > 1]
    if repeated:
        raise ValueError(f"{path}: seeds listed twice: {repeated[:5]}")
    return tuple(seeds)


def default_seeds(num_seeds: int = 256) -> tuple[int, ...]:
    """The trainer's validation panel (`GroupScheduler.val_specs`)."""
    return tuple(range(VAL_BASE_SEED, VAL_BASE_SEED + num_seeds))


@attrs.frozen
class EvalSettings:
    """What decides an evaluation's results (its digest): the model, the engine backend, the
    rollout (game, mode, sampling, prompts), the seeds and the attempts per seed; against a model
    server (backend ``"endpoint"``), its ``endpoint`` URL and ``model`` the name it serves."""

    model: str
    backend: str
    rollout: RolloutConfig
    seeds: tuple[int, ...] = attrs.field(converter=tuple)
    attempts: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    endpoint: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {"model": self.model, "backend": self.backend, "seeds": list(self.seeds), "attempts": self.attempts,
               "rollout": unstructure(self.rollout)}  # type: ignore[arg-type]
        if self.endpoint is not None:  # absent in-process, so the digests of earlier directories hold
            out["endpoint"] = self.endpoint
        return out

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def specs(self) -> list[EpisodeSpec]:
        """Every rollout, task-major: (seed, attempt 0), (seed, attempt 1), ..."""
        return [EpisodeSpec(env_id=self.rollout.env_id, seed=seed, group_id=f"val_{i}_{seed}", episode_id=a, tag="val")
                for i, seed in enumerate(self.seeds) for a in range(self.attempts)]


# ----------------------------------------------------------------------------------------------
# results


def result_row(episode: Episode, attempt: int, decode: Callable[[list[int]], str] | None = None) -> dict[str, Any]:
    """One line of results.jsonl for a finished rollout.

    ``replies`` holds each turn's reply text (a model server's as sent, `arl.rollout.remote`; an
    engine's tokens through ``decode``), what `rescore` replays. A turn played against a server
    counts the tokens its ``usage`` reported, one played in process its token ids; the server's
    calls also give their latency (``call_latency_s``, one per call)."""
    t = episode.trajectory
    judged = [turn for turn in t.turns if "action_valid" in turn.info]
    calls = [turn.info for turn in t.turns if "latency_s" in turn.info]

    def count(turn: Any, key: str, ids: Sequence[int]) -> int:
        value = turn.info.get(key)
        return int(value) if value is not None else len(ids)

    def reply(turn: Any) -> str | None:
        if "reply" in turn.info:
            return str(turn.info["reply"])
        return decode(list(turn.response_ids)) if decode is not None else None

    row = {
        "seed": t.seed, "attempt": attempt, "score": t.episode_score, "success": bool(t.success),
        "exit_reason": t.exit_reason, "status": t.status, "error": t.error, "turns": len(t.turns),
        "tokens": sum(count(turn, "completion_tokens", turn.response_ids) for turn in t.turns),
        "prompt_tokens": sum(count(turn, "prompt_tokens", turn.prompt_ids) for turn in t.turns),
        "actions_valid": sum(bool(turn.info["action_valid"]) for turn in judged), "actions_judged": len(judged),
        "wall_s": round(t.timings.get("total", 0.0), 4),
        "replies": [reply(turn) for turn in t.turns],
    }
    if calls:
        row["call_latency_s"] = [info["latency_s"] for info in calls]
    if t.turns and isinstance(t.turns[-1].info.get("final_files"), dict):  # a BugFix episode's end: rescore reads it
        row["final_files"] = t.turns[-1].info["final_files"]
    if t.turns and isinstance(t.turns[-1].info.get("reward_extra"), dict):  # the spec's numbers beside the score
        row["reward_extra"] = t.turns[-1].info["reward_extra"]
    return row


def is_error(row: dict[str, Any]) -> bool:
    return row.get("exit_reason") in ERROR_EXITS


def error_type(row: dict[str, Any]) -> str:
    """The class an errored row's error text starts with (``"EndpointTimeout: ..."``), else its exit reason.

    >>> error_type({"exit_reason": "engine_error", "error": "EndpointTimeout: no reply in time"})
    'EndpointTimeout'
    >>> error_type({"exit_reason": "timeout", "error": None})
    'timeout'

    A class outside builtins is written with its module (Python's traceback text); its own name counts:

    >>> error_type({"exit_reason": "env_error", "error": "arl.envs.reward_spec.RewardTimeout: past 300 s"})
    'RewardTimeout'
    """
    return error_class(row.get("error")) or str(row.get("exit_reason"))


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a results.jsonl; a line cut short by a crash is skipped."""
    rows = []
    path = Path(path)
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "seed" in row and "attempt" in row:
                rows.append(row)
    return rows


def last_rows(rows: Iterable[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    """The last row of each (seed, attempt): a resumed rollout replaces the errored one."""
    return {(int(r["seed"]), int(r["attempt"])): r for r in rows}


@attrs.define
class EvalReport:
    """The aggregate of one row per (seed, attempt) of the panel."""

    rows: list[dict[str, Any]]  # one per (seed, attempt) played, task-major
    attempts: int
    pass_at_k: dict[int, float]  # k -> mean over tasks with all `attempts` rows
    success_rate: float | None
    mean_score: float | None
    mean_turns: float | None
    valid_action_rate: float | None
    exits: dict[str, int]
    errors: int
    error_types: dict[str, int]  # the errors by the exception class their text names (EndpointTimeout, ...)
    missing: int  # (seed, attempt) pairs of the panel without a row
    tokens: int
    prompt_tokens: int
    calls: int  # model-server calls recorded (`arl.rollout.remote`; 0 in process)
    latency_s: float  # their summed latency
    wall_s: float  # summed over rollouts (their own time, not the run's)
    tasks: list[dict[str, Any]]  # per seed: n, c, mean score
    reward_extras: dict[str, float] = attrs.field(factory=dict)  # means of the rows' reward_extra numbers
    elapsed_s: float = 0.0  # this call's wall time (`evaluate`)
    played: int = 0  # rollouts this call played (a resume: the pending ones)

    @property
    def all_errored(self) -> bool:
        return bool(self.rows) and self.errors == len(self.rows)

    def metrics(self) -> dict[str, float]:
        """The eval/ metrics `arl eval` printed before panels (and the trainer logs), plus pass@k."""
        out = {"eval/num_episodes": float(len(self.rows))}
        for key, value in (("success_rate", self.success_rate), ("mean_episode_score", self.mean_score),
                           ("mean_turns", self.mean_turns), ("valid_action_rate", self.valid_action_rate)):
            if value is not None:
                out[f"eval/{key}"] = value
        if self.attempts > 1:
            out.update({f"eval/pass@{k}": v for k, v in self.pass_at_k.items()})
        out.update({f"eval/reward/{key}": value for key, value in self.reward_extras.items()})
        return out


def _mean(xs: Sequence[float]) -> float | None:
    return float(sum(xs) / len(xs)) if xs else None


def aggregate(settings: EvalSettings, rows: Iterable[dict[str, Any]]) -> EvalReport:
    """The report of the panel's last rows (rows of other seeds or attempts are ignored)."""
    latest = last_rows(rows)
    panel = [(s, a) for s in settings.seeds for a in range(settings.attempts)]
    played = [latest[key] for key in panel if key in latest]
    ok = [not is_error(r) and bool(r["success"]) for r in played]
    tasks = []
    for seed in settings.seeds:
        mine = [latest[(seed, a)] for a in range(settings.attempts) if (seed, a) in latest]
        if mine:
            c = sum(not is_error(r) and bool(r["success"]) for r in mine)
            tasks.append({"seed": seed, "n": len(mine), "c": c,
                          "mean_score": _mean([0.0 if is_error(r) else float(r["score"]) for r in mine])})
    complete = [t for t in tasks if t["n"] == settings.attempts]
    judged = sum(r.get("actions_judged", 0) for r in played)
    return EvalReport(
        rows=played, attempts=settings.attempts,
        pass_at_k={k: sum(pass_at_k(t["n"], t["c"], k) for t in complete) / len(complete)
                   for k in range(1, settings.attempts + 1)} if complete else {},
        success_rate=_mean([float(x) for x in ok]),
        mean_score=_mean([0.0 if is_error(r) else float(r["score"]) for r in played]),
        mean_turns=_mean([float(r["turns"]) for r in played]),
        valid_action_rate=sum(r.get("actions_valid", 0) for r in played) / judged if judged else None,
        exits=dict(sorted(Counter(r["exit_reason"] for r in played).items())),
        errors=sum(is_error(r) for r in played),
        error_types=dict(sorted(Counter(error_type(r) for r in played if is_error(r)).items())),
        missing=len(panel) - len(played),
        tokens=sum(int(r.get("tokens", 0)) for r in played),
        prompt_tokens=sum(int(r.get("prompt_tokens", 0)) for r in played),
        calls=sum(len(r.get("call_latency_s", ())) for r in played),
        latency_s=sum(sum(r.get("call_latency_s", ())) for r in played), wall_s=sum(float(r.get("wall_s", 0.0)) for r in played),
        reward_extras=reward_extras([r["reward_extra"] for r in played
                                     if not is_error(r) and isinstance(r.get("reward_extra"), dict)]),
        tasks=tasks,
    )


# ----------------------------------------------------------------------------------------------
# the results directory


def prepare_dir(settings: EvalSettings, out: str | Path, resume: bool) -> list[dict[str, Any]]:
    """Make ``out`` ready for ``settings`` and return the rows already there (none unless resuming).

    A new run needs a directory without results; a resume needs one whose config.yaml has the
    same digest. Either refusal is an `EvalDirError` that says what to do."""
    out = Path(out)
    config, results = out / CONFIG_FILE, out / RESULTS_FILE
    if resume:
        if not config.exists():
            raise EvalDirError(f"{out} holds no {CONFIG_FILE}: nothing to resume (start it with --out {out})")
        saved = yaml.safe_load(config.read_text()) or {}
        if saved.get("digest") != settings.digest:
            mine, theirs = _flat(settings.as_dict()), _flat(saved.get("settings") or {})
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise EvalDirError(
                f"{out} was evaluated with other settings (digest {saved.get('digest')}, these give {settings.digest}; "
                f"differing: {', '.join(changed) or 'unknown'}): resume it with the command that started it "
                f"(see {config}), or evaluate into a new directory with --out")
        return read_rows(results)
    if results.exists() and results.stat().st_size:
        raise EvalDirError(f"{out} already holds results ({results}): continue it with --resume {out}, "
                           "or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump({"digest": settings.digest, "settings": settings.as_dict()}, sort_keys=False))
    return []


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: a refusal names the setting that changed."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def pending(settings: EvalSettings, rows: Iterable[dict[str, Any]]) -> list[EpisodeSpec]:
    """The panel's rollouts without a row, or whose last row is an error."""
    latest = last_rows(rows)
    return [s for s in settings.specs()
            if (s.seed, s.episode_id) not in latest or is_error(latest[(s.seed, s.episode_id)])]


async def evaluate(
    engine: Any,
    settings: EvalSettings,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    concurrency: int = 64,
    manager: EnvManager | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> EvalReport:
    """Play the panel's rollouts (with ``resume``, only those `pending`) on ``engine``, at most
    ``concurrency`` at once, streaming each row to ``out/results.jsonl`` and to ``on_row``.
    ``manager``: one built elsewhere (default: `make_manager` of ``settings.rollout``)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if resume and out is None:
        raise ValueError("resume needs the results directory (out)")
    before = prepare_dir(settings, out, resume) if out is not None else []
    todo = pending(settings, before)
    rows = list(before)
    own = manager is None
    manager = make_manager(engine, settings.rollout) if manager is None else manager
    limiter = anyio.CapacityLimiter(concurrency)
    sink = open(Path(out) / RESULTS_FILE, "a+") if out is not None else None  # noqa: SIM115 -- closed below
    if sink is not None and sink.tell():  # a line cut short by a crash: end it, so the next row is whole
        sink.seek(sink.tell() - 1)
        if sink.read(1) != "\n":
            sink.write("\n")

    tokenizer = getattr(manager.engine, "tokenizer", None)  # none: a model server's or the oracle's replies are text
    decode = None if tokenizer is None else lambda ids: tokenizer.decode(ids, skip_special_tokens=True)

    async def one(spec: EpisodeSpec) -> None:
        async with limiter:
            episode = await manager.run_episode(spec)
        row = result_row(episode, spec.episode_id, decode)
        rows.append(row)
        if sink is not None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()
        if on_row is not None:
            on_row(row)

    start = time.perf_counter()
    try:
        async with anyio.create_task_group() as tg:
            for spec in todo:
                tg.start_soon(one, spec)
    finally:
        if sink is not None:
            sink.close()
        if own:
            await close_manager(manager)
    report = aggregate(settings, rows)
    report.elapsed_s = time.perf_counter() - start
    report.played = len(todo)
    if out is not None:
        summary = {"digest": settings.digest, "metrics": report.metrics(), "exits": report.exits,
                   "errors": report.errors, "error_types": report.error_types, "missing": report.missing, "tokens": report.tokens, "tasks": report.tasks}
        (Path(out) / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    return report


# ----------------------------------------------------------------------------------------------
# replaying stored episodes: rescoring and viewing

# envs whose stored episodes are re-scored from the files they ended with (``final_files``) by the
# module's ``rescore_episode(seed, files)``, not replayed
RESCORED_FROM_FILES = {BUGFIX_ENV: "arl.envs.bugfix.env", REALBUGS_ENV: "arl.envs.realbugs.env"}


def replayable(rollout: RolloutConfig) -> str | None:
    """Why ``rollout``'s stored replies cannot be played again on its game (None: they can).

    The step and traj managers and proxy mode's ``gym`` runner send every reply to a `TextEnv`
    of ``rollout.env_id`` as it is; any other agent's env is its own. BugFix rows are not
    replayed but re-scored from the files they ended with (`rescore_row`), whatever the agent; so
    are RealBugFix rows (`RESCORED_FROM_FILES`)."""
    if rollout.env_id in RESCORED_FROM_FILES:
        return None
    if rollout.mode == "proxy" and rollout.proxy.runner != "gym":
        return (f"rollout.proxy.runner={rollout.proxy.runner!r} plays its own env: its replies cannot be replayed "
                "on the game (rescore works for the step and traj modes and the gym runner)")
    return None


def replay(rollout: RolloutConfig, seed: int, replies: Sequence[str]) -> dict[str, Any]:
    """Play ``replies`` again on a fresh game of ``rollout`` reset to ``seed`` (the env the
    managers make: `EnvManager.make_env`), without a model: the score, success and exit they earn
    under the game's current rules, and each turn (the frame the reply was given in, the parsed
    action, whether it was valid, the reward). The games' randomness (FrozenLake's slipping) is
    drawn from the reset seed, so a replay is the episode that was played."""
    from arl.envs.text import TextEnv

    m = rollout.manager
    env = TextEnv(rollout.env_id, format_penalty=m.format_penalty, **m.env_kwargs)
    try:
        obs, info = env.reset(seed=seed)
        frame = str(info.get("raw_obs", obs))
        turns, score, success, exit_reason = [], 0.0, False, "truncated"
        for reply in replies:
            obs, reward, terminated, truncated, info = env.step(reply)
            turns.append({"frame": frame, "reply": reply, "action": info.get("action"),
                          "valid": bool(info.get("action_valid", False)), "reward": float(reward)})
            score += float(reward)
            success = bool(info.get("success", False))
            frame = str(info.get("raw_obs", obs))
            if terminated or truncated:
                exit_reason = "terminated" if terminated else "truncated"
                break
    finally:
        env.close()
    return {"score": score, "success": success, "exit_reason": exit_reason, "turns": turns}


def rescore_row(rollout: RolloutConfig, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its score, success and valid actions recomputed by `replay` of its replies
    (an errored row, or one without stored replies, is returned as it is). The exit is the
    replay's where the row ended in the game (terminated or truncated), else the row's own
    (``max_length``: where the context ran out, which a replay cannot see)."""
    if rollout.env_id in RESCORED_FROM_FILES:
        return rescore_files_row(rollout, row)
    replies = row.get("replies")
    if is_error(row) or not replies or any(r is None for r in replies):
        return row
    played = replay(rollout, int(row["seed"]), replies)
    out = {**row, "score": played["score"], "success": played["success"],
           "actions_valid": sum(t["valid"] for t in played["turns"]), "actions_judged": len(played["turns"]),
           "rescored_from": {"score": row["score"], "success": row["success"]}}
    if row.get("exit_reason") in ("terminated", "truncated"):
        out["exit_reason"] = played["exit_reason"]
    return out


def rescore_files_row(rollout: RolloutConfig, row: dict[str, Any]) -> dict[str, Any]:
    """A BugFix or RealBugFix ``row`` scored again by today's reward spec from the files its
    episode ended with (``final_files``: `arl.envs.bugfix.env.rescore_episode`,
    `arl.envs.realbugs.env.rescore_episode`), no agent replayed. An errored row or one without
    stored files is returned as it is; a spec that cannot decide makes the row an ``env_error``
    with the spec's error (never a 0)."""
    import importlib

    from arl.envs.reward_spec import RewardError
    from arl.sandbox.backends import set_default_backend

    files = row.get("final_files")
    if is_error(row) or not isinstance(files, dict):
        return row
    set_default_backend(rollout.sandbox.backend)  # the backend the panel was evaluated with
    rescore_episode = importlib.import_module(RESCORED_FROM_FILES[rollout.env_id]).rescore_episode
    try:
        result = anyio.run(lambda: rescore_episode(int(row["seed"]), files))
    except RewardError as exc:  # no score decided: an error row (counted apart), not a 0
        return {**row, "exit_reason": "env_error", "status": "Failed", "error": f"{type(exc).__name__}: {exc}"}
    return {**row, "score": float(result.score), "success": bool(result.success), "reward_extra": result.metrics,
            "rescored_from": {"score": row["score"], "success": row["success"]}}


def read_settings(directory: str | Path) -> EvalSettings:
    """The `EvalSettings` a results directory was evaluated with (its config.yaml)."""
    from arl.config import structure

    config = Path(directory) / CONFIG_FILE
    if not config.exists():
        raise EvalDirError(f"{directory} holds no {CONFIG_FILE}: not a results directory of arl eval --out")
    saved = (yaml.safe_load(config.read_text()) or {}).get("settings") or {}
    try:
        rollout = structure({"rollout": saved["rollout"]}).rollout
        return EvalSettings(model=saved["model"], backend=saved["backend"], rollout=rollout, seeds=saved["seeds"],
                            attempts=saved["attempts"], endpoint=saved.get("endpoint"))
    except (KeyError, TypeError, ValueError) as exc:
        raise EvalDirError(f"{config}: cannot read its settings ({type(exc).__name__}: {exc})") from None


RESCORED_FILE = "rescored.jsonl"  # `rescore`'s rows: the last row of each rollout, rescored
RESCORED_SUMMARY_FILE = "rescored_summary.json"


def rescore(directory: str | Path) -> tuple[EvalReport, int]:
    """Recompute the rewards of a results directory's rollouts from their stored replies
    (`rescore_row`), without a model: writes ``rescored.jsonl`` (one row per rollout) and
    ``rescored_summary.json`` beside results.jsonl, which stays as it was. Returns the report of
    the rescored rows and how many rows' score or success changed."""
    directory = Path(directory)
    settings = read_settings(directory)
    if (why := replayable(settings.rollout)) is not None:
        raise EvalDirError(f"{directory}: {why}")
    latest = last_rows(read_rows(directory / RESULTS_FILE))
    rows = [rescore_row(settings.rollout, latest[key]) for key in sorted(latest)]
    changed = sum("rescored_from" in r and (r["score"], r["success"]) != (r["rescored_from"]["score"],
                                                                          r["rescored_from"]["success"]) for r in rows)
    (directory / RESCORED_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = aggregate(settings, rows)
    summary = {"digest": settings.digest, "metrics": report.metrics(), "exits": report.exits, "changed": changed,
               "errors": report.errors, "missing": report.missing, "tasks": report.tasks}
    (directory / RESCORED_SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    return report, changed


def format_report(report: EvalReport) -> str:
    """The table `arl eval` prints at the end."""
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    lines = [f"{'rollouts':<18} {len(report.rows)} ({len(report.tasks)} tasks x {report.attempts} attempts"
             + (f", {report.missing} missing" if report.missing else "") + ")"]
    for k, v in report.pass_at_k.items():
        lines.append(f"{f'pass@{k}':<18} {v:.1%}")
    lines.append(f"{'success':<18} {pct(report.success_rate)}")
    lines.append(f"{'mean score':<18} {'-' if report.mean_score is None else f'{report.mean_score:.3f}'}")
    lines.append(f"{'errors':<18} {report.errors}" + (
        " (" + ", ".join(f"{k} {n}" for k, n in report.error_types.items()) + ")" if report.errors else ""))
    lines.append(f"{'exits':<18} " + ", ".join(f"{k} {n}" for k, n in report.exits.items()))
    lines.append(f"{'tokens':<18} {report.tokens} generated, {report.prompt_tokens} prompt")
    if report.reward_extras:
        lines.append(f"{'reward extras':<18} " + ", ".join(f"{k} {v:.3f}" for k, v in report.reward_extras.items()))
    if report.calls:
        lines.append(f"{'server calls':<18} {report.calls}, mean latency {report.latency_s / report.calls:.3f} s")
    lines.append(f"{'wall time':<18} " + (f"{report.elapsed_s:.1f} s for {report.played} rollouts played now; "
                                           if report.played else "") + f"{report.wall_s:.1f} s summed over all rollouts")
    return "\n".join(lines)


__all__ = [
    "CONFIG_FILE", "RESCORED_FILE", "RESCORED_FROM_FILES", "RESCORED_SUMMARY_FILE", "ERROR_EXITS", "RESULTS_FILE", "SUMMARY_FILE", "EvalDirError", "EvalReport", "EvalSettings", "aggregate", "default_seeds", "error_type", "evaluate",
    "format_report", "is_error", "last_rows", "parse_seeds", "pass_at_k", "pending", "prepare_dir", "read_rows",
    "read_seeds_file", "read_settings", "replay", "replayable", "rescore", "rescore_files_row", "rescore_row", "result_row",
]
