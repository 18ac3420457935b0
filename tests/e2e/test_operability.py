"""Operability and honesty of the server (issue 20): HEAD, /version, /metrics behind a key,
tool calling refused through the official openai client, stop_reason, the access log, and
/health and /ready answering 503 (not a refused connection) while draining."""

from __future__ import annotations

import json
import re
import signal
import socket
import time

import openai
import pytest
import requests

from conftest import assert_openai_error, start_server, stop_and_check
from http_raw import connect


def test_head_works_on_get_routes_without_a_body(server):
    for path in ("/health", "/ready", "/version", "/metrics", "/v1/models"):
        r = requests.head(server.url(path), timeout=10)
        assert r.status_code == 200, path
        assert r.content == b"", path
        assert int(r.headers["Content-Length"]) > 0, path  # what GET would send


def test_version_names_the_build(server):
    r = requests.get(server.url("/version"), timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert re.fullmatch(r"\d+\.\d+\.\d+", body["version"]), body
    assert body["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", body["git_commit"]), body


@pytest.mark.parametrize("field,value", [
    ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
    ("function_call", "auto"),
])
def test_legacy_function_calling_is_refused_by_name(openai_client, model_id, field, value):
    """The deprecated functions/function_call are refused, never ignored (tools: test_tool_calling.py)."""
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=2, **{field: value})
    assert e.value.status_code == 400
    assert e.value.body["code"] == "unsupported_parameter", e.value.body
    assert e.value.body["param"] == field, e.value.body


def test_stop_reason_is_in_every_choice(openai_client, model_id, server):
    plain = openai_client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8,
                                             temperature=0, extra_body={"ignore_eos": True})
    text = plain.choices[0].text
    assert plain.choices[0].model_extra["stop_reason"] is None  # length
    stop = text[len(text) // 2:len(text) // 2 + 2]
    r = requests.post(server.url("/v1/completions"), timeout=60, json={
        "model": model_id, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
        "ignore_eos": True, "stop": [stop]})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert choice["stop_reason"] == stop, choice


def test_metrics_require_key_and_access_log():
    server = start_server("--api-key", "sk-e2e-secret", "--metrics-require-key")
    try:
        assert_openai_error(requests.get(server.url("/metrics"), timeout=10), 401)
        auth = {"Authorization": "Bearer sk-e2e-secret"}
        assert requests.get(server.url("/metrics"), headers=auth, timeout=10).status_code == 200
        assert requests.get(server.url("/health"), timeout=10).status_code == 200
        model = requests.get(server.url("/v1/models"), headers=auth, timeout=10).json()["data"][0]["id"]
        r = requests.post(server.url("/v1/completions"), headers=auth, timeout=60,
                          json={"model": model, "prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200, r.text
        request_id = r.json()["id"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and request_id not in server.output():
            time.sleep(0.05)
        lines = [line for line in server.output().splitlines() if f"id={request_id}" in line]
        assert len(lines) == 1, server.output()[-2000:]
        line = lines[0]
        assert re.search(r"tenant=key-[0-9a-f]{12} status=200 finish=length prompt_tokens=\d+ output_tokens=3 "
                         r"cached_tokens=\d+ ttft_ms=[\d.]+ e2e_ms=[\d.]+$", line), line
        assert "sk-e2e-secret" not in server.output()
    finally:
        stop_and_check(server)


def test_disable_log_requests_writes_no_access_line():
    server = start_server("--disable-log-requests")
    try:
        model = requests.get(server.url("/v1/models"), timeout=10).json()["data"][0]["id"]
        r = requests.post(server.url("/v1/completions"), timeout=60,
                          json={"model": model, "prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 200, r.text
        time.sleep(0.2)
        assert "tessera: request id=" not in server.output()
    finally:
        stop_and_check(server)


def test_draining_answers_503_on_health_and_ready_with_the_listener_open():
    server = start_server("--drain-timeout", "30")
    try:
        model = requests.get(server.url("/v1/models"), timeout=10).json()["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": "Count:", "max_tokens": 200, "ignore_eos": True,
                           "stream": True}).encode()
        sock = connect(server.port, timeout=60)
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        sock.settimeout(60)
        assert sock.recv(4096, socket.MSG_PEEK).startswith(b"HTTP/1.1 200")
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        for path in ("/health", "/ready"):
            error = assert_openai_error(requests.get(server.url(path), timeout=10), 503)
            assert error["code"] == "server_draining", error
        sock.close()
    finally:
        code = server.stop()
    assert code == 0, server.output()[-4000:]


def test_per_tenant_limit_counts_sequences_not_requests():
    server = start_server("--max-requests-per-tenant", "2")
    try:
        model = requests.get(server.url("/v1/models"), timeout=10).json()["data"][0]["id"]
        # n = 3 alone is more than a tenant may ever have in flight: 400, not a retry-later 429.
        r = requests.post(server.url("/v1/completions"), timeout=60,
                          json={"model": model, "prompt": "Hi", "max_tokens": 2, "n": 3})
        error = assert_openai_error(r, 400)
        assert "3 sequences" in error["message"], error
        r = requests.post(server.url("/v1/completions"), timeout=60,
                          json={"model": model, "prompt": "Hi", "max_tokens": 2, "n": 2})
        assert r.status_code == 200, r.text
    finally:
        stop_and_check(server)
