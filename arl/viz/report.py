"""`arl view RUN_DIR`: one self-contained HTML file of a run dir: what the run was, what it measured,
and what the validation panel did at each evaluation.

The page, top to bottom: a header (the run's config from its config.yaml, before -> after numbers,
where the wall time went, the format warm-start, the weight sync and the outlier steps); the eval
panels, the eval rows and, from episodes.jsonl (`arl.train.episodes`), the exits table, the actions
table, per-state action distributions and a handful of validation episodes frame by frame; then the
rollout, train, weight-sync and timing panels. A run dir without episodes.jsonl or config.yaml (a run
from before they existed) gets a note: nothing is invented. No script, no external reference.

How a metric is drawn, so that a panel never says more than the numbers (issue 43 item 5):

- Not measured, no panel: a key absent from metrics.jsonl has none, and one that is null (non-finite)
  in every row is named in a note, not drawn.
- One value, no panel: a key with a single distinct value over the run is folded into one line of
  text per section ("constant: key = value, ..."); a key logged at one step only (the warm-start's
  `sft/*`, a single evaluation) into a "one step only" line.
- Rates on a 0-1 axis: a key whose last name ends in ``_rate`` or ``_frac`` (in docs/metrics.md every
  such key is a fraction and every fraction is so named). A value outside [0, 1] widens the axis; it
  is never clipped. Durations (``timing/*``) on an axis from 0, so jitter is not drawn as a doubling.
  Everything else min to max: a loss or a log-prob gap has no meaningful zero. Every axis spans at
  least `MIN_RELATIVE_SPAN` (0.1%) of the series' largest magnitude, so a weight that moves between
  0.99999 and 1 is drawn as the flat line it is, not as a fall from top to bottom.
- A key equal to the step at every point (``train/policy_version``) repeats the x axis: one line of text.
- Outliers: a point farther than `OUTLIER_MADS` (5) scaled MADs from its series' median is ringed in
  `OUTLIER_COLOUR` (MAD x 1.4826: the std of normal data, so 5 is "5 sigma" without letting the
  outliers inflate their own yardstick), in series of at least `OUTLIER_MIN_POINTS` (8) points whose
  MAD is not 0 (a counter that is mostly 0 has no spread to measure a spike against). The steps where
  ``train/grad_norm`` spikes upward by the same rule are marked by a dashed line on every panel (what
  else moved at that step) and listed in the header.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CURVE_COLOUR = "#1f77b4"
OUTLIER_COLOUR = "#ff00cc"  # rings and spike lines; a colour nothing else on the page uses (the browser test counts it)
OUTLIER_MADS = 5.0
OUTLIER_MIN_POINTS = 8
MAD_TO_STD = 1.4826  # the scaled MAD estimates the std of normally distributed data
MIN_RELATIVE_SPAN = 1e-3
SPIKE_KEY = "train/grad_norm"
CONFIG_FILE = "config.yaml"  # = arl.train.run_dir.CONFIG_FILE, the resolved config the trainer writes (save_config)
SECTIONS = ("eval/", "rollout/", "env/", "train/", "sync/", "timing/", "sft/")
# the weight sync's own keys, drawn together whatever their namespace
SYNC_KEYS = ("sync/canary_max_abs", "sync/canary_mean_abs", "timing/canary_s", "timing/weight_push_s",
             "train/weight_push_bytes")
WARM_START_KEYS = ("sft/loss_first", "sft/loss_last", "sft/steps", "timing/sft_s")
# the perception warm-start's (arl/train/perception.py), before the format's: in the header too
PERCEPTION_KEYS = ("sft/perception_steps", "timing/perception_s", "sft/perception_loss_first",
                   "sft/perception_loss_last", "sft/perception_cell_acc", "sft/perception_board_acc")
PAGE_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:24px;border-bottom:1px solid #ccc}
.grid{display:flex;flex-wrap:wrap;gap:6px}
.chart{background:#fff;border:1px solid #ddd;border-radius:4px}
table{border-collapse:collapse;font-size:12px;background:#fff}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
.note{color:#666;font-style:italic}
.constant{font-size:12px;color:#444;font-family:monospace}
.header{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}.header>div{max-width:640px}
.header p{margin:4px 0;font-size:13px}
.episodes{display:flex;flex-wrap:wrap;gap:8px}.episode{background:#fff;border:1px solid #ddd;border-radius:4px;padding:4px}
.frames{display:flex;gap:4px;flex-wrap:wrap}.frame{border:1px solid #eee;padding:2px;font-size:11px}
.frame pre{margin:0;font-size:11px;line-height:1.1}.frame img.shown{display:block;image-rendering:pixelated;max-width:112px}
details>summary{cursor:pointer;font-weight:600;margin:6px 0}
"""
WIN_COLOUR, LOSS_COLOUR = "#2ca02c", "#d62728"  # the badges a browser test looks for in the screenshot
PAGE_CSS += (f".win{{color:#fff;background:{WIN_COLOUR};padding:0 4px;border-radius:3px}}"
             f".loss{{color:#fff;background:{LOSS_COLOUR};padding:0 4px;border-radius:3px}}.bad{{color:{LOSS_COLOUR}}}\n")

