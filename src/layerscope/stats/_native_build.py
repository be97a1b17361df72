"""Building the C kernel at first use: only with LAYERSCOPE_BUILD_NATIVE=1.

The kernel is built when layerscope is installed (setup.py). Where it was not, this builds it
once: into a private per-user cache (``$LAYERSCOPE_CACHE``, default ``~/.cache/layerscope``)
that no one else can write to, under a lock, so torchrun's ranks build once between them; with
a time limit, so a hanging compiler cannot stall training for long; and at most once per
process, so a library that does not load is not rebuilt in a loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

# The opt-in build at first use: the flags of setup.py, and limits so that it cannot stall
# training for long.
_FLAGS = (
    "-O3", "-g0", "-fno-strict-aliasing", "-ffp-contract=off", "-fno-trapping-math",
    "-fvisibility=hidden", "-shared", "-fPIC",
)  # fmt: skip
_OPTIONAL_FLAGS = ("-fopenmp-simd",)
_COMPILE_TIMEOUT = 60.0  # seconds; a build takes about 1.5 s
_LOCK_TIMEOUT = _COMPILE_TIMEOUT + 30.0  # waiting for another process's build


def build(source_path: Path, name: str, load: Callable[[Path], ctypes.CDLL]) -> ctypes.CDLL:
    """Build ``source_path`` with ``$CC`` (else ``cc``) into a library ``name`` and ``load`` it.

    Into a private per-user cache where there is one, so that processes (torchrun's ranks)
    build once between them, under a lock; else into a temporary folder of this process's.
    """
    compiler = shlex.split(os.environ.get("CC", "")) or ["cc"]
    if shutil.which(compiler[0]) is None:
        raise RuntimeError(f"no C compiler: {compiler[0]} is not on PATH")
    source = source_path.read_bytes()
    folder = _private_cache()
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="layerscope-") as temporary:
            path = Path(temporary) / name
            _compile(compiler, source_path, path)
            return load(path)  # loaded: the file can go
    digest = hashlib.sha256(source)
    for part in (*compiler, *_FLAGS, platform.machine(), sys.platform):
        digest.update(b"\0" + part.encode())
    stem, _, suffix = name.rpartition(".")
    path = folder / f"{stem}-{digest.hexdigest()[:16]}.{suffix}"
    with _locked(folder / "build.lock"):
        if not path.exists():  # else another process built it
            _compile(compiler, source_path, path)
    return load(path)  # a failure here is final for this process: no second build


def _private_cache() -> Path | None:
    """``$LAYERSCOPE_CACHE`` (default ``~/.cache/layerscope``), made 0700 if new.

    None unless it is this user's and no one else can write to it: a library there could
    otherwise be replaced with another user's code.
    """
    getuid = getattr(os, "getuid", None)
    configured = os.environ.get("LAYERSCOPE_CACHE")
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    folder = Path(configured) if configured else Path(base) / "layerscope"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError:
        return None
    if getuid is None or info.st_uid != getuid() or info.st_mode & 0o022:
        return None
    return folder


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the block; give up after ``_LOCK_TIMEOUT``."""
    import fcntl  # POSIX only, as is this build

    with open(path, "a") as handle:
        deadline = time.monotonic() + _LOCK_TIMEOUT
        while not _try_lock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} stayed locked for {_LOCK_TIMEOUT:.0f} s")
            time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _try_lock(handle: IO[str], flags: int) -> bool:
    import fcntl

    try:
        fcntl.flock(handle, flags)
    except BlockingIOError:
        return False
    return True


def _compile(compiler: list[str], source_path: Path, path: Path) -> None:
    """Build in a fresh folder beside ``path``, then rename it into place."""
    folder = tempfile.mkdtemp(dir=path.parent)
    built = os.path.join(folder, path.name)
    define = f'-DLAYERSCOPE_SOURCE_ID="{source_id(source_path.read_bytes())}"'
    try:
        for optional in (_OPTIONAL_FLAGS, ()):
            command = [*compiler, *_FLAGS, *optional, define, str(source_path), "-o", built, "-lm"]
            status, errors = _run(command)
            if status == 0:
                os.replace(built, path)
                return
            if not any(flag in errors for flag in optional):
                break  # again without -fopenmp-simd only where the compiler refused it
        last = (errors.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"{' '.join(command)}: {last}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(command: list[str]) -> tuple[int, str]:
    """Run a compiler: its exit status and stderr.

    Past ``_COMPILE_TIMEOUT`` it is killed with the processes it started (cc1, as), and
    ``subprocess.TimeoutExpired`` raised.
    """
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, to kill as one
    )
    try:
        _, errors = process.communicate(timeout=_COMPILE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return process.returncode, errors


def source_id(source: bytes) -> str:
    """What ``_native.c`` is built with as LAYERSCOPE_SOURCE_ID: its sha256."""
    return hashlib.sha256(source).hexdigest()
