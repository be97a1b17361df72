"""Launching torchrun jobs for the distributed tests, and reading what their workers wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
# A launch takes about 10 s on 2 CPU cores; a hang is cut by the workers' own 20 s timeout.
LAUNCH_TIMEOUT = 90
OUTPUT_SHOWN = 12_000  # characters of the workers' output shown when a job failed


@dataclass
class Job:
    """A finished torchrun launch: its exit status, its output and its results folder."""

    directory: Path
    returncode: int
    output: str

    def read(self, name: str) -> Any:
        """A JSON file the workers wrote; fails with their output where they did not write it."""
        path = self.directory / name
        if not path.exists():
            pytest.fail(
                f"the workers exited with {self.returncode} and wrote "
                f"{sorted(p.name for p in self.directory.glob('*.json'))}; their output:\n"
                f"{self.output[-OUTPUT_SHOWN:]}",
                pytrace=False,
            )
        return json.loads(path.read_text())

    def assert_succeeded(self) -> None:
        """Every worker exited with 0; else fail with their output."""
        if self.returncode != 0:
            pytest.fail(
                f"the workers exited with {self.returncode}; their output:\n"
                f"{self.output[-OUTPUT_SHOWN:]}",
                pytrace=False,
            )

    def ranks(self, name: str = "rank") -> list[dict[str, Any]]:
        """``{name}0.json`` and ``{name}1.json``: results of rank 0 and rank 1."""
        return [self.read(f"{name}{rank}.json") for rank in range(2)]


def launch(script: str, directory: Path, *args: str, nproc: int = 2) -> Job:
    """Run ``script`` under torchrun with ``nproc`` workers; ``directory`` comes after ``args``.

    The workers share the environment, with torch's flight recorder on so that they can list
    every collective their process groups ran.
    """
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc_per_node={nproc}", str(HERE / script), *args, str(directory)]
    env = os.environ | {"TORCH_FR_BUFFER_SIZE": "100000", "OMP_NUM_THREADS": "1"}
    # A session of its own: on a timeout the workers are killed with their launcher.
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += f"\n[killed after {LAUNCH_TIMEOUT} s]"
    return Job(directory, process.returncode, output)


@pytest.fixture(scope="session")
def ddp_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """DDP trained unwatched and watched on 2 ranks (see worker_train.py)."""
    return launch("worker_train.py", tmp_path_factory.mktemp("ddp"), "ddp")


@pytest.fixture(scope="session")
def fsdp_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """FSDP2 trained unwatched and watched on 2 ranks (see worker_train.py)."""
    return launch("worker_train.py", tmp_path_factory.mktemp("fsdp"), "fsdp")


@pytest.fixture(scope="session")
def shards_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """``local_tensor`` and ``shard_label`` of DTensors on 2 ranks (see worker_shards.py)."""
    return launch("worker_shards.py", tmp_path_factory.mktemp("shards"))


@pytest.fixture
def one_rank_group(tmp_path: Path):
    """A gloo process group of this process alone, destroyed after the test."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
