#!/usr/bin/env python3
"""llama.cpp's own KV quantization on the same GGUF and text as `tessera eval kv`.

Runs llama.cpp (llama-cpp-python, the C API) with flash attention on and type_k = type_v =
f16 (the reference), q8_0 and q4_0, over the windows of llama.cpp's perplexity rule, and
reports per type: perplexity, mean KL(f16 || type) and top-1 agreement over the scored
positions [window/2, window-1) of every window, and KL / top-1 by position bucket over the
whole window -- the same quantities, windows and scoring rule as src/eval/kv_eval.h, so
the rows sit beside tessera's (docs/benchmarks/kv-quant.md).

    build/venv-kvquant/bin/pip install llama-cpp-python==0.3.36 numpy
    OMP_WAIT_POLICY=PASSIVE build/venv-kvquant/bin/python tools/kvquant/llama_kv_eval.py \
        --file tests/fixtures/text/licenses_gpl3_apache2.txt --window 512 --chunks 8 --json out.json

The KL is against llama.cpp's own f16 run (not tessera's): each engine is compared with
itself, so the two engines' different roundings do not enter the number.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import llama_cpp

DEFAULT_MODEL = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache/tessera/models")) / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"
# ggml_type ids and storage bits per element (block of 32: q8_0 = 2 + 32 bytes, q4_0 = 2 + 16).
TYPES = {"f16": (1, 16.0), "q8_0": (8, 8.5), "q4_0": (2, 4.5)}

_log_cb = None


def quiet_logs() -> None:
    """llama.cpp logs to stderr by default; keep only errors."""
    global _log_cb

    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):  # noqa: ARG001
        if level == 2 or level == 3:  # GGML_LOG_LEVEL_WARN / ERROR
            sys.stderr.write(text.decode("utf-8", errors="replace"))
    _log_cb = cb
    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))


class Ctx:
    """One llama.cpp context over a loaded model, at one KV type, flash attention on."""

    def __init__(self, model, window: int, type_id: int, threads: int):
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = window
        cp.n_batch = cp.n_ubatch = min(window, 512)  # tessera's prefill chunk
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED  # quantized V needs it
        cp.type_k = cp.type_v = type_id
        cp.n_seq_max = 1
        self.ctx = llama_cpp.llama_init_from_model(model, cp)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp refused a context with KV type {type_id}")
        self.n_batch = cp.n_batch
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    def close(self) -> None:
        llama_cpp.llama_free(self.ctx)

    def window_logits(self, tokens: list[int]) -> np.ndarray:
        """Logits of positions 0 .. len-2 (each predicting the next token) from an empty cache."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        out = []
        n_all = len(tokens)
        for s in range(0, n_all, self.n_batch):
            part = tokens[s:s + self.n_batch]
            batch = llama_cpp.llama_batch_init(len(part), 0, 1)
            try:
                n_out = 0
                for i, tok in enumerate(part):
                    batch.token[i] = tok
                    batch.pos[i] = s + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1 if s + i < n_all - 1 else 0
                    n_out += batch.logits[i]
                batch.n_tokens = len(part)
                if llama_cpp.llama_decode(self.ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
                if n_out:
                    ptr = llama_cpp.llama_get_logits(self.ctx)
                    out.append(np.ctypeslib.as_array(ptr, shape=(n_out * self.n_vocab,))
                               .reshape(n_out, self.n_vocab).copy())
            finally:
                llama_cpp.llama_batch_free(batch)
        return np.concatenate(out)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))).astype(np.float32)