Points = list[tuple[float, float]]


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def series(rows: list[dict[str, Any]]) -> dict[str, Points]:
    """(step, value) of every finite value of every key of ``SECTIONS``, in row order."""
    out: dict[str, Points] = {}
    for row in rows:
        step = _num(row.get("step"))
        if step is None:
            continue
        for key, v in row.items():
            if key.startswith(SECTIONS) and (y := _num(v)) is not None:
                out.setdefault(key, []).append((step, y))
    return out


def is_rate(key: str) -> bool:
    """A fraction in [0, 1]: the key's last name ends in ``_rate`` or ``_frac`` (docs/metrics.md's rule)."""
    return key.rsplit("/", 1)[-1].endswith(("_rate", "_frac"))


def outliers(values: list[float], *, mads: float = OUTLIER_MADS, upward_only: bool = False) -> list[int]:
    """Indices of the values farther than ``mads`` scaled MADs from the median (above it only with
    ``upward_only``); none in a series shorter than `OUTLIER_MIN_POINTS` or without spread (MAD 0).

    >>> outliers([1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.1, 9.0])
    [8]
    >>> outliers([0.0] * 8 + [1.0])  # no spread to measure a spike against
    []
    """
    if len(values) < OUTLIER_MIN_POINTS:
        return []
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values) * MAD_TO_STD
    if mad == 0:
        return []
    return [i for i, v in enumerate(values) if (v - med if upward_only else abs(v - med)) > mads * mad]


def spike_steps(curves: dict[str, Points]) -> list[tuple[float, float]]:
    """(step, value) of the upward `SPIKE_KEY` outliers: the steps marked on every panel."""
    points = curves.get(SPIKE_KEY, [])
    return [points[i] for i in outliers([y for _, y in points], upward_only=True)]


def _y_range(key: str, ys: list[float]) -> tuple[float, float]:
    lo, hi = min(ys), max(ys)
    if is_rate(key):
        return min(0.0, lo), max(1.0, hi)
    if key.startswith("timing/"):
        lo = min(0.0, lo)
    least = MIN_RELATIVE_SPAN * max(abs(lo), abs(hi))
    if hi - lo < least:  # centred on the values: a flat line in the middle of the panel
        mid = (lo + hi) / 2
        return mid - least / 2, mid + least / 2
    if hi == lo:  # all 0
        return lo - 0.5, hi + 0.5
    return lo, hi


def _labels(lo: float, hi: float) -> tuple[str, str]:
    """The axis' ends with as many digits as it takes to tell them apart (3 at least)."""
    for digits in range(3, 10):
        a, b = f"{lo:.{digits}g}", f"{hi:.{digits}g}"
        if a != b:
            return a, b
    return a, b


