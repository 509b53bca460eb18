"""`arl view RUN_DIR`: one self-contained HTML file of a run dir: curves, eval rows, and what
the validation panel did at each evaluation.

Curves are inline SVG polylines of every numeric ``rollout/*``, ``train/*`` and ``eval/*`` key of
metrics.jsonl. From episodes.jsonl (`arl.train.episodes`, written at each evaluation): the exits
table (how the panel's episodes ended, per evaluation), the actions table (the share of each action
over the panel's turns), per-state action distributions (the same first states answered at every
evaluation) and a handful of validation episodes frame by frame. A run dir without episodes.jsonl
(a run from before it existed) gets a note: nothing is invented. No script, no external reference.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

CURVE_COLOUR = "#1f77b4"
SECTIONS = ("rollout/", "train/", "eval/")
PAGE_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:24px;border-bottom:1px solid #ccc}
.grid{display:flex;flex-wrap:wrap;gap:6px}
.chart{background:#fff;border:1px solid #ddd;border-radius:4px}
table{border-collapse:collapse;font-size:12px;background:#fff}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
.note{color:#666;font-style:italic}
.episodes{display:flex;flex-wrap:wrap;gap:8px}.episode{background:#fff;border:1px solid #ddd;border-radius:4px;padding:4px}
.frames{display:flex;gap:4px;flex-wrap:wrap}.frame{border:1px solid #eee;padding:2px;font-size:11px}
.frame pre{margin:0;font-size:11px;line-height:1.1}
details>summary{cursor:pointer;font-weight:600;margin:6px 0}
"""
WIN_COLOUR, LOSS_COLOUR = "#2ca02c", "#d62728"  # the badges a browser test looks for in the screenshot
PAGE_CSS += (f".win{{color:#fff;background:{WIN_COLOUR};padding:0 4px;border-radius:3px}}"
             f".loss{{color:#fff;background:{LOSS_COLOUR};padding:0 4px;border-radius:3px}}.bad{{color:{LOSS_COLOUR}}}\n")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def series(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        step = _num(row.get("step"))
        if step is None:
            continue
        for key, v in row.items():
            if key.startswith(SECTIONS) and (y := _num(v)) is not None:
                out.setdefault(key, []).append((step, y))
    return out


def svg_chart(title: str, points: list[tuple[float, float]], width: int = 280, height: int = 150) -> str:
    pad_l, pad_r, pad_t, pad_b = 44, 8, 18, 18
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def xy(x: float, y: float) -> str:
        return f"{pad_l + (x - x0) / (x1 - x0) * w:.1f},{pad_t + (1 - (y - y0) / (y1 - y0)) * h:.1f}"

    pts = " ".join(xy(x, y) for x, y in points)
    mark = "".join(f'<circle cx="{xy(x, y).split(",")[0]}" cy="{xy(x, y).split(",")[1]}" r="2.5" fill="{CURVE_COLOUR}"/>'
                   for x, y in points) if len(points) <= 30 else ""
    e = html.escape
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><title>{e(title)}</title>'
            f'<text x="4" y="12" font-size="11" font-family="sans-serif">{e(title)}</text>'
            f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>'
            f'<text x="{pad_l - 3}" y="{pad_t + 8}" font-size="9" text-anchor="end">{y1:.3g}</text>'
            f'<text x="{pad_l - 3}" y="{pad_t + h}" font-size="9" text-anchor="end">{y0:.3g}</text>'
            f'<text x="{pad_l}" y="{height - 4}" font-size="9">{x0:g}</text>'
            f'<text x="{pad_l + w}" y="{height - 4}" font-size="9" text-anchor="end">{x1:g}</text>'
            f'<polyline fill="none" stroke="{CURVE_COLOUR}" stroke-width="2" points="{pts}"/>{mark}</svg>')


def _eval_table(rows: list[dict[str, Any]]) -> str:
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    if not evals:
        return '<p class="note">no eval rows in metrics.jsonl</p>'
    keys = sorted({k for r in evals for k in r if k.startswith("eval/")})
    head = "<tr><th>step</th>" + "".join(f"<th>{html.escape(k[5:])}</th>" for k in keys) + "</tr>"
    body = "".join("<tr><td>" + html.escape(str(r.get("step"))) + "</td>" +
                   "".join(f"<td>{r[k]:.4g}</td>" if _num(r.get(k)) is not None else "<td></td>" for k in keys)
                   + "</tr>" for r in evals)
    return f"<table>{head}{body}</table>"


def _count_table(evals: list[dict[str, Any]], field: str, share: bool) -> str:
    """Rows = evaluations, columns = the keys of ``row[field]`` (counts, or shares of the row's total)."""
    keys = sorted({k for r in evals for k in r.get(field, {})})
    if not keys:
        return f'<p class="note">no {html.escape(field)} recorded</p>'
    head = "<tr><th>step</th>" + "".join(f"<th>{html.escape(str(k))}</th>" for k in keys) + "</tr>"
    body = ""
    for r in evals:
        counts = r.get(field, {})
        total = sum(counts.values()) or 1
        cells = "".join(f"<td>{counts.get(k, 0) / total:.1%}</td>" if share else f"<td>{counts.get(k, 0)}</td>"
                        for k in keys)
        body += f"<tr><td>{html.escape(str(r.get('step')))}</td>{cells}</tr>"
    return f"<table>{head}{body}</table>"


