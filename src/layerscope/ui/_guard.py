"""What every request to the dashboard passes first, and what every answer carries.

See ``Guard``: the host a request names and its path are checked before any route sees it,
and every answer gets the page's Content-Security-Policy.
"""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The page's own scripts and styles; Plotly adds <style> elements, hence 'unsafe-inline'
# for styles (never for scripts).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; font-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# A slash, a backslash or NUL written as %xx in a URL's path.
_ENCODED_SEPARATORS = (b"%2f", b"%5c", b"%00")

_log = logging.getLogger("layerscope.ui")


class Guard:
    """What every request passes first: the host it names, its path; what every answer carries.

    It answers 400 to a request addressed to a host name that is not this server's loopback
    one (``host_names``; None accepts any), so a page elsewhere whose name resolves to
    127.0.0.1 (DNS rebinding) reads nothing; and 400 to a path with an encoded slash,
    backslash or NUL (``%2f``, ``%5c``, ``%00``), which could put a path inside what routing
    takes for one name. Every answer gets the Content-Security-Policy and no-sniff headers,
    also the JSON 500 it makes of an exception no route expected (Starlette's own 500 would
    come from outside this middleware, without them, as plain text).
    """

    def __init__(self, app: ASGIApp, host_names: set[str] | None) -> None:
        self.app = app
        self.host_names = host_names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                headers.append((b"content-security-policy", CONTENT_SECURITY_POLICY.encode()))
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"referrer-policy", b"no-referrer"))
                message["headers"] = headers
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await JSONResponse({"error": refusal}, status_code=400)(
                scope, receive, send_with_headers
            )
            return
        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if started:
                raise  # half an answer is out: the server can only drop the connection
            _log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            # The message stays in the log: it may name files, or the server's internals.
            await JSONResponse({"error": "internal error"}, status_code=500)(
                scope, receive, send_with_headers
            )

    def _refusal(self, scope: Scope) -> str | None:
        raw = (scope.get("raw_path") or b"").lower()
        if any(encoded in raw for encoded in _ENCODED_SEPARATORS):
            return "no encoded separators in paths"
        if self.host_names is not None:
            headers = dict(scope.get("headers") or [])
            if _host_name(headers.get(b"host", b"").decode("latin-1")) not in self.host_names:
                return "this server answers requests for its loopback address only"
        return None


def _host_name(header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8765`` -> ``::1``.

    Example:
        >>> _host_name("127.0.0.1:8765"), _host_name("[::1]:8765"), _host_name("localhost")
        ('127.0.0.1', '::1', 'localhost')
    """
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if ":" in header else header