def svg_chart(title: str, points: Points, width: int = 280, height: int = 150, *,
              marks: Iterable[float] = ()) -> str:
    """One key's curve: the axis by the rules of the module docstring (``title`` is the key), its
    outliers ringed, a dashed line at each step of ``marks`` inside the x range."""
    pad_l, pad_r, pad_t, pad_b = 44, 8, 18, 18
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    y0, y1 = _y_range(title, ys)
    low, high = _labels(y0, y1)
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def px(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return pad_t + (1 - (y - y0) / (y1 - y0)) * h

    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{CURVE_COLOUR}"/>'
                   for x, y in points) if len(points) <= 30 else ""
    odd = outliers(ys)
    rings = "".join(f'<circle class="outlier" cx="{px(xs[i]):.1f}" cy="{py(ys[i]):.1f}" r="5" fill="none" '
                    f'stroke="{OUTLIER_COLOUR}" stroke-width="2"/>' for i in odd)
    lines = "".join(f'<line class="spike" x1="{round(px(s))}" y1="{pad_t}" x2="{round(px(s))}" y2="{pad_t + h}" '
                    f'stroke="{OUTLIER_COLOUR}" stroke-width="2" stroke-dasharray="4,3"/>'  # whole pixels: crisp
                    for s in marks if x0 <= s <= x1)
    e = html.escape
    hover = title + ("; outliers at step " + ", ".join(f"{xs[i]:g} ({_fmt(ys[i])})" for i in odd) if odd else "")
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><title>{e(hover)}</title>'
            f'<text x="4" y="12" font-size="11" font-family="sans-serif">{e(title)}</text>'
            f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>'
            f'<text class="ymax" x="{pad_l - 3}" y="{pad_t + 8}" font-size="9" text-anchor="end">{high}</text>'
            f'<text class="ymin" x="{pad_l - 3}" y="{pad_t + h}" font-size="9" text-anchor="end">{low}</text>'
            f'<text x="{pad_l}" y="{height - 4}" font-size="9">{x0:g}</text>'
            f'<text x="{pad_l + w}" y="{height - 4}" font-size="9" text-anchor="end">{x1:g}</text>'
            f'{lines}<polyline fill="none" stroke="{CURVE_COLOUR}" stroke-width="2" points="{pts}"/>{dots}{rings}</svg>')


def panels(keys: Iterable[str], curves: dict[str, Points], logged: set[str], marks: Iterable[float] = ()) -> str:
    """The panels of ``keys`` that vary; the keys with one value folded into text lines; the keys
    ``logged`` but never a number named. Empty string when there is nothing at all."""
    keys = sorted(keys)
    marks = list(marks)
    drawn, constant, single, steps = [], [], [], []
    for key in keys:
        points = curves.get(key)
        if not points:
            continue
        if len(points) > 1 and all(x == y for x, y in points):
            steps.append(key)
        elif len({y for _, y in points}) > 1:
            drawn.append(svg_chart(key, points, marks=marks))
        elif len(points) > 1:
            constant.append(f"{key} = {_fmt(points[0][1])}")
        else:
            single.append(f"{key} = {_fmt(points[0][1])} (step {points[0][0]:g})")
    never = [k for k in keys if k in logged and not curves.get(k)]
    parts = ['<div class="grid">' + "".join(drawn) + "</div>"] if drawn else []
    if constant:
        parts.append(f'<p class="constant">constant: {html.escape(", ".join(constant))}</p>')
    if steps:
        parts.append(f'<p class="constant">equal to the step: {html.escape(", ".join(steps))}</p>')
    if single:
        parts.append(f'<p class="constant">one step only: {html.escape(", ".join(single))}</p>')
    if never:
        parts.append(f'<p class="note">logged, never a number (null at every step): {html.escape(", ".join(never))}</p>')
    return "".join(parts)


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


def _frame_image(turn: dict[str, Any]) -> str:
    """The picture the turn's prompt showed (its record's ``image``, a PNG data URL: the report stays
    one file), drawn above its text frame; nothing for a text turn or a value that is no image URL."""
    url = turn.get("image")
    if not isinstance(url, str) or not url.startswith("data:image/"):
        return ""
    return f'<img class="shown" src="{html.escape(url)}" alt="the frame shown" title="the frame the model was shown">'


