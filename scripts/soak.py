#!/usr/bin/env python3
"""Soak test: N minutes of mixed load through `tessera serve`, then checks that nothing leaked.

Load (worker threads, each its own API key, i.e. its own tenant, plus one greedy tenant):
  streamed chat completions, non-streamed completions with n > 1, long prompts, clients that
  disconnect mid-stream, bad requests (bad JSON, bad parameters, bad key, unknown route), and a
  tenant that sends bursts over its --max-requests-per-tenant quota.

Checks at the end (exit status 1 if any fails):
  rss    resident memory is flat after warm-up: the largest RSS of the last quarter of the run
         is within max(--rss-slack-mib, 5%) of the largest RSS at the end of warm-up
  fds    once every client has closed, /proc/PID/fd holds no more entries than after start-up
  kv     every KV block is free once idle (vllm:kv_cache_usage_perc == 0, nothing running/waiting)
  counts /metrics adds up with what the clients saw, by HTTP status: responses with 200 ==
         sum of vllm:request_success_total (every finish reason, disconnects as "abort"), and
         each refused status == tessera:requests_rejected_total{status=...}

Uses only the standard library. Usage:
  scripts/soak.py --minutes 30 --model ~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf
  scripts/soak.py --seconds 60 --json build/soak.json      # the CI version
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADDRESS_RE = re.compile(r"on http://127\.0\.0\.1:(\d+)")
SAMPLE_RE = re.compile(r'^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$')
QUOTA_KEY = "soak-greedy-tenant"
MODEL_NAME = "soak-model"  # --served-model-name


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="how long to load the server")
    length.add_argument("--seconds", type=float, help="how long to load the server (default 60)")
    p.add_argument("--binary", default=str(REPO / "build" / "bin" / "tessera"))
    p.add_argument("--model", default="smollm2-135m", help="model path or alias for `tessera serve --model`")
    p.add_argument("--workers", type=int, default=4, help="client threads besides the greedy tenant")
    p.add_argument("--threads", type=int, default=1, help="server CPU threads (-t)")
    # The default pool (40% of memory) is touched page by page as the prefix cache fills it,
    # which reads as RSS growth for hours; a small pool is fully touched during warm-up.
    p.add_argument("--kv-cache-memory", default="128M", help="KV cache budget (--kv-cache-memory)")
    # The server refuses to start when the pool cannot hold one sequence of --max-model-len.
    p.add_argument("--max-model-len", default="2048", help="context per sequence (--max-model-len)")
    p.add_argument("--warmup-fraction", type=float, default=0.2, help="share of the run before RSS must be flat")
    p.add_argument("--rss-slack-mib", type=float, default=16.0)
    p.add_argument("--seed", type=int, default=20)
    p.add_argument("--json", help="write the figures here as JSON")
    args = p.parse_args()
    args.duration_s = args.minutes * 60 if args.minutes is not None else (args.seconds or 60.0)
    return args


class Tally:
    """What the clients sent and saw, shared by the worker threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_status: collections.Counter[int] = collections.Counter()
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.transport_errors: list[str] = []

    def add(self, kind: str, status: int) -> None:
        with self.lock:
            self.by_status[status] += 1
            self.by_kind[kind] += 1

    def error(self, kind: str, what: str) -> None:
        with self.lock:
            self.by_kind[kind + ":transport_error"] += 1
            if len(self.transport_errors) < 20:
                self.transport_errors.append(f"{kind}: {what}")


