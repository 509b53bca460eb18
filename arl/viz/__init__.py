"""A view of every token: HTML renderings of training samples and a static report of a run dir.

    from arl.viz import sample_html, episode_html, SampleView
    html = sample_html(sample, tokenizer, advantages=adv, trainer_logprobs=lp)
    SampleView(sample, tokenizer)          # renders itself in a notebook cell (_repr_html_)
    arl view RUN_DIR -o report.html        # a run: config, before -> after, curves, episodes; one file

Everything is self-contained HTML: inline CSS, inline SVG, no external URL, no JS library.
"""

from __future__ import annotations

from arl.viz.report import report_html, write_report
from arl.viz.tokens import EpisodeView, SampleView, episode_html, sample_html, sample_text, token_rows

__all__ = ["EpisodeView", "SampleView", "episode_html", "report_html", "sample_html", "sample_text", "token_rows",
           "write_report"]
