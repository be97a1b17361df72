"""A watched ``torch.compile``d model: recompiles, graph breaks and step times, against unwatched.

    python benchmarks/compile.py            # prints the table
    python benchmarks/compile.py --write    # also updates its section of BENCHMARKS.md

Two models, each compiled (inductor, the default backend) and trained for 12 steps with AdamW:
a tiny GPT-2 (transformers' GPT2LMHeadModel, 2 layers, d=64, 2 heads, vocabulary 256, random
weights, nothing downloaded) and a small MLP. Watched, it is
``layerscope.watch(model, optimizer=opt, every=Schedule(every=5))``, attached before the first
compiled call: steps 0, 5 and 10 are recorded, the others not. By design, a recorded step runs
eagerly (torch.compile's stance is ``force_eager`` for that step), and on unrecorded steps the
hooks are traced away so that the model runs as one graph, as unwatched: this measures what
dynamo makes of that.

Each configuration runs in a process of its own, with an empty inductor cache, so every
compile is cold and no configuration reuses another's graphs. Counted over the 12 steps, from
torch._dynamo's logs and counters: recompiles ("Recompiling function" records of the
``recompiles`` log), graph breaks (records of the ``graph_breaks`` log), graphs compiled
(``counters["stats"]["unique_graphs"]``), and whether dynamo warned that it hit
``recompile_limit`` (8 by default), after which it runs a function eagerly for good; each count
says whose code the events were in (layerscope's hooks, its statistics kernel, the model's or
torch.nn's). Also the functions dynamo gave up on (a graph break inside a loop), and the rows
recorded and their steps, against the same 12 steps watched eagerly.
A step is forward, backward, ``optimizer.step()`` and ``zero_grad()``. Runs in about 2 minutes
on a 2-core CPU, most of it cold compiles.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import report
from report import replace_section  # run as a script

STEPS = 12
EVERY = 5
MODELS = ("gpt2", "mlp")
CONFIGS = ("unwatched", "watched")
RECORDED = [step for step in range(STEPS) if step % EVERY == 0]  # 0, 5, 10
# Unrecorded steps after the first one (which is where a watched model recompiles).
STEADY = [step for step in range(2, STEPS) if step % EVERY != 0]


def _gpt2() -> tuple[Any, Any]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64)
    model = GPT2LMHeadModel(config)  # random weights: nothing is downloaded
    generator = torch.Generator().manual_seed(0)

    def loss(compiled: Any) -> Any:
        tokens = torch.randint(0, 256, (8, 64), generator=generator)
        return compiled(input_ids=tokens, labels=tokens).loss

    return model, loss


def _mlp() -> tuple[Any, Any]:
    import torch
    from torch import nn

    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    generator = torch.Generator().manual_seed(0)

    def loss(compiled: Any) -> Any:
        x = torch.randn(64, 256, generator=generator)
        y = torch.randint(0, 10, (64,), generator=generator)
        return nn.functional.cross_entropy(compiled(x), y)

    return model, loss


class _DynamoLog(logging.Handler):
    """Dynamo's recompiles, graph breaks and recompile-limit warnings, by where they happened.

    One log record is one event: ``Recompiling function NAME in FILE:LINE`` (the ``recompiles``
    artifact), ``Graph break ... in user code at FILE:LINE`` (``graph_breaks``), and the
    warning ``torch._dynamo hit config.recompile_limit (8)`` with the function's FILE.
    """

    PLACE = re.compile(r" (?:in|at) (/\S+?\.py):\d+")
    SKIPPED = re.compile(r"frame skipped: (\S+) \((\S+) line \d+\)")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.recompiles: list[str] = []
        self.graph_breaks: list[str] = []
        self.limit_hits: list[str] = []
        self.skipped: list[str] = []  # functions dynamo gave up on: eager from then on

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        first = message.splitlines()[0] if message else ""
        if record.name.endswith("__recompiles") and first.startswith("Recompiling function"):
            self.recompiles.append(_where(first))
        elif record.name.endswith("__graph_breaks") and first.startswith("Graph break"):
            self.graph_breaks.append(_where(first))
            for name, path in self.SKIPPED.findall(message):
                function = f"{name} ({Path(path).name})"
                if function not in self.skipped:
                    self.skipped.append(function)
        elif "hit config.recompile_limit" in message or "hit config.cache_size_limit" in message:
            self.limit_hits.append(_where(message.replace("\n", " ")))


def _where(message: str) -> str:
    """Whose code an event is in: layerscope's hooks, its statistics kernel, or the model's
    (torch.nn's modules included)."""
    found = _DynamoLog.PLACE.search(message)
    path = found.group(1) if found else ""
    if "layerscope/stats/" in path:
        return "kernel"
    if "layerscope/" in path:
        return "hooks"
    return "model"


def cpu_wait() -> float:
    """Seconds that some task has waited for a CPU since boot (Linux PSI), or NaN.

    Over steps that run only this process's threads, it grows only when another process takes
    a core: on a shared machine, the sign that a step's time is not this process's alone.
    """
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return math.nan
    return int(line.rsplit("total=", 1)[1]) / 1e6


def _train(model_name: str, watched: bool, compiled: bool) -> dict[str, Any]:
    import torch

    import layerscope

    torch.manual_seed(0)
    model, loss_of = {"gpt2": _gpt2, "mlp": _mlp}[model_name]()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model) if compiled else model
    scope = None
    if watched:  # before the first compiled call: dynamo does not see hooks added later
        scope = layerscope.watch(run, optimizer=optimizer, every=layerscope.Schedule(every=EVERY))
    times, waits = [], []
    for _ in range(STEPS):
        start, waited = time.perf_counter(), cpu_wait()
        loss = loss_of(run)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
        waits.append(cpu_wait() - waited)
    # The share of the steady steps' time that some task waited for a CPU.
    contention = sum(waits[step] for step in STEADY) / sum(times[step] for step in STEADY)
    if scope is None:
        return {"times": times, "contention": contention}
    scope.close()
    frame = scope.frame()
    steps = sorted(int(step) for step in frame["step"].unique())
    return {
        "times": times,
        "contention": contention,
        "rows": len(frame),
        "steps": steps,
        "failures": scope.failures,
    }