class Client:
    """One request per connection (Connection: close), so every socket is the server's to close."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.key = key

    def post(self, path: str, body: bytes | str, key: str | None = None, read: bool = True):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        headers = {"Content-Type": "application/json", "Connection": "close",
                   "Authorization": f"Bearer {key or self.key}"}
        conn.request("POST", path, body=body if isinstance(body, bytes) else body.encode(), headers=headers)
        resp = conn.getresponse()
        if read:
            resp.read()
            conn.close()
            return resp.status, None
        return resp.status, (conn, resp)


LONG_PROMPT = " ".join(
    f"Paragraph {i}: the quick brown fox jumps over the lazy dog while the engine counts blocks."
    for i in range(60))  # about 1200 tokens


def one_request(client: Client, rng: random.Random, tally: Tally) -> None:
    kind = rng.choices(["stream_chat", "n_completion", "long_prompt", "disconnect", "bad"],
                       weights=[30, 20, 10, 15, 25])[0]
    try:
        if kind == "stream_chat":
            body = {"model": MODEL_NAME, "stream": True, "max_tokens": rng.randint(4, 32),
                    "messages": [{"role": "user", "content": f"Count to {rng.randint(3, 30)}."}]}
            status, (conn, resp) = client.post("/v1/chat/completions", json.dumps(body), read=False)
            resp.read()  # the whole event stream
            conn.close()
        elif kind == "n_completion":
            body = {"model": MODEL_NAME, "prompt": "Once upon a time", "n": rng.randint(2, 4),
                    "max_tokens": rng.randint(4, 24), "temperature": 0.8, "seed": rng.randint(0, 1 << 30)}
            status, _ = client.post("/v1/completions", json.dumps(body))
        elif kind == "long_prompt":
            body = {"model": MODEL_NAME, "prompt": LONG_PROMPT[: rng.randint(2000, len(LONG_PROMPT))], "max_tokens": 8}
            status, _ = client.post("/v1/completions", json.dumps(body))
        elif kind == "disconnect":
            body = {"model": MODEL_NAME, "stream": True, "max_tokens": 200, "n": rng.randint(1, 2),
                    "messages": [{"role": "user", "content": "Tell me a very long story."}]}
            status, (conn, resp) = client.post("/v1/chat/completions", json.dumps(body), read=False)
            resp.readline()  # the first event line, then hang up mid-stream
            if conn.sock:
                conn.sock.shutdown(2)  # both directions, as a client that dies does
            conn.close()
        else:
            kind, status = bad_request(client, rng)
        tally.add(kind, status)
    except (OSError, http.client.HTTPException) as e:
        tally.error(kind, repr(e))


def bad_request(client: Client, rng: random.Random) -> tuple[str, int]:
    """Requests the server must refuse with a 4xx and survive."""
    choice = rng.randrange(6)
    if choice == 0:
        return "bad_json", client.post("/v1/completions", b'{"prompt": "unterminated')[0]
    if choice == 1:
        return "bad_max_tokens", client.post("/v1/completions", json.dumps({"prompt": "x", "max_tokens": -3}))[0]
    if choice == 2:
        return "bad_n", client.post("/v1/completions", json.dumps({"prompt": "x", "n": 0}))[0]
    if choice == 3:
        return "bad_messages", client.post("/v1/chat/completions", json.dumps({"messages": "not a list"}))[0]
    if choice == 4:
        return "bad_key", client.post("/v1/completions", json.dumps({"prompt": "x"}), key="not-a-key")[0]
    return "bad_utf8", client.post("/v1/completions", b'{"prompt": "\xff\xfe bad bytes"}')[0]


def greedy_tenant(port: int, stop: threading.Event, tally: Tally, rng: random.Random) -> None:
    """Bursts of 4 concurrent requests against a quota of 2 in flight: some must get 429."""
    client = Client(port, QUOTA_KEY)
    while not stop.is_set():
        burst = []
        for _ in range(4):
            t = threading.Thread(target=lambda: quota_request(client, rng.randint(8, 24), tally))
            t.start()
            burst.append(t)
        for t in burst:
            t.join()
        stop.wait(1.0)


def quota_request(client: Client, max_tokens: int, tally: Tally) -> None:
    try:
        body = {"model": MODEL_NAME, "prompt": "The tenant asks again", "max_tokens": max_tokens}
        tally.add("over_quota", client.post("/v1/completions", json.dumps(body))[0])
    except (OSError, http.client.HTTPException) as e:
        tally.error("over_quota", repr(e))


def worker(port: int, key: str, stop: threading.Event, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    client = Client(port, key)
    while not stop.is_set():
        one_request(client, rng, tally)


def get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={"Connection": "close"})
    body = conn.getresponse().read().decode()
    conn.close()
    return body


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in get(port, "/metrics").splitlines():
        m = SAMPLE_RE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def metric(samples, name: str, **want: str) -> float:
    return sum(v for n, labels, v in samples if n == name and all(labels.get(k) == w for k, w in want.items()))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024  # VmRSS is in KiB
    return 0.0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_idle(port: int, timeout_s: float = 120) -> list:
    """Until nothing runs or waits and every request has been counted (disconnects finish late)."""
    deadline = time.monotonic() + timeout_s
    samples = scrape(port)
    while time.monotonic() < deadline:
        samples = scrape(port)
        if metric(samples, "vllm:num_requests_running") == 0 and metric(samples, "vllm:num_requests_waiting") == 0:
            time.sleep(1.0)  # a finished request is recorded just after it leaves the engine
            return scrape(port)
        time.sleep(0.5)
    return samples


def start_server(args) -> tuple[subprocess.Popen, int, list[str]]:
    keys = [f"soak-worker-{i}" for i in range(args.workers)] + [QUOTA_KEY]
    cmd = [args.binary, "serve", "--model", args.model, "--port", "0", "-t", str(args.threads),
           "--max-requests-per-tenant", "2", "--served-model-name", MODEL_NAME,
           "--kv-cache-memory", args.kv_cache_memory, "--max-model-len", args.max_model_len]
    for k in keys:
        cmd += ["--api-key", k]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[str] = []
    assert proc.stdout is not None
    first = proc.stdout.readline()
    lines.append(first)
    m = ADDRESS_RE.search(first)
    if not m:
        proc.kill()
        sys.exit(f"soak: `{' '.join(cmd)}` did not print its address; got: {first!r}")
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    port = int(m.group(1))
    for _ in range(240):
        try:
            # /ready, not /health: the listener opens before the model is loaded.
            if '"ready"' in get(port, "/ready"):
                break
        except OSError:
            pass
        time.sleep(0.5)
    return proc, port, lines


def main() -> int:
    args = parse_args()
    proc, port, server_lines = start_server(args)
    pid = proc.pid
    idle_fds = fd_count(pid)
    tally = Tally()
    stop = threading.Event()
    threads = [threading.Thread(target=worker, args=(port, f"soak-worker-{i}", stop, tally, args.seed + i))
               for i in range(args.workers)]
    threads.append(threading.Thread(target=greedy_tenant, args=(port, stop, tally, random.Random(args.seed - 1))))
    start = time.monotonic()
    for t in threads:
        t.start()

    rss: list[tuple[float, float]] = []  # (seconds since start, MiB)
    interval = max(1.0, min(10.0, args.duration_s / 120))
    while time.monotonic() - start < args.duration_s and proc.poll() is None:
        rss.append((time.monotonic() - start, rss_mib(pid)))
        time.sleep(interval)
    stop.set()
    for t in threads:
        t.join()
    if proc.poll() is not None:
        print("".join(server_lines[-40:]), file=sys.stderr)
        print(f"soak: FAIL: the server exited with {proc.returncode} under load", file=sys.stderr)
        return 1

    samples = wait_idle(port)
    end_fds = fd_count(pid)
    for _ in range(20):  # closed sockets can take a moment to leave the table
        if end_fds <= idle_fds:
            break
        time.sleep(0.5)
        end_fds = fd_count(pid)
    rss.append((time.monotonic() - start, rss_mib(pid)))

    checks: dict[str, tuple[bool, str]] = {}
    warm_end = args.duration_s * args.warmup_fraction
    warm = [m for t, m in rss if t <= warm_end] or [rss[0][1]]
    tail = [m for t, m in rss if t >= args.duration_s * 0.75] or [rss[-1][1]]
    slack = max(args.rss_slack_mib, 0.05 * max(warm))
    checks["rss"] = (max(tail) <= max(warm) + slack,
                     f"warm-up peak {max(warm):.1f} MiB, last-quarter peak {max(tail):.1f} MiB, slack {slack:.1f} MiB")
    checks["fds"] = (end_fds <= idle_fds, f"{idle_fds} open after start-up, {end_fds} at the end")
    kv_usage = metric(samples, "vllm:kv_cache_usage_perc")
    running = metric(samples, "vllm:num_requests_running") + metric(samples, "vllm:num_requests_waiting")
    checks["kv"] = (kv_usage == 0 and running == 0, f"kv_cache_usage_perc {kv_usage}, running+waiting {running}")

    served = metric(samples, "vllm:request_success_total")
    mismatches = []
    if served != tally.by_status.get(200, 0):
        mismatches.append(f"200: clients {tally.by_status.get(200, 0)}, request_success_total {served:.0f}")
    for status, count in sorted(tally.by_status.items()):
        if status == 200:
            continue
        counted = metric(samples, "tessera:requests_rejected_total", status=str(status))
        if counted != count:
            mismatches.append(f"{status}: clients {count}, requests_rejected_total {counted:.0f}")
    rejected_total = metric(samples, "tessera:requests_rejected_total")
    extra = rejected_total - sum(c for s, c in tally.by_status.items() if s != 200)
    if extra:
        mismatches.append(f"{extra:.0f} rejections counted under statuses no client saw")
    if tally.transport_errors:
        mismatches.append(f"transport errors: {tally.transport_errors[:3]}")
    sent = sum(tally.by_status.values())
    checks["counts"] = (not mismatches, "; ".join(mismatches) or
                        f"{sent} sent = {served:.0f} finished + {rejected_total:.0f} refused")
    if not tally.by_status.get(429):
        checks["quota"] = (False, "the greedy tenant was never refused with 429")

    proc.send_signal(signal.SIGTERM)
    exit_code = proc.wait(timeout=120)
    checks["exit"] = (exit_code == 0, f"exit status {exit_code} after SIGTERM")

    finish = {labels.get("finished_reason"): int(v) for n, labels, v in samples if n == "vllm:request_success_total"}
    report = {
        "duration_s": round(time.monotonic() - start, 1),
        "requests_sent": sent,
        "by_status": {str(k): v for k, v in sorted(tally.by_status.items())},
        "by_kind": dict(sorted(tally.by_kind.items())),
        "finished_by_reason": finish,
        "refused_by_status_reason": {f"{labels.get('status')} {labels.get('reason')}": int(v)
                                     for n, labels, v in samples if n == "tessera:requests_rejected_total"},
        "generation_tokens": int(metric(samples, "vllm:generation_tokens_total")),
        "prompt_tokens": int(metric(samples, "vllm:prompt_tokens_total")),
        "rss_mib": {"start": round(rss[0][1], 1), "warmup_peak": round(max(warm), 1),
                    "last_quarter_peak": round(max(tail), 1), "end": round(rss[-1][1], 1)},
        "fds": {"after_startup": idle_fds, "end": end_fds},
        "rss_series_mib": [[round(t), round(m, 1)] for t, m in rss],
        "checks": {k: {"ok": ok, "detail": d} for k, (ok, d) in checks.items()},
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    failed = [k for k, (ok, _) in checks.items() if not ok]
    for k in failed:
        print(f"soak: FAIL {k}: {checks[k][1]}", file=sys.stderr)
    if not failed:
        print(f"soak: PASS ({sent} requests in {report['duration_s']} s)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
