"""`arl view` of a real (short) run of the demo's config, rendered in headless Chromium: it loads
with no console message at all (the report has no script, so any message is a fault: a blocked
resource, a parse error), and the screenshot's pixels show the curves and the validation episodes;
its header holds the run's config (the config.yaml the trainer wrote) and before -> after numbers.
A second report, of a synthetic run with a gradient-norm spike, shows the outlier marks.

Chromium comes from the distribution's packages (`apt-get install chromium`, done by .ci/run). Where
it is missing the test is skipped, except under ARL_REQUIRE_BROWSER=1 (.ci/run sets it), where it
fails: CI must not pass by skipping.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from PIL import Image

from arl.config import load_config
from arl.engine import make_engine
from arl.train import Trainer
from arl.train.episodes import read_episodes
from arl.viz import write_report
from arl.viz.report import CURVE_COLOUR, LOSS_COLOUR, OUTLIER_COLOUR, PAGE_CSS, WIN_COLOUR

pytestmark = pytest.mark.anyio

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def _pixels_near(image: Image.Image, colour: tuple[int, int, int], tol: int = 12) -> int:
    pixels = image.convert("RGB").get_flattened_data()
    return sum(1 for px in pixels if all(abs(a - b) <= tol for a, b in zip(px, colour, strict=True)))


@pytest.fixture
def chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("ARL_REQUIRE_BROWSER") == "1":
            pytest.fail("ARL_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install -y chromium)")
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    return CHROMIUM


async def _demo_run(tmp_path):
    """The demo's config (tiny FrozenLake GiGPO), shortened, on the scripted engine: a real Trainer run
    that writes metrics.jsonl and episodes.jsonl as `make demo` does."""
    config = load_config("tiny_frozenlake_gigpo", [
        f"out_dir={tmp_path}", "name=demo", "steps=4", "tensorboard=false", "sft.steps=0",
        "rollout.num_groups=2", "rollout.group_size=4", "eval.every=2", "eval.num_seeds=12",
        "eval.record_episodes=3", "eval.state_samples=8", "optim.micro_batch_size=16", "save_every=0",
    ])
    engine = make_engine(backend="scripted", model=config.model, max_model_len=1024, scripted={"invalid_rate": 0.2})
    async with Trainer(config, engine=engine) as trainer:
        await trainer.train()
    return config.run_dir


async def test_the_demo_runs_report_renders_in_chromium_with_curves_and_episodes(tmp_path, chromium):
    run_dir = await _demo_run(tmp_path)
    evals = read_episodes(run_dir)
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert all(len(r["episodes"]) == 3 and sum(r["exits"].values()) == 12 for r in evals)
    assert all(len(r["states"]) == 3 and all(s["n"] == 8 for s in r["states"]) for r in evals), evals[0].get(
        "states_error")
    # the scripted engine answers ~80% of replies validly: the states' samples are parsed as the game parses
    sampled = [c for r in evals for st in r["states"] for c in st["counts"].items()]
    assert sum(n for a, n in sampled if a != "(invalid)") > sum(n for a, n in sampled if a == "(invalid)")
    report = write_report(run_dir, tmp_path / "report.html")
    text = report.read_text()
    assert "validation episodes" in text and "per-state action distributions" in text and "exits" in text
    assert WIN_COLOUR in PAGE_CSS and LOSS_COLOUR in PAGE_CSS
    header = text[:text.index("<h2>")]
    # the config the trainer wrote into the run dir, and the first and last evaluation
    assert "arl/FrozenLake-v0" in header and "gigpo" in header and "config.yaml</summary>" in header, header[-3000:]
    assert re.search(r"<th>eval/success_rate</th><td>step 0</td>.*?<td>step 4</td>", header)
    assert "4 steps in" in header and "warm-start</b>: none" in header and "no canary metrics" in header
    image = _screenshot(chromium, report, tmp_path / "shot.png")
    assert _pixels_near(image, _rgb(CURVE_COLOUR)) > 500  # the curves' polylines and markers
    # the episodes' outcome badges: every recorded episode has one, green (success) or red (its exit)
    assert _pixels_near(image, _rgb(WIN_COLOUR)) + _pixels_near(image, _rgb(LOSS_COLOUR)) > 200
    assert _pixels_near(image, _rgb(OUTLIER_COLOUR)) == 0  # 4 steps: too few to call anything an outlier


def test_an_outlier_step_is_marked_in_chromium(tmp_path, chromium):
    rows = [{"step": s, "train/grad_norm": 40.0 if s == 7 else 1.0 + 0.1 * (s % 4), "train/loss": 1.0 + 0.01 * (s % 5),
             "rollout/success_rate": s / 40} for s in range(1, 21)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    image = _screenshot(chromium, write_report(tmp_path, tmp_path / "report.html"), tmp_path / "shot.png")
    # the grad norm's ring and the dashed line at step 7 on each of the three panels
    assert _pixels_near(image, _rgb(OUTLIER_COLOUR)) > 100


def _screenshot(chromium: str, report, shot) -> Image.Image:
    """The report rendered at 1280 x 3000, after checking it logged nothing to the console."""
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,3000",
         "--enable-logging=stderr", "--v=0", f"--screenshot={shot}", report.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.exists(), proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if re.search(r":CONSOLE[:(]", line)]
    assert console == [], console
    image = Image.open(shot)
    assert image.size == (1280, 3000)
    return image
