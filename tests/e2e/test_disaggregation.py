"""Prefill/decode disaggregation end to end (docs/design/disaggregation.md): a router in
front of one prefill and one decode worker, on CPU with SmolLM2.

Greedy outputs through the router equal the colocated server's (completions and chat,
streamed and not); the decode worker pulls the KV and never falls back while the prefill
worker is up; the tenant salt travels with the KV and is checked; a bad handle is a 400; a
handle nobody serves, or a prefill worker killed, still answers (local prefill, counted);
a decode worker killed is a 502 naming it. The workers share a --kv-transfer-secret-file: a
decode worker with another secret is refused by the prefill worker (counted there) and
prefills locally. Every worker's KV is free again at the end.
"""

from __future__ import annotations

import json
import time

import pytest
import requests
from conftest import assert_openai_error, start_server
from prometheus_client.parser import text_string_to_metric_families

KEYS = ("key-alpha", "key-beta")  # two tenants, on both workers
WORKER_ARGS = ("--api-key", KEYS[0], "--api-key", KEYS[1], "--kv-cache-memory", "64M", "--max-model-len", "2048",
               "--max-num-seqs", "4", "--max-num-batched-tokens", "128")  # a short warm-up
AUTH = {"Authorization": f"Bearer {KEYS[0]}"}
# Longer than one 16-token block, so the prefill worker leases at least one.
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
          "combined movable type with an oil-based ink and a screw press. In a few sentences,")
MESSAGES = [{"role": "user", "content": "Name three rivers of Europe and say one thing about each."}]
MAX_TOKENS = 8
MODEL = ""  # the served model's name (every server derives the same one from the file)


@pytest.fixture(scope="module", autouse=True)
def served_model_name(model_id):
    global MODEL
    MODEL = model_id


