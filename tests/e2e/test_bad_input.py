"""Every item of RELIABILITY.md's "HTTP" and "API semantics" lists against the real server:
the right status, an OpenAI-shaped error body naming the parameter, and afterwards the
server still answers /health and a normal request."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from conftest import assert_openai_error, tokenize
from http_raw import connect, exchange, post_bytes, read_response, send_until_answered

VOCAB_SIZE = 49152  # SmolLM2


def still_serving(server, model_id):
    assert server.alive(), server.output()[-3000:]
    assert requests.get(server.url("/health"), timeout=10).status_code == 200
    r = requests.post(server.url("/v1/chat/completions"), timeout=60, json={
        "model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] in ("stop", "length"), body
    assert body["usage"]["completion_tokens"] <= 1, body


def chat_body(model_id, **overrides):
    body = {"model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    body.update(overrides)
    return body


# (id, overrides of a valid chat body, the parameter the error must name)
CHAT_CASES = [
    ("n-bool", {"n": True}, "n"),
    ("n-zero", {"n": 0}, "n"),
    ("n-negative", {"n": -1}, "n"),
    ("n-huge", {"n": 1_000_000_000}, "n"),
    ("max-tokens-string", {"max_tokens": "10"}, "max_tokens"),
    ("max-tokens-zero", {"max_tokens": 0}, "max_tokens"),
    ("max-tokens-negative", {"max_tokens": -5}, "max_tokens"),
    ("max-tokens-2^63", {"max_tokens": 2**63}, "max_tokens"),
    ("max-tokens-fraction", {"max_tokens": 10.5}, "max_tokens"),
    ("max-completion-tokens-negative", {"max_completion_tokens": -1}, "max_completion_tokens"),
    ("messages-string", {"messages": "x"}, "messages"),
    ("messages-empty", {"messages": []}, "messages"),
    ("messages-not-objects", {"messages": [1, 2]}, "messages"),
    ("temperature-negative", {"temperature": -0.5}, "temperature"),
    ("temperature-too-high", {"temperature": 2.5}, "temperature"),
    ("temperature-string", {"temperature": "hot"}, "temperature"),
    ("top-p-negative", {"top_p": -0.1}, "top_p"),
    ("top-p-over-one", {"top_p": 1.5}, "top_p"),
    ("top-k-negative", {"top_k": -5}, "top_k"),
    ("top-k-fraction", {"top_k": 1.5}, "top_k"),
    ("min-p-over-one", {"min_p": 1.5}, "min_p"),
    ("presence-penalty-range", {"presence_penalty": 3}, "presence_penalty"),
    ("frequency-penalty-range", {"frequency_penalty": -3}, "frequency_penalty"),
    ("repetition-penalty-zero", {"repetition_penalty": 0}, "repetition_penalty"),
    ("logit-bias-id-out-of-range", {"logit_bias": {str(VOCAB_SIZE + 10): 1}}, "logit_bias"),
    ("logit-bias-negative-id", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("logit-bias-non-numeric-key", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("logit-bias-huge-value", {"logit_bias": {"5": 1e6}}, "logit_bias"),
    ("logit-bias-too-many", {"logit_bias": {str(i): 1 for i in range(VOCAB_SIZE)}}, "logit_bias"),
    ("stop-thousands", {"stop": [f"s{i}" for i in range(5000)]}, "stop"),
    ("stop-megabyte", {"stop": "x" * (1 << 20)}, "stop"),
    ("stop-wrong-type", {"stop": 5}, "stop"),
    ("stop-token-ids-out-of-range", {"stop_token_ids": [VOCAB_SIZE + 1]}, "stop_token_ids"),
    ("stop-token-ids-negative", {"stop_token_ids": [-1]}, "stop_token_ids"),
    ("seed-string", {"seed": "abc"}, "seed"),
    ("top-logprobs-too-many", {"logprobs": True, "top_logprobs": 1000}, "top_logprobs"),
    ("stream-not-bool", {"stream": "yes"}, "stream"),
]


@pytest.mark.parametrize("overrides,param", [c[1:] for c in CHAT_CASES], ids=[c[0] for c in CHAT_CASES])
def test_chat_parameter_errors(server, model_id, overrides, param):
    started = time.monotonic()
    r = requests.post(server.url("/v1/chat/completions"), json=chat_body(model_id, **overrides), timeout=30)
    assert_openai_error(r, 400, param)
    assert time.monotonic() - started < 5, "a refusal must not wait for the engine"
    still_serving(server, model_id)


# Bodies JSON cannot spell from Python: literal NaN, Infinity, overflowing numbers. A server
# may refuse them as malformed JSON (param null) or name the field.
RAW_CASES = [
    ("max-tokens-1e400", '"max_tokens": 1e400', "max_tokens"),
    ("temperature-nan", '"temperature": NaN', "temperature"),
    ("temperature-infinity", '"temperature": Infinity', "temperature"),
    ("top-p-minus-infinity", '"top_p": -Infinity', "top_p"),
    ("temperature-1e400", '"temperature": 1e400', "temperature"),
]


@pytest.mark.parametrize("fragment,param", [c[1:] for c in RAW_CASES], ids=[c[0] for c in RAW_CASES])
def test_non_finite_numbers(server, model_id, fragment, param):
    body = '{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], %s}' % (model_id, fragment)
    r = requests.post(server.url("/v1/chat/completions"), data=body.encode(), timeout=30,
                      headers={"Content-Type": "application/json"})
    assert_openai_error(r, 400, params=(param, None))
    still_serving(server, model_id)


def test_malformed_json(server, model_id):
    for body in (b"{", b"not json", b'{"model": 1,}', b"", b"[]"):
        r = requests.post(server.url("/v1/chat/completions"), data=body, timeout=30,
                          headers={"Content-Type": "application/json"})
        assert_openai_error(r, 400)
    still_serving(server, model_id)


def test_deeply_nested_json_is_refused_fast(server, model_id):
    depth = 100_000
    body = ('{"model": "m", "messages": ' + "[" * depth + "]" * depth + "}").encode()
    started = time.monotonic()
    r = requests.post(server.url("/v1/chat/completions"), data=body, timeout=30,
                      headers={"Content-Type": "application/json"})
    assert_openai_error(r, 400)
    assert time.monotonic() - started < 2
    still_serving(server, model_id)


@pytest.mark.parametrize("content", [b'"caf\xc3\xa9 \xff\xfe broken"', b'"\\ud800 lone surrogate"',
                                     b'"nul \\u0000 inside"'], ids=["invalid-utf8", "lone-surrogate", "nul"])
def test_unusual_text_is_refused_or_answered(server, model_id, content):
    # RELIABILITY.md allows a 400 or a documented replacement; never a 500 or a crash.
    body = b'{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": %s}]}' % (
        model_id.encode(), content)
    r = requests.post(server.url("/v1/chat/completions"), data=body, timeout=60,
                      headers={"Content-Type": "application/json"})
    if r.status_code == 400:
        assert_openai_error(r, 400, params=("messages", None))
    else:
        assert r.status_code == 200, r.text
        json.dumps(r.json(), ensure_ascii=False).encode("utf-8")  # the answer is valid UTF-8
    still_serving(server, model_id)


def test_prompt_plus_max_tokens_over_context(server, model_id):
    messages = [{"role": "user", "content": "Hi"}]
    info = tokenize(server, model_id, messages=messages, add_generation_prompt=True)
    n_prompt, max_model_len = info["count"], info["max_model_len"]
    max_tokens = max_model_len  # with any prompt, over the context
    r = requests.post(server.url("/v1/chat/completions"), timeout=30,
                      json=chat_body(model_id, messages=messages, max_tokens=max_tokens, stream=True))
    error = assert_openai_error(r, 400, params=("max_tokens", "messages", None))
    assert str(max_tokens) in error["message"] and str(n_prompt) in error["message"], error
    still_serving(server, model_id)


def test_prompt_larger_than_the_context(server, model_id):
    max_model_len = tokenize(server, model_id, prompt="x")["max_model_len"]
    r = requests.post(server.url("/v1/completions"), timeout=30,
                      json={"model": model_id, "prompt": [100] * (max_model_len + 10), "max_tokens": 1})
    assert_openai_error(r, 400, params=("prompt", "max_tokens", None))
    still_serving(server, model_id)


COMPLETION_CASES = [
    ("token-id-at-vocab-size", {"prompt": [1, VOCAB_SIZE]}, "prompt"),
    ("token-id-negative", {"prompt": [5, -1]}, "prompt"),
    ("token-id-huge", {"prompt": [2**40]}, "prompt"),
    ("token-ids-nested-out-of-range", {"prompt": [[1, 2], [VOCAB_SIZE * 2]]}, "prompt"),
    ("prompt-empty-list", {"prompt": []}, "prompt"),
    ("prompt-wrong-type", {"prompt": {"text": "x"}}, "prompt"),
    ("logprobs-negative", {"prompt": "Hi", "logprobs": -1}, "logprobs"),
    ("echo-not-bool", {"prompt": "Hi", "echo": "yes"}, "echo"),
]


@pytest.mark.parametrize("body,param", [c[1:] for c in COMPLETION_CASES], ids=[c[0] for c in COMPLETION_CASES])
def test_completion_parameter_errors(server, model_id, body, param):
    r = requests.post(server.url("/v1/completions"), timeout=30, json={"model": model_id, "max_tokens": 2, **body})
    assert_openai_error(r, 400, param)
    still_serving(server, model_id)


def test_empty_prompt_is_refused_or_answered(server, model_id):
    r = requests.post(server.url("/v1/completions"), timeout=60, json={"model": model_id, "prompt": "",
                                                                       "max_tokens": 2})
    if r.status_code == 400:
        assert_openai_error(r, 400, "prompt")
    else:
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] is not None
    still_serving(server, model_id)


def test_user_text_spelling_special_tokens_stays_text(server, model_id):
    def prompt_tokens(text):
        r = requests.post(server.url("/v1/chat/completions"), timeout=60, json=chat_body(
            model_id, messages=[{"role": "user", "content": text}], max_tokens=1))
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    # As one special token the marker would add 1; as text it is several pieces (<, |, im, ...).
    added = prompt_tokens("Hello <|im_start|>") - prompt_tokens("Hello")
    assert added >= 3, f"'<|im_start|>' in user text became {added} token(s)"
    still_serving(server, model_id)


def test_unknown_model_and_route(server, model_id):
    r = requests.post(server.url("/v1/chat/completions"), json=chat_body("no-such-model"), timeout=30)
    assert_openai_error(r, 404, params=("model", None))
    r = requests.get(server.url("/v1/no-such-route"), timeout=30)
    assert r.status_code == 404
    r = requests.get(server.url("/v1/chat/completions"), timeout=30)
    assert r.status_code in (404, 405)
    still_serving(server, model_id)


# --- HTTP framing and limits, over raw sockets ------------------------------------------


def test_content_length_and_transfer_encoding_together(server, model_id):
    body = json.dumps(chat_body(model_id)).encode()
    data = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n"
            f"{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"
    with connect(server.port) as sock:
        sock.sendall(data)
        response = read_response(sock)
        assert response.status == 400
        # ... and the connection is closed: nothing more is read from it.
        sock.settimeout(5)
        try:
            assert sock.recv(1) == b""
        except ConnectionResetError:
            pass
    still_serving(server, model_id)


@pytest.mark.parametrize("chunks", [b"zz\r\nabc\r\n0\r\n\r\n", b"ffffffffffffffffffff\r\nx\r\n0\r\n\r\n",
                                    b"5\r\nabcdefghij\r\n0\r\n\r\n", b"-5\r\nabc\r\n0\r\n\r\n"],
                         ids=["non-hex-size", "overflowing-size", "chunk-longer-than-size", "negative-size"])
def test_chunked_encoding_abuse(server, model_id, chunks):
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
    response = exchange(server.port, data)
    assert response.status in (400, 413)
    still_serving(server, model_id)


def test_oversized_body_is_refused_before_it_is_sent(server, model_id):
    # Claim 64 MiB and send none of it: the answer must come from the headers alone.
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {64 << 20}\r\n\r\n").encode()
    started = time.monotonic()
    response = exchange(server.port, head, timeout=10)
    assert response.status == 413
    assert time.monotonic() - started < 5
    still_serving(server, model_id)


def test_oversized_chunked_body(server, model_id):
    # No Content-Length to look at: the limit must hold while chunks arrive.
    piece = b"x" * (256 << 10)
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    with connect(server.port, timeout=30) as sock:
        response = send_until_answered(sock, [head] + [b"%x\r\n" % len(piece) + piece + b"\r\n"] * 256)
    assert response.status == 413
    still_serving(server, model_id)


def test_oversized_header(server, model_id):
    with connect(server.port) as sock:
        pieces = [b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: "] + [b"a" * 1024] * 64 + [b"\r\n\r\n"]
        response = send_until_answered(sock, pieces)
    assert response.status == 431
    still_serving(server, model_id)


def test_too_many_headers(server, model_id):
    # 1000 small headers, about 11 KB: under the size limit, over any sane count.
    with connect(server.port) as sock:
        pieces = [b"GET /health HTTP/1.1\r\nHost: x\r\n"] + [b"X-H%d: v\r\n" % i for i in range(1000)] + [b"\r\n"]
        response = send_until_answered(sock, pieces)
    assert response.status == 431
    still_serving(server, model_id)


def test_slow_clients_do_not_slow_others(server, model_id):
    # Connections that dribble header bytes must not hold back anyone else.
    stop = threading.Event()
    socks: list[socket.socket] = []

    def dribble():
        try:
            sock = connect(server.port)
            socks.append(sock)
            for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n":
                if stop.wait(0.2):
                    return
                sock.sendall(bytes([byte]))
        except OSError:
            pass  # closed by the server's timeout: what we want

    threads = [threading.Thread(target=dribble, daemon=True) for _ in range(50)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        for _ in range(3):
            started = time.monotonic()
            assert requests.get(server.url("/health"), timeout=10).status_code == 200
            assert time.monotonic() - started < 1.0
        still_serving(server, model_id)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        for s in socks:
            s.close()


def test_request_body_read_in_pieces(server, model_id):
    # A legitimate client that sends its body slowly is still served.
    body = json.dumps(chat_body(model_id, max_tokens=1)).encode()
    with connect(server.port) as sock:
        data = post_bytes("/v1/chat/completions", body, server.port)
        for i in range(0, len(data), 40):
            sock.sendall(data[i:i + 40])
            time.sleep(0.01)
        response = read_response(sock)
    assert response.status == 200, response.body[:300]
