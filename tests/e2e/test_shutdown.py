"""SIGTERM under load: the server stops admitting, lets the streams in flight finish, and
exits with 0."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import requests

from conftest import start_server
from http_raw import connect, read_response


def stream_request(port: int, model: str, i: int) -> bytes:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": f"Count to ten, run {i}."}],
                       "max_tokens": 16, "stream": True, "ignore_eos": True}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def test_sigterm_drains_streams_in_flight_then_exits_0():
    server = start_server()
    try:
        model = requests.get(server.url("/v1/models"), timeout=10).json()["data"][0]["id"]
        n_streams = 4
        socks = [connect(server.port, timeout=60) for _ in range(n_streams)]
        for i, sock in enumerate(socks):
            sock.sendall(stream_request(server.port, model, i))
        # Wait until every stream has started (its headers and a first event are out).
        for sock in socks:
            sock.settimeout(60)
            first = sock.recv(4096, socket.MSG_PEEK)  # look, leave it for read_response
            assert first.startswith(b"HTTP/1.1 200"), first[:200]

        server.process.send_signal(signal.SIGTERM)
        # New work is refused while draining (503; the listener stays open, a refused
        # connection is tolerated for servers that close it).
        time.sleep(0.2)
        try:
            r = requests.post(server.url("/v1/chat/completions"), timeout=10, json={
                "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
            assert r.status_code == 503, r.text
        except requests.ConnectionError:
            pass

        results: list[str] = []

        def finish(sock):
            response = read_response(sock)
            events = [e for e in response.body.decode("utf-8").split("\n\n") if e]
            results.append(events[-1])
            finishes = [json.loads(e[6:])["choices"][0].get("finish_reason") for e in events[:-1]]
            results.append(str(finishes[-1]))

        threads = [threading.Thread(target=finish, args=(s,)) for s in socks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        # Each stream ran to its length (16 tokens with ignore_eos), not cut by the shutdown.
        assert results.count("data: [DONE]") == n_streams, results
        assert results.count("length") == n_streams, results
        for s in socks:
            s.close()
    finally:
        code = server.stop()
    assert code == 0, server.output()[-4000:]