def scrape(server) -> dict:
    r = requests.get(server.url("/metrics"), timeout=10)
    assert r.status_code == 200, r.text
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(server, family: str, sample: str | None = None, **labels) -> float:
    """The one sample of `family` (name `sample`, default the family's) with these labels."""
    families = scrape(server)
    assert family in families, f"{server.base_url}/metrics has no {family}"
    name = sample or (family + "_total" if families[family].type == "counter" else family)
    found = [s.value for s in families[family].samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def wait_for(predicate, what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.05)


def kv_idle(server) -> bool:
    return (value(server, "vllm:kv_cache_usage_perc") == 0 and value(server, "tessera:kv_leased_blocks") == 0
            and value(server, "tessera:kv_import_reserved_blocks") == 0)


def secret_file(tmp_path_factory, text: str) -> str:
    path = tmp_path_factory.mktemp("secret") / "kv-secret"
    path.write_text(text + "\n")
    return str(path)


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    secret = ("--kv-transfer-secret-file", secret_file(tmp_path_factory, "e2e-shared-secret-0123456789"))
    prefill = start_server("--role", "prefill", "--kv-lease-seconds", "20", *secret, *WORKER_ARGS)
    decode = start_server("--role", "decode", "--kv-transfer-timeout", "5", *secret, *WORKER_ARGS)
    router = start_server("--role", "router", "--prefill", prefill.base_url, "--decode", decode.base_url)
    yield prefill, decode, router
    for s in (router, decode, prefill):
        s.stop()  # the tests kill some of them: the exit code is not checked here


def post(server, path: str, body: dict, headers=None, stream: bool = False) -> requests.Response:
    return requests.post(server.url(path), json=body, headers=headers if headers is not None else AUTH,
                         timeout=60, stream=stream)


def completion_text(server, endpoint: str, stream: bool, headers=None, **extra) -> str:
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream, **extra}
    if endpoint == "chat":
        body["messages"] = MESSAGES
        path = "/v1/chat/completions"
    else:
        body["prompt"] = PROMPT
        path = "/v1/completions"
    r = post(server, path, body, headers=headers, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        choice = r.json()["choices"][0]
        return choice["message"]["content"] if endpoint == "chat" else choice["text"]
    text, done = "", False
    for line in r.iter_lines(decode_unicode=True):
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            text += (c.get("delta", {}).get("content") or "") if endpoint == "chat" else c["text"]
    assert done, "the stream ended without [DONE]"
    return text


@pytest.fixture(scope="module")
def colocated_outputs(server) -> dict:
    """The greedy outputs of the shared colocated server (no API key)."""
    return {(e, s): completion_text(server, e, s, headers={}) for e in ("completions", "chat") for s in (False, True)}


def test_router_outputs_equal_colocated_and_the_decode_worker_pulls(workers, colocated_outputs):
    prefill, decode, router = workers
    for (endpoint, stream), expected in colocated_outputs.items():
        got = completion_text(router, endpoint, stream)
        assert got == expected, f"{endpoint} stream={stream}: router {got!r} != colocated {expected!r}"
    assert value(decode, "tessera:kv_transfer_pulls") == 4
    assert value(decode, "tessera:kv_transfer_fallbacks") == 0
    assert value(decode, "tessera:kv_imports", "tessera:kv_imports_total", outcome="imported") == 4
    wait_for(lambda: value(prefill, "tessera:kv_transfer_served") == 4, "the prefill worker served 4 pulls")
    sent = value(prefill, "tessera:kv_transfer_bytes", "tessera:kv_transfer_bytes_total", direction="sent")
    assert sent > 0 and sent == value(decode, "tessera:kv_transfer_bytes", "tessera:kv_transfer_bytes_total",
                                      direction="received")
    # A streamed decode is counted when the worker's connection ends, which may be just after the
    # client read the last event the router forwarded: wait for the counts, do not race them.
    for outcome, n in (("ok", 4), ("failed", 0)):
        wait_for(lambda: value(router, "tessera:router_prefills", "tessera:router_prefills_total",
                               worker=prefill.base_url, outcome=outcome) == n
                 and value(router, "tessera:router_decodes", "tessera:router_decodes_total",
                           worker=decode.base_url, outcome=outcome) == n,
                 f"the router counted {n} {outcome} prefills and decodes")
    # --router-policy load (the default): each request's prompt prefix kept its prefill worker,
    # and every call was counted out of flight.
    assert value(router, "tessera:router_prefix_affinity", "tessera:router_prefix_affinity_total", outcome="hit") == 4
    for worker, role in ((prefill.base_url, "prefill"), (decode.base_url, "decode")):
        assert value(router, "tessera:router_in_flight", worker=worker, role=role) == 0
    models = requests.get(router.url("/v1/models"), headers=AUTH, timeout=10)
    assert models.status_code == 200 and models.json()["data"][0]["id"], models.text
    wait_for(lambda: kv_idle(prefill) and kv_idle(decode), "every KV block free on both workers")


def test_prefill_worker_answers_a_handle(workers):
    prefill, _, _ = workers
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 50, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True}}
    r = post(prefill, "/v1/completions", body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["usage"]["completion_tokens"] == 1  # the first token only
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_block_count"] >= 1, params
    host_port, lease = params["remote_handle"].rsplit("/", 1)
    assert host_port.startswith("127.0.0.1:") and lease.isdigit(), params
    # Streaming is not a prefill worker's job: refused by name.
    assert_openai_error(post(prefill, "/v1/completions", {**body, "stream": True}), 400, "stream")
    # Nobody pulls this lease: it stays until it expires (20 s), so release it through a pull.
    decode_body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "kv_transfer_params": params}
    assert post(workers[1], "/v1/completions", decode_body).status_code == 200


def test_the_tenant_travels_with_the_kv(workers, colocated_outputs):
    prefill, decode, _ = workers
    r = post(prefill, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                          "temperature": 0, "kv_transfer_params": {"do_remote_decode": True}})
    assert r.status_code == 200, r.text
    params = r.json()["kv_transfer_params"]
    before = value(decode, "tessera:kv_transfer_fallbacks")
    # Another key is another tenant: the decode engine refuses the KV and prefills itself.
    other = {"Authorization": f"Bearer {KEYS[1]}"}
    got = post(decode, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
                                           "kv_transfer_params": params}, headers=other)
    assert got.status_code == 200, got.text
    assert got.json()["choices"][0]["text"] == colocated_outputs[("completions", False)]
    assert value(decode, "tessera:kv_transfer_fallbacks") == before + 1
    # The refused reservation is given back on a pull thread.
    wait_for(lambda: value(decode, "tessera:kv_imports", "tessera:kv_imports_total", outcome="cancelled") >= 1,
             "the refused import's reservation given back")


