"""Small real runs and a real server for the dashboard's tests."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import torch
from torch import nn

import layerscope

XSS_NAME = "<img src=x onerror=alert(1)>"


def tiny_model(hidden: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def xss_model() -> nn.Module:
    """A model whose second layer is named like an HTML tag that runs a script."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("first", nn.Linear(4, 8))
    model.add_module(XSS_NAME, nn.ReLU())
    model.add_module("last", nn.Linear(8, 3))
    return model


def record(
    path: Path, steps: int, *, model: nn.Module | None = None, nan_at=None, seed: int = 0
) -> Path:
    """Train ``model`` (default: the tiny MLP) for ``steps`` SGD steps, each recorded.

    ``nan_at``: a step whose batch holds a NaN, which raises a ``nonfinite`` alert.
    """
    model = tiny_model() if model is None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + seed)
    with (
        warnings.catch_warnings(),
        layerscope.watch(model, run=path, every=1, optimizer=optimizer) as scope,
    ):
        warnings.simplefilter("ignore")  # the non-finite alert warns; here it is wanted
        for step in range(steps):
            inputs = torch.randn(6, 4, generator=generator)
            if step == nan_at:
                inputs[0, 0] = float("nan")
            loss = model(inputs).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss, lr=0.1)
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """The dashboard app under uvicorn on 127.0.0.1, in a thread of this process."""

    def __init__(self, root: Path) -> None:
        import uvicorn

        from layerscope.ui._app import create_app

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(root), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> Server:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the dashboard server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def get(self, path: str, *, method: str = "GET", headers=None) -> tuple[int, dict, bytes]:
        """(status, headers, body) of a request for ``path`` exactly as written."""
        request = urllib.request.Request(self.url + path, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def json(self, path: str):
        status, _, body = self.get(path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)
