"""Raw HTTP/1.1 over sockets, for what `requests` will not send (malformed framing, huge
headers, bodies never sent) and for reading responses exactly as they come."""

from __future__ import annotations

import select
import socket
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # lowercase names
    body: bytes = b""
    closed: bool = False  # the server closed the connection after this response


def connect(port: int, timeout: float = 30.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""
        self.eof = False

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if not self._fill():
                raise ConnectionError(f"connection closed before {marker!r}; got {self.buffer[:200]!r}")
        head, self.buffer = self.buffer.split(marker, 1)
        return head

    def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._fill():
                raise ConnectionError(f"connection closed with {len(self.buffer)} of {n} bytes")
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def rest(self) -> bytes:
        while self._fill():
            pass
        out, self.buffer = self.buffer, b""
        return out


def read_response(sock: socket.socket) -> RawResponse:
    """One response: status, headers and the whole body (Content-Length, chunked, or to EOF)."""
    reader = _Reader(sock)
    head = reader.until(b"\r\n\r\n").decode("latin-1")
    lines = head.split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int(reader.until(b"\r\n").split(b";")[0], 16)
            if size == 0:
                reader.until(b"\r\n")
                break
            body += reader.exactly(size)
            reader.until(b"\r\n")
    elif "content-length" in headers:
        body = reader.exactly(int(headers["content-length"]))
    else:
        body = reader.rest()
    closed = headers.get("connection", "").lower() == "close"
    return RawResponse(status, headers, body, closed)


def exchange(port: int, data: bytes, timeout: float = 30.0) -> RawResponse:
    """Sends `data` on a new connection and reads one response."""
    with connect(port, timeout) as sock:
        sock.sendall(data)
        return read_response(sock)


def post_bytes(path: str, body: bytes, port: int, extra_headers: str = "",
               content_type: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra_headers}\r\n").encode() + body


def send_until_answered(sock: socket.socket, pieces) -> RawResponse:
    """Sends pieces until the server answers (or stops reading), then reads the response.
    Stopping early matters: a server that closes with unread input resets the connection,
    and a reset can discard the answer before we read it."""
    for piece in pieces:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            break
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            break
    return read_response(sock)
