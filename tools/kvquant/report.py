#!/usr/bin/env python3
"""Merges `tessera eval kv --json` and tools/kvquant/llama_kv_eval.py --json reports of one
window into the markdown tables of docs/benchmarks/kv-quant.md: one quality table (both
engines, each KL against its own f16 run), sorted by bits per element, and one table of
KL by position bucket.

    python3 tools/kvquant/report.py --tessera w512.json [--llama llama_w512.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", type=Path, required=True)
    ap.add_argument("--llama", type=Path)
    args = ap.parse_args()
    t = json.loads(args.tessera.read_text())
    ref_ppl = t["rows"][0]["ppl"]
    rows = [dict(r, engine="tessera", rel=r["ppl"] / ref_ppl - 1) for r in t["rows"]]
    if args.llama:
        lj = json.loads(args.llama.read_text())
        assert lj["window"] == t["window"] and lj["n_scored"] == t["n_scored"], "different windows"
        lref = lj["rows"][0]["ppl"]
        rows += [dict(r, engine="llama.cpp", rel=r["ppl"] / lref - 1, k_bits=r["bits_per_element"],
                      v_bits=r["bits_per_element"]) for r in lj["rows"]]
    rows.sort(key=lambda r: (-r["bits_per_element"], r["engine"] != "tessera", r["mean_kl"]))
    print(f"window {t['window']}: {t['n_chunks']} windows, {t['n_scored']} scored tokens\n")
    print("| engine | format | K bits | V bits | bits/elem | ppl | Δppl vs own f16 | mean KL | max KL | top-1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['label']} | {r['k_bits']:.2f} | {r['v_bits']:.2f} | {r['bits_per_element']:.2f} | "
              f"{r['ppl']:.4f} | {100 * r['rel']:+.2f}% | {r['mean_kl']:.5f} | {r['max_kl']:.3f} | "
              f"{100 * r['top1']:.2f}% |")
    b = t["buckets"]
    print("\nmean KL (top-1 agreement with f16) by position in the window, every position:\n")
    print("| engine | format |" + "".join(f" {lo}–{hi - 1} |" for lo, hi in b))
    print("|---|---|" + "---|" * len(b))
    for r in rows:
        if r["label"] == "f16":
            continue
        print(f"| {r['engine']} | {r['label']} |" + "".join(
            f" {k:.5f} ({100 * a:.1f}%) |" for k, a in zip(r["bucket_kl"], r["bucket_top1"])))


if __name__ == "__main__":
    main()
