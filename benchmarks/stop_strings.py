"""Stop strings on vLLM: matched by vLLM as tokens arrive (the request detokenized) or after the
generation by arl (`arl.engine.stops.stop_cut` on undetokenized output). What each costs.

    .venv/bin/python benchmarks/stop_strings.py           # full size (~2 min on 2 cores, tiny model, 15 repeats)
    .venv/bin/python benchmarks/stop_strings.py --quick   # CI smoke size

One in-process vLLM engine on ``--model``; batches of ``c`` concurrent requests of ``--tokens``
tokens each (ignore_eos, temperature 1, distinct seeds), the variants interleaved per repeat:

- ``plain``: what arl sends without stop strings (``detokenize=False``);
- ``detokenize``: the same with a stop string that never matches: vLLM now decodes every token
  (incremental text and each log-prob's token string) and checks the string, so the difference
  to ``plain`` is the price of asking vLLM to stop on text;
- ``post-hoc``: ``plain``'s generation, then ``stop_cut`` with that stop string in this process
  (what a backend that cannot stop on text pays: one decode, no match);
- ``early stop, native`` / ``early stop, post-hoc``: a stop string the reply contains at about
  ``--stop-at`` tokens in: vLLM stops there (arl's path since this benchmark); the post-hoc way
  generates all ``--tokens`` and cuts afterwards (arl's path before). Same kept tokens.

Reports ms per batch (median, min-max) and generated tokens/s; writes benchmarks/results/stop_strings.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import cell, quiet_logs, result_path, summary, table, write_result  # noqa: E402

NEVER = "\x07never-matches\x07"


def _prompt(tokenizer) -> list[int]:
    msgs = [{"role": "user", "content": "Observation:\n#####\n#P_O#\n#####\nDecide the next action:"}]
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


async def bench(args: argparse.Namespace) -> tuple[list[dict], dict]:
    import attrs

    from arl.engine import SamplingParams, make_engine
    from arl.engine.stops import stop_cut

    engine = make_engine(backend="vllm", model=args.model, max_model_len=2048, kv_cache_memory_bytes=256 * 2**20)
    tok = engine.tokenizer

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    prompt = _prompt(tok)
    rows: list[dict] = []
    checks: dict = {}
    async with engine:
        await engine.generate(prompt, SamplingParams(max_tokens=8, seed=0))  # warm-up
        for c in args.concurrency:
            base = [SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=1.0, seed=1000 + i)
                    for i in range(c)]
            # per request, a stop string its own reply completes at about --stop-at tokens (3 characters
            # of text there, without a U+FFFD), found once from the plain generation
            free = await asyncio.gather(*[engine.generate(prompt, p) for p in base])
            early = []
            for p, gen in zip(base, free, strict=True):
                text = decode(gen.token_ids[: args.stop_at])
                window = next((text[i:i + 3] for i in range(len(text) - 4, -1, -1)
                               if "\ufffd" not in text[i:i + 4] and text[i:i + 3].strip()), None)
                early.append(attrs.evolve(p, stop=(window,)) if window else p)

            async def plain(params=base):
                return await asyncio.gather(*[engine.generate(prompt, p) for p in params])

            async def detok(base=base):
                return await plain([attrs.evolve(p, stop=(NEVER,)) for p in base])

            async def post_hoc(base=base):
                gens = await plain(base)
                return [g.token_ids[: stop_cut(g.token_ids, decode, (NEVER,)) or len(g.token_ids)] for g in gens]

            async def early_native(early=early):
                return [g.token_ids for g in await plain(early)]

            async def early_post_hoc(base=base, early=early):
                gens = await plain(base)
                kept = []
                for g, p in zip(gens, early, strict=True):
                    k = stop_cut(g.token_ids, decode, p.stop) if p.stop else None
                    kept.append(g.token_ids[: k or len(g.token_ids)])
                return kept

            variants = {"plain": plain, "detokenize": detok, "post-hoc": post_hoc,
                        "early stop, native": early_native, "early stop, post-hoc": early_post_hoc}
            times: dict[str, list[float]] = {k: [] for k in variants}
            tokens: dict[str, int] = {}
            kept: dict[str, list] = {}
            for r in range(args.repeats):
                names = list(variants)
                names = names[r % len(names):] + names[: r % len(names)]  # rotate the order per repeat
                for name in names:
                    start = time.perf_counter()
                    out = await variants[name]()
                    times[name].append(time.perf_counter() - start)
                    ids = [list(getattr(o, "token_ids", o)) for o in out]
                    tokens[name] = sum(len(i) for i in ids)
                    kept[name] = ids
            checks[c] = {"early_same_tokens": kept["early stop, native"] == kept["early stop, post-hoc"],
                         "plain_equals_detokenized": kept["plain"] == kept["detokenize"]}
            plain_median = summary(times["plain"])["median"]
            for name in variants:
                s = summary(times[name])
                rows.append({"concurrency": c, "variant": name, "s_per_batch": s, "tokens": tokens[name],
                             "tokens_per_s": tokens[name] / s["median"], "ratio_to_plain": s["median"] / plain_median})
    return rows, checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--stop-at", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="smoke size")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.tokens, args.stop_at, args.repeats = [2], 24, 8, 1
    quiet_logs()
    started = time.perf_counter()
    rows, checks = asyncio.run(bench(args))
    print(table(["concurrency", "variant", "ms per batch (min-max)", "tokens", "tokens/s", "x plain"],
                [[r["concurrency"], r["variant"], cell(r["s_per_batch"], scale=1e3), r["tokens"],
                  f"{r['tokens_per_s']:.0f}", f"{r['ratio_to_plain']:.2f}"] for r in rows]))
    print("checks (same kept tokens either way):", checks)
    write_result(args.out or result_path("stop_strings", args.quick), args, {"rows": rows, "checks": checks}, started)


if __name__ == "__main__":
    main()
