"""The dashboard's ASGI app: one page, its scripts, and a read-only JSON API over the runs.

Every route answers GET (and HEAD) only; a run is named by its folder under the root and found
through ``RunCatalog``, which refuses any other name with 404. Answers are JSON, never
pickles; the page builds its DOM with ``textContent`` from them, and a Content-Security-Policy
lets it run only its own scripts and talk only to this server.

Runs are input from anywhere, so no file of a run can make a route fail unanswered:

    400  a bad argument: ``{"error": "stat: ..."}``, naming the argument
    404  no such run: ``{"error": "no such run"}``
    422  the run's files are damaged: ``{"error": "RUN/run.json: started: expected a number,
         got ...", "file": "RUN/run.json", "field": "started"}`` (``file`` and ``field`` where
         one is to blame; a file that cannot be read at all says what the reader said)
    500  anything else, a bug: ``{"error": "internal error"}``, the traceback in the log

An answer read with files left out (a damaged segment, a copy of one) says which and why:
``"skipped": [{"file": "RUN/stats/seg-000002.parquet", "reason": "..."}]``. Files are named
relative to the root, never by where the root is on the server's disk.

API (``RUN`` is a run's folder name; ``kind``, ``tensor``, ``phase``, ``rank`` select rows as
in the figures, ``columns`` caps the columns of steps)::

    /api/runs                              the runs: id, name, status, steps, alerts, error
    /api/runs/RUN                          status, ranks, kinds and tensors, stats, overhead
    /api/runs/RUN/modules                  the module tree
    /api/runs/RUN/scalars?rank=            scalars over steps
    /api/runs/RUN/alerts?rank=             alerts
    /api/runs/RUN/heatmap?stat=&kind=...   layers by steps of one statistic
    /api/runs/RUN/series?module=&kind=...  one layer's statistics over steps
    /api/runs/RUN/colordim?module=&kind=.. one layer's histogram (log2 or linear) over steps
    /api/runs/RUN/distribution?module=&step=&kind=...  its histogram at one step
    /api/runs/RUN/attention?phase=&rank=   attention heads by steps of entropy fraction
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from layerscope._imports import require
from layerscope.store import Run, RunFileError
from layerscope.ui import _assets, _attention, _distributions, _heatmap, _overview
from layerscope.ui._catalog import RunCatalog, UnknownRunError
from layerscope.ui._query import MAX_COLUMNS, Selection, bucket_width

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# The page's own scripts and styles; Plotly adds <style> elements, hence 'unsafe-inline'
# for styles (never for scripts).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; font-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_MAX_COLUMNS_ASKED = 5000
# A slash, a backslash or NUL written as %xx in a URL's path.
_ENCODED_SEPARATORS = (b"%2f", b"%5c", b"%00")

Handler = Callable[[Request], Any]
_log = logging.getLogger("layerscope.ui")


class JSONError(Exception):
    """An answer other than 200: its status and a message for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_app(root: str | os.PathLike[str], *, host: str = "127.0.0.1") -> Starlette:
    """The dashboard of the runs directly under ``root``.

    Args:
        root: the folder of runs.
        host: the address the server binds; a loopback one also makes the app answer only
            requests addressed to a loopback name, so a web page elsewhere cannot reach it by
            DNS rebinding.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
    """
    catalog = RunCatalog(root)
    cache = AnswerCache()
    unreadable = _reading_errors()

    def api(handler: Handler) -> Callable[[Request], Response]:
        return _json(handler, catalog, unreadable)

    def runs(request: Request) -> dict[str, Any]:
        return {"root": catalog.root.name, "runs": catalog.listing()}

    def summary(request: Request) -> dict[str, Any]:
        name = request.path_params["run"]
        fresh = catalog.fresh(name)
        answer: dict[str, Any] = cache.get(
            request, fresh, lambda: catalog.noted(_overview.summary(fresh, name), fresh)
        )
        return answer

    def modules(request: Request) -> dict[str, Any]:
        run = catalog.run(request.path_params["run"])
        return catalog.noted({"modules": _overview.modules(run)}, run)

    def scalars(request: Request) -> dict[str, Any]:
        run = catalog.run(request.path_params["run"])
        return catalog.noted(_overview.scalars(run, _integer(request, "rank", 0)), run)

    def alerts(request: Request) -> dict[str, Any]:
        run = catalog.run(request.path_params["run"])
        return catalog.noted(_overview.alerts(run, _integer(request, "rank", 0)), run)

    def heatmap(request: Request) -> dict[str, Any]:
        run, selection, width, fresh = _chart(catalog, request)
        stat = _text(request, "stat", "absmax")
        answer: dict[str, Any] = cache.get(
            request,
            fresh,
            lambda: catalog.noted(_heatmap.heatmap(run, selection, stat, width), run, fresh),
        )
        return answer

    def series(request: Request) -> dict[str, Any]:
        run, selection, width, fresh = _chart(catalog, request)
        answer = _heatmap.series(run, selection, _text(request, "module"), width)
        return catalog.noted(answer, run, fresh)

    def colordim(request: Request) -> dict[str, Any]:
        run, selection, width, fresh = _chart(catalog, request)
        answer = _distributions.color_dim(run, selection, _text(request, "module"), width)
        return catalog.noted(answer, run, fresh)

    def distribution(request: Request) -> dict[str, Any]:
        run, selection, _, fresh = _chart(catalog, request)
        module = _text(request, "module")
        answer = _distributions.distribution(run, selection, module, _integer(request, "step"))
        return catalog.noted(answer, run, fresh)

    def attention(request: Request) -> dict[str, Any]:
        run, selection, width, fresh = _chart(catalog, request)
        answer = _attention.attention(run, selection.phase, selection.rank, width)
        return catalog.noted(answer, run, fresh)

    routes = [
        Route("/", _page, methods=["GET"]),
        Route("/static/{file}", _static, methods=["GET"]),
        Route("/api/runs", api(runs), methods=["GET"]),
        Route("/api/runs/{run}", api(summary), methods=["GET"]),
        *(
            Route(f"/api/runs/{{run}}/{name}", api(handler), methods=["GET"])
            for name, handler in [
                ("modules", modules),
                ("scalars", scalars),
                ("alerts", alerts),
                ("heatmap", heatmap),
                ("series", series),
                ("colordim", colordim),
                ("distribution", distribution),
                ("attention", attention),
            ]
        ),
    ]
    names = {*LOOPBACK_HOSTS, host.strip("[]")} if is_loopback(host) else None
    middleware = [Middleware(Guard, host_names=names)]
    app = Starlette(routes=routes, middleware=middleware)
    app.router.redirect_slashes = False  # "RUN%2F" is refused, not redirected to "RUN"
    return app


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("0.0.0.0")
        (True, False)
    """
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _chart(catalog: RunCatalog, request: Request) -> tuple[Run, Selection, int, Run]:
    """The run, the rows and the width of a column of steps that a chart asks for.

    Also the run freshly loaded: its ``meta`` says how far a run being written has come.
    """
    name = request.path_params["run"]
    run = catalog.run(name)
    selection = Selection.checked(
        _text(request, "kind", "activation"),
        request.query_params.get("tensor"),
        _text(request, "phase", "train"),
        _integer(request, "rank", 0),
    )
    columns = _integer(request, "columns", MAX_COLUMNS)
    if not 1 <= columns <= _MAX_COLUMNS_ASKED:
        raise JSONError(400, f"columns: expected 1 to {_MAX_COLUMNS_ASKED}, got {columns}")
    fresh = catalog.fresh(name)
    return run, selection, bucket_width(run, fresh.meta.get("steps"), columns), fresh


def _json(
    handler: Handler, catalog: RunCatalog, unreadable: tuple[type[Exception], ...]
) -> Callable[[Request], Response]:
    """``handler``'s result as JSON; its errors as 400, 404 or 422 (see the module's doc)."""

    def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(handler(request))
        except UnknownRunError:
            return JSONResponse({"error": "no such run"}, status_code=404)
        except RunFileError as error:
            return JSONResponse(catalog.damage(error), status_code=422)
        except JSONError as error:
            return JSONResponse({"error": str(error)}, status_code=error.status)
        except unreadable as error:  # a file that passed the reader's checks but not a read
            _log.warning("%s: a file cannot be read: %s", request.url.path, error)
            return JSONResponse(catalog.unreadable(error), status_code=422)
        except ValueError as error:  # an unknown kind, statistic, module: the argument named
            return JSONResponse({"error": str(error)}, status_code=400)

    # Starlette runs a plain function in its thread pool: DuckDB queries do not block the loop.
    return endpoint


def _reading_errors() -> tuple[type[Exception], ...]:
    """What reading a run's Parquet files raises on a damaged one: DuckDB's, Arrow's, the OS's.

    Arrow's errors are ValueErrors too: they are caught first, never taken for a bad argument.
    """
    duckdb = require("duckdb", "dataframe")
    pyarrow = require("pyarrow", "dataframe")
    return (duckdb.Error, pyarrow.ArrowException, OSError)


def _text(request: Request, name: str, default: str | None = None) -> str:
    value = request.query_params.get(name, default)
    if value is None:
        raise JSONError(400, f"{name}: missing")
    return value


def _integer(request: Request, name: str, default: int | None = None) -> int:
    value = request.query_params.get(name)
    if value is None:
        if default is None:
            raise JSONError(400, f"{name}: missing")
        return default
    try:
        return int(value)
    except ValueError:
        raise JSONError(400, f"{name}: expected an integer, got {value!r}") from None


def _page(request: Request) -> Response:
    return Response(_assets.page(), media_type="text/html; charset=utf-8")


def _static(request: Request) -> Response:
    path = _assets.static_path(request.path_params["file"])
    if path is None:
        return JSONResponse({"error": "not found"}, status_code=404)
    # Plotly is asked for by version (see _assets.page): kept a week. The page's own files
    # change with layerscope: asked again each time (a 304 when unchanged).
    kept = "max-age=604800, immutable" if path.name == _assets.PLOTLY else "no-cache"
    return FileResponse(path, headers={"Cache-Control": kept})


class AnswerCache:
    """The last answers of the slower routes, kept while their run has not changed.

    A run being written changes its ``run.json`` (``updated``, ``steps``) at every flush, so an
    answer is reused only until the run has more rows; a finished run's answers stay until
    ``size`` newer ones push them out. A heat map of 200 layers by 1,000 columns is ~1 MB.
    """

    def __init__(self, size: int = 32) -> None:
        self._answers: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, request: Request, fresh: Run, compute: Callable[[], Any]) -> Any:
        """The answer to ``request`` for the run as ``fresh`` is now, computed if not kept."""
        meta = fresh.meta
        key = (
            request.url.path,
            tuple(sorted(request.query_params.multi_items())),
            meta.get("updated"),
            meta.get("steps"),
            meta.get("status"),
        )
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return self._answers[key]
        answer = compute()
        with self._lock:
            self._answers[key] = answer
            while len(self._answers) > self._size:
                self._answers.popitem(last=False)
        return answer


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
