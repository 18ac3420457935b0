"""200 streaming requests over raw sockets, most dropped at random points (while sending,
before the first byte back, mid-stream; closed or reset). Afterwards nothing runs, nothing
waits, and the KV cache is empty; the requests read to the end were whole."""

from __future__ import annotations

import json
import random
import socket
import struct
from concurrent.futures import ThreadPoolExecutor

import requests

from http_raw import read_response
from test_metrics import sample_value, scrape, wait_idle

N_REQUESTS = 200
CONCURRENCY = 16
TOPICS = ["the sea", "a mountain", "bread", "the moon", "a river", "winter", "a city at night", "a small dog"]


def request_bytes(port: int, model: str, rng: random.Random) -> bytes:
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": f"Write one sentence about {rng.choice(TOPICS)}."}],
        "max_tokens": 10,
        "temperature": 0.8,
        "seed": rng.randrange(1 << 30),
        "stream": True,
    }).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def one_client(port: int, model: str, seed: int) -> str:
    """Runs one client to its planned end; returns what happened."""
    rng = random.Random(seed)
    data = request_bytes(port, model, rng)
    plan = rng.random()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        if rng.random() < 0.5:
            # Reset instead of a clean close: SO_LINGER with a zero timeout sends RST.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if plan < 0.05:
            sock.sendall(data[: rng.randrange(1, len(data))])  # gone while sending the request
            return "dropped-sending"
        sock.sendall(data)
        if plan < 0.15:
            return "dropped-before-reading"  # gone before the first byte back (often mid-prefill)
        if plan < 0.90:
            budget = rng.randrange(1, 1500)  # gone somewhere mid-stream
            received = 0
            while received < budget:
                chunk = sock.recv(min(512, budget - received))
                if not chunk:
                    break
                received += len(chunk)
            return "dropped-mid-stream"
        response = read_response(sock)
        assert response.status == 200, response.body[:300]
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [e for e in response.body.decode("utf-8").split("\n\n") if e]
        assert events[-1] == "data: [DONE]", events[-3:]
        finishes = [json.loads(e[len("data: "):])["choices"][0].get("finish_reason") for e in events[:-1]]
        assert finishes[-1] in ("stop", "length"), finishes
        return "complete"
    finally:
        sock.close()


def test_dropped_streams_leave_nothing_behind(server, model_id):
    before = scrape(server)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        outcomes = list(pool.map(lambda i: one_client(server.port, model_id, 1000 + i), range(N_REQUESTS)))
    assert outcomes.count("complete") >= 5
    assert outcomes.count("dropped-mid-stream") >= 100

    after = wait_idle(server, timeout_s=30)
    assert sample_value(after, "vllm:num_requests_running", "vllm:num_requests_running") == 0
    assert sample_value(after, "vllm:num_requests_waiting", "vllm:num_requests_waiting") == 0
    assert sample_value(after, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc") == 0
    aborted = (sample_value(after, "vllm:request_success", "vllm:request_success_total", finished_reason="abort")
               - sample_value(before, "vllm:request_success", "vllm:request_success_total", finished_reason="abort"))
    assert aborted >= 1, "dropped streams should end as aborted requests"

    # And the server still serves.
    assert requests.get(server.url("/health"), timeout=10).status_code == 200
    r = requests.post(server.url("/v1/chat/completions"), timeout=60, json={
        "model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
