"""Every benchmark script runs at its smoke size (`--quick`), prints a table and writes its JSON.

So the scripts cannot rot: each runs as a subprocess exactly as the README's commands run it.
The ones that start a real vLLM engine are marked `vllm`. benchmarks/envs.py has its own test
(tests/envs). The peer comparisons need a separate venv (gem-llm, TRL) that CI does not have:
without it the script must still run arl's side and say the peers were skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, tmp_path: Path, *args: str, timeout: float = 240, env: dict | None = None) -> dict:
    out = tmp_path / f"{Path(script).stem}.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "|---|" in proc.stdout, proc.stdout[-3000:]  # a markdown table was printed
    result = json.loads(out.read_text())
    assert result["meta"]["args"]["quick"] is True
    return result


def test_overhead_quick(tmp_path):
    result = _run("overhead.py", tmp_path)
    managers = {row["manager"] for row in result["rows"]}
    assert managers == {"traj", "step", "proxy-inprocess", "proxy-openai-inproc", "proxy-http", "proxy-responses-inproc",
                        "proxy-responses-http", "proxy-stream-inproc", "proxy-stream-http"}
    assert len({(row["turns"], row["samples"]) for row in result["rows"] if row["manager"].startswith("proxy-")}) == 1
    for row in result["rows"]:
        assert row["us_per_turn"]["median"] > 0 and row["turns"] > 0
    for b in result["breakdown"]:  # the parts add up to the instrumented total
        parts = sum(b[k] for k in ("engine", "env", "tokenization", "tracker", "http/json", "agent code",
                                   "manager code", "scheduling"))
        assert parts == pytest.approx(b["total"], rel=0.05)
    assert result["fixed"][0]["us_per_turn"]["median"] > 0  # the physical floor


@pytest.mark.anyio
async def test_overhead_responses_and_stream_rows_play_the_same_episodes():
    """The Responses-API and streaming agents of benchmarks/overhead.py give proxy-http's samples,
    token for token: their rows time the same episodes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import overhead
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from arl.engine import make_engine
    from arl.rollout import GroupScheduler

    names = ["proxy-http", "proxy-openai-inproc", *overhead.AGENT_ROWS]
    specs = GroupScheduler(overhead.ENV_ID, num_groups=1, group_size=2).specs(0)
    played = {}
    async with make_engine(backend="scripted", model="tiny", scripted={"invalid_rate": 0.2}) as engine:
        for name in names:
            async with overhead._entered(overhead.MANAGERS[name](engine, overhead._config())) as manager:
                batch = await GroupScheduler(overhead.ENV_ID, num_groups=1, group_size=2).run(manager, specs)
            assert batch.metrics["rollout/abnormal_rate"] == 0, name
            played[name] = [(s.input_ids, s.response_mask, s.old_logprobs, s.step_score) for s in batch.samples]
    assert played["proxy-http"] and all(played[n] == played["proxy-http"] for n in names), \
        [n for n in names if played[n] != played["proxy-http"]]


def test_peers_quick_without_peer_venv(tmp_path):
    # envs part only: arl's FrozenLake vs gymnasium runs in arl's venv; gem rows skipped without the venv
    result = _run("peers.py", tmp_path, "envs", "--peer-python", str(tmp_path / "missing-python"))
    rows = result["envs"]["rows"]
    assert rows and rows[-1]["peer"].startswith("gymnasium FrozenLake-v1")
    assert rows[-1]["reset_ratio"]["median"] > 0


@pytest.mark.vllm
def test_engines_quick(tmp_path):
    result = _run("engines.py", tmp_path, "--backends", "vllm")
    assert result["rows"][0]["backend"] == "vllm"


@pytest.mark.vllm
def test_rollout_quick(tmp_path):
    result = _run("rollout.py", tmp_path, "--managers", "traj", "proxy-inprocess")
    rows = result["results"][0]["rows"]
    assert {r["manager"] for r in rows} == {"traj", "proxy-inprocess"}
    for r in rows:
        assert r["tokens"] > 0 and 0 < r["ratio"]["median"] < 5
    plot = Path(result["plot"])
    assert plot == tmp_path / "rollout.png" and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.vllm
def test_trainer_step_quick(tmp_path):
    result = _run("trainer_step.py", tmp_path)
    assert len(result["steps"]) == 2
    assert set(result["phases"]) >= {"rollout", "advantages", "update", "weight_push"}
    assert 0 < result["weight_push_share"] < 1


