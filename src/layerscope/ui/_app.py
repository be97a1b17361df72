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
         one is to blame; a file that cannot be read at all, one this user may not read, says
         what the reader said)
    503  the run's files took too long to read: ``{"error": "RUN: timed out: ...", "run":
         "RUN"}``, with ``Retry-After`` (``run`` null for the list of runs); or the server is
         stopping
    500  anything else, a bug: ``{"error": "internal error"}``, the traceback in the log

The work on a run runs in threads of its own, a few at once per run, and a request waits for
it ``DEADLINE`` seconds at most (see ``_run_threads``): a run whose files never finish reading
(a named pipe, a filesystem that stopped answering) is that run's 503, never the server's
hang. The page, its files and the list of runs are served meanwhile; in the list, such a run
is ``unreadable``, its ``error`` saying it timed out.

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

import asyncio
import ipaddress
import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from layerscope._imports import require
from layerscope.store import Run, RunFileError
from layerscope.ui import _assets, _attention, _distributions, _heatmap, _overview
from layerscope.ui._catalog import RunCatalog, UnknownRunError
from layerscope.ui._guard import CONTENT_SECURITY_POLICY as CONTENT_SECURITY_POLICY
from layerscope.ui._guard import Guard
from layerscope.ui._query import MAX_COLUMNS, Selection, bucket_width
from layerscope.ui._run_threads import DEADLINE, PER_RUN, RunThreads, RunTimeoutError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_MAX_COLUMNS_ASKED = 5000
# The work of listing the folder itself, apart from every run's (no run has this name).
_FOLDER = "/"
# Runs whose entries in the list are read at once: a folder of a thousand runs is not a
# thousand threads.
_LISTED_AT_ONCE = 16

Handler = Callable[[Request], Any]
_log = logging.getLogger("layerscope.ui")


class JSONError(Exception):
    """An answer other than 200: its status and a message for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_app(
    root: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    deadline: float = DEADLINE,
    per_run: int = PER_RUN,
) -> Starlette:
    """The dashboard of the runs directly under ``root``.

    Args:
        root: the folder of runs.
        host: the address the server binds; a loopback one also makes the app answer only
            requests addressed to a loopback name, so a web page elsewhere cannot reach it by
            DNS rebinding.
        deadline: seconds a request waits for the work on its run before it is answered 503.
        per_run: threads that may work for one run at once.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: ``deadline`` or ``per_run`` is not positive.
    """
    catalog = RunCatalog(root)
    cache = AnswerCache()
    unreadable = _reading_errors()
    threads = RunThreads(deadline, per_run)

    def api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        return _json(handler, catalog, unreadable, threads)

    def survey() -> list[tuple[str, str, tuple[bool, dict[str, Any] | None]]]:
        """Each run's name, location and kept entry: a stat of each run's files, no read."""
        return [(name, place, catalog.kept_entry(name)) for name, place in catalog.folders()]

    async def runs(request: Request) -> Response:
        return await _answered(request, None, listing(), threads.deadline)

    async def listing() -> Response:
        # The folder surveyed in one piece of work; each run that changed read in its own.
        try:
            surveyed = await threads.call(_FOLDER, survey)
        except RunTimeoutError as error:
            raise RunTimeoutError("the folder of runs", error.reason) from None
        at_once = asyncio.Semaphore(_LISTED_AT_ONCE)

        async def entry(name: str, location: str) -> dict[str, Any] | None:
            async with at_once:
                try:
                    return await threads.call(name, lambda: catalog.entry(name, location))
                except RunTimeoutError as error:
                    return catalog.timed_out(name, error.reason)

        listed = await asyncio.gather(
            *(
                _given(kept) if unchanged else entry(name, location)
                for name, location, (unchanged, kept) in surveyed
            )
        )
        entries = [listed_entry for listed_entry in listed if listed_entry is not None]
        return JSONResponse({"root": catalog.root.name, "runs": entries})

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
        Route("/api/runs", runs, methods=["GET"]),
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
    handler: Handler,
    catalog: RunCatalog,
    unreadable: tuple[type[Exception], ...],
    threads: RunThreads,
) -> Callable[[Request], Awaitable[Response]]:
    """``handler``'s result as JSON; its errors as 400, 404, 422 or 503 (see the module's doc).

    The handler runs in a thread of its run's (``threads``), its answer encoded there too.
    """

    async def endpoint(request: Request) -> Response:
        name = request.path_params["run"]
        work = threads.call(name, lambda: answer(request))
        return await _answered(request, name, work, threads.deadline)

    def answer(request: Request) -> Response:
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

    return endpoint


async def _given(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """``entry`` as the entries still to read are given: awaited."""
    return entry


async def _answered(
    request: Request, run: str | None, work: Awaitable[Response], deadline: float
) -> Response:
    """``work``'s answer; a 503 where it took too long or the server stopped, naming ``run``."""
    try:
        return await work
    except RunTimeoutError as error:
        _log.warning("%s: %s", request.url.path, error)
        retry = str(math.ceil(deadline))
        return JSONResponse(
            {"error": str(error), "run": run}, status_code=503, headers={"Retry-After": retry}
        )
    except asyncio.CancelledError:  # the server is stopping: an answer, not a traceback in its log
        return JSONResponse({"error": "the server is stopping", "run": run}, status_code=503)


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
