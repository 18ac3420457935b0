#!/usr/bin/env python3
"""llama.cpp's prompt-lookup decoding (llama-cpp-python's LlamaPromptLookupDecoding) beside plain
decoding on the prompts of docs/benchmarks/spec-decode, greedy, batch 1: the peer figure for
tessera's `--speculative-config '{"method": "ngram", ...}'` (docs/benchmarks/spec-decode.md).

    LLAMA_NO_EXTRA_BUFTS=1 /tmp/llamaref/venv/bin/python tools/bench/llama_cpp_prompt_lookup.py \\
        --prompt docs/benchmarks/spec-decode/copy.txt -n 160 --reps 3

Decode rate = (tokens - 1) / (time of the last token - time of the first), streamed, so the
prompt's evaluation stays out as in tessera's "generated N tokens in T s" line.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import llama_cpp
import llama_cpp.llama_cpp as C
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

if os.environ.get("LLAMA_NO_EXTRA_BUFTS") == "1":  # this VM advertises AMX and faults on it
    _default = C.llama_model_default_params

    def _no_extra_bufts():
        p = _default()
        p.use_extra_bufts = False
        return p

    C.llama_model_default_params = _no_extra_bufts
    llama_cpp.llama_model_default_params = _no_extra_bufts


def run(llm: llama_cpp.Llama, prompt: str, n: int) -> tuple[float, str]:
    llm.reset()
    t_first = t_last = None
    text, count = "", 0
    for chunk in llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1, stream=True):
        now = time.perf_counter()
        t_first = t_first or now
        t_last = now
        text += chunk["choices"][0]["text"]
        count += 1
    return (count - 1) / (t_last - t_first), text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(Path.home() / ".cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompt", type=Path, required=True)
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-pred-tokens", type=int, default=4)
    ap.add_argument("--max-ngram-size", type=int, default=4)
    a = ap.parse_args()
    prompt = a.prompt.read_text()
    common = dict(model_path=a.model, n_ctx=2048, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    plain = llama_cpp.Llama(**common)
    lookup = llama_cpp.Llama(**common, draft_model=LlamaPromptLookupDecoding(
        num_pred_tokens=a.num_pred_tokens, max_ngram_size=a.max_ngram_size))
    rates = {"plain": [], "lookup": []}
    texts = {}
    for rep in range(a.reps):
        for name, llm in (("plain", plain), ("lookup", lookup)):
            rate, text = run(llm, prompt, a.n)
            rates[name].append(rate)
            texts[name] = text
            print(f"rep {rep + 1} {name}: {rate:.1f} tok/s")
    same = texts["plain"] == texts["lookup"]
    ratios = sorted(l / p for l, p in zip(rates["lookup"], rates["plain"]))
    print(f"median plain {statistics.median(rates['plain']):.1f} tok/s, lookup "
          f"{statistics.median(rates['lookup']):.1f} tok/s, paired ratio median {statistics.median(ratios):.2f} "
          f"(outputs {'identical' if same else 'DIFFER'})")


if __name__ == "__main__":
    main()