def _states_table(evals: list[dict[str, Any]]) -> str:
    """One row per recorded first state (its frame), one column per evaluation: the sampled actions."""
    frames: dict[str, dict[Any, dict[str, int]]] = {}
    for r in evals:
        for st in r.get("states", []):
            frames.setdefault(st["frame"], {})[r.get("step")] = st["counts"]
    errors = {r.get("states_error") for r in evals} - {None}
    if not frames:
        return '<p class="note">no per-state samples recorded' + (
            f" ({html.escape('; '.join(sorted(errors)))})" if errors else "") + "</p>"
    steps = [r.get("step") for r in evals]
    head = "<tr><th>state</th>" + "".join(f"<th>step {html.escape(str(s))}</th>" for s in steps) + "</tr>"
    body = ""
    for frame, by_step in frames.items():
        cells = ""
        for s in steps:
            counts = by_step.get(s, {})
            n = sum(counts.values())
            cells += "<td>" + "<br>".join(f"{html.escape(a)} {c}/{n}" for a, c in
                                          sorted(counts.items(), key=lambda kv: -kv[1])) + "</td>"
        body += f'<tr><td><pre style="text-align:left;margin:0">{html.escape(frame)}</pre></td>{cells}</tr>'
    return f"<table>{head}{body}</table>"


def _episode_block(ep: dict[str, Any]) -> str:
    badge = ('<span class="win">success</span>' if ep.get("success")
             else f'<span class="loss">{html.escape(str(ep.get("exit_reason")))}</span>')
    frames = "".join(
        f'<div class="frame"><pre>{html.escape(t["frame"])}</pre>'
        f'<div class="{"" if t.get("valid") else "bad"}" title="{html.escape(t.get("reply", ""))}">'
        f'{i + 1}: {html.escape(str(t.get("action") or "(invalid)"))} r={t.get("reward", 0):.2g}</div></div>'
        for i, t in enumerate(ep.get("turns", [])))
    return (f'<div class="episode"><div>seed {html.escape(str(ep.get("seed")))} {badge} '
            f'score {ep.get("score", 0):.3g}, {len(ep.get("turns", []))} turns</div><div class="frames">{frames}</div></div>')


def _episodes_sections(run_dir: Path) -> list[str]:
    from arl.train.episodes import EPISODES_FILE, read_episodes  # the one reader of episodes.jsonl

    evals = read_episodes(run_dir)
    if not evals:
        return ["<h2>episodes</h2>", f'<p class="note">this run dir has no {EPISODES_FILE} (a run from before arl '
                "recorded validation episodes, or eval.record_episodes: 0)</p>"]
    parts = ["<h2>exits (validation episodes, per evaluation)</h2>", _count_table(evals, "exits", share=False),
             "<h2>actions (share of validation turns)</h2>", _count_table(evals, "actions", share=True),
             "<h2>per-state action distributions</h2>", _states_table(evals), "<h2>validation episodes</h2>"]
    for i, r in enumerate(evals):
        blocks = "".join(_episode_block(ep) for ep in r.get("episodes", []))
        opened = " open" if i in (0, len(evals) - 1) else ""  # the first and the last shown, the rest folded
        parts.append(f"<details{opened}><summary>step {html.escape(str(r.get('step')))}: "
                     f"{len(r.get('episodes', []))} of {r.get('num_episodes')} episodes</summary>"
                     f'<div class="episodes">{blocks}</div></details>')
    return parts


def report_html(run_dir: str | Path) -> str:
    from arl.train.logging import read_metrics  # the one reader of metrics.jsonl

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    curves = series(rows)
    parts = [f"<h1>arl run: {html.escape(str(run_dir))}</h1>",
             f'<p>{len(rows)} metric rows, {len({r.get("step") for r in rows})} steps, '
             f'{len(sorted(run_dir.glob("ckpt_*")))} checkpoint(s)</p>']
    # what a reader looks for first (validation curves, eval rows, what the episodes did), then the rest
    for prefix in ("eval/", "rollout/", "train/"):
        keys = sorted(k for k in curves if k.startswith(prefix))
        parts.append(f"<h2>{html.escape(prefix.rstrip('/'))}</h2>")
        if not keys:
            parts.append(f'<p class="note">no {html.escape(prefix)}* metrics</p>')
        else:
            parts.append('<div class="grid">' + "".join(svg_chart(k, curves[k]) for k in keys) + "</div>")
        if prefix == "eval/":
            parts += ["<h2>eval rows</h2>", _eval_table(rows), *_episodes_sections(run_dir)]
    return ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>arl view</title>'
            f'<style>{PAGE_CSS}</style></head><body>{"".join(parts)}</body></html>')


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    out = Path(out) if out is not None else Path(run_dir) / "report.html"
    out.write_text(report_html(run_dir), encoding="utf-8")
    return out