def child(model_name: str, config: str, threads: int) -> dict[str, Any]:
    """Train one compiled model for STEPS steps, in this process; return what was seen."""
    import torch
    import torch._dynamo.utils

    torch.set_num_threads(threads)
    log = _DynamoLog()
    torch._logging.set_logs(recompiles=True, graph_breaks=True)
    logging.getLogger("torch._dynamo").addHandler(log)  # set_logs stops it propagating
    result = _train(model_name, config == "watched", compiled=True)
    counters = torch._dynamo.utils.counters
    result.update(
        recompiles=log.recompiles,
        graph_breaks=log.graph_breaks,
        graphs=counters["stats"]["unique_graphs"],
        limit_hits=log.limit_hits,
        skipped=log.skipped,
    )
    if config == "watched":  # the same steps eagerly: the rows a compiled run should match
        eager = _train(model_name, True, compiled=False)
        result.update(eager_rows=eager["rows"], eager_steps=eager["steps"])
    return result


def run(model_name: str, config: str, threads: int) -> dict[str, Any]:
    """``child`` in a fresh process with an empty inductor cache: every compile is cold."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        command = [sys.executable, __file__, "--child", model_name, config]
        done = subprocess.run(
            [*command, "--threads", str(threads)], capture_output=True, text=True, env=env
        )
    if done.returncode != 0:
        raise RuntimeError(f"{model_name}, {config}: failed\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _by_place(events: list[str]) -> str:
    """``7 (6 hooks, 1 kernel)``: a count, and where the events were if any were."""
    if not events:
        return "0"
    places = ", ".join(
        f"{events.count(place)} {place}"
        for place in ("hooks", "kernel", "model")
        if place in events
    )
    return f"{len(events)} ({places})"


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps))


HEADER = (
    "model",
    "configuration",
    "step 0: first call (recorded when watched)",
    "step 1: first unrecorded",
    "steps 5 and 10 (recorded when watched), mean",
    "steady unrecorded steps, median",
    "CPU wait in steady steps",
    "recompiles",
    "graph breaks",
    "graphs compiled",
    "recompile_limit (8) warning",
    "frames left to eager (graph break in a loop)",
    "rows recorded: compiled / eager",
    "steps with rows: compiled / eager",
)


def table(results: dict[tuple[str, str], dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for (model_name, config), result in results.items():
        times = result["times"]
        hits = result["limit_hits"]
        cells = [
            model_name,
            config,
            _time(times[0]),
            _time(times[1]),
            _time(statistics.mean(times[step] for step in RECORDED[1:])),
            _time(statistics.median(times[step] for step in STEADY)),
            f"{result['contention']:.0%}",
            _by_place(result["recompiles"]),
            _by_place(result["graph_breaks"]),
            str(result["graphs"]),
            f"yes, {_by_place(hits)}" if hits else "no",
            ", ".join(result["skipped"]) or "none",
            f"{result['rows']:,} / {result['eager_rows']:,}" if "rows" in result else "",
            _steps(result["steps"]) + " / " + _steps(result["eager_steps"])
            if "steps" in result
            else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, threads=args.threads)))
        return

    results = {}
    for model_name in args.models:
        for config in CONFIGS:
            began = time.perf_counter()
            results[model_name, config] = run(model_name, config, args.threads)
            print(
                f"{model_name}, {config}: done in {time.perf_counter() - began:.0f} s",
                file=sys.stderr,
            )
    text = table(results)
    print(text)
    if args.write:
        command = report.command("compile.py")
        machine = report.machine(args.threads)
        replace_section(
            "torch.compile: recompiles and graph breaks (CPU)",
            f"Machine: {machine}. Command: `{command}`.\n"
            f"{STEPS} steps of a `torch.compile`d model (inductor) with AdamW, each "
            "configuration in a process of its own with an empty inductor cache, so that every "
            "compile is cold. Tiny GPT-2: transformers' GPT2LMHeadModel, 2 layers, d=64, 2 "
            "heads, vocabulary 256, 64 positions, random weights, batch 8 x 64 tokens. MLP: "
            "Linear(256, 512), ReLU, Linear(512, 512), ReLU, Linear(512, 10), batch 64. Watched "
            "is `layerscope.watch(model, optimizer=opt, every=Schedule(every=5))` attached "
            "before the first compiled call: steps 0, 5 and 10 are recorded and run eagerly "
            "(torch.compile's stance is `force_eager` while a step records), so a watched "
            "model's first compiled call is step 1. A step is forward, "
            "backward, `optimizer.step()` and `zero_grad()`; steady unrecorded steps are steps "
            f'{", ".join(map(str, STEADY))}. Recompiles are dynamo\'s "Recompiling function" '
            "log records (`torch._logging.set_logs(recompiles=True)`), graph breaks its "
            '`graph_breaks` records, graphs compiled `torch._dynamo.utils.counters["stats"]'
            '["unique_graphs"]`; each count says where the events were: layerscope\'s hooks, '
            "layerscope's statistics kernel (its torch-compiled fallback), or the model (its "
            "code and torch.nn's modules' forwards). CPU wait is the share of the steady "
            "steps' time that some task on the machine waited for a CPU (`/proc/pressure/cpu`): "
            "near 0% where they had the cores to themselves; on a shared 2-core machine another "
            "process can slow a 2-thread step many times over. The recompile_limit column is "
            "whether dynamo warned that a function hit it, after which dynamo runs that "
            "function eagerly for good; the next, functions whose frame dynamo gave up on, "
            "running them eagerly from then on, because a graph break fell "
            "inside a loop (a Sequential's or a ModuleList's). The last two columns compare "
            "the rows recorded, and the steps they are of, with those of the same 12 steps "
            "watched and run eagerly, uncompiled, in the same process.\n\n"
            f"{text}",
        )


if __name__ == "__main__":
    main()
