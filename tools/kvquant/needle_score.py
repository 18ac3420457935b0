#!/usr/bin/env python3
"""Scores `tessera generate --batch` answers to make_needles.py prompts: a trial is retrieved
when the hidden number appears in the answer. One row per format, one column per depth.

    python3 tools/kvquant/needle_score.py --needles needles.jsonl --dir DIR f16 int8 ...
(reads DIR/run_<format>.jsonl)
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--needles", type=Path, required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("formats", nargs="+")
    args = ap.parse_args()
    meta = [json.loads(line)["meta"] for line in args.needles.read_text().splitlines() if line.strip()]
    depths = sorted({m["depth"] for m in meta})
    print("| format |" + "".join(f" depth {d:.0%} |" for d in depths) + " all |")
    print("|---|" + "---|" * (len(depths) + 1))
    for f in args.formats:
        path = args.dir / f"run_{f}.jsonl"
        if not path.exists():
            continue
        rows = sorted((json.loads(line) for line in path.read_text().splitlines() if line.strip()),
                      key=lambda r: r["index"])
        if len(rows) != len(meta):
            continue
        hit, n = defaultdict(int), defaultdict(int)
        for m, r in zip(meta, rows):
            n[m["depth"]] += 1
            hit[m["depth"]] += str(m["number"]) in r["choices"][0]["text"]
        print(f"| {f} |" + "".join(f" {hit[d]}/{n[d]} |" for d in depths) +
              f" {sum(hit.values())}/{len(meta)} |")


if __name__ == "__main__":
    main()
