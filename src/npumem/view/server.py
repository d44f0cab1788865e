"""The viewer's local HTTP server: the page's static files and the JSON API over the opened
sources (API.md says what each route answers).

Safety: it binds 127.0.0.1 unless told otherwise; every request carries the token printed at
start (query `token`, header X-Npumem-Token, or the cookie the page gets when it is opened with
the token, so that its own scripts and styles load); the only files it reads are the static
files shipped in the package, looked up by a name from a fixed list, never by a path taken from
a request; any other path is 404.

Threads: a ThreadingHTTPServer answers each request in its own thread; the precomputed arrays
are read-only after loading, so requests need no lock. What-if replays run in background
threads (jobs.py).
"""

from __future__ import annotations

import hmac
import json
import mimetypes
import os
import re
import socket
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from . import api
from .errors import RequestError

STATIC_PACKAGE = "npumem.view"
STATIC_FOLDER = "static"
TOKEN_HEADER = "X-Npumem-Token"
COOKIE = "npumem_token"
MAX_BODY = 1 << 16                # a POST body (a what-if request is a few dozen bytes)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

PLACEHOLDER = """<!doctype html>
<html><head><meta charset="utf-8"><title>npumem view</title></head>
<body data-npumem-ready="0"><h1>npumem view</h1>
<p>The viewer's page is not installed in this copy of npumem; the API answers at
<code>/api/info</code>.</p></body></html>
"""


class ApiError(Exception):
    """An answer other than 200: `status` and the one line the page shows."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def static_files() -> dict[str, bytes]:
    """The page's files by name, read once at start (no file is opened for a request)."""
    files = {}
    try:
        folder = resources.files(STATIC_PACKAGE).joinpath(STATIC_FOLDER)
        entries = list(folder.iterdir()) if folder.is_dir() else []
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        entries = []
    for entry in entries:
        if entry.is_file() and _NAME.match(entry.name):
            files[entry.name] = entry.read_bytes()
    files.setdefault("index.html", PLACEHOLDER.encode())
    return files


class ViewServer(ThreadingHTTPServer):
    daemon_threads = True          # Ctrl-C does not wait for a browser's open connection
    block_on_close = False
    allow_reuse_address = False    # a port in use is an error, not shared

    def __init__(self, address, app: "api.App", token: str):
        self.app, self.token = app, token
        self.files = static_files()
        if ":" in address[0]:                      # --host ::1
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def handle_error(self, request, client_address):
        """A browser that drops or resets a connection between two requests (Chrome closes
        idle keep-alive sockets) is no error: quiet. Anything else is printed as before."""
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    server: ViewServer
    protocol_version = "HTTP/1.1"
    server_version = "npumem-view"

    def log_message(self, format, *args):      # the terminal shows only the serving line
        pass

    def do_GET(self):
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")

    def do_HEAD(self):                 # as GET, without the body (_send leaves it out)
        self._answer("GET")

    def _other(self):                  # PUT, DELETE, ...: the token first, then 405, in JSON
        self.close_connection = True   # a body it sent is not read: no next request after it
        self._answer(self.command)

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _other

    def _answer(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            try:
                if not self._allowed(query):
                    raise ApiError(403, "a token is needed: open the address npumem view printed")
                body = self._body() if method == "POST" else None
                if url.path.startswith("/api/"):
                    self._json(200, self.server.app.route(method, url.path, query, body))
                elif method == "GET" and (url.path == "/" or url.path.startswith("/static/")):
                    self._static(url.path, "token" in query)
                elif method not in ("GET", "POST"):
                    raise ApiError(405, f"{method} is not answered: the viewer takes GET and POST")
                else:
                    raise ApiError(404, f"no such page: {url.path}")
            except ApiError as exc:
                self._json(exc.status, {"error": exc.message})
            except RequestError as exc:
                self._json(exc.status, {"error": str(exc)})
            except ConnectionError:
                raise
            except Exception as exc:             # a bug: the page says so, the server goes on
                traceback.print_exc()
                self._json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
        except ConnectionError:                  # the browser went away (a newer request)
            self.close_connection = True

    def _allowed(self, query: dict) -> bool:
        expected = self.server.token
        given = [query.get("token"), self.headers.get(TOKEN_HEADER), self._cookie()]
        return any(isinstance(value, str) and hmac.compare_digest(value, expected)
                   for value in given)

    def _cookie(self) -> str | None:
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return None

    def _body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ApiError(400, "Content-Length is not a number") from None
        if length > MAX_BODY:
            raise ApiError(413, f"the request body is over {MAX_BODY} bytes")
        return self.rfile.read(length) if length > 0 else b""

    def _static(self, path: str, set_cookie: bool) -> None:
        name = "index.html" if path == "/" else path[len("/static/"):]
        data = self.server.files.get(name) if _NAME.match(name) else None
        if data is None:
            raise ApiError(404, f"no such file: {path}")
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind in ("application/javascript", "application/json"):
            kind += "; charset=utf-8"
        headers = {"Content-Type": kind, "Cache-Control": "no-store",
                   "X-Content-Type-Options": "nosniff"}
        if set_cookie:
            headers["Set-Cookie"] = (f"{COOKIE}={self.server.token}; Path=/; HttpOnly; "
                                     "SameSite=Strict")
        self._send(200, data, headers)

    def _json(self, status: int, value) -> None:
        data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        self._send(status, data, {"Content-Type": "application/json",
                                  "Cache-Control": "no-store"})

    def _send(self, status: int, data: bytes, headers: dict) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def serve_address(server: ViewServer) -> str:
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?token={server.token}"


def new_token() -> str:
    import secrets
    return secrets.token_urlsafe(24)


def static_root() -> str:
    """Where the static files live in this checkout (for messages)."""
    return os.path.join(os.path.dirname(__file__), STATIC_FOLDER)
