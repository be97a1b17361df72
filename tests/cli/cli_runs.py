"""Small real runs for the command's tests: a tiny MLP, fixed seeds, every step recorded."""

import json
import os
import re
import time
from pathlib import Path

import torch
from torch import nn

import layerscope


def tiny_model(scale_last=1.0):
    """Linear(4, 8), ReLU, Linear(8, 2), the same weights every time; the last layer's scaled."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        model[2].weight.mul_(scale_last)
    return model


def train(model, path, steps=3, **options):
    """Train ``model`` for ``steps`` SGD steps on fixed batches, recording each in ``path``.

    Health rules are off unless ``alerts=`` says otherwise: the output tested is the
    command's, whatever rules layerscope ships.
    """
    options.setdefault("alerts", False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = torch.randn(steps, 8, 4, generator=torch.Generator().manual_seed(1))
    with layerscope.watch(model, optimizer=optimizer, run=path, every=1, **options) as scope:
        for batch in batches:
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return path


def mark_crashed(path):
    """Make a finished run read as one whose writer died: running, heartbeat an hour old."""
    run_json = path / "run.json"
    meta = json.loads(run_json.read_text())
    meta.update(status="running", ended=None, host="another-host.invalid", pid=1)
    meta.update(updated=time.time() - 3600, heartbeat_seconds=5.0)
    run_json.write_text(json.dumps(meta))


# What changes from one run of the same training to the next: when, where, on what.
_VARYING_FIELDS = ("started", "ended", "updated", "host", "versions", "kernel")
_VARYING_COST = ("training thread", "writer thread")


def normalised(text, tmp_path):
    """``text`` with the temporary folder, times, host, versions, kernel and costs replaced."""
    text = text.replace(str(tmp_path), "TMP")
    for name in _VARYING_FIELDS + _VARYING_COST:
        text = re.sub(rf"^({re.escape(name)} +).*$", r"\1<varies>", text, flags=re.MULTILINE)
    return text


def forward_only(model, path, steps=2, **options):
    """Record ``steps`` forwards of fixed batches with no optimizer: the weights never change."""
    options.setdefault("alerts", False)
    batches = torch.randn(steps, 8, 4, generator=torch.Generator().manual_seed(1))
    with layerscope.watch(model, run=path, every=1, **options) as scope:
        for batch in batches:
            model(batch)
            scope.step()
    return path


# The alerts table as runs written before health rules shipped have it, and as it is now.
OLD_ALERT_COLUMNS = ("step", "rule", "module", "kind", "severity", "message", "rank")
NEW_ALERT_COLUMNS = (
    "step", "phase", "rule", "module", "kind", "tensor", "severity", "value", "threshold",
    "message", "rank",
)  # fmt: skip


def add_alerts(run_path, alerts, columns=NEW_ALERT_COLUMNS):
    """Write ``alerts`` (dicts) into the run as one more alerts segment with ``columns``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"step": pa.int64(), "rank": pa.int32(), "value": pa.float64()}
    types["threshold"] = pa.float64()
    schema = pa.schema([(name, types.get(name, pa.string())) for name in columns])
    table = pa.table({name: [alert[name] for alert in alerts] for name in columns}, schema=schema)
    folder = run_path / "alerts"
    folder.mkdir(exist_ok=True)
    pq.write_table(table, folder / "seg-900000.parquet")  # after any segment the writer made


def rows_of(output, title):
    """The cells of each row of the plain table whose title starts with ``title``."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 3 :]:  # title, headers, rule of dashes
        if not line:
            break
        rows.append(re.split(r" {2,}", line.strip()))
    return rows


def field(output, name):
    """The value of the ``name`` line of a plain block of fields."""
    match = re.search(rf"^{re.escape(name)} +(.*)$", output, flags=re.MULTILINE)
    assert match, f"no {name!r} line in:\n{output}"
    return match.group(1)


GOLDEN = Path(__file__).parent / "golden"


def check_golden(name, text):
    """``text`` equals ``golden/<name>``; ``LAYERSCOPE_UPDATE_GOLDEN=1`` writes it instead."""
    path = GOLDEN / name
    if os.environ.get("LAYERSCOPE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()