@pytest.mark.vllm
def test_overlap_quick(tmp_path):
    result = _run("overlap.py", tmp_path)
    modes = {run["mode"]: run for run in result["runs"]}
    assert set(modes) == {"sync", "overlap"} and len(result["ratios"]) == 1
    # Overlapped rows lag by one version, except turns sampled after the push landed mid-rollout.
    assert modes["sync"]["staleness_mean"] == 0 and 0.5 < modes["overlap"]["staleness_mean"] <= 1


@pytest.mark.vllm
def test_weight_push_quick(tmp_path):
    rows = {r["mode"]: r for r in _run("weight_push.py", tmp_path)["rows"]}
    assert set(rows) == {"full", "lora"}
    assert 0 < rows["lora"]["bytes"] < rows["full"]["bytes"] / 10  # the tiny model's rank-8 adapter: ~15x less
    assert rows["full"]["push_s"]["median"] > 0 and rows["lora"]["push_s"]["median"] > 0


@pytest.mark.vllm
def test_spare_groups_quick(tmp_path):
    result = _run("spare_groups.py", tmp_path)
    rows = result["rows"]
    assert set(rows) == {"0", "1"}
    assert rows["0"][0]["dropped"] == 0 and rows["1"][0]["dropped"] == 1
    assert rows["0"][0]["episodes"] == rows["1"][0]["episodes"] == 8  # the kept batch is the same size