def _episode_block(ep: dict[str, Any]) -> str:
    badge = ('<span class="win">success</span>' if ep.get("success")
             else f'<span class="loss">{html.escape(str(ep.get("exit_reason")))}</span>')
    frames = "".join(
        f'<div class="frame">{_frame_image(t)}<pre>{html.escape(t["frame"])}</pre>'
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


# ---------------------------------------------------------------------------------------- header


def read_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's resolved config (run_dir/config.yaml), or None where the run dir has none."""
    import yaml

    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


# what a reader asks of a run first; the whole file is one click below
CONFIG_SUMMARY = (
    ("model", "model"), ("env", "rollout.env_id"), ("rollout mode", "rollout.mode"),
    ("estimator", "algo.estimator"), ("steps", "steps"), ("groups x size", None), ("lr", "optim.lr"),
    ("kl_coef", "algo.kl_coef"), ("entropy_coef", "algo.entropy_coef"), ("engine", "engine.backend"),
    ("precision", "optim.precision"), ("lora rank", "lora.rank"), ("warm-start steps", "sft.steps"),
    ("eval seeds / every / T", None), ("seed", "seed"),
)


def _config_block(run_dir: Path) -> str:
    try:
        config = read_config(run_dir)
    except Exception as exc:  # a report is never the reason a run cannot be looked at
        return f'<p class="note">{CONFIG_FILE} unreadable: {html.escape(f"{type(exc).__name__}: {exc}")}</p>'
    if config is None:
        return (f'<p class="note">this run dir has no {CONFIG_FILE} (a run from before the trainer wrote it; '
                "its checkpoints' trainer_state.pt hold the config)</p>")
    rows = []
    for label, dotted in CONFIG_SUMMARY:
        if dotted is not None:
            value = _get(config, dotted)
        elif label.startswith("groups"):
            value = f'{_get(config, "rollout.num_groups")} x {_get(config, "rollout.group_size")}'
        else:
            value = f'{_get(config, "eval.num_seeds")} / {_get(config, "eval.every")} / {_get(config, "eval.temperature")}'
        rows.append(f"<tr><th>{html.escape(label)}</th><td>{html.escape(str(value))}</td></tr>")
    import yaml

    text = yaml.safe_dump(config, sort_keys=False)
    return (f'<table class="config">{"".join(rows)}</table>'
            f"<details><summary>{CONFIG_FILE}</summary><pre>{html.escape(text)}</pre></details>")


def _window_mean(points: Points, first: bool, k: int) -> tuple[float, str]:
    part = points[:k] if first else points[-k:]
    span = f"{part[0][0]:g}" if k == 1 else f"{part[0][0]:g}-{part[-1][0]:g}"
    return sum(y for _, y in part) / len(part), span


def before_after(rows: list[dict[str, Any]], curves: dict[str, Points]) -> list[tuple[str, str, float, str, float]]:
    """(key, from, value, to, value): the first and the last evaluation for ``eval/*``; for the
    training batch's ``rollout/*`` the mean of the first and of the last k steps (k = a quarter of
    the steps, 1 to 5: one batch is noisy). Keys with fewer than 2 values are left out."""
    out = []
    for key in ("eval/success_rate", "eval/valid_action_rate", "eval/mean_episode_score", "eval/mean_turns"):
        points = curves.get(key, [])
        if len(points) >= 2:
            out.append((key, f"step {points[0][0]:g}", points[0][1], f"step {points[-1][0]:g}", points[-1][1]))
    for key in ("rollout/success_rate", "rollout/valid_action_rate", "rollout/mean_episode_score"):
        points = [p for p in curves.get(key, []) if p[0] > 0]
        if len(points) >= 2:
            k = max(1, min(5, len(points) // 4))
            (a, sa), (b, sb) = _window_mean(points, True, k), _window_mean(points, False, k)
            label = "step" if k == 1 else "steps"
            out.append((key, f"{label} {sa}", a, f"{label} {sb}", b))
    return out


def _before_after_block(rows: list[dict[str, Any]], curves: dict[str, Points]) -> str:
    found = before_after(rows, curves)
    if not found:
        return '<p class="note">no before -> after: fewer than two evaluations and two training steps</p>'
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(fa)}</td><td>{_fmt(a)}</td><td>-&gt;</td>"
                   f"<td>{html.escape(fb)}</td><td>{_fmt(b)}</td><td>{b - a:+.3g}</td></tr>"
                   for k, fa, a, fb, b in found)
    return f'<table class="before-after"><tr><th>before -&gt; after</th><th colspan="6"></th></tr>{body}</table>'


def _timing_block(curves: dict[str, Points]) -> str:
    steps = [y for x, y in curves.get("timing/step_s", []) if x > 0]
    if not steps:
        return '<p class="note">no timing/step_s: no step times recorded</p>'
    total = sum(steps)
    parts = []
    for key, label in (("timing/rollout_s", "rollout"), ("timing/advantages_s", "advantages"),
                       ("timing/update_s", "update"), ("timing/weight_push_s", "weight push"),
                       ("timing/canary_s", "canary"), ("timing/engine_sleep_s", "engine sleep"),
                       ("timing/engine_wake_s", "engine wake")):
        spent = sum(y for x, y in curves.get(key, []) if x > 0)
        if key in curves:
            parts.append(f"{label} {spent / total:.0%}")
    accounted = sum(sum(y for x, y in curves.get(k, []) if x > 0) for k in (
        "timing/rollout_s", "timing/advantages_s", "timing/update_s", "timing/weight_push_s", "timing/canary_s",
        "timing/engine_sleep_s", "timing/engine_wake_s"))
    parts.append(f"evaluation and the rest {max(0.0, total - accounted) / total:.0%}")
    sft = curves.get("timing/sft_s", [])
    warm = f"; warm-start {sum(y for _, y in sft):.1f} s before them" if sft else ""
    return (f"<p><b>time</b>: {len(steps)} steps in {total:.1f} s (mean {total / len(steps):.3g} s a step{warm}); "
            f"of the steps' time: {html.escape(', '.join(parts))}</p>")


def _warm_start_block(curves: dict[str, Points]) -> str:
    got = {k: curves[k][-1][1] for k in WARM_START_KEYS + PERCEPTION_KEYS if k in curves}
    if not got:
        return "<p><b>warm-start</b>: none in this run (no sft/* metrics)</p>"
    seeing = _perception_line(got)
    if not any(k in got for k in WARM_START_KEYS):
        return seeing
    bits = []
    if "sft/steps" in got:
        bits.append(f'{got["sft/steps"]:g} steps')
    if "timing/sft_s" in got:
        bits.append(f'{got["timing/sft_s"]:.1f} s')
    if "sft/loss_first" in got and "sft/loss_last" in got:
        bits.append(f'cross-entropy {_fmt(got["sft/loss_first"])} -&gt; {_fmt(got["sft/loss_last"])} nats '
                    "(first batch -&gt; mean of the last 5)")
    return seeing + "<p><b>format warm-start</b>: " + ", ".join(bits) + "</p>"


def _perception_line(got: dict[str, float]) -> str:
    """The perception warm-start's line ('' without one): steps, seconds, loss, held-out read accuracy."""
    if "sft/perception_steps" not in got:
        return ""
    bits = [f'{got["sft/perception_steps"]:g} steps']
    if "timing/perception_s" in got:
        bits.append(f'{got["timing/perception_s"]:.1f} s')
    if "sft/perception_loss_first" in got and "sft/perception_loss_last" in got:
        bits.append(f'cross-entropy {_fmt(got["sft/perception_loss_first"])} -&gt; '
                    f'{_fmt(got["sft/perception_loss_last"])} nats')
    if "sft/perception_cell_acc" in got:
        bits.append(f'held-out boards read: {100 * got["sft/perception_cell_acc"]:.1f}% of cells'
                    + (f', {100 * got["sft/perception_board_acc"]:.1f}% of boards whole'
                       if "sft/perception_board_acc" in got else ""))
    return "<p><b>perception warm-start</b>: " + ", ".join(bits) + "</p>"


def _sync_block(curves: dict[str, Points], config: dict[str, Any] | None) -> str:
    bits = []
    canary = curves.get("sync/canary_max_abs", [])
    if canary:
        worst = max(canary, key=lambda p: p[1])
        bits.append(f"canary checked at {len(canary)} steps, largest |engine - trainer| log-prob gap "
                    f"{_fmt(worst[1])} nats (step {worst[0]:g})")
        if config is not None:
            from arl.train.canary import tolerance_for  # the bound the canary itself enforces

            tol = tolerance_for(_get(config, "engine.dtype") or "float32", _get(config, "optim.precision") or "fp32")
            bits[-1] += f" against the {tol.label} tolerance {tol.max_abs:g}"
    else:
        bits.append("no canary metrics (canary_every: 0, or an engine without real log-probs: the scripted one)")
    push = [y for x, y in curves.get("timing/weight_push_s", []) if x > 0]
    size = curves.get("train/weight_push_bytes", [])
    if push:
        bits.append(f"{len(push)} pushes, mean {statistics.fmean(push) * 1e3:.3g} ms"
                    + (f", {size[-1][1] / 2**20:.3g} MiB each (last)" if size else ""))
    return "<p><b>weight sync</b>: " + html.escape("; ".join(bits)) + "</p>"


def _spikes_block(spikes: list[tuple[float, float]], curves: dict[str, Points]) -> str:
    if SPIKE_KEY not in curves:
        return ""
    if not spikes:
        return (f"<p><b>outlier steps</b>: none ({SPIKE_KEY} never above its median + {OUTLIER_MADS:g} scaled MADs, "
                f"or fewer than {OUTLIER_MIN_POINTS} steps)</p>")
    listed = ", ".join(f"{s:g} ({_fmt(v)})" for s, v in spikes)
    return (f'<p><b>outlier steps</b> (dashed on every panel): {SPIKE_KEY} above its median + '
            f"{OUTLIER_MADS:g} scaled MADs at step {html.escape(listed)}</p>")


# ---------------------------------------------------------------------------------------- the page


def _section_of(key: str, envs: int) -> str | None:
    """The section a key is drawn in; None: not drawn as a panel (the warm-start's keys are in the
    header; with one env, ``env/<id>/*`` repeats ``rollout/*`` value for value)."""
    if key in WARM_START_KEYS or key in PERCEPTION_KEYS:
        return None
    if key in SYNC_KEYS or key.startswith("sync/"):
        return "weight sync"
    if key.startswith("env/"):
        return "env" if envs > 1 else None
    return key.split("/", 1)[0]


def report_html(run_dir: str | Path) -> str:
    from arl.train.logging import read_metrics  # the one reader of metrics.jsonl

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    curves = series(rows)
    logged = {k for r in rows for k in r if k.startswith(SECTIONS)}
    envs = len({k[len("env/"):k.rindex("/")] for k in logged if k.startswith("env/")})  # env ids hold slashes
    by_section: dict[str, list[str]] = {}
    for key in logged:
        if (section := _section_of(key, envs)) is not None:
            by_section.setdefault(section, []).append(key)
    spikes = spike_steps(curves)
    marks = [s for s, _ in spikes]
    try:
        config = read_config(run_dir)
    except Exception:  # _config_block says why
        config = None
    steps = sorted({r["step"] for r in rows if isinstance(r.get("step"), int)})
    parts = [f"<h1>arl run: {html.escape(str(run_dir))}</h1>",
             f'<p>{len(rows)} metric rows, {len(steps)} steps ({steps[0] if steps else "-"} to '
             f'{steps[-1] if steps else "-"}), {len(sorted(run_dir.glob("ckpt_*")))} checkpoint(s)</p>',
             '<div class="header"><div>', _config_block(run_dir), "</div><div>", _before_after_block(rows, curves),
             _timing_block(curves), _warm_start_block(curves), _sync_block(curves, config),
             _spikes_block(spikes, curves), "</div></div>"]
    # what a reader looks for first (validation curves, eval rows, what the episodes did), then the rest
    order = ("eval", "rollout", "env", "train", "weight sync", "timing")
    for section in (*order, *sorted(set(by_section) - set(order))):
        keys = by_section.get(section, [])
        if section == "env" and not keys:
            continue
        parts.append(f"<h2>{html.escape(section)}</h2>")
        body = panels(keys, curves, logged, marks)
        parts.append(body or f'<p class="note">no {html.escape(section)} metrics</p>')
        if section == "eval":
            parts += ["<h2>eval rows</h2>", _eval_table(rows), *_episodes_sections(run_dir)]
    return ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>arl view</title>'
            f'<style>{PAGE_CSS}</style></head><body>{"".join(parts)}</body></html>')


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    out = Path(out) if out is not None else Path(run_dir) / "report.html"
    out.write_text(report_html(run_dir), encoding="utf-8")
    return out