def test_bad_handles_are_400s_and_an_unserved_handle_falls_back(workers, colocated_outputs):
    _, decode, _ = workers
    base = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    bad = post(decode, "/v1/completions", {**base, "kv_transfer_params": {
        "do_remote_prefill": True, "remote_handle": "127.0.0.1/7", "remote_block_count": 2}})
    error = assert_openai_error(bad, 400, "kv_transfer_params.remote_handle")
    assert "host:port/id" in error["message"], error
    # A handle whose worker is gone (nothing listens on port 9): local prefill, counted.
    before = value(decode, "tessera:kv_transfer_fallbacks")
    gone = post(decode, "/v1/completions", {**base, "kv_transfer_params": {
        "do_remote_prefill": True, "remote_handle": "127.0.0.1:9/7", "remote_block_count": 2}})
    assert gone.status_code == 200, gone.text
    assert gone.json()["choices"][0]["text"] == colocated_outputs[("completions", False)]
    assert value(decode, "tessera:kv_transfer_fallbacks") == before + 1
    assert value(decode, "tessera:kv_transfer_pull_failures") >= 1


def test_a_decode_worker_with_another_secret_is_refused_and_prefills_locally(workers, colocated_outputs,
                                                                           tmp_path_factory):
    prefill, _, _ = workers
    other = start_server("--role", "decode", "--kv-transfer-timeout", "5", "--kv-transfer-secret-file",
                         secret_file(tmp_path_factory, "not-the-shared-secret-at-all"), *WORKER_ARGS)
    try:
        r = post(prefill, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                              "temperature": 0, "kv_transfer_params": {"do_remote_decode": True}})
        assert r.status_code == 200, r.text
        params = r.json()["kv_transfer_params"]
        before = value(prefill, "tessera:kv_transfer_unauthenticated")
        got = post(other, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                              "temperature": 0, "kv_transfer_params": params})
        assert got.status_code == 200, got.text
        assert got.json()["choices"][0]["text"] == colocated_outputs[("completions", False)]
        assert value(other, "tessera:kv_transfer_fallbacks") == 1
        wait_for(lambda: value(prefill, "tessera:kv_transfer_unauthenticated") == before + 1,
                 "the prefill worker counting the unauthenticated pull")
        # The lease was not served: the right decode worker can still pull it (releasing it).
        decode_body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0,
                       "kv_transfer_params": params}
        assert post(workers[1], "/v1/completions", decode_body).status_code == 200
        wait_for(lambda: kv_idle(other), "the refused worker's KV free")
    finally:
        other.stop()


def test_prefill_worker_killed_requests_prefill_locally(workers, colocated_outputs):
    prefill, decode, router = workers
    wait_for(lambda: kv_idle(prefill), "the prefill worker's KV free before it is killed")
    fallbacks = value(decode, "tessera:kv_transfer_fallbacks")
    prefill.process.kill()
    prefill.process.wait(timeout=30)
    assert completion_text(router, "chat", True) == colocated_outputs[("chat", True)]
    assert value(router, "tessera:router_prefills", "tessera:router_prefills_total", worker=prefill.base_url,
                 outcome="failed") == 1
    assert value(router, "tessera:router_local_prefills") == 1
    assert value(router, "tessera:router_in_flight", worker=prefill.base_url, role="prefill") == 0
    assert value(decode, "tessera:kv_transfer_fallbacks") == fallbacks  # no handle: not a failed pull


def test_decode_worker_killed_is_a_502_naming_it(workers):
    _, decode, router = workers
    wait_for(lambda: kv_idle(decode), "the decode worker's KV free before it is killed")
    decode.process.kill()
    decode.process.wait(timeout=30)
    r = post(router, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 4})
    error = assert_openai_error(r, 502)
    assert decode.base_url in error["message"], error
    assert value(router, "tessera:router_decodes", "tessera:router_decodes_total", worker=decode.base_url,
                 outcome="failed") == 1
    assert value(router, "tessera:router_in_flight", worker=decode.base_url, role="decode") == 0
