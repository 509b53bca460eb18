"""Memory: the planner's prediction (`arl plan`, arl/plan/) beside measured peak memory on CPU.

    .venv/bin/python benchmarks/memory.py            # tiny + SmolLM2-135M: trainer steps, vLLM engine, peaks (~8 min, 2 cores)
    .venv/bin/python benchmarks/memory.py --quick    # tiny, full fine-tune step only (~15 s)
    .venv/bin/python benchmarks/memory.py --models smollm2-135m --rows 4 --seq-len 512 --points trainer
    .venv/bin/python benchmarks/memory.py --points trainer --response-frac 0.125   # short responses
    .venv/bin/python benchmarks/memory.py --predict-from benchmarks/results/memory.json  # the planner changed

Each point runs in a fresh interpreter (`--child`), so nothing of an earlier point stays in the
process. The child imports everything first, then reads its resident set size (the baseline),
builds what the point measures and reports, against that baseline:

- trainer (full fine-tune, fp32, CPU, as arl's Trainer builds it): RSS growth after
  `from_pretrained` (the weights; safetensors are memory-mapped, so this is low until a forward
  touches them), then `--steps` real `arl.train.update.policy_update` calls on a warm-up row of
  16 tokens (they allocate gradients and AdamW states: the RSS growth after them is "weights +
  grads + AdamW", plus the runtime's own buffers), then `--steps` calls on ROWS x SEQ_LEN random
  tokens (`masks`: a prompt, then a response of `--response-frac` of the row, 3/4 by default; one
  row padded, as arl's batches are) in two micro-batches, so the second runs beside the first
  one's gradients, as gradient accumulation does. Peak RSS growth (`ru_maxrss`) over the
  warm-up's peak is the measured activations of one micro-batch of ROWS/2 rows; the planner
  predicts it (`activation_bytes` with the head on the positions the update really keeps,
  `response_len`, accumulating; its max with the optimizer step's temporaries, less the
  warm-up's). With and without gradient checkpointing.
- trainer with LoRA (peft, rank 16, all linear layers): only where peft is installed.
- engine: arl's in-process vLLM engine (`make_engine`, fp32 on CPU, `--kv-mib` KV cache) after
  one short generation: measured RSS growth beside weights + KV cache; what is left is vLLM's own
  overhead on CPU (the planner's GPU overhead is a stated assumption, this is no check of it).
- peaks: `child_peaks`, the exact live tensor bytes at one micro-batch's peak (torch's profiler,
  no allocator or runtime in the count) beside `activation_bytes`, over settings that put the
  peak at each moment of the backward (`_peak_settings`).

Memory does not depend on machine load: these figures may be produced on a busy machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import quiet_logs, result_path, table, write_result  # noqa: E402

quiet_logs()

MiB = 2**20
WARM_TOKENS = 16
WARM_ROWS = (slice(0, 1), slice(-WARM_TOKENS, None))  # the warm-up micro-batch: row 0's last tokens
# glibc keeps freed memory of small and mid-sized blocks for reuse, so RSS after a free says
# little. A fixed mmap threshold (which also turns off its dynamic growth) gives every tensor
# above 128 KiB its own mapping, returned to the system when the tensor dies: RSS then follows
# the live bytes. The peak (ru_maxrss) does not depend on it.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def masks(point: dict) -> tuple:
    """A trainer point's attention and response masks: every row a prompt, then a response of
    `response_frac` of the row; the last row a quarter shorter (a padded batch, as arl's are)."""
    import torch

    rows, length = point["rows"], point["seq_len"]
    attention_mask = torch.ones(rows, length, dtype=torch.long)
    attention_mask[-1, -length // 4 :] = 0
    response_mask = attention_mask.float()
    response_mask[:, : length - int(length * point["response_frac"])] = 0.0
    return attention_mask, response_mask


def response_len(response_mask) -> int:
    """Positions per row the update runs the head on (`predicting_positions`). Every row's response
    starts at the same position, so each micro-batch keeps as many as the whole batch does."""
    from arl.algo import predicting_positions

    return predicting_positions(response_mask).numel()


# ---------------------------------------------------------------------------------------------- child


def child_trainer(point: dict) -> dict:
    import gc

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from arl.config import AlgoConfig, OptimConfig
    from arl.models import resolve_model
    from arl.train.update import policy_update

    path = resolve_model(point["model"])
    if point.get("lora_rank"):
        import peft
    gc.collect()
    base = _rss()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    loaded = _rss() - base
    if point["checkpointing"]:
        model.gradient_checkpointing_enable()
    if point.get("lora_rank"):
        from arl.plan import ALL_LINEAR

        lora = peft.LoraConfig(r=point["lora_rank"], lora_alpha=2 * point["lora_rank"], lora_dropout=0.0,
                               target_modules=list(ALL_LINEAR))
        model = peft.get_peft_model(model, lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    rows, length = point["rows"], point["seq_len"]
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (rows, length), generator=gen)
    attention_mask, response_mask = masks(point)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask,
             "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
             "response_mask": response_mask, "logprobs": torch.full((rows, length), -1.0)}
    rng = np.random.default_rng(0)

    def steps(batch: dict, micro_batch: int) -> None:
        n = batch["input_ids"].shape[0]
        for _ in range(point["steps"]):
            policy_update(model, optimizer, batch, np.linspace(-1.0, 1.0, n), algo=AlgoConfig(),
                          optim=OptimConfig(micro_batch_size=micro_batch), temperature=1.0, rng=rng)

    # A warm-up micro-batch of WARM_TOKENS tokens allocates gradients and AdamW states (and the
    # runtime's own first-use buffers) at negligible activations; the real micro-batch's peak
    # above it is then its activations.
    steps({k: v[WARM_ROWS] for k, v in batch.items()}, 1)  # row 0: unpadded, response tokens
    state, warm_peak = _rss() - base, _peak() - base
    steps(batch, rows // 2)  # two micro-batches: the second runs with the first one's gradients
    return {"base": base, "loaded": loaded, "state": state, "warm_peak": warm_peak, "peak": _peak() - base,
            "activations": _peak() - base - warm_peak, "after": _rss() - base,
            "trainable": sum(p.numel() for p in trainable), "parameters": sum(p.numel() for p in model.parameters())}


def child_engine(point: dict) -> dict:
    import asyncio

    import vllm  # noqa: F401 -- imported before the baseline: its import is not the engine

    from arl.engine import SamplingParams, make_engine
    from arl.models import resolve_model

    resolve_model(point["model"])
    base = _rss()

    async def start_and_generate():
        engine = make_engine(backend="vllm", model=point["model"], max_model_len=2048,
                             kv_cache_memory_bytes=point["kv_bytes"])
        await engine.generate([1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0.0))
        measured = _rss() - base
        await engine.close()
        return measured

    after = asyncio.run(start_and_generate())
    return {"base": base, "after": after, "peak": _peak() - base}


def child_peaks(point: dict) -> dict:
    """The exact peak of live tensor bytes (not RSS: no allocator, no runtime) of one micro-batch
    as the update runs it (`response_logits`, `token_logprobs` on the kept positions,
    `policy_loss`, backward), per setting, on the model cut to `layers` layers with random
    weights: torch.profiler's memory timeline (a private API, `_memory_profile`), parameters,
    their gradients and optimizer states left out as the planner counts them apart. Accumulating:
    an earlier micro-batch's gradients are in .grad already."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, Category
    from transformers import AutoConfig, AutoModelForCausalLM

    from arl.algo import predicting_positions
    from arl.models import resolve_model
    from arl.plan import ALL_LINEAR

    torch.manual_seed(0)
    rows, length = point["rows"], point["seq_len"]
    apart = (Category.PARAMETER, Category.GRADIENT, Category.OPTIMIZER_STATE)
    peaks = []
    for s in point["settings"]:
        config = AutoConfig.from_pretrained(resolve_model(point["model"]), num_hidden_layers=point["layers"],
                                            tie_word_embeddings=s["tied"])
        ids = torch.randint(0, config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0))
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32 if s["dtype"] == "fp32" else torch.bfloat16)
        model.train()
        if s["checkpointing"]:
            model.gradient_checkpointing_enable()
        if s["lora_rank"]:
            import peft

            model = peft.get_peft_model(model, peft.LoraConfig(r=s["lora_rank"], target_modules=list(ALL_LINEAR)))
        attention_mask, response_mask = _peak_masks(point, s)
        inputs = {"input_ids": ids, "attention_mask": attention_mask,
                  "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0)}
        keep = predicting_positions(response_mask)
        advantages = torch.tensor(np.linspace(-1.0, 1.0, rows), dtype=torch.float32)
        micro_batch = functools.partial(_micro_batch, model, inputs, keep, advantages, response_mask)
        micro_batch()  # allocates .grad (and warms up the kernels)
        if not s["accumulating"]:
            model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
            micro_batch()
        memory = prof._memory_profile()
        # a tensor is apart if any version of it is (a weight gradient starts as autograd's output)
        kept_apart = {key[0] for _, _, key, _ in memory.timeline if memory._categories.get(*key) in apart}
        live, peak = 0, 0
        for _, action, key, size in memory.timeline:
            if action in (Action.CREATE, Action.DESTROY) and key[0] not in kept_apart:
                live += size if action == Action.CREATE else -size
                peak = max(peak, live)
        peaks.append(peak)
    return {"peaks": peaks}


def _peak_masks(point: dict, setting: dict) -> tuple:
    return masks({**point, "response_frac": setting["response_len"] / point["seq_len"]})


def _micro_batch(model, inputs: dict, keep, advantages, response_mask) -> None:
    """One micro-batch of the update: logits at the kept positions, their log-probs, the loss,
    backward; the logits stay referenced through the backward, as `policy_update`'s loop holds them."""
    from arl.algo import policy_loss, token_logprobs
    from arl.train.update import response_logits

    logits = response_logits(model, inputs, keep)
    logp = token_logprobs(logits, inputs["input_ids"], positions=keep)
    loss, _ = policy_loss(logp, logp.detach(), advantages, response_mask)
    loss.backward()
    del logits


def _peak_settings(length: int) -> list[dict]:
    """Full fine-tune in fp32 (tied lm_head as the model has it, and untied; with and without an
    earlier micro-batch's gradients), in bf16, with gradient checkpointing; LoRA in bf16: each
    with long and short responses."""
    out = []
    for response in (3 * length // 4, length // 16):
        for dtype, lora, ckpt, acc, tied in (("fp32", None, False, False, True), ("fp32", None, False, True, True),
                                             ("fp32", None, False, True, False), ("bf16", None, False, False, True),
                                             ("fp32", None, True, False, True), ("bf16", 16, False, False, True)):
            out.append({"dtype": dtype, "lora_rank": lora, "checkpointing": ckpt, "accumulating": acc,
                        "tied": tied, "response_len": response})
    return out


# ---------------------------------------------------------------------------------------------- parent


def measure(point: dict) -> dict:
    """Run one point in a fresh interpreter; its JSON is the last line of its stdout."""
    cmd = [sys.executable, __file__, "--child", json.dumps(point)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env={**os.environ, **CHILD_ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"point {point} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def predict(point: dict) -> dict:
    import attrs

    from arl.plan import TrainSetting, model_shape, plan_memory

    shape = model_shape(point["model"])
    if point["kind"] == "engine":
        from arl.plan import BYTES, kv_cache_bytes, parameter_count

        weights = BYTES["fp32"] * parameter_count(shape)
        return {"weights": weights, "kv_cache": point["kv_bytes"], "after": weights + point["kv_bytes"],
                "kv_tokens": point["kv_bytes"] // kv_cache_bytes(shape, 1, "fp32")}
    if point["kind"] == "peaks":
        from arl.plan import activation_bytes

        shape = attrs.evolve(shape, num_layers=point["layers"])
        return {"peaks": [activation_bytes(attrs.evolve(shape, tie_word_embeddings=s["tied"]), point["rows"],
                                           point["seq_len"], s["dtype"], checkpointing=s["checkpointing"],
                                           lora_rank=s["lora_rank"], response_len=response_len(_peak_masks(point, s)[1]),
                                           accumulating=s["accumulating"])
                          for s in point["settings"]]}
    _, response_mask = masks(point)
    # the measured step: two micro-batches (the second beside the first one's gradients); the
    # warm-up: one micro-batch of row 0's last tokens, unpadded
    setting = TrainSetting(lora_rank=point.get("lora_rank"), dtype="fp32", gradient_checkpointing=point["checkpointing"],
                           micro_batch=point["rows"] // 2, seq_len=point["seq_len"],
                           response_len=response_len(response_mask), accumulating=True, device="cpu")
    plan = plan_memory(shape, setting, engine=None)
    warm = plan_memory(shape, attrs.evolve(setting, micro_batch=1, seq_len=WARM_TOKENS, padded=False, accumulating=False,
                                           response_len=response_len(response_mask[WARM_ROWS])), engine=None)
    # measured "activations" is the peak's growth over the warm-up's peak, so the prediction is
    # the growth of max(activations, the optimizer step's temporaries) over the warm-up's
    return {"weights": plan.weights, "state": plan.weights + plan.gradients + plan.optimizer,
            "peak": plan.trainer_bytes, "activations": plan.trainer_bytes - warm.trainer_bytes,
            "trainable": plan.trainable}


def points(args: argparse.Namespace) -> list[dict]:
    out = []
    for model in args.models:
        for checkpointing in () if "trainer" not in args.points else (False,) if args.quick else (False, True):
            out.append({"kind": "trainer", "model": model, "rows": args.rows, "seq_len": args.seq_len,
                        "response_frac": args.response_frac,
                        "steps": args.steps, "checkpointing": checkpointing})
        if args.lora and "trainer" in args.points:
            out.append({"kind": "trainer", "model": model, "rows": args.rows, "seq_len": args.seq_len,
                        "response_frac": args.response_frac,
                        "steps": args.steps, "checkpointing": False, "lora_rank": 16})
        if "engine" in args.points:
            out.append({"kind": "engine", "model": model, "kv_bytes": args.kv_mib * MiB})
        if "peaks" in args.points:
            out.append({"kind": "peaks", "model": model, "layers": 2, "rows": 2, "seq_len": 96,
                        "settings": _peak_settings(96)})
    return out


def _label(p: dict) -> str:
    if p["kind"] == "engine":
        return f"{p['model']} vLLM engine (fp32, KV {p['kv_bytes'] // MiB} MiB)"
    if p["kind"] == "peaks":
        return f"{p['model']} cut to {p['layers']} layers, {p['rows']}x{p['seq_len']} tokens"
    what = f"LoRA r={p['lora_rank']}" if p.get("lora_rank") else "full"
    return (f"{p['model']} {what} fp32{' + ckpt' if p['checkpointing'] else ''}, "
            f"2 micro-batches of {p['rows'] // 2}x{p['seq_len']} tokens, head on {response_len(masks(p)[1])}")


HEADER = ["point", "predicted MiB", "measured MiB", "measured / predicted", "parts (predicted / measured)"]


def table_rows(record: dict) -> list[list[str]]:
    """One point's rows of the table (a peaks point: one per setting)."""
    point, measured, predicted = record["point"], record["measured"], record["predicted"]
    label = _label(point)
    if point["kind"] == "engine":
        rest = measured["after"] - predicted["after"]
        return [[label, f"{predicted['after'] / MiB:.0f}", f"{measured['after'] / MiB:.0f}",
                 f"{measured['after'] / predicted['after']:.2f}",
                 f"weights {predicted['weights'] / MiB:.0f} + KV {predicted['kv_cache'] / MiB:.0f}; "
                 f"vLLM's CPU overhead {rest / MiB:.0f} MiB"]]
    if point["kind"] == "peaks":
        rows = []
        for s, got, want in zip(point["settings"], measured["peaks"], predicted["peaks"], strict=True):
            what = (f"{'LoRA r=' + str(s['lora_rank']) if s['lora_rank'] else 'full'} {s['dtype']}"
                    f"{' + ckpt' if s['checkpointing'] else ''}{'' if s['tied'] else ', untied'}"
                    f"{', accumulating' if s['accumulating'] else ''}")
            rows.append([f"{label}: {what}, head on {s['response_len']}", f"{want / MiB:.2f}", f"{got / MiB:.2f}",
                         f"{got / want:.3f}", "activations: live tensor bytes (profiler)"])
        return rows
    return [[label, f"{predicted['peak'] / MiB:.0f}", f"{measured['peak'] / MiB:.0f}",
             f"{measured['peak'] / predicted['peak']:.2f}",
             f"weights {predicted['weights'] / MiB:.0f} / {measured['loaded'] / MiB:.0f}; "
             f"weights+grads+AdamW {predicted['state'] / MiB:.0f} / {measured['state'] / MiB:.0f}; "
             f"activations {predicted['activations'] / MiB:.0f} / {measured['activations'] / MiB:.0f}"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--rows", type=int, default=8, help="micro-batch rows")
    parser.add_argument("--seq-len", type=int, default=256, help="padded tokens per row")
    parser.add_argument("--response-frac", type=float, default=0.75,
                        help="the response's share of each row (the update runs the head on those positions)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--kv-mib", type=int, default=256, help="the engine's kv_cache_memory_bytes, MiB")
    parser.add_argument("--points", nargs="+", choices=["trainer", "engine", "peaks"],
                        default=["trainer", "engine", "peaks"])
    parser.add_argument("--predict-from", type=Path, default=None,
                        help="re-predict a saved run's measurements with the current planner (no measuring)")
    parser.add_argument("--quick", action="store_true", help="tiny, full fine-tune point only")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/memory.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        point = json.loads(args.child)
        result = {"engine": child_engine, "peaks": child_peaks, "trainer": child_trainer}[point["kind"]](point)
        print(json.dumps(result))
        return
    try:
        import peft  # noqa: F401
        args.lora = peft_installed = True
    except ImportError:
        args.lora = peft_installed = False
    if args.quick:
        args.models, args.points, args.lora = ["tiny"], ["trainer"], False
    if args.predict_from:  # the measurements do not depend on the planner: only the predictions change
        records = json.loads(args.predict_from.read_text())["points"]
        for record in records:
            record["predicted"] = predict(record["point"])
        print(table(HEADER, [row for record in records for row in table_rows(record)]))
        return
    started = time.perf_counter()
    rows, records = [], []
    for point in points(args):
        measured, predicted = measure(point), predict(point)
        records.append({"point": point, "label": _label(point), "measured": measured, "predicted": predicted})
        rows += table_rows(records[-1])
        print(table(HEADER, rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(HEADER, rows))
    if not peft_installed:
        print("\nLoRA: peft is not installed, so no LoRA point was measured (`arl plan` predicts it).")
    out = args.out or result_path("memory", args.quick)
    write_result(out, args, {"points": records, "lora_measured": args.lora}, started)


if __name__ == "__main__":
    main()
