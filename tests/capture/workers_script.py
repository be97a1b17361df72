"""A training process with an on_tensor worker pool, for test_workers.py, and a benchmark.

Run: python tests/capture/workers_script.py MODE [OUT_DIR]

    wait   start a pool, write its worker pids to OUT_DIR/pids.json once a record went
           through, wait; on Ctrl-C close the pool and write OUT_DIR/closed.json
    raise  the same, then raise an error: the pool is closed at interpreter exit, and
           OUT_DIR/survivors.json lists the workers alive after that
    bench  time TensorWorkers.submit() of a 1 MiB tensor, accepted and dropped
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from layerscope.tensors import Record
from layerscope.tensors._workers import TensorWorkers


def ignore_record(record: Record, directory: Path | None) -> None:
    del record, directory  # a callback that only has to run


def _record(step: int, value: torch.Tensor) -> Record:
    return Record(
        module="fc", type="Linear", kind="activation", tensor="out", step=step, phase="train",
        call=0, value=value,
    )  # fmt: skip


def _started_pool(out: Path) -> TensorWorkers:
    pool = TensorWorkers(ignore_record, 1, None)
    pool.submit(_record(0, torch.ones(3)))
    deadline = time.monotonic() + 120
    while pool.processed < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    return pool


def _write_pids(out: Path, pids: list[int]) -> None:
    (out / "pids.tmp").write_text(json.dumps(pids))
    (out / "pids.tmp").rename(out / "pids.json")  # whole, or not there yet


def _wait(out: Path) -> None:
    pool = _started_pool(out)
    try:
        _write_pids(out, pool.pids())  # in here: Ctrl-C may come as soon as they are known
        while True:
            time.sleep(0.1)
    except KeyboardInterrupt:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            clean = pool.close(timeout=30)
        result = {"clean": clean, "restarts": pool.restarts, "warnings": len(caught)}
        (out / "closed.json").write_text(json.dumps(result))


def _raise(out: Path) -> None:
    pids: list[int] = []
    # Registered first, so it runs after the pool's own atexit close.
    atexit.register(_note_survivors, out, pids)
    pids.extend(_started_pool(out).pids())
    _write_pids(out, pids)
    raise RuntimeError("the training script failed")


def _note_survivors(out: Path, pids: list[int]) -> None:
    survivors = []
    for pid in pids:  # our children: a worker that ended was reaped by close()
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        survivors.append(pid)
    (out / "survivors.json").write_text(json.dumps(survivors))


def _bench() -> None:
    value = torch.randn(256 * 1024)  # 1 MiB of float32
    record = _record(0, value)
    rounds = 5_000
    pool = TensorWorkers(ignore_record, 1, None, queue_size=rounds)
    pool.submit(record)
    while pool.processed < 1:
        time.sleep(0.05)
    accepted = []
    for _ in range(rounds):  # the worker takes them meanwhile: the monitor thread competes
        start = time.perf_counter_ns()
        pool.submit(record)
        accepted.append(time.perf_counter_ns() - start)
    full = TensorWorkers(ignore_record, 1, None, queue_size=1)
    full.submit(record)  # its worker is still starting: the queue stays full
    dropped = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        full.submit(record)
        dropped.append(time.perf_counter_ns() - start)
    start = time.perf_counter_ns()
    for _ in range(100):
        pickle.dumps(value)
    pickled = (time.perf_counter_ns() - start) / 100
    for name, times in (("accepted", accepted), ("dropped", dropped)):
        times.sort()
        print(
            f"submit, {name}: median {statistics.median(times) / 1000:.2f} us, "
            f"p99 {times[len(times) * 99 // 100] / 1000:.2f} us, max {times[-1] / 1000:.1f} us"
        )
    print(f"for scale, pickle.dumps of the 1 MiB tensor: {pickled / 1000:.1f} us")
    remaining = pool.submitted - pool.processed
    start = time.perf_counter()
    pool.close(timeout=120)
    per_record = (time.perf_counter() - start) / remaining
    print(f"throughput of one worker: {per_record * 1000:.2f} ms per 1 MiB record")
    full.close(timeout=0)


def main() -> None:
    mode = sys.argv[1]
    if mode == "bench":
        _bench()
        return
    out = Path(sys.argv[2])
    {"wait": _wait, "raise": _raise}[mode](out)


if __name__ == "__main__":  # spawn workers import this module: no training there
    main()
