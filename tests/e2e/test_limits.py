"""Context limit, scheduling policy and operability flags of `tessera serve` (issue 20):
--max-model-len (alias --ctx) reaches the engine and /tokenize, a request over it is a 400
naming both numbers, the `priority` field needs --scheduling-policy priority, --swap-space
without swap preemption and a KV pool smaller than one sequence stop the start with a clear
message, and the start-up summary and the periodic stats line are printed."""

from __future__ import annotations

import subprocess
import time

import pytest
import requests

from conftest import assert_openai_error, model_path, start_server, stop_and_check, tessera_binary, tokenize


def run_to_exit(*args: str) -> subprocess.CompletedProcess:
    if not model_path().exists():
        pytest.skip(f"model file missing: {model_path()} (make model)")
    cmd = [str(tessera_binary()), "serve", "--model", str(model_path()), "--port", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def limited_server():
    s = start_server("--ctx", "1024", "--scheduling-policy", "priority", "--log-stats-interval", "0.5")
    yield s
    stop_and_check(s)


def model_of(server) -> str:
    return requests.get(server.url("/v1/models"), timeout=10).json()["data"][0]["id"]


def test_summary_and_context_limit(limited_server):
    model = model_of(limited_server)
    assert tokenize(limited_server, model, prompt="x")["max_model_len"] == 1024
    out = limited_server.output()
    assert "max 1024 tokens per sequence" in out, out
    assert "tessera: KV cache" in out and "policy priority" in out, out
    r = requests.post(limited_server.url("/v1/completions"), timeout=30,
                      json={"model": model, "prompt": [100] * 1000, "max_tokens": 30})
    error = assert_openai_error(r, 400)
    assert "1030" in error["message"] and "1024" in error["message"], error


def test_priority_is_taken_under_the_priority_policy(limited_server):
    model = model_of(limited_server)
    for priority in (-5, 0, 7):
        r = requests.post(limited_server.url("/v1/completions"), timeout=60,
                          json={"model": model, "prompt": "Hello", "max_tokens": 4, "priority": priority})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1


def test_stats_line_while_busy(limited_server):
    model = model_of(limited_server)
    r = requests.post(limited_server.url("/v1/completions"), timeout=60,
                      json={"model": model, "prompt": "Count to ten:", "max_tokens": 24, "ignore_eos": True})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "generation throughput" not in limited_server.output():
        time.sleep(0.1)
    out = limited_server.output()
    assert "generation throughput" in out and "KV cache usage" in out and "prefix cache hit rate" in out, out


def test_priority_is_refused_under_fcfs(server, model_id):
    r = requests.post(server.url("/v1/completions"), timeout=30,
                      json={"model": model_id, "prompt": "Hello", "max_tokens": 2, "priority": 1})
    error = assert_openai_error(r, 400)
    assert "--scheduling-policy priority" in error["message"], error
    r = requests.post(server.url("/v1/completions"), timeout=30,
                      json={"model": model_id, "prompt": "Hello", "max_tokens": 2, "priority": 0})
    assert r.status_code == 200, r.text


def test_swap_space_without_swap_mode_stops_the_start():
    p = run_to_exit("--swap-space", "2")
    assert p.returncode != 0
    assert "--swap-space" in p.stderr and "--preemption-mode swap" in p.stderr, p.stderr


def test_kv_pool_smaller_than_one_sequence_stops_the_start():
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K, V) x f16 = 23,040 bytes a token, so
    # 1 MiB holds 2 blocks of 16 tokens, far below the trained context of 8,192.
    p = run_to_exit("--kv-cache-memory", "1M")
    assert p.returncode != 0
    assert "holds 32 tokens" in p.stderr and "lower --max-model-len to at most 33" in p.stderr, p.stderr
    assert "--kv-cache-memory" in p.stderr, p.stderr
