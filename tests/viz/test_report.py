"""`arl view`'s rules (arl/viz/report.py's docstring, issue 43 item 5), one test each: what is not
measured has no panel, a rate has a 0-1 axis, one value is a line of text, the header holds the
config and before -> after numbers, timing, the warm-start and the weight sync, and an outlier is
marked. Synthetic metrics.jsonl rows, so each rule is checked on the case it is about."""

from __future__ import annotations

import json
import re
from pathlib import Path

from arl.config import load_config
from arl.train.run_dir import CONFIG_FILE, check_fresh, save_config
from arl.viz import report as report_module
from arl.viz import report_html
from arl.viz.report import OUTLIER_COLOUR, is_rate, outliers

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _write(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def _charts(page: str) -> dict[str, str]:
    """key -> its panel's SVG."""
    return {re.search(r'font-family="sans-serif">([^<]+)</text>', svg).group(1): svg
            for svg in re.findall(r'<svg class="chart".*?</svg>', page, flags=re.S)}


def _axis(svg: str) -> tuple[float, float]:
    """(bottom, top) of the y axis: its two end labels, the top one first."""
    high, low = re.findall(r'text-anchor="end">([^<]+)<', svg)[:2]
    return float(low), float(high)


def _training_rows(n: int = 20, **series) -> list[dict]:
    """n training steps; each keyword is a key (``__`` for ``/``) -> a function of the step."""
    return [{"step": s, **{k.replace("__", "/"): f(s) for k, f in series.items()}} for s in range(1, n + 1)]


def test_a_metric_that_was_not_measured_has_no_panel(tmp_path):
    rows = _training_rows(train__loss=lambda s: 1.0 / s, train__entropy=lambda s: None)
    page = report_html(_write(tmp_path, rows))
    charts = _charts(page)
    assert "train/loss" in charts
    assert "train/entropy" not in charts  # null at every step: not drawn...
    assert "never a number" in page and "train/entropy" in page  # ...but named
    assert "train/kl" not in page  # absent: nothing at all


def test_a_rate_is_drawn_on_a_0_1_axis_and_other_series_min_to_max(tmp_path):
    # a 0.06% dip in valid actions: on its own min-max axis it was drawn as a crash to the bottom
    rows = _training_rows(rollout__valid_action_rate=lambda s: 0.9994 if s == 10 else 1.0,
                          train__clip_frac=lambda s: 0.1 + s / 1000, train__loss=lambda s: 2.0 + s / 100,
                          timing__update_s=lambda s: 1.0 + s / 1000)
    charts = _charts(report_html(_write(tmp_path, rows)))
    assert _axis(charts["rollout/valid_action_rate"]) == (0.0, 1.0)
    assert _axis(charts["train/clip_frac"]) == (0.0, 1.0)
    assert _axis(charts["train/loss"]) == (2.01, 2.2)  # a loss has no meaningful zero
    assert _axis(charts["timing/update_s"])[0] == 0.0  # a duration's zero is meaningful
    ys = [float(y) for y in re.findall(r",([\d.]+)", re.search(r'points="([^"]+)"', charts[
        "rollout/valid_action_rate"]).group(1))]
    assert max(ys) - min(ys) < 0.5  # pixels: the dip is a fraction of one, not the panel's height


def test_the_rate_rule_is_the_glossarys_unit():
    """A key is drawn as a rate iff docs/metrics.md gives it the unit "fraction"."""
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", DOCS.read_text(), flags=re.M)
    assert len(rows) > 50
    wrong = [(key, unit.strip()) for key, unit in rows if is_rate(key) != (unit.strip() == "fraction")]
    assert wrong == []


def test_constant_series_fold_into_one_line(tmp_path):
    rows = _training_rows(train__loss=lambda s: 1.0 / s, train__skipped_updates=lambda s: 0.0,
                          train__staleness_max=lambda s: 0.0, train__weight_push_bytes=lambda s: 2684416.0, train__policy_version=lambda s: float(s))
    page = report_html(_write(tmp_path, rows))
    charts = _charts(page)
    assert set(charts) == {"train/loss"}
    assert "constant: train/skipped_updates = 0, train/staleness_max = 0</p>" in page  # one line per section: train's...
    assert "constant: train/weight_push_bytes = 2.684e+06</p>" in page  # ...and the weight sync's
    assert "equal to the step: train/policy_version" in page


def test_a_near_constant_series_is_drawn_flat(tmp_path):
    rows = _training_rows(train__is_weight_mean=lambda s: 1.0 - (s % 3) * 1e-6)
    svg = _charts(report_html(_write(tmp_path, rows)))["train/is_weight_mean"]
    ys = [float(p.split(",")[1]) for p in re.search(r'points="([^"]+)"', svg).group(1).split()]
    assert max(ys) - min(ys) < 1.0  # pixels: 2e-6 of a value of 1 is not the panel's height


def test_the_header_shows_the_config_and_before_after(tmp_path):
    run = tmp_path / "run"
    rows = [{"step": 0, "eval/success_rate": 0.2, "eval/valid_action_rate": 0.5, "sft/loss_first": 7.5,
             "sft/loss_last": 0.4, "sft/steps": 30.0, "timing/sft_s": 9.5}]
    rows += _training_rows(rollout__success_rate=lambda s: s / 40, timing__step_s=lambda s: 2.0,
                           timing__rollout_s=lambda s: 1.0, timing__update_s=lambda s: 0.5 + (s % 2) * 0.01,
                           timing__weight_push_s=lambda s: 0.01 + s / 1e4, sync__canary_max_abs=lambda s: 1e-6 * s,
                           train__weight_push_bytes=lambda s: 2**21)
    rows.append({"step": 20, "eval/success_rate": 0.6, "eval/valid_action_rate": 0.9})
    _write(run, rows)
    config = load_config("tiny_frozenlake_gigpo", [f"out_dir={tmp_path}", "name=run", "algo.estimator=grpo"])
    save_config(run, config)
    page = report_html(run)
    header = page[:page.index("<h2>")]
    for shown in ("tiny", "arl/FrozenLake-v0", "grpo", "8 x 8", CONFIG_FILE):
        assert f">{shown}<" in header or shown in header, shown
    row = re.search(r"<th>eval/success_rate</th>(.*?)</tr>", header).group(1)
    assert re.findall(r"<td>([^<]+)</td>", row) == ["step 0", "0.2", "-&gt;", "step 20", "0.6", "+0.4"]
    # the training batch: the mean of the first and of the last 5 steps (one batch is noisy)
    row = re.search(r"<th>rollout/success_rate</th>(.*?)</tr>", header).group(1)
    assert re.findall(r"<td>([^<]+)</td>", row)[:2] == ["steps 1-5", "0.075"]
    assert "20 steps in 40.0 s" in header and "rollout 50%" in header and "update 25%" in header and "weight push 1%" in header
    assert "30 steps, 9.5 s, cross-entropy 7.5 -&gt; 0.4" in header
    assert "canary checked at 20 steps" in header and "fp32 tolerance 0.01" in header and "2 MiB each" in header
    charts = _charts(page)
    assert {"sync/canary_max_abs", "timing/weight_push_s", "timing/update_s"} <= set(charts)
    assert "sft/loss_first" not in charts and "timing/sft_s" not in charts  # in the header, one step only
    assert page.index("<h2>weight sync</h2>") < page.index("sync/canary_max_abs")


def test_a_run_dir_without_a_config_says_so(tmp_path):
    page = report_html(_write(tmp_path, _training_rows(train__loss=lambda s: 1.0 / s)))
    assert f"no {CONFIG_FILE}" in page


def test_an_outlier_is_marked_on_its_panel_and_a_gradient_spike_on_every_panel(tmp_path):
    rows = _training_rows(train__grad_norm=lambda s: 40.0 if s == 7 else 1.0 + 0.1 * (s % 4),
                          train__loss=lambda s: 1.0 + 0.01 * (s % 5), rollout__success_rate=lambda s: s / 40)
    page = report_html(_write(tmp_path, rows))
    charts = _charts(page)
    assert charts["train/grad_norm"].count('class="outlier"') == 1
    assert "outliers at step 7 (40)" in charts["train/grad_norm"]
    assert all(svg.count('class="spike"') == 1 for svg in charts.values())  # the spike's step, on each panel
    assert 'class="outlier"' not in charts["train/loss"]
    assert "at step 7 (40)" in page[:page.index("<h2>")]
    assert OUTLIER_COLOUR in charts["train/grad_norm"]


def test_the_outlier_rule():
    steady = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.1]
    assert outliers(steady + [9.0]) == [8] and outliers(steady + [-7.0]) == [8]
    assert outliers(steady + [-7.0], upward_only=True) == []
    assert outliers([1.0, 9.0, 1.0]) == []  # too few points to call anything an outlier
    assert outliers([0.0] * 10 + [1.0]) == []  # no spread: a counter's first event is no spike


