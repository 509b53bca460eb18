"""`arl eval --rescore DIR` (scores recomputed from the stored replies, no model) and `arl view
EVAL_DIR` (the table, the tasks and every episode frame by frame), on a scripted-engine panel."""

from __future__ import annotations

import html
import json

from arl.rollout import evaluate as ev


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    from arl.cli import main

    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def panel(capsys, tmp_path, *flags: str):
    out = tmp_path / "eval"
    code, _, err = cli(capsys, "eval", "tiny", "--backend", "scripted", "--prompt-style", "compact", "--seeds", "0:6",
                       "--attempts", "2", "--out", str(out), *flags)
    assert code == 0, err
    return out


def test_rescore_recomputes_scores_from_stored_replies(capsys, tmp_path):
    out = panel(capsys, tmp_path)
    rows = ev.read_rows(out / ev.RESULTS_FILE)
    assert all(isinstance(r, str) for row in rows for r in row["replies"])
    truth = {(r["seed"], r["attempt"]): (r["score"], r["success"], r["exit_reason"]) for r in rows}
    # scores the game would not give: a rescore must put every one back from the replies alone
    (out / ev.RESULTS_FILE).write_text("".join(json.dumps({**r, "score": 99.0, "success": not r["success"]}) + "\n"
                                               for r in rows))
    code, text, err = cli(capsys, "eval", "--rescore", str(out))
    assert code == 0, err
    assert "rescored 12 rollouts from their stored replies, 12 changed" in text
    rescored = ev.read_rows(out / ev.RESCORED_FILE)
    assert {(r["seed"], r["attempt"]): (r["score"], r["success"], r["exit_reason"]) for r in rescored} == truth
    summary = json.loads((out / ev.RESCORED_SUMMARY_FILE).read_text())
    assert summary["changed"] == 12 and len(summary["tasks"]) == 6
    # a second rescore of untouched rows changes nothing
    (out / ev.RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, text, err = cli(capsys, "eval", "--rescore", str(out))
    assert code == 0 and "12 rollouts from their stored replies, 0 changed" in text


def test_rescore_refuses_what_is_not_an_eval_dir(capsys, tmp_path):
    code, _, err = cli(capsys, "eval", "--rescore", str(tmp_path))
    assert code == 2 and "config.yaml" in err


def test_view_shows_every_episode_frame_by_frame(capsys, tmp_path):
    out = panel(capsys, tmp_path)
    code, text, err = cli(capsys, "view", str(out))
    assert code == 0, err
    page = (out / "report.html").read_text()
    settings = ev.read_settings(out)
    for row in ev.read_rows(out / ev.RESULTS_FILE):
        assert f"seed {row['seed']} attempt {row['attempt']}" in page
        first = ev.replay(settings.rollout, row["seed"], row["replies"])["turns"][0]
        assert html.escape(first["frame"]) in page  # the board the first reply was given in
    assert "pass@2" in page and "<h2>tasks</h2>" in page


def test_oracle_solves_every_deterministic_game_task(capsys, tmp_path):
    """The games' gold solutions (shortest paths by breadth-first search) solve every level of a
    non-slippery panel; slippery ice can make them miss (replanned after each slip)."""
    for game in ("arl/FrozenLake-v0", "arl/Sokoban-v0"):
        out = tmp_path / game.split("/")[1]
        code, text, err = cli(capsys, "eval", game, "--oracle", "--seeds", "0:24", "--out", str(out))
        assert code == 0, err
        rows = ev.read_rows(out / ev.RESULTS_FILE)
        assert len(rows) == 24 and all(r["success"] and r["exit_reason"] == "terminated" for r in rows), game
        assert all(r["replies"][0].startswith("<answer>") for r in rows)
        code, text, err = cli(capsys, "eval", "--rescore", str(out))  # an oracle's directory rescores like any
        assert code == 0 and "24 rollouts from their stored replies, 0 changed" in text


def test_oracle_fixes_bugfix_tasks(capsys, tmp_path):
    """BugFix's known fix, played by the config's tool-calling agent: every hidden test passes."""
    code, text, err = cli(capsys, "eval", "tiny_bugfix_proxy", "--oracle", "--seeds", "0:2", "--out", str(tmp_path))
    assert code == 0, err
    rows = ev.read_rows(tmp_path / ev.RESULTS_FILE)
    assert len(rows) == 2 and all(r["success"] and r["score"] == 1.0 and r["turns"] == 3 for r in rows)
    assert '"name": "submit"' in rows[0]["replies"][-1]


def test_oracle_refuses_what_it_cannot_play(capsys):
    code, text, err = cli(capsys, "eval", "arl/BugFix-v0", "--oracle", "--mode", "step", "--seeds", "0:2")
    assert code == 2 and "tool-calling agent" in err
    code, text, err = cli(capsys, "eval", "arl/FrozenLake-v0", "--oracle", "--model", "x", "--seeds", "0:2")
    assert code == 2 and "no --base-url or --model" in err


def test_doctests_of_the_gold_solutions_and_the_endpoint():
    import doctest

    from arl.envs import frozen_lake, sokoban
    from arl.rollout import remote

    for module in (frozen_lake, sokoban, remote):
        failures, tried = doctest.testmod(module)
        assert tried >= 2 and failures == 0, module.__name__
