"""`arl view EVAL_DIR`: one self-contained HTML file of an `arl eval --out` results directory.

The page: the settings (model, engine or server, game, mode, seeds, attempts; config.yaml), the
table `arl eval` printed (`format_report` of the last row of each rollout), one row per task
(seed, attempts, successes, mean score), and every rollout's episode, task by task: frame by frame
where the stored replies can be played again on the game (`arl.rollout.evaluate.replay`: the step
and traj modes, proxy's gym runner), else the replies alone; an errored rollout shows its error.
A directory rescored (`arl eval --rescore`) is shown with its rescored rows.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from arl.rollout.evaluate import (
    RESCORED_FILE,
    RESULTS_FILE,
    aggregate,
    format_report,
    is_error,
    last_rows,
    read_rows,
    read_settings,
    replay,
    replayable,
)
from arl.viz.report import PAGE_CSS, _episode_block


def is_eval_dir(directory: str | Path) -> bool:
    """Whether ``directory`` is an `arl eval --out` results directory (not a run directory)."""
    directory = Path(directory)
    return (directory / RESULTS_FILE).exists() and not (directory / "metrics.jsonl").exists()


def _episode(row: dict[str, Any], rollout: Any, frames: bool) -> str:
    if is_error(row):
        return (f'<div class="episode"><div>seed {row["seed"]} attempt {row["attempt"]} '
                f'<span class="loss">{html.escape(str(row.get("exit_reason")))}</span></div>'
                f'<pre>{html.escape(str(row.get("error") or ""))}</pre></div>')
    replies = [r or "" for r in row.get("replies") or []]
    if frames and replies:
        turns = replay(rollout, int(row["seed"]), replies)["turns"]
    else:  # no game to replay on: the replies, without frames
        turns = [{"frame": "", "reply": r, "action": r[:40], "valid": True, "reward": 0.0} for r in replies]
    episode = {"seed": f'{row["seed"]} attempt {row["attempt"]}', "success": row.get("success"),
               "exit_reason": row.get("exit_reason"), "score": float(row.get("score", 0.0)), "turns": turns}
    return _episode_block(episode)


def eval_report_html(directory: str | Path) -> str:
    directory = Path(directory)
    settings = read_settings(directory)
    rescored = directory / RESCORED_FILE
    source = rescored if rescored.exists() else directory / RESULTS_FILE
    latest = last_rows(read_rows(source))
    report = aggregate(settings, latest.values())
    rollout = settings.rollout
    why = replayable(rollout)
    where = f"server {settings.endpoint}" if settings.endpoint else f"{settings.backend} engine"
    parts = [f"<h1>arl eval: {html.escape(str(directory))}</h1>",
             f"<p>{html.escape(settings.model)} on the {html.escape(where)}; {html.escape(rollout.env_id)}, "
             f"{html.escape(rollout.mode)} mode, T={rollout.manager.temperature}; {len(settings.seeds)} seeds x "
             f"{settings.attempts} attempts; digest {settings.digest}; rows from {html.escape(source.name)}</p>",
             f"<pre>{html.escape(format_report(report))}</pre>", "<h2>tasks</h2><table><tr><th>seed</th><th>n</th>"
             "<th>successes</th><th>mean score</th></tr>"]
    parts += [f'<tr><td>{t["seed"]}</td><td>{t["n"]}</td><td>{t["c"]}</td><td>{t["mean_score"]:.3g}</td></tr>'
              for t in report.tasks]
    parts.append("</table><h2>episodes</h2>")
    if why is not None:
        parts.append(f'<p class="note">replies only, no frames: {html.escape(why)}</p>')
    for seed in settings.seeds:
        rows = [latest[(seed, a)] for a in range(settings.attempts) if (seed, a) in latest]
        if rows:
            blocks = "".join(_episode(r, rollout, why is None) for r in rows)
            wins = sum(bool(r.get("success")) and not is_error(r) for r in rows)
            parts.append(f"<details><summary>seed {seed}: {wins} of {len(rows)} solved</summary>"
                         f'<div class="episodes">{blocks}</div></details>')
    return ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>arl eval view</title>'
            f'<style>{PAGE_CSS}</style></head><body>{"".join(parts)}</body></html>')


def write_eval_report(directory: str | Path, out: str | Path | None = None) -> Path:
    out = Path(out) if out is not None else Path(directory) / "report.html"
    out.write_text(eval_report_html(directory), encoding="utf-8")
    return out


__all__ = ["eval_report_html", "is_eval_dir", "write_eval_report"]