def test_overwriting_a_run_removes_its_episodes_and_config(tmp_path):
    """An overwritten run's evaluations in episodes.jsonl used to stay: the new run's report showed
    both runs' evaluations, steps 0, 2, 4, 0, 2, 4."""
    run = _write(tmp_path, [{"step": 1, "train/loss": 1.0}])
    (run / "episodes.jsonl").write_text('{"step": 0}\n')
    save_config(run, load_config("tiny_frozenlake_gigpo", [f"out_dir={tmp_path}"]))
    check_fresh(run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == []


def test_the_report_reads_the_file_the_trainer_writes():
    import arl.train.run_dir as run_dir

    assert report_module.CONFIG_FILE == run_dir.CONFIG_FILE


def test_the_perception_warm_start_is_a_header_line_not_a_panel(tmp_path):
    run = tmp_path / "run"
    rows = [{"step": 0, "eval/success_rate": 0.2, "sft/perception_steps": 300.0, "timing/perception_s": 187.1,
             "sft/perception_loss_first": 7.28, "sft/perception_loss_last": 0.001, "sft/perception_cell_acc": 1.0,
             "sft/perception_board_acc": 0.75, "sft/loss_first": 7.5, "sft/loss_last": 0.4, "sft/steps": 30.0}]
    rows += _training_rows(rollout__success_rate=lambda s: s / 40)
    _write(run, rows)
    page = report_html(run)
    header = page[:page.index("<h2>")]
    assert "<b>perception warm-start</b>: 300 steps, 187.1 s, cross-entropy 7.28 -&gt; 0.001 nats" in header
    assert "100.0% of cells, 75.0% of boards whole" in header and "<b>format warm-start</b>: 30 steps" in header
    assert not any(k.startswith("sft/perception") or k == "timing/perception_s" for k in _charts(page))
