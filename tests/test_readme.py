"""The README's quick start is what CI and the scripts run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent


def quick_start_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start") : readme.index("## Usage")]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_quick_start_is_two_commands_and_ci_runs_the_second():
    demo, test = quick_start_commands()
    assert (demo, test) == ("bash scripts/demo.sh", "bash scripts/test.sh")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec bash scripts/test.sh" in ci


def test_the_demo_script_runs_the_demo_command():
    script = (ROOT / "scripts" / "demo.sh").read_text()
    assert re.search(r"^source scripts/torch.sh\ninstall_torch\b", script, flags=re.M)
    assert re.search(r"^\.venv/bin/layerscope demo\b", script, flags=re.M)
    assert "torch==" not in script  # no one old torch pinned


def _install_torch(tmp_path, *, has_torch=False, gpu=False, cpu_index_up=True):
    """Run ``install_torch`` with a fake .venv and nvidia-smi: (pip calls, what it printed)."""
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    calls = tmp_path / "pip-calls"
    fail = "--index-url" if not cpu_index_up else "no-such-argument"
    (venv / "pip").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *{fail}*) exit 1;; esac\n'
    )
    (venv / "python").write_text(
        f'#!/bin/sh\ncase "$*" in *print*) echo 2.13.0;; *) exit {0 if has_torch else 1};; esac\n'
    )
    tools = tmp_path / "tools"
    tools.mkdir()
    if gpu:
        (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200'\n")
    for script in [*venv.iterdir(), *tools.iterdir()]:
        script.chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", f"source {ROOT / 'scripts' / 'torch.sh'} && install_torch"],
        cwd=tmp_path,
        env={"PATH": f"{tools}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    pip = calls.read_text().splitlines() if calls.exists() else []
    return pip, done.stdout


def test_the_scripts_install_the_cpu_build_where_no_gpu_answers(tmp_path):
    pip, said = _install_torch(tmp_path)
    assert pip == [
        "install -q --retries 1 --timeout 20 --index-url https://download.pytorch.org/whl/cpu torch"
    ]
    assert "CPU-only build" in said


def test_the_scripts_fall_back_to_the_default_index_where_the_cpu_one_is_out_of_reach(tmp_path):
    pip, said = _install_torch(tmp_path, cpu_index_up=False)
    assert len(pip) == 2
    assert pip[1] == "install -q torch"
    assert "cannot be reached" in said


def test_the_scripts_take_the_cuda_build_where_a_gpu_answers(tmp_path):
    pip, said = _install_torch(tmp_path, gpu=True)
    assert pip == ["install -q torch"]
    assert "CUDA" in said


def test_the_scripts_use_the_torch_the_venv_holds(tmp_path):
    pip, said = _install_torch(tmp_path, has_torch=True)
    assert pip == []
    assert "torch 2.13.0, found in .venv" in said


def test_the_diagnosis_figures_are_the_benchmarks():
    # BENCHMARKS.md's are written by `python benchmarks/diagnosis.py --write`; the README's by hand.
    measured = re.findall(
        r"^- (default|every=10): \*\*(\d+) right out of (\d+)\*\*",
        (ROOT / "BENCHMARKS.md").read_text(),
        flags=re.M,
    )
    said = re.search(
        r"With the default schedule (\d+) of (\d+) are right and (\d+) of (\d+) with\s+`every=10`",
        (ROOT / "README.md").read_text(),
    )
    assert said is not None
    assert [(schedule, right, total) for schedule, right, total in measured] == [
        ("default", said[1], said[2]),
        ("every=10", said[3], said[4]),
    ]
