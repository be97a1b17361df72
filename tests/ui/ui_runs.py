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
LINEAR_HISTOGRAM = ("linear", -1.0, 1.0, 8)


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


def tanh_model() -> nn.Module:
    """The tiny MLP with a Tanh where it has a ReLU: layer "1" is another module type."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def dead_model() -> nn.Module:
    """The tiny MLP whose ReLU ("1") outputs exact zeros only: its first layer's bias is -100."""
    model = tiny_model()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)
    return model


def write_alerts(path: Path, alerts: list[dict]) -> None:
    """Replace the alerts of the finished run at ``path`` with ``alerts`` (rows of its table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (file,) = (path / "alerts").glob("*.parquet")
    schema = pq.read_schema(file)
    pq.write_table(pa.Table.from_pylist(alerts, schema=schema), file)


def record(
    path: Path,
    steps: int,
    *,
    model: nn.Module | None = None,
    nan_at=None,
    seed: int = 0,
    **options,
) -> Path:
    """Train ``model`` (default: the tiny MLP) for ``steps`` SGD steps, each recorded.

    ``nan_at``: a step whose batch holds a NaN, which raises a ``nonfinite`` alert.
    ``options``: more arguments of ``watch`` (``histogram=``...).
    """
    model = tiny_model() if model is None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + seed)
    with (
        warnings.catch_warnings(),
        layerscope.watch(model, run=path, every=1, optimizer=optimizer, **options) as scope,
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


def many_alerts() -> list[dict]:
    """118 alerts: 72 "dead" warnings, 36 "exploding" warnings, 10 "nonfinite" errors."""
    rows = []
    for rule, severity, kinds, steps in [
        ("dead", "warning", ("activation", "grad", "weight", "weight_grad"), range(6)),
        ("exploding", "warning", ("grad", "weight_grad"), range(6)),
        ("nonfinite", "error", ("activation",), range(3, 6)),
    ]:
        for step in steps:
            for module in ("0", "1", "2"):
                for kind in kinds:
                    rows.append(_alert(step, rule, severity, module, kind))
    rows.append(_alert(5, "nonfinite", "error", "2", "grad"))
    return sorted(rows, key=lambda row: (row["step"], row["module"]))


def _alert(step: int, rule: str, severity: str, module: str, kind: str) -> dict:
    return {
        "step": step, "phase": "train", "rule": rule, "module": module, "kind": kind,
        "tensor": "out", "severity": severity, "value": 1.0, "threshold": 0.5,
        "message": f"{rule} at step {step}", "rank": 0,
    }  # fmt: skip
