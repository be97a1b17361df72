"""What keeping whole tensors costs a training step: capture(), watch(tensors=), on_tensor.

    OMP_NUM_THREADS=1 python benchmarks/tensors.py           # prints figures
    OMP_NUM_THREADS=1 python benchmarks/tensors.py --write   # also updates BENCHMARKS.md

An MLP of 64 -> 256 -> 256 -> 10 (Linear and ReLU), batch 128, SGD. Variants are interleaved
round by round; each figure is the median over rounds of the mean step time, as a ratio to the
unwatched step. Captures are cleared between rounds, so kept memory does not grow. The
``on_tensor`` variant hands every tensor to one worker process whose callback sleeps 50 ms:
the workers fall behind at once, so it measures what a busy pool costs the step (the copy and
a dropped item), and the drop count says how many items the pool refused.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import layerscope

sys.path.insert(0, str(Path(__file__).parent))

STEPS = 50
ROUNDS = 25
SLOW_SECONDS = 0.05


def slow_callback(record: Any, directory: Any) -> None:
    """A callback busier than training: the pool drops what it cannot take."""
    time.sleep(SLOW_SECONDS)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


class Variant:
    """One way to train: what it watches, and how it ends a step."""

    def __init__(self, name: str, make: Any) -> None:
        self.name = name
        self.model = _model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.watcher = make(self.model, self.optimizer)
        self.times: list[float] = []

    def steps(self, x: torch.Tensor, y: torch.Tensor) -> float:
        model, optimizer, watcher = self.model, self.optimizer, self.watcher
        step = watcher.step if isinstance(watcher, layerscope.tensors.Capture) else None
        start = time.perf_counter()
        for _ in range(STEPS):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if step is not None:
                step()
        return (time.perf_counter() - start) / STEPS


def variants(directory: str) -> list[Variant]:
    every_step = {"include": r"^(0|2)$", "every": 1}
    return [
        Variant("unwatched", lambda m, o: None),
        Variant(
            "capture(): whole activations and grads of 3 Linear, every step",
            lambda m, o: layerscope.capture(m, types=nn.Linear),
        ),
        Variant("capture(every=10)", lambda m, o: layerscope.capture(m, types=nn.Linear, every=10)),
        Variant("watch(every=10)", lambda m, o: layerscope.watch(m, o, every=10, alerts=False)),
        Variant(
            "watch(every=10, tensors=2 layers, kept every step), in memory",
            lambda m, o: layerscope.watch(m, o, every=10, alerts=False, tensors=every_step),
        ),
        Variant(
            "watch(every=10, tensors=2 layers, kept every step), written to the run",
            lambda m, o: layerscope.watch(
                m, o, every=10, alerts=False, tensors=every_step, run=f"{directory}/run"
            ),
        ),
        Variant(
            "watch(every=10, tensors=2 layers on recorded steps), written to the run",
            lambda m, o: layerscope.watch(
                m, o, every=10, alerts=False, tensors=r"^(0|2)$", run=f"{directory}/run10"
            ),
        ),
        Variant(
            f"watch(every=10, tensors=2 layers every step, keep=False, on_tensor sleeping "
            f"{SLOW_SECONDS * 1e3:.0f} ms, 1 worker)",
            lambda m, o: layerscope.watch(
                m,
                o,
                every=10,
                alerts=False,
                tensors={**every_step, "keep": False},
                on_tensor=slow_callback,
                workers=1,
            ),
        ),
    ]


def animations(directory: str) -> list[tuple[str, float, int]]:
    """Seconds and bytes of 200-frame animations of whole tensors (a SavedCapture)."""
    from layerscope.tensors import Record, SavedCapture

    generator = torch.Generator().manual_seed(0)
    records = []
    for step in range(200):
        for module, shape in (("heat", (64, 256)), ("pca", (256, 64))):
            value = torch.randn(shape, generator=generator) * (1 + step / 100)
            records.append(
                Record(
                    module=module,
                    type="Linear",
                    kind="activation",
                    tensor="out",
                    step=step,
                    phase="train",
                    call=0,
                    value=value,
                )
            )
    saved = SavedCapture(records, {})
    rows = []
    for what, module, suffix in (
        ("heatmap", "heat", "gif"),
        ("heatmap", "heat", "mp4"),
        ("pca", "pca", "gif"),
        ("pca", "pca", "mp4"),
    ):
        path = Path(directory, f"{what}.{suffix}")
        start = time.perf_counter()
        try:
            layerscope.animate(saved, module, what=what, path=path)
        except RuntimeError as error:  # no ffmpeg here
            print(f"{what} {suffix}: {error}")
            continue
        rows.append(
            (
                f"`animate(..., what={what!r})` to .{suffix}",
                time.perf_counter() - start,
                path.stat().st_size,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    with tempfile.TemporaryDirectory() as directory:
        chosen = variants(directory)
        for variant in chosen:
            variant.steps(x, y)  # warm up
        for _ in range(ROUNDS):
            for variant in chosen:
                if isinstance(variant.watcher, layerscope.tensors.Capture):
                    variant.watcher.clear()
                variant.times.append(variant.steps(x, y))
        base = statistics.median(chosen[0].times)
        rows = []
        for variant in chosen:
            median = statistics.median(variant.times)
            rows.append((variant.name, median, median / base))
            print(f"{variant.name:100s} {median * 1e3:7.3f} ms/step  {median / base:5.2f}x")
        pool = chosen[-1].watcher._whole.workers
        for variant in chosen:
            if variant.watcher is not None:
                variant.watcher.close()
        submitted, dropped, processed = pool.submitted, pool.dropped, pool.processed
        print(f"on_tensor: {submitted} taken, {dropped} dropped, {processed} processed")
        animated = animations(directory)
        for name, seconds, size in animated:
            print(f"{name:60s} {seconds:6.2f} s  {size / 1e6:6.1f} MB")
    if args.write:
        from report import command, machine, replace_section

        lines = ["| variant | ms a step | vs unwatched |", "|---|---|---|"]
        lines += [f"| {name} | {ms * 1e3:.2f} | {ratio:.2f}x |" for name, ms, ratio in rows]
        body = (
            f"Command: `OMP_NUM_THREADS=1 {command('tensors.py')}` on {machine(1)}.\n\n"
            f"An MLP 64 -> 256 -> 256 -> 10 (3 Linear, 2 ReLU), batch 128, SGD; median over "
            f"{ROUNDS} interleaved rounds of {STEPS} steps. Whole tensors are copied in the "
            f"hook; in `watch` the copies go to the host, to disk and to the workers on a "
            f"thread of their own.\n\n" + "\n".join(lines) + "\n\n"
            f"With the slow callback the pool took {submitted} tensors and dropped "
            f"{dropped}; it processed {processed} before closing.\n\n"
            "Animations of whole tensors, 200 frames of 512 x 288 pixels each: a heat map of a "
            "64 x 256 activation, and a PCA of 256 samples by 64 features.\n\n"
            "| animation | time | size |\n|---|---|---|\n"
            + "\n".join(
                f"| {name} | {seconds:.2f} s | {size / 1e6:.1f} MB |"
                for name, seconds, size in animated
            )
        )
        replace_section("Whole tensors (CPU)", body)


if __name__ == "__main__":
    main()