def test_partial_quick(tmp_path):
    """Sync trains every token it generates; spare groups throw the cancelled groups' away; partial
    rollouts carry them over, so what they waste is only what max_age dropped (the hf engine: no vllm)."""
    results = _run("partial.py", tmp_path)["results"]
    assert set(results) == {"sync", "spare 2", "partial 2"}
    sync, spare, partial = results["sync"], results["spare 2"], results["partial 2"]
    assert sync["generated"] == sync["trained"] > 0 and sync["wasted"] == 0 and sync["age_max"] == 0
    assert spare["dropped_groups"] > 0 and spare["wasted"] > 0
    assert partial["generated"] == partial["trained"] + partial["in_flight"] + partial["wasted"]
    assert partial["dropped_groups"] > 0 or partial["wasted"] == 0
    assert max(sync["env_s"]) > 5 * sorted(sync["env_s"])[len(sync["env_s"]) // 2]  # the workload's long tail


def test_partial_bugfix_quick(tmp_path):
    """The BugFix workload (arl/BugFix-v0 through the proxy, the scripted engine): every mode trains,
    sync all it generates, partial what it generated less what is still in flight or was dropped;
    every sync episode's env time (its sandbox commands and test run) is measured."""
    result = _run("partial.py", tmp_path, "--workload", "bugfix")
    assert result["meta"]["args"]["workload"] == "bugfix"
    results = result["results"]
    sync, partial = results["sync"], results["partial 2"]
    assert sync["generated"] == sync["trained"] > 0 and sync["wasted"] == 0
    assert partial["generated"] == partial["trained"] + partial["in_flight"] + partial["wasted"] and partial["trained"] > 0
    assert len(sync["env_s"]) == 3 * 2 and min(sync["env_s"]) > 0  # (2 + 1 evaluating) steps x 1 group x 2


def test_partial_bugfix_tail_quick(tmp_path):
    """The heavy-tailed BugFix workload: the config's ``test_latency`` reaches the env through the
    proxy's runner, so every episode's env time holds its task's drawn test wait (small scale here)."""
    from arl.envs.bugfix.judge import latency_key
    from arl.envs.latency import ParetoLatency

    result = _run("partial.py", tmp_path, "--workload", "bugfix-tail", "--test-latency", "1.0,0.5,5")
    assert result["meta"]["args"]["workload"] == "bugfix-tail"
    latency = ParetoLatency(alpha=1.0, scale_s=0.5, cap_s=5.0)
    for name, mode in result["results"].items():
        assert mode["trained"] > 0 and len(mode["env_seeds"]) == len(mode["env_s"]) > 0, name
        for seed, env_s in zip(mode["env_seeds"], mode["env_s"], strict=True):
            assert env_s >= latency.draw_s(latency_key(seed)) >= 0.5, (name, seed, env_s)


@pytest.mark.vllm
def test_learning_quick(tmp_path):
    result = _run("learning.py", tmp_path, timeout=180)  # ~50 s on 2 cores; the smoke size must stay < 90 s
    (game,) = result["games"]
    assert game["game"] == "frozenlake"
    assert {r["estimator"] for r in game["runs"]} == {"grpo", "gigpo-mean"}
    for run in game["runs"]:
        steps = [p["step"] for p in run["curve"]]
        assert steps[0] == 0 and steps[-1] == 2  # evaluated at the start and at the end
        env = [p["env_steps"] for p in run["curve"]]
        assert env[0] == 0 and env == sorted(env) and env[-1] > 0
        assert all(0 <= p["success"] <= 1 for p in run["curve"]) and run["wall_s"] > 0
    rows = result["aggregates"]["frozenlake"]
    assert [r["estimator"] for r in rows] == ["grpo", "gigpo-mean"]
    assert all(len(r["curve"]) == len(game["runs"][0]["curve"]) for r in rows)
    assert result["goal"]["status"] in {"met", "partly met", "not met", "not measured"}
    plot = Path(result["plot"])
    assert plot == tmp_path / "learning.png"
    assert plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arl_bench_cli_passes_arguments(tmp_path):
    out = tmp_path / "o.json"
    proc = subprocess.run(
        [sys.executable, "-m", "arl.cli", "bench", "overhead", "--quick", "--managers", "traj",
         "--no-breakdown", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert {r["manager"] for r in json.loads(out.read_text())["rows"]} == {"traj"}
    proc = subprocess.run([sys.executable, "-m", "arl.cli", "bench", "no-such-benchmark"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "overhead" in proc.stderr


def test_scaling_quick(tmp_path):
    result = _run("scaling.py", tmp_path, timeout=120)  # ~15-20 s; the smoke size must stay < 60 s
    args = result["meta"]["args"]
    managers = {"traj", "step", "proxy-inprocess"}
    for key, sweep, points in (("concurrency", "concurrency_sweep", args["concurrency"]),
                               ("turns_per_episode", "length_sweep", args["turns"])):
        rows = result[sweep]
        assert {(r["manager"], r[key]) for r in rows} == {(m, p) for m in managers for p in points}
        for r in rows:
            for field in ("cpu", "framework", "validate", "wall", "cpu_sample", "turns_per_s"):
                assert r[field]["median"] > 0, (field, r)
            assert r["heap_kib_per_episode"] > 0 and r["turns"] > 0
            assert r["mean_turns"] == r["turns_per_episode"]  # every episode ran its full length
    plot = Path(result["plot"])
    assert plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_learning_add_to_pools_runs_of_the_same_setup_only():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import learning
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    setup = {"steps": 100, "algo": {"estimator": "gigpo", "gamma": 0.5}, "rollout": {"num_groups": 8}}

    def game(runs, **changes):
        s = {**setup, "algo": {**setup["algo"]}, "rollout": {**setup["rollout"]}}
        for path, value in changes.items():
            section, key = path.split("__")
            s[section][key] = value
        return {"game": "frozenlake", "setup": s, "engine_startup_s": 1.0,
                "runs": [{"estimator": e, "seed": seed, "tag": tag} for e, seed, tag in runs]}

    old = [game([("gigpo-mean", 0, "old"), ("gigpo-mean", 1, "old")])]
    new = [game([("gigpo-mean", 1, "new"), ("grpo", 0, "new")], algo__estimator="grpo")]  # estimator may differ
    (pooled,) = learning.merge_games(old, new)
    assert sorted((r["estimator"], r["seed"], r["tag"]) for r in pooled["runs"]) == [
        ("gigpo-mean", 0, "old"), ("gigpo-mean", 1, "new"), ("grpo", 0, "new")]
    with pytest.raises(SystemExit, match=r"rollout.num_groups: 8 vs 4"):
        learning.merge_games([game([("grpo", 0, "old")])], [game([("grpo", 1, "new")], rollout__num_groups=4)])
    # a key added since pools at its old behaviour's value (absent before), and only at that value
    (pooled,) = learning.merge_games(old, [game([("grpo", 2, "new")], rollout__spare_groups=0)])
    assert len(pooled["runs"]) == 3
    with pytest.raises(SystemExit, match=r"rollout.spare_groups: None vs 2"):
        learning.merge_games(old, [game([("grpo", 2, "new")], rollout__spare_groups=2)])


def test_learning_add_to_compares_the_setup_it_records():
    """The check before an --add-to run compares the config resolved as the recorded setup is (engine.dtype
    "policy" and optim.precision "auto" made concrete), so a config that says "policy" pools with its
    own earlier result instead of being refused as another setup."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import learning
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    config = ROOT / "configs" / "smollm2_sokoban_gigpo.yaml"
    recorded = learning.setup_of(learning.resolved_config(config, ["seed=0"]))
    assert recorded["engine"]["dtype"] in ("bfloat16", "float32")  # "policy" resolved
    learning.check_same_setup({"game": "sokoban", "setup": recorded},
                              learning.setup_of(learning.resolved_config(config, ["seed=1"])))


def test_credit_quick(tmp_path):
    result = _run("credit.py", tmp_path, timeout=180)
    (geometry,) = result["geometries"]
    assert (geometry["groups"], geometry["group_size"]) == (8, 8)
    for name, values in geometry["estimators"].items():
        assert len(values["corr"]) == 2, name
        assert all(-1 <= c <= 1 for c in values["corr"] + values["corr_given_action"]), name
        assert all(0 <= s <= 1 for s in values["action_share"]), name
    # random actions carry no credit on their own: every estimator must find *some* signal
    assert all(min(v["corr"]) > 0 for v in geometry["estimators"].values())
    # forked anchor groups beside the natural ones, at the natural batch's engine tokens (to one episode)
    arms = geometry["arms"]
    assert list(arms)[0] == "natural" and len(arms) > 1
    assert arms["natural"]["estimators"] == geometry["estimators"]
    for name, arm in list(arms.items())[1:]:
        batch = arm["batch"]
        assert arm["fork"]["k"] >= 2 and min(batch["fork_groups"]) > 0, name
        for tokens, budget, episodes in zip(batch["engine_tokens"], arms["natural"]["batch"]["engine_tokens"],
                                            batch["episodes"], strict=True):
            assert abs(tokens - budget) <= tokens / episodes, name  # within one episode's cost
        assert "grpo" not in arm["estimators"] and all(len(v["corr"]) == 2 for v in arm["estimators"].values())
    assert max(arms["fork k=2 every, horizon 3"]["batch"]["singleton_frac"]) == 0  # every state forked: no singletons


def test_ceiling_quick(tmp_path):
    from arl.models import resolve_model

    tiny = resolve_model("tiny")  # any model directory scores as a checkpoint row
    result = _run("ceiling.py", tmp_path, "--checkpoints", str(tiny), timeout=180)
    policies = [row["policy"] for row in result["rows"]]
    assert policies[0].startswith("chance") and policies[2].startswith("format warm-start")
    assert policies[3] == "supervised, epoch 1" and policies[-1] == f"checkpoint {tiny}"
    for row in result["rows"]:
        assert 0 <= row["accuracy"] <= 1, row
        assert row["p_optimal"] != row["p_optimal"] or 0 <= row["p_optimal"] <= 1, row  # NaN or a probability
    assert result["test_states"] > 0 and result["train_states"] > 0


def test_ceiling_quick_from_frames(tmp_path):
    """The supervised ceiling from pixels: tiny-vl trained and scored on the frames its processor renders
    (the scripted engine's fake pixels would not fit the vision tower), a VLM checkpoint scored too."""
    from arl.models import resolve_model

    vl = resolve_model("tiny-vl")
    result = _run("ceiling.py", tmp_path, "model=tiny-vl", "rollout.manager.observation=image",
                  "--checkpoints", str(vl), timeout=300)
    assert result["meta"]["args"]["overrides"] == ["model=tiny-vl", "rollout.manager.observation=image"]
    policies = [row["policy"] for row in result["rows"]]
    assert policies[3] == "supervised, epoch 1" and policies[-1] == f"checkpoint {vl}"
    assert all(0 <= row["accuracy"] <= 1 for row in result["rows"])


def test_credit_optimal_actions():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import credit
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    # P at the top left, a hole to its right: only Down starts a shortest safe path
    assert credit.optimal_actions("PO__\n____\n____\n___G") == {"Down"}
    assert credit.optimal_actions("P___\n____\n____\n___G") == {"Down", "Right"}
    assert credit.optimal_actions("_O__\nO___\n____\n___G") == set()  # no player on the grid
    # Sokoban: two pushes up solve it; a box in a corner off target cannot be solved
    assert credit.sokoban_optimal_actions("######\n#O_###\n#__###\n#X_###\n#P_###\n######") == {"Up"}
    assert credit.sokoban_optimal_actions("######\n#O__X#\n#___P#\n######") == set()
    assert credit.sokoban_optimal_actions("######\n#√_###\n#P_###\n######") == set()  # already solved


@pytest.mark.vllm
def test_stop_strings_quick(tmp_path):
    result = _run("stop_strings.py", tmp_path)
    assert {r["variant"] for r in result["rows"]} == {"plain", "detokenize", "post-hoc", "early stop, native",
                                                       "early stop, post-hoc"}
    assert all(all(c.values()) for c in result["checks"].values())  # the same kept tokens either way
