#!/usr/bin/env python3
"""Timeline of the decode steps in a kernel trace (tools/gpu/kernel_trace.cpp).

Splits the graph-launched kernels into steps (each begins with the embedding gather), keeps
the steady ones, and prints per kernel of one layer: mean duration, mean start after the
previous kernel's start and its end (negative: it overlapped), so the time the GPU spends
between products shows. Usage: kernel_timeline.py TRACE[.gz]
"""
import gzip
import re
import statistics
import sys


def short(name):
    """A short label for a (mangled) kernel name."""
    for pat, label in [(r"gemv_bulk_kernel.*InputE0", "gemv"), (r"gemv_bulk_kernel.*InputE1", "gemv+swiglu"),
                       (r"gemv_bulk_kernel.*InputE2", "gemv+addnorm"), (r"rope_kv_store", "rope_kv_store"),
                       (r"attention_decode_mma_kernelILi[0-9]+ELb1", "attn_fused"), (r"attention_decode_mma", "attn_mma"),
                       (r"attention_decode_merge", "attn_merge"),
                       (r"attention_decode_split", "attn_split"), (r"embed_kernel", "embed"),
                       (r"rms_norm_kernel", "rms_norm"), (r"gather_rows", "gather_rows"), (r"add_kernel", "add"),
                       (r"row_argmax", "argmax"), (r"gemv_gq_kernel", "gemv_gq"),
                       (r"quantize_q8_rows_kernel", "quantize_q8"), (r"add_rms_norm_q8", "add_rms_norm_q8"),
                       (r"add_rms_norm_into", "add_rms_norm_into")]:
        if re.search(pat, name):
            return label
    return name[:40]


def main():
    path = sys.argv[1]
    opener = gzip.open if path.endswith(".gz") else open
    rows = []
    with opener(path, "rt") as f:
        for line in f:
            p = line.split(maxsplit=5)
            if len(p) < 6 or p[2] == "0":
                continue
            rows.append((int(p[0]), int(p[1]), short(p[5].strip())))
    rows.sort()
    steps, cur = [], []
    for r in rows:
        if r[2] == "embed" and cur:
            steps.append(cur)
            cur = []
        cur.append(r)
    if cur:
        steps.append(cur)
    n = len(steps[0]) if steps else 0
    steady = [s for s in steps[len(steps) // 5: len(steps) * 4 // 5] if len(s) == n]
    if not steady:
        print("no steady steps")
        return
    step_us = statistics.mean((s[-1][1] - s[0][0]) / 1e3 for s in steady)
    print(f"{len(steps)} steps, {len(steady)} steady of {n} kernels; step {step_us:.1f} us ({1e6 / step_us:.0f} tok/s)")
    # One layer in the middle: from one attention kernel (or RoPE before it) to the next.
    names = [r[2] for r in steady[0]]
    anchor = "rope_kv_store" if "rope_kv_store" in names else "attn_fused"
    layer_at = [i for i, nm in enumerate(names) if nm == anchor]
    if len(layer_at) < 3:
        return
    mid = len(layer_at) // 2
    a, b = layer_at[mid], layer_at[mid + 1]
    print(f"layer of {b - a} kernels (kernel {a}..{b - 1}), per-layer time {statistics.mean((s[b][0] - s[a][0]) / 1e3 for s in steady):.1f} us")
    print(f"{'kernel':<16}{'dur us':>8}{'start-prev start':>18}{'start-prev end':>16}{'end-prev end':>14}")
    for i in range(a, b):
        dur = statistics.mean((s[i][1] - s[i][0]) / 1e3 for s in steady)
        ds = statistics.mean((s[i][0] - s[i - 1][0]) / 1e3 for s in steady)
        de = statistics.mean((s[i][0] - s[i - 1][1]) / 1e3 for s in steady)
        ee = statistics.mean((s[i][1] - s[i - 1][1]) / 1e3 for s in steady)
        print(f"{names[i]:<16}{dur:>8.1f}{ds:>18.1f}{de:>16.1f}{ee:>14.1f}")
    # Head and tail of the step (outside the layers).
    print("step head:", ", ".join(f"{names[i]} {statistics.mean((s[i][1]-s[i][0])/1e3 for s in steady):.1f}" for i in range(0, layer_at[0])))
    last = layer_at[-1] + (b - a)
    print("step tail:", ", ".join(f"{names[i]} {statistics.mean((s[i][1]-s[i][0])/1e3 for s in steady):.1f}" for i in range(last, n)))


if __name__ == "__main__":
    main()
