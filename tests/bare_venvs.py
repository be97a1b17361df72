"""Virtualenvs that hold only torch, one extra's requirements and a layerscope wheel.

``pip install torch layerscope-*.whl`` on a fresh machine installs torch's own dependencies
and layerscope's, nothing else: here each requirement is resolved against this virtualenv's
installed distributions (their ``Requires-Dist``, markers evaluated, extras followed) and each
distribution's files are linked into the new virtualenv, as its RECORD lists them.
No download, no resolver: a package that layerscope imports but no requirement brings is
missing there, as on a user's machine.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parent.parent


def _our_extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"": project["dependencies"], **project["optional-dependencies"]}


def _requirements(dist: metadata.Distribution, extras: set[str]) -> list[Requirement]:
    """The requirements of ``dist`` that apply here, with ``extras`` asked for."""
    chosen = []
    for text in dist.requires or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in extras | {""}):
            chosen.append(requirement)
    return chosen


def closure(extra: str) -> set[str]:
    """The distributions that ``pip install 'layerscope[extra]'`` installs, by name, ours not
    among them: what layerscope and ``extra`` require, and what those require in turn."""
    ours = _our_extras()
    pending = [Requirement(text) for text in ours[""] + (ours[extra] if extra else [])]
    found: set[str] = set()
    asked: set[tuple[str, frozenset[str]]] = set()
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name == "layerscope":  # one of our extras naming others
            for more in requirement.extras:
                pending.extend(Requirement(text) for text in ours[more])
            continue
        key = (name, frozenset(requirement.extras))
        if key in asked:
            continue
        asked.add(key)
        found.add(name)
        pending.extend(_requirements(metadata.distribution(name), set(requirement.extras)))
    return found


@functools.cache
def _owners() -> dict[str, set[str]]:
    """Each top-level name in site-packages, and the distributions with files under it."""
    owners: dict[str, set[str]] = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for top in {file.parts[0] for file in dist.files or []}:
            owners.setdefault(top, set()).add(name)
    return owners


def _link(dist: metadata.Distribution, site: Path) -> None:
    """Link ``dist``'s files into ``site``: a folder it alone has files in at once, others
    (namespace packages) file by file."""
    name = canonicalize_name(dist.metadata["Name"])
    for file in dist.files or []:
        if file.parts[0] == "..":
            continue  # scripts, outside site-packages
        whole = _owners()[file.parts[0]] == {name}
        relative = Path(file.parts[0]) if whole else Path(file)
        source = Path(str(dist.locate_file(relative)))
        target = site / relative
        if source.exists() and not target.is_symlink() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)


def bare_venv(folder: Path, wheel: Path, extra: str = "") -> Path:
    """A virtualenv at ``folder`` with ``closure(extra)`` linked in and ``wheel`` installed;
    its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for name in closure(extra):
        _link(metadata.distribution(name), site)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        check=True,
    )  # fmt: skip
    return python
