"""Every key of metrics.jsonl is a measurement or it is absent (issue 43 item 3).

A short real run of the demo's config (tiny model, FrozenLake, GiGPO with a KL anchor) on the hf
engine: real sampling from the policy being trained, so the rollout, the evaluations and the
weight-sync canary all depend on the weights (the scripted engine's replies do not: its evaluation
would be constant by construction, and it has no canary). A warm-start of 30 small batches teaches
the answer format, so episodes end both ways and the rollout's actions are valid and invalid; the
evaluation samples at the rollout's temperature (1.0), so its numbers move with the policy. ~25 s
on 2 idle cores.

The rule the run is held to. A key may keep one value through a healthy run only when it
  - counts an event that did not happen: a fault (an abnormal exit, a skipped update, a reply cut at
    max_tokens, a stale sample, an invalid action). It was counted, so its "none" is a measurement,
    and an alarm when it is not; a fault's counter may stay at "none" only; or
  - is fixed by the configuration: episodes per batch, the pushed weights' size, a constant
    learning rate.
Anything else that stays constant is an identity of the set-up (PPO's ratio is exactly 1 with one
optimizer step per rollout) or the default of a computation that did not run (`train/entropy` was
0.0 in every row while `algo.entropy_coef` was 0): not a measurement, so the trainer must leave it
out. A key logged at fewer than 3 steps (the warm-start's `sft/*` at step 0) is not judged.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from arl.config import load_config
from arl.rollout import rollout_metrics
from arl.rollout.base import Episode
from arl.rollout.records import Trajectory, Turn
from arl.train import Trainer
from arl.train.logging import read_metrics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
MIN_STEPS = 3  # fewer values than this cannot tell a constant from a coincidence

# (key pattern, the one value it may keep (None: any), why); see the module docstring. A fault's
# counter may stay at "no fault" only: a constant 0% valid actions is no healthy run's.
MAY_BE_CONSTANT: tuple[tuple[str, float | None, str], ...] = (
    (r"(rollout|eval|env/.+)/num_episodes", None, "set by the config (num_groups x group_size, eval.num_seeds)"),
    (r"rollout/status/.+", None, "episodes per runner status: all Finished unless episodes fail"),
    (r"rollout/exit/(?!terminated$|truncated$).+", 0.0, "abnormal exits: counted faults"),
    (r"(rollout|env/.+)/abnormal_rate", 0.0, "the share of abnormal exits"),
    (r"(rollout|eval|env/.+)/valid_action_rate", 1.0, "invalid actions, as a share: none (the warm-started policy "
                                                    "answers the 16-level panel validly at every evaluation)"),
    (r"rollout/state_key_fallback_rate", 0.0, "GiGPO keys hashed from the text, not a game's state_key(): 0 for arl's games"),
    (r"rollout/response_clipped_rate", 0.0, "replies cut at max_tokens: none while the policy answers inside it"),
    (r"train/skipped_updates", 0.0, "updates with a non-finite gradient norm"),
    (r"train/ratio_outside_clip_frac", 0.0, "trainer/engine ratios outside the clip range: none where the engine "
                                            "computes as the trainer does (the hf engine, fp32)"),
    (r"train/is_weight_capped_frac", 0.0, "tokens whose importance weight the cap truncates: none where the engine "
                                          "computes as the trainer does (the hf engine, fp32)"),
    (r"train/staleness_(mean|max)", 0.0, "versions between the sampling and the current policy: none when synchronous"),
    (r"train/sampling_.+", None, "how the tokens were drawn: the config's sampling (no greedy, truncated, "
                                 "constrained or overridden draws; its one temperature)"),
    (r"train/weight_push_bytes", None, "the size of the pushed weights, set by the model (and the LoRA rank)"),
)


def _may_be_constant(key: str, value: float, config) -> str | None:
    for pattern, allowed, why in MAY_BE_CONSTANT:
        if re.fullmatch(pattern, key) and (allowed is None or value == allowed):
            return why
    if key == "train/lr" and config.optim.schedule == "constant" and config.optim.warmup_steps == 0:
        return "a constant schedule without warm-up"
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(config, metrics rows) of the short hf run."""
    config = load_config("tiny_frozenlake_gigpo", [
        f"out_dir={tmp_path_factory.mktemp('measured')}", "name=m", "steps=6", "tensorboard=false",
        "engine.backend=hf", "sft.steps=30", "sft.batch_episodes=16", "sft.lr=0.003",
        "rollout.num_groups=2", "rollout.group_size=4", "eval.every=2", "eval.num_seeds=16", "eval.temperature=1.0",
        "eval.record_episodes=0", "optim.micro_batch_size=16", "save_every=0",
    ])

    async def train() -> None:
        async with Trainer(config) as trainer:
            await trainer.train()

    asyncio.run(train())
    return config, read_metrics(config.run_dir)


