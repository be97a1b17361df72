"""Run the documentation's snippets as a reader would, and write the outputs the pages show.

    python scripts/run_snippets.py [--work DIR] [NAME ...]

Every snippet runs in one scratch folder, as a user would from a fresh directory: the Python
ones (docs/snippets/*.py) first, in name order, as they write the runs that the shell ones
(*.sh) read. A Python snippet whose first line is ``# run: COMMAND`` runs with that command
(torchrun). Each line of a shell snippet is a command, shown as ``$ command`` and followed by
its output. What a snippet prints, stdout and stderr together, goes to docs/snippets/NAME.out.
Without names, every snippet runs; with names, only those, in the same order.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = ROOT / "docs" / "snippets"
WORK = Path("/tmp/layerscope-docs")
TIMEOUT = 600  # seconds for one command; the slowest (the demo, torchrun) take well under


class SnippetError(RuntimeError):
    """A snippet's command exited with an error."""


def prepare(work: Path) -> None:
    """An empty scratch folder in which ``examples/`` is the repository's."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "examples").symlink_to(ROOT / "examples")


def environment() -> dict[str, str]:
    """This interpreter's environment first on the PATH (python, torchrun, layerscope)."""
    bin_folder = str(Path(sys.executable).parent)
    return os.environ | {
        "PATH": os.pathsep.join([bin_folder, os.environ.get("PATH", "")]),
        "PYTHONUNBUFFERED": "1",  # stdout and stderr reach the output in the order written
        "WANDB_SILENT": "true",
        # One OpenMP thread per process: torchrun would otherwise print a warning that it set it.
        "OMP_NUM_THREADS": "1",
    }


def ordered(names: Iterable[str]) -> list[Path]:
    """The snippets of ``names`` in the order they run: the Python ones, then the shell ones."""
    snippets = []
    for name in sorted(set(names)):
        found = [SNIPPETS / f"{name}{suffix}" for suffix in (".py", ".sh")]
        existing = [path for path in found if path.exists()]
        if not existing:
            raise FileNotFoundError(f"no snippet {name}.py or {name}.sh in {SNIPPETS}")
        snippets.extend(existing)
    return sorted(snippets, key=lambda path: (path.suffix != ".py", path.name))


def every_name() -> list[str]:
    """The name of every snippet."""
    return sorted({path.stem for path in [*SNIPPETS.glob("*.py"), *SNIPPETS.glob("*.sh")]})


def run(snippet: Path, work: Path, env: Mapping[str, str]) -> str:
    """What ``snippet`` prints when run in ``work``."""
    if snippet.suffix == ".py":
        return _run_python(snippet, work, env)
    return _run_shell(snippet, work, env)


def _run_python(snippet: Path, work: Path, env: Mapping[str, str]) -> str:
    first = snippet.read_text().split("\n", 1)[0]
    launcher = first.removeprefix("# run: ") if first.startswith("# run: ") else "python"
    return _output([*shlex.split(launcher), str(snippet)], work, env)


def _run_shell(snippet: Path, work: Path, env: Mapping[str, str]) -> str:
    shown = []
    for line in snippet.read_text().splitlines():
        if line and not line.startswith("#"):
            shown.append(f"$ {line}\n" + _output(["bash", "-c", line], work, env))
    return "".join(shown)


def _output(command: list[str], work: Path, env: Mapping[str, str]) -> str:
    """What ``command`` prints, stdout and stderr together as a terminal interleaves them."""
    # A session of its own: on a timeout, torchrun's workers are killed with their launcher.
    process = subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise SnippetError(f"{shlex.join(command)} ran past {TIMEOUT} s:\n{output}") from None
    if process.returncode != 0:
        raise SnippetError(f"{shlex.join(command)} exited with {process.returncode}:\n{output}")
    return output


def main(argv: list[str] | None = None) -> None:
    """Run the snippets named (all without names) and rewrite their outputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=WORK, help="the scratch folder, emptied")
    parser.add_argument("names", nargs="*", help="snippets to run (default: all)")
    args = parser.parse_args(argv)
    prepare(args.work)
    env = environment()
    for snippet in ordered(args.names or every_name()):
        print(f"docs: {snippet.relative_to(ROOT)}", file=sys.stderr)
        try:
            output = run(snippet, args.work, env)
        except SnippetError as error:
            sys.exit(f"docs: {snippet.name} failed: {error}")
        (SNIPPETS / f"{snippet.stem}.out").write_text(output)


if __name__ == "__main__":
    main()
