"""arl.viz: one span per token with its role and hover values; `arl view` writes one self-contained file."""

from __future__ import annotations

import json
import math
import re

from arl.rollout.records import Sample
from arl.viz import sample_html, token_rows, write_report


def _sample() -> Sample:
    # 3 prompt tokens, 2 trained response tokens, 1 masked closing token
    return Sample(input_ids=[5, 6, 7, 8, 9, 10], response_mask=[0, 0, 0, 1, 1, 0],
                  old_logprobs=[0, 0, 0, -0.5, -1.0, 0], episode_score=1.0, step_score=1.0,
                  group_id="g", traj_id="t", state_key="abc")


def test_every_token_is_one_span_with_its_role_and_ratio():
    rows = token_rows(_sample(), advantages=0.5, trainer_logprobs=[0, 0, 0, -0.4, -1.0, 0])
    assert [r["role"] for r in rows] == ["prompt"] * 3 + ["response"] * 2 + ["masked"]
    assert rows[3]["ratio"] == math.exp(-0.4 + 0.5) and rows[4]["ratio"] == 1.0 and rows[0]["ratio"] is None
    assert rows[3]["advantage"] == 0.5 and rows[0]["advantage"] is None
    html = sample_html(_sample(), advantages=0.5, trainer_logprobs=[0, 0, 0, -0.4, -1.0, 0], standalone=False)
    roles = re.findall(r'<span class="tok (prompt|response|masked)', html)
    assert roles == ["prompt"] * 3 + ["response"] * 2 + ["masked"]
    assert "1.1052" in html  # the ratio exp(0.1) on the hover of the first response token


def test_view_writes_one_self_contained_small_report(tmp_path):
    rows = [{"step": s, "rollout/success_rate": s / 200, "train/kl": 0.01} for s in range(1, 201)]
    rows += [{"step": s, "eval/success_rate": 0.2 + s / 1000} for s in range(0, 201, 20)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = write_report(tmp_path, tmp_path / "r.html")
    text = out.read_text()
    assert "<svg" in text and "eval/success_rate" in text
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing fetched from anywhere
    assert out.stat().st_size < 3_000_000


def test_the_episode_records_docstring_example_holds():
    import doctest

    from arl.train import episodes

    failures, tried = doctest.testmod(episodes)
    assert tried > 0 and failures == 0
