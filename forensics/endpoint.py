"""Talking to a live engine over HTTP (``forensics gate`` and ``forensics canary``).

Standard library only: the checks must run on a deploy runner or an on-call laptop with
nothing but this package. Every failure becomes an :class:`EndpointError` whose one line names
the URL and what went wrong (timed out, connection refused, HTTP 500, not JSON), so a pipeline
log says which engine to look at without a traceback.
"""

from __future__ import annotations

import json
import socket
import urllib.parse
from typing import Any

from forensics import __version__
from forensics.errors import ForensicsError

USER_AGENT = f"kv-forensics/{__version__}"
# How much of an unexpected body an error line quotes: enough to recognise it, not a page.
_QUOTE = 80
# A server_info document or an error body is kilobytes; anything far larger is not one.
MAX_BODY = 16 * 2**20


class EndpointError(ForensicsError):
    """An engine endpoint could not be read: the message names the URL and the reason."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


def is_url(source: str) -> bool:
    """Whether a command-line source is an engine's base URL rather than a saved file.

    >>> is_url("http://10.0.0.5:30000"), is_url("fleet/prefill-1.json")
    (True, False)
    """
    return urllib.parse.urlsplit(source).scheme in ("http", "https")


def join(base_url: str, path: str) -> str:
    """``path`` under an engine's root, however the root was written.

    >>> join("http://h:30000/", "/get_server_info")
    'http://h:30000/get_server_info'
    """
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def check_base_url(value: str) -> str:
    """The base URL of an engine, or ValueError saying what a base URL looks like.

    >>> check_base_url("http://127.0.0.1:30000/")
    'http://127.0.0.1:30000'
    """
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an engine base URL such as http://host:30000: {value!r}")
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise ValueError(f"not a valid port in {value!r}") from None
    return value.rstrip("/")


def describe(exc: BaseException, timeout: float) -> str:
    """One short reason for a failed exchange, the way an operator would say it."""
    import http.client
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}".rstrip()
    if isinstance(exc, urllib.error.URLError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    if isinstance(exc, http.client.IncompleteRead):
        expected = len(exc.partial) + (exc.expected or 0)
        return f"the answer was cut off ({len(exc.partial):,} of {expected:,} bytes)"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the connection closed without an answer"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out after {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"host not found ({exc.strerror or exc})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def open_url(url: str, timeout: float, body: dict[str, Any] | None = None):
    """Open ``url`` (GET, or POST of a JSON ``body``); the response, whatever its status.

    A 4xx or 5xx answer is returned, not raised: the canary must see a refusal as data.

    Raises:
        EndpointError: nothing came back (timeout, refused connection, unknown host).
    """
    # Imported here: urllib.request pulls in ssl and http.client, and --help must stay instant.
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    request.add_header("User-Agent", USER_AGENT)
    request.add_header("Accept", "application/json, text/event-stream")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    transport: tuple[type[BaseException], ...] = (urllib.error.URLError, *read_errors())
    try:
        return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - http(s) only
    except urllib.error.HTTPError as exc:
        return exc
    except transport as exc:
        raise EndpointError(url, describe(exc, timeout)) from None


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading an answer can raise when the other end misbehaves."""
    import http.client

    return (OSError, ValueError, http.client.HTTPException)


def read_body(response, url: str, timeout: float) -> bytes:
    """The whole body of a response, with read failures as one line naming ``url``.

    Raises:
        EndpointError: the read failed, or the body is larger than any document the checks
            read (a misrouted download must not fill the memory of a deploy runner).
    """
    try:
        body = response.read(MAX_BODY + 1)
        # A read of a set size returns what came before the connection closed; the bytes the
        # server promised and did not send tell a cut-off answer from a short one.
        missing = getattr(response, "length", None) or 0
    except read_errors() as exc:
        raise EndpointError(url, describe(exc, timeout)) from None
    finally:
        response.close()
    if missing > 0 and len(body) <= MAX_BODY:
        total = len(body) + missing
        raise EndpointError(url, f"the answer was cut off ({len(body):,} of {total:,} bytes)")
    if len(body) > MAX_BODY:
        raise EndpointError(url, f"answer larger than {MAX_BODY // 2**20} MiB")
    return body


def get_json(url: str, timeout: float) -> dict[str, Any]:
    """GET a JSON object.

    Raises:
        EndpointError: unreachable, a status other than 200, or a body that is not a JSON
            object; the message quotes the start of what came back instead.
    """
    response = open_url(url, timeout)
    body = read_body(response, url, timeout)
    if response.status != 200:
        raise EndpointError(url, f"HTTP {response.status} {response.reason}".rstrip())
    return parse_object(body, url)


def parse_object(body: bytes, where: str) -> dict[str, Any]:
    """A JSON object from bytes, or an :class:`EndpointError` quoting what it was instead.

    >>> parse_object(b'{"a": 1}', "x")
    {'a': 1}
    """
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise EndpointError(where, f"not JSON ({quote(body)})") from None
    if not isinstance(value, dict):
        raise EndpointError(where, f"not a JSON object ({quote(body)})")
    return value


def quote(body: bytes) -> str:
    """The start of a body for an error line: decoded leniently, cut, never empty.

    >>> quote(b"<html>" + b"x" * 200)[:12]
    "'<html>xxxxx"
    """
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return "empty body"
    return repr(text[:_QUOTE] + ("..." if len(text) > _QUOTE else ""))
