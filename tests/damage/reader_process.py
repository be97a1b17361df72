"""A process that reads damaged runs for ``isolation.Worker``: one job a line on stdin.

Each job (JSON: the run, the dashboard's parameters, the case's folder, the readers) is read
by ``classify.read_all``, its readings pickled into the job's ``out`` file, and its ``token``
printed when they are there.

    reader_process.py [--user UID [--warm-up RUN --params JSON]]

``--user``: read as that user (and group): the process drops to it once it has read the
good run ``RUN`` through every reader, so that what reading imports is imported already.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import classify  # found through the line above


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--user", type=int)
    parser.add_argument("--warm-up", type=Path)
    parser.add_argument("--params", type=json.loads, default={})
    args = parser.parse_args()
    if args.user is not None:
        if args.warm_up is not None:
            with tempfile.TemporaryDirectory() as folder:
                classify.read_all(args.warm_up, args.params, Path(folder))
        os.setgroups([])
        os.setgid(args.user)
        os.setuid(args.user)
        if os.geteuid() != args.user:
            raise SystemExit(f"still uid {os.geteuid()}, not {args.user}")
    for line in sys.stdin:
        job = json.loads(line)
        readings = classify.read_all(
            Path(job["run"]), job["params"], Path(job["folder"]), tuple(job["readers"])
        )
        Path(job["out"]).write_bytes(pickle.dumps(readings))
        print(job["token"], flush=True)


if __name__ == "__main__":
    main()
