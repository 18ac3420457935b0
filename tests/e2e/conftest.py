"""Shared fixtures for the end-to-end tests: the real `tessera serve` as a subprocess.

The server is started with `--port 0`; its first stdout line names the bound address
(`... on http://127.0.0.1:PORT ...`). It is stopped with SIGTERM and must exit with 0.
Everything is skipped only when the model file is missing; a missing binary or browser is
a failure.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
STARTUP_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60
ADDRESS_RE = re.compile(r"on (http://127\.0\.0\.1:(\d+))")


def model_path() -> Path:
    cache = os.environ.get("TESSERA_CACHE") or str(Path.home() / ".cache" / "tessera" / "models")
    return Path(cache) / MODEL_FILE


def tessera_binary() -> Path:
    return Path(os.environ.get("TESSERA_BIN") or REPO / "build" / "bin" / "tessera")


class Server:
    """One running `tessera serve`; its stdout is drained on a thread into `lines`."""

    def __init__(self, *extra_args: str):
        binary = tessera_binary()
        if not binary.exists():
            pytest.fail(f"tessera binary not found at {binary} (build it, or set TESSERA_BIN)")
        self.args = [str(binary), "serve", "--model", str(model_path()), "--port", "0", *extra_args]
        self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, bufsize=1)
        self.lines: list[str] = []
        self._first_line = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        if not self._first_line.wait(STARTUP_TIMEOUT_S):
            self.process.kill()
            pytest.fail(f"`{' '.join(self.args)}` printed nothing in {STARTUP_TIMEOUT_S}s")
        first_line = self.lines[0] if self.lines else ""
        match = ADDRESS_RE.search(first_line)
        if not match:
            self.process.kill()
            self._reader.join(timeout=5)
            pytest.fail(f"`{' '.join(self.args)}` did not print its address first; output:\n{self.output()}")
        self.base_url = match.group(1)
        self.port = int(match.group(2))
        self._wait_ready()

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            self._first_line.set()
        self._first_line.set()  # exited without a line: let the constructor report it

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"server exited with {self.process.returncode} while starting:\n{self.output()}")
            try:
                # /health is 200 as soon as the listener is open; /ready once the model is loaded.
                if requests.get(self.base_url + "/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        pytest.fail(f"server not ready after {STARTUP_TIMEOUT_S}s:\n{self.output()}")

    def output(self) -> str:
        return "".join(self.lines)

    def url(self, path: str) -> str:
        return self.base_url + path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        """SIGTERM, then the exit code (killed and failed after STOP_TIMEOUT_S)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"server did not exit within {STOP_TIMEOUT_S}s of SIGTERM:\n{self.output()[-4000:]}")
        self._reader.join(timeout=5)
        return code


def start_server(*extra_args: str) -> Server:
    if not model_path().exists():
        pytest.skip(f"model file missing: {model_path()} (make model)")
    return Server(*extra_args)


def stop_and_check(server: Server) -> None:
    code = server.stop()
    assert code == 0, f"server exited with {code} after SIGTERM; output tail:\n{server.output()[-4000:]}"


@pytest.fixture(scope="session")
def server():
    """The shared server: no API key."""
    s = start_server()
    yield s
    stop_and_check(s)


@pytest.fixture(scope="session")
def model_id(server) -> str:
    body = requests.get(server.url("/v1/models"), timeout=10).json()
    return body["data"][0]["id"]


@pytest.fixture(scope="session")
def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60)


def tokenize(server: Server, model: str, **body) -> dict:
    """vLLM's POST /tokenize: {"count", "max_model_len", "tokens"}."""
    r = requests.post(server.url("/tokenize"), json={"model": model, **body}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def assert_openai_error(response: requests.Response, status: int, param: str | None | object = ...,
                        params: tuple = ()) -> dict:
    """The response has `status` and an OpenAI error body; when given, `param` must match
    (or be one of `params`)."""
    assert response.status_code == status, f"want {status}, got {response.status_code}: {response.text[:500]}"
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    for key in ("message", "type", "param", "code"):
        assert key in error, f"error body lacks {key!r}: {body}"
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["type"], body
    wanted = params if params else ((param,) if param is not ... else ())
    if wanted:
        assert any(names_param(error["param"], w) for w in wanted), f"param {error['param']!r} not {wanted}: {body}"
    return error


def names_param(got, want) -> bool:
    """`got` names `want` itself or a part of it ("messages[0].content" names "messages")."""
    if want is None or got is None:
        return got == want
    return got == want or got.startswith(want + ".") or got.startswith(want + "[")
