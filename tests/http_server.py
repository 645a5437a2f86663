"""Serve a folder over HTTP on localhost, with an optional added latency per request: a remote store to test and
benchmark reading through fsspec (``http://127.0.0.1:PORT/store.zarr``, or a file read by byte ranges:
``Range: bytes=a-b`` requests are answered with the piece) without a network.

* ``LocalHTTPServer(folder, latency=0.05)``: a context manager; ``url(name)`` is the address of ``folder/name``,
  ``requests`` lists the paths requested (GET and HEAD) and ``most_in_flight`` the most served at once, for tests
  that count reads.

The standard library's server, not pytest-httpserver: that one answers registered requests, so serving a folder
would keep a handler of its own, and on werkzeug it serves ``Range`` GETs about 1.5 times slower
(``benchmarks/library_speed.py --cases http_server``); the benchmarks use this server too.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Handler(SimpleHTTPRequestHandler):
    server: _Server

    def _delay_and_log(self) -> None:
        server = self.server
        with server.lock:
            server.requests.append(self.path)
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
        if server.latency > 0:
            time.sleep(server.latency)

    def _done(self) -> None:
        with self.server.lock:
            self.server.in_flight -= 1

    def do_GET(self) -> None:
        self._delay_and_log()
        try:
            if self.headers.get("Range", "").startswith("bytes=") and os.path.isfile(self.translate_path(self.path)):
                self._send_range()
            else:
                super().do_GET()
        finally:
            self._done()

    def _send_range(self) -> None:
        """``206 Partial Content`` for ``Range: bytes=a-b`` (a file read in pieces, as object stores serve it)."""
        path = self.translate_path(self.path)
        size = os.path.getsize(path)
        first, _, last = self.headers["Range"].removeprefix("bytes=").split(",")[0].partition("-")
        start = int(first) if first else max(size - int(last), 0)  # "-N": the last N bytes
        end = min(int(last), size - 1) if first and last else size - 1
        if start >= size or start > end:
            self.send_error(416, "Requested Range Not Satisfiable")
            return
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._delay_and_log()
        try:
            super().do_HEAD()
        finally:
            self._done()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and benchmarks count requests instead
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    requests: list[str]
    latency: float
    lock: threading.Lock
    in_flight: int
    most_in_flight: int


class LocalHTTPServer:
    """``folder`` served at ``http://127.0.0.1:<port>/`` in a background thread, each request delayed by
    ``latency`` seconds (requests overlap, as they do with a remote server)."""

    def __init__(self, folder: str | os.PathLike[str], latency: float = 0.0) -> None:
        handler = functools.partial(_Handler, directory=str(folder))
        self.server = _Server(("127.0.0.1", 0), handler)
        self.server.requests, self.server.latency = [], float(latency)
        self.server.lock, self.server.in_flight, self.server.most_in_flight = threading.Lock(), 0, 0
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def requests(self) -> list[str]:
        """The paths requested so far, in order."""
        return self.server.requests

    @property
    def most_in_flight(self) -> int:
        """The most requests served at once so far."""
        return self.server.most_in_flight

    def url(self, name: str = "") -> str:
        """The address of ``folder/name``."""
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/{name}"

    def __enter__(self) -> LocalHTTPServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
