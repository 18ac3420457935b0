"""--api-key: 401 without or with a wrong key (before the body is read), service with any
configured key, and no prefix-cache sharing between keys."""

from __future__ import annotations

import time

import pytest
import requests

from conftest import assert_openai_error, start_server, stop_and_check
from http_raw import connect, read_response
from test_metrics import sample_value, wait_idle

KEY_A = "sk-tessera-test-a"
KEY_B = "sk-tessera-test-b"


@pytest.fixture(scope="module")
def keyed_server():
    s = start_server("--api-key", KEY_A, "--api-key", KEY_B)
    yield s
    stop_and_check(s)


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def model_of(server) -> str:
    r = requests.get(server.url("/v1/models"), headers=auth(KEY_A), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["id"]


def test_missing_or_wrong_key_is_401(keyed_server):
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    url = keyed_server.url("/v1/chat/completions")
    assert_openai_error(requests.post(url, json=body, timeout=10), 401)
    assert_openai_error(requests.post(url, json=body, headers=auth("sk-wrong"), timeout=10), 401)
    assert_openai_error(requests.post(url, json=body, headers=auth(KEY_A + "x"), timeout=10), 401)
    assert_openai_error(requests.post(url, json=body, headers=auth(KEY_A[:-1]), timeout=10), 401)
    assert_openai_error(requests.post(url, json=body, headers={"Authorization": KEY_A}, timeout=10), 401)
    assert_openai_error(requests.get(keyed_server.url("/v1/models"), timeout=10), 401)


def test_401_comes_before_the_body(keyed_server):
    # Announce a large body and send none of it: the refusal needs only the headers.
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n")
    started = time.monotonic()
    with connect(keyed_server.port, timeout=10) as sock:
        sock.sendall(head)
        response = read_response(sock)
    assert response.status == 401
    assert time.monotonic() - started < 5


def test_both_keys_work_with_the_openai_client(keyed_server):
    import openai

    model = model_of(keyed_server)
    for key in (KEY_A, KEY_B):
        client = openai.OpenAI(base_url=keyed_server.url("/v1"), api_key=key, max_retries=0, timeout=60)
        resp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=2)
        assert resp.usage.completion_tokens >= 1
    bad = openai.OpenAI(base_url=keyed_server.url("/v1"), api_key="sk-nope", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)


def test_keys_do_not_share_the_prefix_cache(keyed_server):
    model = model_of(keyed_server)
    # Long enough to fill several KV blocks, so a shared prefix would show as hits.
    prompt = "Tenant secret context: " + " ".join(f"item{i}" for i in range(120))

    def run(key):
        r = requests.post(keyed_server.url("/v1/completions"), headers=auth(key), timeout=60,
                          json={"model": model, "prompt": prompt, "max_tokens": 1})
        assert r.status_code == 200, r.text
        families = wait_idle(keyed_server, headers=auth(KEY_A))
        return sample_value(families, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")

    hits_after_a = run(KEY_A)
    hits_after_b = run(KEY_B)
    assert hits_after_b == hits_after_a, "key B hit the blocks key A cached"
    hits_after_a_again = run(KEY_A)
    assert hits_after_a_again > hits_after_b, "the same key should hit its own cached prefix"
