"""`arl view RUN_DIR`: one self-contained HTML file of a run dir: curves and eval rows.

Curves are inline SVG polylines of every numeric ``rollout/*``, ``train/*`` and ``eval/*`` key of
metrics.jsonl. A run dir records no episodes yet, and the report says so: nothing is invented.
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
"""


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


def report_html(run_dir: str | Path) -> str:
    from arl.train.logging import read_metrics  # the one reader of metrics.jsonl

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    curves = series(rows)
    parts = [f"<h1>arl run: {html.escape(str(run_dir))}</h1>",
             f'<p>{len(rows)} metric rows, {len({r.get("step") for r in rows})} steps, '
             f'{len(sorted(run_dir.glob("ckpt_*")))} checkpoint(s)</p>']
    for prefix in SECTIONS:
        keys = sorted(k for k in curves if k.startswith(prefix))
        parts.append(f"<h2>{html.escape(prefix.rstrip('/'))}</h2>")
        if not keys:
            parts.append(f'<p class="note">no {html.escape(prefix)}* metrics</p>')
            continue
        parts.append('<div class="grid">' + "".join(svg_chart(k, curves[k]) for k in keys) + "</div>")
    parts += ["<h2>eval rows</h2>", _eval_table(rows), "<h2>episodes</h2>",
              '<p class="note">a run dir records no episodes yet; render samples in a notebook with '
              "arl.viz.episode_html</p>"]
    return ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>arl view</title>'
            f'<style>{PAGE_CSS}</style></head><body>{"".join(parts)}</body></html>')


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    out = Path(out) if out is not None else Path(run_dir) / "report.html"
    out.write_text(report_html(run_dir), encoding="utf-8")
    return out
