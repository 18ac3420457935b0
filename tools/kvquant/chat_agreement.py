#!/usr/bin/env python3
"""Greedy agreement of KV formats with the f16 cache over the chats of chats.jsonl.

Each chat is a two-turn ChatML conversation (the first assistant reply fixed text); every
format answers the second user turn greedily (64 tokens at most) through the serving
engine, and this script compares each format's token ids with the f16 run's:

    for f in f16 int8 ...; do
      tessera generate --batch tools/kvquant/chats.jsonl --special --temperature 0 -n 64 \\
          --kv-cache-dtype $f --out run_$f.jsonl
    done
    python3 tools/kvquant/chat_agreement.py --dir . f16 int8 ...

Reports per format: chats whose answer is identical to f16's, and the mean fraction of
f16's answer tokens reproduced before the first difference.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def ids(path: Path) -> list[list[int]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["index"])
    return [r["choices"][0]["token_ids"] for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--reference", default="f16")
    ap.add_argument("formats", nargs="+")
    args = ap.parse_args()
    ref = ids(args.dir / f"run_{args.reference}.jsonl")
    print(f"| format | identical answers (of {len(ref)}) | mean prefix agreement |\n|---|---|---|")
    for f in args.formats:
        path = args.dir / f"run_{f}.jsonl"
        if not path.exists():
            continue
        got = ids(path)
        if len(got) != len(ref):  # a run still writing, or failed
            print(f"| {f} | incomplete ({len(got)} answers) | |")
            continue
        same = sum(a == b for a, b in zip(ref, got))
        frac = []
        for a, b in zip(ref, got):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            frac.append(n / max(len(a), 1))
        print(f"| {f} | {same} | {100 * sum(frac) / len(frac):.1f}% |")


if __name__ == "__main__":
    main()
