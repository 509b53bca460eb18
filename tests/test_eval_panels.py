"""`arl eval` panels (arl/rollout/evaluate.py): pass@k against brute force, seeds x attempts on the
scripted engine into a results directory, a resume that finishes a run cut short without a
duplicate or a gap, a resume refused under other settings, and exit 1 when every rollout failed."""

from __future__ import annotations

import doctest
import itertools
import json
import math

import pytest

from arl.rollout import evaluate as ev


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of k-subsets of the attempts that hold a success."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force_enumeration():
    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                assert math.isclose(ev.pass_at_k(n, c, k), brute_pass_at_k(outcomes, k)), (n, c, k)
    assert ev.pass_at_k(5, 0, 3) == 0.0 and ev.pass_at_k(5, 3, 3) == 1.0  # c = 0; n - c < k
    for bad in ((3, 4, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError):
            ev.pass_at_k(*bad)
    failures, tried = doctest.testmod(ev)
    assert tried >= 2 and failures == 0


def test_seed_lists():
    assert ev.parse_seeds("5:8") == (5, 6, 7)
    for bad in ("5", "8:5", "a:b", "3:3"):
        with pytest.raises(ValueError):
            ev.parse_seeds(bad)


def test_seeds_file(tmp_path):
    f = tmp_path / "seeds.txt"
    f.write_text("7\n\n3  # a comment\n11\n")
    assert ev.read_seeds_file(f) == (7, 3, 11)
    f.write_text("7\n7\n")
    with pytest.raises(ValueError, match="twice"):
        ev.read_seeds_file(f)


def eval_cli(capsys, *flags: str) -> tuple[int, str, str]:
    from arl.cli import main

    capsys.readouterr()
    code = main(["eval", "tiny", "--backend", "scripted", "--prompt-style", "compact", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in (path / "results.jsonl").read_text().splitlines()]


def test_panel_of_seeds_and_attempts_writes_a_row_per_rollout_and_resumes(tmp_path, capsys):
    out = tmp_path / "ev"
    code, printed, _ = eval_cli(capsys, "--seeds", "0:4", "--attempts", "3", "--out", str(out), "--concurrency", "5")
    assert code == 0
    rows = rows_of(out)
    assert sorted((r["seed"], r["attempt"]) for r in rows) == [(s, a) for s in range(4) for a in range(3)]
    assert {"score", "success", "exit_reason", "status", "error", "turns", "tokens", "wall_s"} <= set(rows[0])
    assert (out / "config.yaml").exists() and "pass@3" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [t["seed"] for t in summary["tasks"]] == [0, 1, 2, 3] and all(t["n"] == 3 for t in summary["tasks"])
    assert sum(t["c"] for t in summary["tasks"]) == sum(r["success"] for r in rows)
    values = dict(line.split() for line in printed.splitlines() if line.startswith("eval/"))
    assert float(values["eval/num_episodes"]) == 12
    # pass@k as the rows say it
    settings_rows = ev.last_rows(rows)
    expected = sum(ev.pass_at_k(3, sum(settings_rows[(s, a)]["success"] for a in range(3)), 2) for s in range(4)) / 4
    assert math.isclose(float(values["eval/pass@2"]), expected, abs_tol=5e-4)

    # a run cut short: two rows lost, one ended by an engine error (and the file's last line cut mid-write)
    lost, errored = {(1, 2), (3, 0)}, (2, 1)
    kept = [r for r in rows if (r["seed"], r["attempt"]) not in lost]
    for r in kept:
        if (r["seed"], r["attempt"]) == errored:
            r.update(exit_reason="engine_error", status="Failed", error="EngineError: gone", success=False)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"seed": 3, "att')
    code, printed, _ = eval_cli(capsys, "--seeds", "0:4", "--attempts", "3", "--resume", str(out))
    assert code == 0
    after = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()[len(kept) + 1:]]
    assert sorted((r["seed"], r["attempt"]) for r in after) == sorted(lost | {errored})  # only those replayed
    latest = ev.last_rows(ev.read_rows(out / "results.jsonl"))
    assert sorted(latest) == [(s, a) for s in range(4) for a in range(3)]
    assert not any(ev.is_error(r) for r in latest.values())
    values = dict(line.split() for line in printed.splitlines() if line.startswith("eval/"))
    assert float(values["eval/num_episodes"]) == 12  # no duplicate: the errored row is replaced
    # the scripted engine is a pure function of its seeds: the replayed rollouts are the ones lost
    assert {k: latest[k]["score"] for k in latest} == {(r["seed"], r["attempt"]): r["score"] for r in rows}

    # nothing left: a resume plays nothing; a new --out into the same directory is refused
    code, printed, _ = eval_cli(capsys, "--seeds", "0:4", "--attempts", "3", "--resume", str(out))
    assert code == 0 and len(ev.read_rows(out / "results.jsonl")) == len(kept) + 3
    code, _, err = eval_cli(capsys, "--seeds", "0:4", "--attempts", "3", "--out", str(out))
    assert code == 2 and "--resume" in err


def test_resume_under_other_settings_is_refused(tmp_path, capsys):
    out = tmp_path / "ev"
    assert eval_cli(capsys, "--seeds", "0:2", "--out", str(out))[0] == 0
    before = (out / "results.jsonl").read_text()
    for changed, named in ((["--seeds", "0:3"], "seeds"), (["--seeds", "0:2", "--temperature", "0.9"], "rollout.manager.temperature"),
                           (["--seeds", "0:2", "--attempts", "2"], "attempts")):
        code, _, err = eval_cli(capsys, *changed, "--resume", str(out))
        assert code == 2 and "other settings" in err and named in err, (changed, err)
    assert (out / "results.jsonl").read_text() == before
    code, _, err = eval_cli(capsys, "--seeds", "0:2", "--resume", str(tmp_path / "nothing"))
    assert code == 2 and "nothing to resume" in err


def test_every_rollout_failing_exits_1(tmp_path, capsys):
    code, printed, err = eval_cli(capsys, "--seeds", "0:2", "--attempts", "2", "--env-kwargs", '{"no_such_option": 1}',
                                  "--out", str(tmp_path / "ev"))
    assert code == 1 and "every rollout failed" in err
    assert [r["exit_reason"] for r in rows_of(tmp_path / "ev")] == ["env_error"] * 4
    assert "errors             4" in printed


def test_default_is_todays_panel_without_a_directory(capsys):
    code, printed, _ = eval_cli(capsys, "--num-seeds", "3")
    assert code == 0
    values = dict(line.split() for line in printed.splitlines())  # only the eval/ metrics, as before panels
    assert float(values["eval/num_episodes"]) == 3 and "eval/pass@1" not in values
