"""The snippets that write runs, and those run in a shell or by torchrun, print what pages show.

scripts/run_snippets.py runs them as ``scripts/docs.sh --outputs`` does, in one scratch folder:
the Python snippets that write the runs under runs/ first, then the shell snippets, which list
and compare those runs and run the examples. Each output is compared with its
docs/snippets/NAME.out line by line: what changes from one run to the next is masked, each kind
by a named pattern (MASKS); numbers are compared to a tolerance (TOLERANCE), as a CPU's rounding
moves their last digits; everything else exactly. What the examples claim of the files they
write is checked on those files.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import ModuleType

import pytest

import layerscope
from tests.test_docs import STABLE_SNIPPETS

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = ROOT / "docs" / "snippets"
DOCS_FOLDER = "/tmp/layerscope-docs"  # where scripts/docs.sh runs them: the paths pages show


def _load_runner() -> ModuleType:
    """scripts/run_snippets.py, which scripts/docs.sh runs too (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location(
        "run_snippets", ROOT / "scripts" / "run_snippets.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner = _load_runner()

# The Python snippets that write runs under runs/, which cli.sh lists, and the shell snippets.
WRITERS = ["call_order", "ddp_each", "fsdp", "nan", "quickstart", "run_directory", "sql"]
SHELL = [
    "attention_summary", "cli", "compiled", "ddp", "demo", "huggingface", "lightning", "trackers",
    "whole_tensors",
]  # fmt: skip
COMPARED = WRITERS + SHELL


@dataclass(frozen=True)
class Mask:
    """A kind of value that changes from one run to the next, compared as a placeholder."""

    pattern: re.Pattern[str]
    placeholder: str

    def apply(self, text: str) -> str:
        return self.pattern.sub(self.placeholder, text)


def _mask(pattern: str, placeholder: str) -> Mask:
    return Mask(re.compile(pattern, re.MULTILINE), placeholder)


# When a run started and ended: the clock's time then.
CLOCK = _mask(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "<time> UTC")
# How long something took ("after 0.122 s", "0.02168 s in hooks", "235 in 1.0 s"): the
# machine's speed and load.
SECONDS = _mask(r"(?<![\w.])\d+(?:\.\d+)? s\b", "<seconds> s")
# Who recorded a run: the machine's name, the user and the process id.
PROCESS = _mask(r"^(host +)\S+ \(user \S+, pid \d+\)$", r"\1<host> (user <user>, pid <pid>)")
# What is installed.
VERSIONS = _mask(
    r"^(versions +)python \S+, torch \S+, layerscope \S+$",
    r"\1python <version>, torch <version>, layerscope <version>",
)
# The statistics kernel a run names: the fastest copy this CPU runs (native-avx2, -avx512...).
KERNEL = _mask(r"(\bkernel\W+)(?:native-\w+|native|triton|compiled|eager)\b", r"\1<kernel>")
# The ids W&B and MLflow give a new run: random.
WANDB_ID = _mask(r"(W&B:? (?:offline )?run )[a-z0-9]{8}\b", r"\1<id>")
MLFLOW_ID = _mask(r"(MLflow:? run )[0-9a-f]{32}\b", r"\1<id>")
# The demo's fixed CNN's losses and test accuracy: oneDNN orders a convolution's sums by CPU,
# and training carries the first steps' rounding into the digits shown (the broken CNN's
# ReLUs die by step 5: its numbers stay put).
FIXED_LOSSES = _mask(r"^(  fixed: epoch \d+/\d+, loss )\d+\.\d+$", r"\1<loss>")
FIXED_ACCURACY = _mask(r"(run +layerscope-demo/fixed\ntest accuracy +)[\d.]+%", r"\1<accuracy>%")
# How many kept tensors the worker process draws and how many it drops for want of time: its
# speed beside training's (their sum, every tensor kept, is checked apart). What it had not
# drawn 10 s after the run closed is dropped with a warning, shown or not by the same speed.
RENDERS = _mask(
    r"the worker drew \d+ heat maps(.*); \d+ it had no time",
    r"the worker drew <drawn> heat maps\1; <dropped> it had no time",
)
BACKLOG = _mask(r"^\S+: LayerscopeWarning: layerscope: on_tensor .* had not finished .*\n .*\n", "")
# After head 1's queries are multiplied by 100 at step 50, training is chaotic: a CPU's
# rounding grows into other gradients from step 53 on, other values at step 99 and other
# heads ranked after the collapsed one. The collapsed head keeps its row and its values at
# step 0 (in brackets), the collapse alert its numbers (at step 51).
EXPLODING_GRAD = _mask(
    r"^(layerscope exploding_grad: .*its scale )\S+( is )\S+( times .*?, )\S+( times )",
    r"\1<scale>\2<ratio>\3<ratio>\4",
)
LATER_HEADS = _mask(r"(?<!-\n)^blocks\.\d+\.attn +\d+ .*$", "<a head ranked after it>")
AT_STEP_99 = _mask(
    r"^(blocks\.\d+\.attn +\d+) +\S+ (\(\S+\)) +\S+ (\(\S+\)) +\S+ (\(\S+\))$",
    r"\1 <step 99> \2 <step 99> \3 <step 99> \4",
)

MASKS: dict[str, tuple[Mask, ...]] = {
    "attention_summary": (EXPLODING_GRAD, LATER_HEADS, AT_STEP_99),
    "cli": (CLOCK, SECONDS, PROCESS, VERSIONS, KERNEL),
    "demo": (SECONDS, FIXED_LOSSES, FIXED_ACCURACY),
    "run_directory": (KERNEL,),
    "trackers": (WANDB_ID, MLFLOW_ID),
    "whole_tensors": (RENDERS, BACKLOG),
}

# A number, where it stands alone ("0.5117", "-0.579%", "(2.52)", "1e-05") or after the "x" of
# a ratio ("x1.01"); not the digits inside a name ("blocks.2.attn", "e4m3", "version_0").
NUMBER = re.compile(r"(?:(?<=\bx)|(?<![\w.-]))[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")
# Numbers agree to 1e-4 of themselves (a CPU's kernels sum float32 values in an order of their
# own: about 1e-6 apart, more after training's steps), or, written with a decimal point, to
# one unit of the last digit either shows (a difference that small moves a rounded digit).
TOLERANCE = Decimal("1e-4")
# An alert, logged to stderr: where it falls among what the snippet prints on stdout depends
# on when the writer thread found it.
ALERT = re.compile(r"^layerscope \w+: ")


@dataclass(frozen=True)
class Output:
    """An output as compared: masked, its alerts apart from the lines in the order printed."""

    text: str
    lines: list[str]
    alerts: list[str]

    @classmethod
    def of(cls, name: str, text: str) -> Output:
        for mask in MASKS.get(name, ()):
            text = mask.apply(text)
        lines = text.splitlines()
        alerts = sorted((line for line in lines if ALERT.match(line)), key=_sort_key)
        return cls(text, [line for line in lines if not ALERT.match(line)], alerts)

    def agrees(self, other: Output) -> bool:
        pairs = [(self.lines, other.lines), (self.alerts, other.alerts)]
        return all(len(ours) == len(theirs) for ours, theirs in pairs) and all(
            _same_line(a, b) for ours, theirs in pairs for a, b in zip(ours, theirs, strict=True)
        )


def _words(line: str) -> str:
    """The line's words: column widths and the lengths of a table's rules set aside."""
    return " ".join("--" if set(word) == {"-"} else word for word in line.split())


def _sort_key(line: str) -> tuple[str, str]:
    return NUMBER.sub("#", _words(line)), line


def _same_line(printed: str, shown: str) -> bool:
    ours, theirs = _words(printed), _words(shown)
    if NUMBER.sub("#", ours) != NUMBER.sub("#", theirs):
        return False
    numbers = zip(NUMBER.findall(ours), NUMBER.findall(theirs), strict=True)
    return all(_same_number(a, b) for a, b in numbers)


def _same_number(printed: str, shown: str) -> bool:
    ours, theirs = Decimal(printed), Decimal(shown)
    allowed = TOLERANCE * abs(theirs)
    if _has_decimals(printed) or _has_decimals(shown):
        allowed = max(allowed, _last_digit(printed), _last_digit(shown))
    return abs(ours - theirs) <= allowed


def _has_decimals(number: str) -> bool:
    return "." in number or "e" in number.lower()


def _last_digit(number: str) -> Decimal:
    """What one unit of the number's last digit is worth: 0.001 for "2.388", 1e-7 for "3.03e-05"."""
    exponent = Decimal(number).as_tuple().exponent
    assert isinstance(exponent, int)
    return Decimal(1).scaleb(exponent)


def differences(name: str, printed: str) -> str:
    """How ``printed`` differs from docs/snippets/NAME.out, masked; empty where they agree."""
    shown = (SNIPPETS / f"{name}.out").read_text()
    ours, theirs = Output.of(name, printed), Output.of(name, shown)
    if ours.agrees(theirs):
        return ""
    lines = difflib.unified_diff(
        theirs.text.splitlines(), ours.text.splitlines(), f"{name}.out", "printed", lineterm=""
    )
    return "\n".join(lines)


@dataclass
class Printed:
    """What each snippet printed, run in ``work``; a failed one's error in ``failures``."""

    work: Path
    outputs: dict[str, str]
    failures: dict[str, str]

    def __getitem__(self, name: str) -> str:
        self.ran(name)
        # The pages show the folder the docs are built in; the tests run in a temporary one.
        return self.outputs[name].replace(str(self.work), DOCS_FOLDER)

    def ran(self, name: str) -> Path:
        """The scratch folder, where snippet ``name`` ran and wrote its files."""
        if name in self.failures:
            pytest.fail(self.failures[name], pytrace=False)
        return self.work


# What the snippets and examples import, beyond torch: '.[all]' and the dev tools bring them.
NEEDED = (
    "pandas", "duckdb", "matplotlib", "sklearn", "safetensors", "PIL", "tensorboard", "wandb",
    "mlflow", "lightning", "transformers", "accelerate",
)  # fmt: skip


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> Printed:
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the snippets need {', '.join(missing)}: pip install -e '.[dev]'")
    work = tmp_path_factory.mktemp("snippets")
    runner.prepare(work)
    env = runner.environment()
    for name in ("WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)  # the examples choose these themselves
    outputs, failures = {}, {}
    for snippet in runner.ordered(COMPARED):
        try:
            outputs[snippet.stem] = runner.run(snippet, work, env)
        except runner.SnippetError as error:
            failures[snippet.stem] = str(error)
    return Printed(work, outputs, failures)


def test_every_output_a_page_shows_is_compared() -> None:
    outputs = {path.stem for path in SNIPPETS.glob("*.out")}
    assert not set(COMPARED) & set(STABLE_SNIPPETS)  # each run once
    assert outputs == {*COMPARED, *STABLE_SNIPPETS, "help"}


def _replace(pattern: str, replacement: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        edited, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        assert count, f"{pattern!r} is not in the output any more: write another edit"
        return edited

    return edit


def _decimals_times(factor: float, plus_last_digit: int = 0) -> Callable[[str], str]:
    """Every number with a decimal point multiplied, then moved by units of its last digit."""

    def edit(text: str) -> str:
        def moved(match: re.Match[str]) -> str:
            number = match[0]
            value = Decimal(number) * Decimal(factor) + plus_last_digit * _last_digit(number)
            return str(value.quantize(_last_digit(number)))

        return re.sub(r"(?<![\w.-])\d+\.\d+(?![\w.])", moved, text)

    return edit


def _alerts_last(text: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(sorted(lines, key=lambda line: bool(ALERT.match(line))))


# Outputs as another run on another machine prints them: other times, ids, process, kernel,
# versions, column widths and last digits; the alerts logged at other moments. Each agrees.
ANOTHER_RUN = {
    "cli: times": ("cli", _replace(r"\d\d:\d\d:\d\d UTC", "09:41:07 UTC")),
    "cli: durations": ("cli", _replace(r"\d+\.\d+ s\b", "12.5 s")),
    "cli: process": ("cli", _replace(r"\(user \S+, pid \d+\)", "(user ci, pid 41)")),
    "cli: kernel": ("cli", _replace(r"native-\w+", "native-neon")),
    "cli: versions": (
        "cli",
        _replace(r"python \S+, torch \S+,", "python 3.13.1, torch 2.14+cu130,"),
    ),
    "cli: widths": ("cli", _replace(r"^(\w+) +(finished|failed)", r"\1    \2")),
    "cli: last digits": ("cli", _decimals_times(1, plus_last_digit=1)),
    "demo: last digits": ("demo", _decimals_times(1, plus_last_digit=-1)),
    "demo: fixed losses": ("demo", _replace(r"(fixed: epoch \d/5, loss )[\d.]+", r"\g<1>0.5")),
    "demo: fixed accuracy": ("demo", _replace(r"(/fixed\ntest accuracy +)[\d.]+", r"\g<1>91.3")),
    "demo: alerts logged later": ("demo", _alerts_last),
    "ddp: float32 sums": ("ddp", _decimals_times(1 + 5e-5)),
    "trackers: ids": ("trackers", _replace(r"run [0-9a-z]{8}\b", "run 0a1b2c3d")),
    "trackers: mlflow ids": ("trackers", _replace(r"run [0-9a-f]{32}\b", "run " + 32 * "e")),
    "whole_tensors: renders": ("whole_tensors", _replace(r"drew \d+(.*); \d+", r"drew 7\1; 41")),
    "whole_tensors: backlog": (
        "whole_tensors",
        _replace(
            r"^(\$ .*\n)",
            r"\1/x/_whole_tensors.py:1: LayerscopeWarning: layerscope: on_tensor HeatMap had not "
            r"finished 9 queued tensors 10 s after the run closed; they were dropped\n  close()\n",
        ),
    ),
    "attention: later heads": ("attention_summary", _replace(r"(?<!-\n)^blocks\.\d", "blocks.7")),
    "attention: step 99": (
        "attention_summary",
        _replace(r"(?<=-\n)(blocks\S+ +1 +)\S+", r"\g<1>0.5"),
    ),
    "attention: gradients": ("attention_summary", _replace(r"(its scale )\S+", r"\g<1>9e-05")),
    "run_directory: kernel": ("run_directory", _replace(r"native-\w+", "native")),
}
# Outputs gone stale: a run left out of a listing, a column renamed, a line lost, numbers or an
# alert's step changed. Each disagrees.
STALE = {
    "cli: a run unlisted": ("cli", _replace(r"^quickstart +finished.*\n", "")),
    "cli: a column renamed": ("cli", _replace(r"(steps +)ranks", r"\1world")),
    "cli: steps": ("cli", _replace(r"^(quickstart +finished +)50", r"\g<1>40")),
    "cli: a line lost": ("cli", _replace(r"^no alerts\n", "")),
    "cli: report size": ("cli", _replace(r"\([\d.]+ MB\)", "(9.9 MB)")),
    "demo: broken loss": ("demo", _replace(r"(broken: epoch 1/5, loss )[\d.]+", r"\g<1>1.234")),
    "demo: alert step": ("demo", _replace(r"^  10(  warning   dead  1)", r"  20\1")),
    "demo: an alert lost": ("demo", _replace(r"^layerscope dead: 3 .*\n", "")),
    "ddp: values": ("ddp", _decimals_times(1.01)),
    "attention: collapsed head": (
        "attention_summary",
        _replace(r"(?<=-\n)(blocks\S+ +)1", r"\g<1>2"),
    ),
    "attention: step 0": (
        "attention_summary",
        _replace(r"(?<=-\n)(blocks.*?)\(2.52\)", r"\1(2.72)"),
    ),
    "attention: an alert lost": (
        "attention_summary",
        _replace(r"^layerscope exploding_grad.*\n", ""),
    ),
    "whole_tensors: kept": ("whole_tensors", _replace(r"kept 48 whole", "kept 47 whole")),
    "trackers: rows": ("trackers", _replace(r"132 rows", "131 rows")),
    "lightning: a layer lost": ("lightning", _replace(r"^net\.1 .*\n", "")),
    "fsdp: a shard": ("fsdp", _replace(r" 1/2 ", " 0/2 ")),
}


@pytest.mark.parametrize("case", sorted(ANOTHER_RUN))
def test_what_another_run_prints_agrees(case: str) -> None:
    name, edit = ANOTHER_RUN[case]
    shown = (SNIPPETS / f"{name}.out").read_text()
    assert edit(shown) != shown
    assert not differences(name, edit(shown))


@pytest.mark.parametrize("case", sorted(STALE))
def test_a_stale_output_disagrees(case: str) -> None:
    name, edit = STALE[case]
    assert differences(name, edit((SNIPPETS / f"{name}.out").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPARED)
def test_a_snippet_prints_what_its_page_shows(printed: Printed, name: str) -> None:
    difference = differences(name, printed[name])
    assert not difference, f"{name}.out is not what the snippet prints now:\n{difference}"


@pytest.mark.slow
def test_the_attention_example_names_the_head_it_collapses(printed: Printed) -> None:
    work = printed.ran("attention_summary")
    assert (work / "images" / "attention.png").stat().st_size > 10_000
    run = layerscope.load(work / "runs" / "attention")
    alerts = run.alerts[run.alerts.rule == "attention_collapse"]
    assert set(zip(alerts.module, alerts.tensor, strict=True)) == {("blocks.2.attn", "head 1")}
    assert alerts.step.min() >= 50  # the step its queries grow 100 times
    last = run.attention[run.attention.step == run.attention.step.max()]
    lowest = last.sort_values("entropy_frac").iloc[0]
    assert (lowest.module, lowest["head"]) == ("blocks.2.attn", 1)


@pytest.mark.slow
def test_the_distributed_example_writes_whole_job_rows_from_rank_0(printed: Printed) -> None:
    stats = layerscope.load(printed.ran("ddp") / "runs" / "distributed").stats
    recorded = stats[~stats["sentinel"].fillna(False).astype(bool)]
    assert set(recorded["rank"]) == {0}
    relu = recorded[(recorded["module"] == "1") & (recorded["kind"] == "activation")]
    assert list(relu["step"]) == [0, 5, 10, 15]
    assert set(relu["numel"]) == {2 * 8 * 32}  # both ranks' batches of 8 x 32 features


@pytest.mark.slow
def test_the_whole_tensors_example_draws_or_drops_each_kept_tensor_and_animates(
    printed: Printed,
) -> None:
    from PIL import Image

    out = printed["whole_tensors"]
    assert "the run kept 48 whole tensors" in out  # 12 kept steps: 2 activations, 2 weights
    assert "whole tensors not kept: 0" in out
    drawn = re.search(r"the worker drew (\d+) heat maps.*; (\d+) it had no time for", out)
    assert drawn is not None
    # Each of the 48 kept tensors drawn or dropped; where close() gave up on the worker, the one
    # it was drawing may have reached the disk as it was stopped, and counts as dropped too.
    assert 48 <= int(drawn[1]) + int(drawn[2]) <= 49
    animations = printed.work / "whole-tensors" / "run" / "animations"
    for name in ("0-weight-heatmap.gif", "3-activation-pca.gif"):
        with Image.open(animations / name) as gif:
            assert gif.n_frames == 12


@pytest.mark.slow
def test_the_sinks_example_writes_to_all_three_trackers(
    printed: Printed, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, sinks = printed["trackers"], printed.work / "sinks"
    run = layerscope.load(sinks / "run")
    assert f"run {DOCS_FOLDER}/sinks/run: finished, {len(run.stats)} rows of statistics" in out
    losses = run.scalars.query("name == 'loss'").sort_values("step")
    assert losses.step.tolist() == list(range(30))

    events = EventAccumulator(str(sinks / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = events.Scalars("loss")
    assert [event.step for event in logged] == losses.step.tolist()
    assert [event.value for event in logged] == pytest.approx(losses.value.tolist(), rel=1e-6)

    (wandb_id,) = re.findall(r"W&B: offline run (\w+) under", out)
    assert len(list((sinks / "wandb").glob(f"offline-run-*-{wandb_id}/run-*.wandb"))) == 1

    (mlflow_id,) = re.findall(r"MLflow: run (\w+) in", out)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((sinks / "mlruns").as_uri())
    assert client.get_run(mlflow_id).info.status == "FINISHED"
    history = sorted(client.get_metric_history(mlflow_id, "loss"), key=lambda m: m.step)
    assert [metric.step for metric in history] == losses.step.tolist()
    assert [metric.value for metric in history] == pytest.approx(losses.value.tolist())
    weights = run.stats.query("module == '0' and kind == 'weight' and tensor == 'weight'")
    std = client.get_metric_history(mlflow_id, "train/weight/0/weight/std")
    assert sorted(metric.step for metric in std) == weights.step.tolist() == list(range(0, 30, 5))


# Both trainer examples record the steps their validation follows: 9, 19, ...
@pytest.mark.slow
def test_the_lightning_example_writes_its_run_in_the_loggers_directory(printed: Printed) -> None:
    logs = printed.ran("lightning") / "runs" / "lightning" / "lightning_logs" / "version_0"
    run = layerscope.load(logs / "layerscope")
    assert run.meta["status"] == "finished"
    assert sorted(set(run.stats.step)) == [9, 19, 29, 39]
    assert sorted(set(run.stats[run.stats.phase == "eval"].step)) == [9, 19, 29, 39]
    assert set(run.stats.kind) == {"activation", "grad", "weight", "update"}
    scalars = run.scalars
    for name in ("loss", "lr"):
        assert sorted(scalars[scalars.name == name].step) == list(range(40)), name
    assert (logs / "metrics.csv").exists()


@pytest.mark.slow
def test_the_transformers_example_writes_its_run_in_the_output_dir(printed: Printed) -> None:
    run = layerscope.load(printed.ran("huggingface") / "runs" / "transformers" / "layerscope")
    assert run.meta["status"] == "finished"
    assert sorted(set(run.stats.step)) == [9, 19]
    assert sorted(set(run.stats[run.stats.phase == "eval"].step)) == [9, 19]
    scalars = run.scalars
    for name in ("loss", "learning_rate", "grad_norm"):
        assert sorted(scalars[scalars.name == name].step) == [4, 9, 14, 19], name
    assert sorted(scalars[scalars.name == "eval_loss"].step) == [9, 19]
