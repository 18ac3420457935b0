#!/usr/bin/env python3
"""Folds per-block probe records (src/backend/cuda/probe.cuh) into a decode layer's timeline.

Build with -DTESSERA_CUDA_PROBE=ON, run a batch-1 decode with TESSERA_CUDA_DIAG=probe=path
(e.g. TESSERA_CUDA_BENCH=b1 tessera_tests --gtest_filter='CudaBench*'), then:

  block_timeline.py path[.gz]            median over the steady launches, per kernel after kernel
  block_timeline.py path[.gz] --layer 6  one layer's launches, block quantiles of each mark
  block_timeline.py path[.gz] --tails    per launch, when its blocks end (p50 ... last)

Record: tag block SM aux t0..t5 (ns). Tag 7 is the fused decode attention (marks: start,
tiles issued, wait over, own split done, cluster synced, merged); other tags are bulk GEMVs,
input kind * 1e6 + width, aux = chunks (marks: start, wait over, input read, end). Times
print in microseconds after the previous launch's last mark.
"""
import argparse
import collections
import gzip
import statistics

ATTENTION = 7


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [tuple(int(x) for x in line.split()) for line in f if line.strip()]


def end(r):
    return max(r[4:10])


def launches(records, gap_ns=20000):
    """Groups records of one (tag, aux) into launches by their start times."""
    by_key = collections.defaultdict(list)
    for r in records:
        by_key[(r[0], r[3])].append(r)
    out = []
    for key, rs in by_key.items():
        rs.sort(key=lambda r: r[4])
        cur = [rs[0]]
        for r in rs[1:]:
            if r[4] - cur[-1][4] > gap_ns:
                out.append((key, cur))
                cur = [r]
            else:
                cur.append(r)
        out.append((key, cur))
    out.sort(key=lambda kv: max(end(r) for r in kv[1]))
    return out


def name(key):
    tag, aux = key
    if tag == ATTENTION:
        return "attention"
    kind, width = divmod(tag, 1000000)
    return {0: "gemv", 1: "gemv swiglu-in", 2: "gemv norm-in"}.get(kind, f"kind{kind}") + f" {width}w/{aux}ch"


def marks(key):
    if key[0] == ATTENTION:
        return [(4, "start"), (5, "tiles"), (6, "wait"), (7, "own done"), (8, "synced"), (9, "merged")]
    return [(4, "start"), (5, "wait"), (6, "input"), (7, "end")]


def steady(ls):
    """(key before, key, records, end of the launch before) of each launch past the first 40%
    (warm-up and prefill)."""
    for i in range(max(1, len(ls) * 2 // 5), len(ls)):
        (pkey, prev), (key, cur) = ls[i - 1], ls[i]
        yield pkey, key, cur, max(end(r) for r in prev)


def quantile(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def summary(ls):
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for pkey, key, cur, base in steady(ls):
        row = rows[(name(pkey), name(key))]
        row["blocks"].append(len(cur))
        row["late blocks"].append(sum(1 for r in cur if r[4] > base))
        for col, label in marks(key)[1:]:
            row[label + " first"].append((min(r[col] for r in cur) - base) / 1e3)
            row[label + " last"].append((max(r[col] for r in cur) - base) / 1e3)
    for (pn, dn), row in sorted(rows.items(), key=lambda kv: -len(kv[1]["blocks"])):
        if len(row["blocks"]) < 3:
            continue
        cells = ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in row.items())
        print(f"{pn} -> {dn} (x{len(row['blocks'])}): {cells}")


def one_layer(ls, count):
    mid = len(ls) * 3 // 4
    base = max(end(r) for r in ls[mid - 1][1])
    for key, cur in ls[mid:mid + count]:
        print(f"{name(key)}: {len(cur)} blocks on {len(set(r[2] for r in cur))} SMs")
        for col, label in marks(key):
            v = sorted((r[col] - base) / 1e3 for r in cur)
            q = [quantile(v, p) for p in (0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)]
            print(f"   {label:9s}" + "".join(f"{x:8.1f}" for x in q))


def tails(ls):
    """Per launch, when its blocks end (p50, p90, p97, last), medians over the steady launches:
    how long the last blocks of each product run after most have finished."""
    ends = collections.defaultdict(lambda: collections.defaultdict(list))
    for _, key, cur, base in steady(ls):
        e = sorted((end(r) - base) / 1e3 for r in cur)  # a block's last mark: end, or merged
        for q in (0.5, 0.9, 0.97, 1.0):
            ends[key][q].append(quantile(e, q))
    for key, qs in sorted(ends.items(), key=lambda kv: -len(kv[1][0.5])):
        if len(qs[0.5]) < 3:
            continue
        cells = " ".join(f"p{int(q * 100)} {statistics.median(v):.1f}" for q, v in qs.items())
        print(f"{name(key)} (x{len(qs[0.5])}): blocks end {cells}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--layer", type=int, default=0, help="print this many launches of one layer instead")
    ap.add_argument("--tails", action="store_true", help="per launch, when its blocks end (quantiles)")
    a = ap.parse_args()
    ls = launches(load(a.path))
    if a.tails:
        tails(ls)
    elif a.layer:
        print("quantiles over blocks: min 10% 25% 50% 75% 90% max (us after the launch before)")
        one_layer(ls, a.layer)
    else:
        summary(ls)


if __name__ == "__main__":
    main()
