#!/usr/bin/env python3
"""Measure llama.cpp's CPU speed on the same GGUF tessera runs (the peer baseline).

Mirrors llama-bench's pp512 / tg128 through the llama.cpp C API (llama-cpp-python):
  * pp<P>      : prefill P random tokens in ONE llama_decode call (n_batch = n_ubatch = P)
                 into an empty cache; only the last position's logits are requested.
  * tg<N>@d<P> : after that prefill, decode N tokens one llama_decode call each.
  * tg<N>@d0   : llama-bench's own tg: N single-token decodes from an empty cache.
  * batched    : S independent sequences (separate KV streams), each prefilled with
                 B prompt tokens, then N steps that decode one token for every sequence
                 in a single llama_decode call (llama-batched-bench's S_TG).
Every timing is wall clock around llama_decode + llama_synchronize (what llama-bench
does); llama.cpp's own perf counters (llama_perf_context) are recorded as a cross-check.
One warm-up pass precedes the measured repetitions. Token ids are random (fixed seed),
as in llama-bench; content does not change the cost of a dense model.

    /tmp/llamaref/venv/bin/python tools/bench/llama_cpp_bench.py --reps 5 --json out.json
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import llama_cpp

DEFAULT_MODEL = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache/tessera/models")) / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"
FA = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
      "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}

_log_lines: list[str] = []


@llama_cpp.llama_log_callback
def _log_cb(level, text, user_data):  # noqa: ARG001
    _log_lines.append(text.decode("utf-8", errors="replace"))
    if level == 3:
        sys.stderr.write(_log_lines[-1])


class Bench:
    def __init__(self, model, *, n_ctx: int, n_batch: int, n_seq: int, threads: int, flash_attn: str):
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_seq_max = n_seq
        cp.kv_unified = False          # one KV stream per sequence, like independent requests
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = FA[flash_attn]
        cp.no_perf = False
        first = len(_log_lines)
        self.ctx = llama_cpp.llama_init_from_model(model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp failed to create a context")
        log = "".join(_log_lines[first:])
        self.flash_attn_resolved = "enabled" if "Flash Attention enabled" in log else "disabled"
        self.batch = llama_cpp.llama_batch_init(max(n_batch, n_seq), 0, 1)

    def close(self):
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)

    def clear(self):
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)

    def decode(self, items):
        """items: list of (token, pos, seq, want_logits); one llama_decode call, waited for."""
        b = self.batch
        for i, (tok, pos, seq, out) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, out
            b.seq_id[i][0] = seq
        b.n_tokens = len(items)
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        llama_cpp.llama_synchronize(self.ctx)

    def perf(self) -> dict:
        p = llama_cpp.llama_perf_context(self.ctx)
        return {"t_p_eval_ms": p.t_p_eval_ms, "n_p_eval": p.n_p_eval, "t_eval_ms": p.t_eval_ms, "n_eval": p.n_eval}


def prefill(bench: Bench, tokens, seq: int = 0, pos0: int = 0) -> float:
    items = [(t, pos0 + i, seq, 1 if i == len(tokens) - 1 else 0) for i, t in enumerate(tokens)]
    t0 = time.perf_counter()
    bench.decode(items)
    return time.perf_counter() - t0


def generate(bench: Bench, tokens, pos0: int) -> float:
    t0 = time.perf_counter()
    for i, t in enumerate(tokens):
        bench.decode([(t, pos0 + i, 0, 1)])
    return time.perf_counter() - t0


def stats(rates: list[float]) -> dict:
    return {"mean": statistics.mean(rates), "sd": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "median": statistics.median(rates), "best": max(rates), "runs": rates}


def run_single(model, args, rng, n_vocab) -> dict:
    b = Bench(model, n_ctx=args.pp + args.tg, n_batch=args.pp, n_seq=1, threads=args.threads,
              flash_attn=args.flash_attn)
    res = {"flash_attn_resolved": b.flash_attn_resolved}
    rand = lambda n: rng.integers(0, n_vocab, n).tolist()  # noqa: E731
    b.clear(); prefill(b, rand(args.pp)); generate(b, rand(4), args.pp)         # warm-up
    pp, tg_d, tg_0, perf_pp, perf_tg = [], [], [], [], []
    for _ in range(args.reps):
        b.clear()
        llama_cpp.llama_perf_context_reset(b.ctx)
        pp.append(args.pp / prefill(b, rand(args.pp)))
        perf = b.perf()
        perf_pp.append(1000.0 * perf["n_p_eval"] / perf["t_p_eval_ms"])
        llama_cpp.llama_perf_context_reset(b.ctx)
        tg_d.append(args.tg / generate(b, rand(args.tg), args.pp))
        perf = b.perf()
        perf_tg.append(1000.0 * perf["n_eval"] / perf["t_eval_ms"])
    for _ in range(args.reps):
        b.clear()
        tg_0.append(args.tg / generate(b, rand(args.tg), 0))
    b.close()
    print(f"single: pp {[round(x) for x in pp]} tg@d{args.pp} {[round(x) for x in tg_d]} "
          f"tg@d0 {[round(x) for x in tg_0]}", file=sys.stderr, flush=True)
    res[f"pp{args.pp}"] = stats(pp)
    res[f"tg{args.tg}@d{args.pp}"] = stats(tg_d)
    res[f"tg{args.tg}@d0"] = stats(tg_0)
    res["perf_counters_tok_s"] = {f"pp{args.pp}": stats(perf_pp), f"tg{args.tg}@d{args.pp}": stats(perf_tg)}
    return res


def run_batched(model, args, rng, n_vocab, n_seq: int) -> dict:
    per_seq = args.batched_prompt + args.batched_gen
    b = Bench(model, n_ctx=n_seq * per_seq, n_batch=max(512, n_seq), n_seq=n_seq, threads=args.threads,
              flash_attn=args.flash_attn)
    rates = []
    for rep in range(args.batched_reps + 1):            # rep 0 is the warm-up
        b.clear()
        for s in range(n_seq):
            prefill(b, rng.integers(0, n_vocab, args.batched_prompt).tolist(), seq=s)
        steps = args.batched_gen if rep else 4
        t0 = time.perf_counter()
        for step in range(steps):
            toks = rng.integers(0, n_vocab, n_seq).tolist()
            b.decode([(toks[s], args.batched_prompt + step, s, 1) for s in range(n_seq)])
        if rep:
            rates.append(n_seq * steps / (time.perf_counter() - t0))
    b.close()
    print(f"batched {n_seq}: {[round(x) for x in rates]}", file=sys.stderr, flush=True)
    return {"n_seq": n_seq, "prompt_per_seq": args.batched_prompt, "gen_per_seq": args.batched_gen,
            "aggregate_tg_tok_s": stats(rates)}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_model(path: Path):
    """Initialises llama.cpp (log capture, backend) and loads the GGUF: (model, n_vocab)."""
    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    # LLAMA_NO_EXTRA_BUFTS=1: no repacked (AMX/...) weight layouts. Some VMs advertise AMX and
    # fault on it (SIGILL in ggml_backend_amx_mul_mat); `tessera bench model --peer`
    # passes the environment through.
    if os.environ.get("LLAMA_NO_EXTRA_BUFTS") == "1":
        params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise SystemExit(f"cannot load {path}")
    return model, llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--flash-attn", choices=sorted(FA), default="auto")
    ap.add_argument("--batched", type=int, nargs="*", default=[8, 32], help="parallel sequence counts")
    ap.add_argument("--batched-prompt", type=int, default=128)
    ap.add_argument("--batched-gen", type=int, default=128)
    ap.add_argument("--batched-reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    model, n_vocab = load_model(args.model)
    rng = np.random.default_rng(args.seed)

    result = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu_model(), "nproc": os.cpu_count(), "threads": args.threads, "threads_batch": args.threads,
        "load_avg_at_start": os.getloadavg(),
        "llama_cpp_python": llama_cpp.__version__, "libllama": llama_cpp.llama_version().decode(),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "model": args.model.name, "flash_attn": args.flash_attn, "kv_type": "f16", "reps": args.reps,
        "single": run_single(model, args, rng, n_vocab),
        "batched": [run_batched(model, args, rng, n_vocab, s) for s in args.batched],
    }
    result["load_avg_at_end"] = os.getloadavg()
    llama_cpp.llama_model_free(model)

    def row(name, s):
        return f"| {name} | {s['mean']:.1f} ± {s['sd']:.1f} | {s['median']:.1f} | {s['best']:.1f} |"
    sgl = result["single"]
    lines = ["| test | tok/s mean ± sd | median | best |", "|---|---:|---:|---:|"]
    for key in (f"pp{args.pp}", f"tg{args.tg}@d{args.pp}", f"tg{args.tg}@d0"):
        lines.append(row(key, sgl[key]))
    for bt in result["batched"]:
        lines.append(row(f"batched tg, {bt['n_seq']} seqs (aggregate)", bt["aggregate_tg_tok_s"]))
    print("\n".join(lines))
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
