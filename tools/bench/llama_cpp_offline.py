#!/usr/bin/env python3
"""llama.cpp's side of `tessera bench offline`: many requests, continuous batching, same file.

R requests of P random prompt tokens each generate N tokens (greedy, end-of-generation
ignored), at most S in flight. Every step is ONE llama_decode holding the next token of every
decoding sequence and then prompt tokens of admitted requests, up to n_batch (512) tokens —
the way llama-server batches its slots. A finished request frees its slot (its KV is removed)
and the next waiting request takes it. Timing is wall clock from the moment all R requests
are queued, like tessera's offline bench: requests/s, output tok/s (prefill included), TTFT
and inter-token latency.

    /tmp/llamaref/venv/bin/python tools/bench/llama_cpp_offline.py -C 1 8 32 --requests 64 -p 128 -n 128
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_cpp_bench import DEFAULT_MODEL, Bench, cpu_model, load_model  # noqa: E402


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))] if v else float("nan")


def run(model, args, n_vocab: int, concurrency: int, rng) -> dict:
    n_batch = args.batch
    per_seq = -(-(args.n_prompt + args.n_gen) // 256) * 256  # llama.cpp splits n_ctx evenly over sequences
    b = Bench(model, n_ctx=concurrency * per_seq, n_batch=max(n_batch, concurrency), n_seq=concurrency,
              threads=args.threads, flash_attn=args.flash_attn)
    mem = llama_cpp.llama_get_memory(b.ctx)
    prompts = [rng.integers(100, n_vocab - 100, args.n_prompt).tolist() for _ in range(args.requests)]
    waiting = list(range(args.requests))
    free_slots = list(range(concurrency))
    # slot -> [request, tokens prefilled, last sampled token, tokens generated]
    active: dict[int, list[int]] = {}
    ttft = [-1.0] * args.requests
    last = [-1.0] * args.requests
    itl: list[float] = []
    out_tokens = 0
    t0 = time.perf_counter()
    while waiting or active:
        while waiting and free_slots:
            active[free_slots.pop(0)] = [waiting.pop(0), 0, -1, 0]
        items, owners = [], []  # owners: (slot, is_last_prompt_token or decode)
        for slot, st in active.items():  # decodes first
            if st[1] == args.n_prompt and st[3] > 0:
                items.append((st[2], args.n_prompt + st[3] - 1, slot, 1))
                owners.append(slot)
        budget = n_batch - len(items)
        for slot, st in active.items():  # then prompt chunks
            if budget <= 0:
                break
            if st[1] < args.n_prompt:
                take = min(budget, args.n_prompt - st[1])
                for i in range(st[1], st[1] + take):
                    want = 1 if i == args.n_prompt - 1 else 0
                    items.append((prompts[st[0]][i], i, slot, want))
                    if want:
                        owners.append(slot)
                st[1] += take
                budget -= take
        b.decode(items)
        now = time.perf_counter() - t0
        logits_rows = [i for i, it in enumerate(items) if it[3]]
        for row, slot in zip(logits_rows, owners):
            st = active[slot]
            ptr = llama_cpp.llama_get_logits_ith(b.ctx, row)
            st[2] = int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))
            st[3] += 1
            out_tokens += 1
            req = st[0]
            if ttft[req] < 0:
                ttft[req] = now
            else:
                itl.append(now - last[req])
            last[req] = now
        for slot in [s for s, st in active.items() if st[3] >= args.n_gen]:
            llama_cpp.llama_memory_seq_rm(mem, slot, -1, -1)
            del active[slot]
            free_slots.append(slot)
    seconds = time.perf_counter() - t0
    b.close()
    row = {"concurrency": concurrency, "requests": args.requests, "seconds": seconds,
           "requests_per_s": args.requests / seconds, "output_tok_s": out_tokens / seconds,
           "computed_tok_s": (args.requests * args.n_prompt + out_tokens) / seconds,
           "ttft_mean_s": statistics.mean(ttft), "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99),
           "itl_mean_ms": 1e3 * statistics.mean(itl) if itl else float("nan"),
           "itl_p50_ms": 1e3 * pct(itl, 0.5), "itl_p99_ms": 1e3 * pct(itl, 0.99)}
    print(f"llama.cpp offline C={concurrency}: {row['output_tok_s']:.1f} output tok/s", file=sys.stderr, flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-C", "--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--batch", type=int, default=512, help="tokens per llama_decode (prompt chunking)")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    model, n_vocab = load_model(args.model)
    rng = np.random.default_rng(args.seed)
    result = {"cpu": cpu_model(), "threads": args.threads, "load_avg_at_start": os.getloadavg(),
              "libllama": llama_cpp.llama_version().decode(), "llama_cpp_python": llama_cpp.__version__,
              "model": args.model.name, "rows": [run(model, args, n_vocab, c, rng) for c in args.concurrency]}
    result["load_avg_at_end"] = os.getloadavg()
    llama_cpp.llama_model_free(model)
    print("| seqs | requests | time (s) | req/s | output tok/s | computed tok/s | TTFT mean (s) | TTFT p50 (s) "
          "| ITL mean (ms) | ITL p50 (ms) | ITL p99 (ms) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| {r['concurrency']} | {r['requests']} | {r['seconds']:.2f} | {r['requests_per_s']:.2f} "
              f"| {r['output_tok_s']:.1f} | {r['computed_tok_s']:.1f} | {r['ttft_mean_s']:.3f} | {r['ttft_p50_s']:.3f} "
              f"| {r['itl_mean_ms']:.1f} | {r['itl_p50_ms']:.1f} | {r['itl_p99_ms']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