def _values(rows: list[dict], key: str) -> list:
    return [row[key] for row in rows if key in row]


def test_no_logged_metric_is_constant_unless_it_counts_what_did_not_happen_or_the_config_fixes(run):
    config, rows = run
    keys = sorted({k for row in rows for k in row} - {"step"})
    constant = {}
    for key in keys:
        values = _values(rows, key)
        steps = {row["step"] for row in rows if key in row}
        if len(steps) >= MIN_STEPS and len(set(values)) == 1 and _may_be_constant(key, values[0], config) is None:
            constant[key] = values[0]
    assert constant == {}, (
        f"logged with one value at every step, though what they measure changes over this run "
        f"(a key is measured or absent): {constant}")


def test_the_run_measures_what_the_rule_is_about(run):
    """The run is not degenerate: what the rule exempts is exempt for its reason, not because the run
    did nothing (episodes end both ways, the canary and the evaluation run, the policy updates)."""
    config, rows = run
    for key in ("rollout/exit/terminated", "rollout/exit/truncated", "rollout/valid_action_rate",
                "train/grad_norm", "train/loss", "sync/canary_max_abs", "eval/mean_turns"):
        assert len(set(_values(rows, key))) > 1, (key, _values(rows, key))
    assert [row["step"] for row in rows if "eval/success_rate" in row] == [0, 2, 4, 6]
    assert _values(rows, "sft/steps") == [30.0]


def _documented() -> list[re.Pattern]:
    """The keys docs/metrics.md names (in backticks, with a slash), `<...>` standing for any name."""
    names = set(re.findall(r"`([a-z_]+/[^`\s]+)`", DOCS.read_text()))
    return [re.compile(re.sub(r"<[^>]+>", ".+", re.escape(n).replace(r"\<", "<").replace(r"\>", ">")))
            for n in names]


def test_every_logged_key_is_in_the_glossary(run):
    _, rows = run
    documented = _documented()
    keys = sorted({k for row in rows for k in row} - {"step"})
    missing = [k for k in keys if not any(p.fullmatch(k) for p in documented)]
    assert missing == [], f"logged but not in {DOCS.name}: {missing}"


# ---------------------------------------------------------------------------------------------
# rollout_metrics: a rate of nothing is absent, and a field no env reported is not averaged as 0


def _episode(turns: list[Turn], **kw) -> Episode:
    return Episode(trajectory=Trajectory(env_id="e", group_id="g", episode_id=0, seed=0, turns=turns, **kw),
                   samples=[])


def _turn(**info) -> Turn:
    return Turn(observation="o", prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.1], info=info)


def test_an_empty_batch_has_counts_but_no_rates():
    m = rollout_metrics([])
    assert m["rollout/num_episodes"] == 0 and m["rollout/num_turns"] == 0 and m["rollout/exit/timeout"] == 0
    assert m["rollout/status/NoData"] == 0  # every status is counted, like every exit reason
    for key in ("success_rate", "valid_action_rate", "mean_turns", "mean_episode_score", "abnormal_rate",
                "response_tokens_max", "response_clipped_rate", "action_effective_rate", "sample_tokens_mean"):
        assert f"rollout/{key}" not in m, key


def test_episodes_without_turns_have_no_per_turn_rates():
    m = rollout_metrics([_episode([], exit_reason="agent_error")])
    assert m["rollout/abnormal_rate"] == 1.0 and m["rollout/mean_turns"] == 0.0
    assert "rollout/valid_action_rate" not in m and "rollout/response_tokens_mean" not in m


def test_per_turn_rates_average_only_the_turns_that_reported_the_field():
    """An agent whose steps report no `action_effective` (nor `action_valid`) is not 0% effective."""
    silent = rollout_metrics([_episode([_turn(), _turn()])])
    assert "rollout/action_effective_rate" not in silent and "rollout/valid_action_rate" not in silent
    mixed = rollout_metrics([_episode([_turn(action_effective=True, action_valid=True), _turn(action_valid=False),
                                       _turn()])])
    assert mixed["rollout/action_effective_rate"] == 1.0  # one turn reported it
    assert mixed["rollout/valid_action_rate"] == 0.5 and mixed["env/e/valid_action_rate"] == 0.5