def kl_rows(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    p = np.exp(logp.astype(np.float64))
    return np.maximum((p * (logp.astype(np.float64) - logq.astype(np.float64))).sum(axis=1), 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--file", type=Path, required=True)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=0, help="at most this many windows (0 = all)")
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--types", default="q8_0,q4_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="no repacked CPU weight layouts (AMX, ...): a VM that advertises AMX without granting "
                         "it faults with SIGILL in ggml_backend_amx_mul_mat")
    args = ap.parse_args()

    quiet_logs()
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    if args.no_extra_bufts:
        mp.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(args.model).encode(), mp)
    if not model:
        raise SystemExit(f"cannot load {args.model}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    text = args.file.read_text(encoding="utf-8")
    if text.endswith("\n"):
        text = text[:-1]  # as llama-perplexity -f and tessera eval read the file
    raw = text.encode("utf-8")
    buf = (llama_cpp.llama_token * (len(raw) + 16))()
    # No BOS in the token stream (tessera eval's rule): each window's first token becomes BOS
    # below, so with a BOS here every window of a BOS model (Gemma) would be one token off
    # tessera's. Models without BOS (SmolLM2) tokenize the same either way.
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(raw) + 16, False, False)
    tokens = list(buf[:n])
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    w = args.window
    n_chunks = len(tokens) // w
    if args.chunks:
        n_chunks = min(n_chunks, args.chunks)
    if n_chunks < 1:
        raise SystemExit(f"{len(tokens)} tokens, fewer than one window of {w}")
    first = w // 2
    rows = w - 1
    bucket = (np.arange(rows) * args.buckets) // rows
    windows = []
    for c in range(n_chunks):
        t = tokens[c * w:(c + 1) * w]
        if add_bos:
            t[0] = llama_cpp.llama_vocab_bos(vocab)
        windows.append(t)

    results = []
    ref_logp: list[np.ndarray] = []
    t0 = time.time()
    for name in ["f16"] + [t for t in args.types.split(",") if t and t != "f16"]:
        type_id, bits = TYPES[name]
        ctx = Ctx(model, w, type_id, args.threads)
        nll = kl_sum = agree = 0.0
        max_kl = 0.0
        bkl = np.zeros(args.buckets)
        btop = np.zeros(args.buckets)
        for c, t in enumerate(windows):
            logp = log_softmax(ctx.window_logits(t))
            if name == "f16":
                ref_logp.append(logp)
            ref = ref_logp[c]
            kl = kl_rows(ref, logp)
            same = (logp.argmax(axis=1) == ref.argmax(axis=1)).astype(np.float64)
            targets = np.array(t[1:], dtype=np.int64)
            nll -= float(logp[np.arange(first, rows), targets[first:rows]].astype(np.float64).sum())
            kl_sum += float(kl[first:].sum())
            max_kl = max(max_kl, float(kl[first:].max()))
            agree += float(same[first:].sum())
            np.add.at(bkl, bucket, kl)
            np.add.at(btop, bucket, same)
            print(f"[{name} {c + 1}/{n_chunks}] {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        ctx.close()
        n_scored = n_chunks * (rows - first)
        counts = np.bincount(bucket, minlength=args.buckets) * n_chunks
        results.append({"label": name, "bits_per_element": bits, "mean_nll": nll / n_scored,
                        "ppl": float(np.exp(nll / n_scored)), "mean_kl": kl_sum / n_scored, "max_kl": max_kl,
                        "top1": agree / n_scored, "bucket_kl": (bkl / counts).tolist(),
                        "bucket_top1": (btop / counts).tolist()})
    llama_cpp.llama_model_free(model)

    ref = results[0]
    print(f"llama.cpp {llama_cpp.__version__}, window {w}, {n_chunks} windows, "
          f"{n_chunks * (rows - first)} scored tokens (of {len(tokens)}), flash attention on\n")
    print("| format | bits/elem | ppl | Δppl | mean KL | max KL | top-1 |\n|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| llama.cpp {r['label']} | {r['bits_per_element']:.2f} | {r['ppl']:.4f} | "
              f"{100 * (r['ppl'] / ref['ppl'] - 1):+.2f}% | {r['mean_kl']:.5f} | {r['max_kl']:.3f} | "
              f"{100 * r['top1']:.2f}% |")
    print("\n| format |" + "".join(f" bucket {b} |" for b in range(args.buckets)))
    print("|---|" + "---|" * args.buckets)
    for r in results[1:]:
        print(f"| llama.cpp {r['label']} |" + "".join(
            f" {k:.5f} ({100 * a:.1f}%) |" for k, a in zip(r["bucket_kl"], r["bucket_top1"])))
    if args.json:
        args.json.write_text(json.dumps({
            "engine": "llama.cpp", "llama_cpp_python": llama_cpp.__version__,
            "libllama": llama_cpp.llama_version().decode() if hasattr(llama_cpp, "llama_version") else None,
            "model": str(args.model), "file": str(args.file), "window": w, "n_chunks": n_chunks,
            "n_tokens": len(tokens), "n_scored": n_chunks * (rows - first), "flash_attn": "enabled",
            "rows": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
