"""``layerscope.integrations.transformers.LayerscopeCallback`` under a real HF ``Trainer``.

A random-init tiny GPT-2 (nothing downloaded) trains on random token ids. The run is read back
with ``layerscope.load`` and compared with what the Trainer did: its global step, and what it
logged in ``state.log_history``.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import Dataset

import layerscope
from tests.integration._util import assert_same_parameters, has_no_hooks, select

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("pandas")
from layerscope.integrations.transformers import LayerscopeCallback  # noqa: E402

MAX_STEPS = 6
LOGGING_STEPS = 2
EVAL_STEPS = 3
BATCH = 2
TOKENS = 16
VOCAB = 64


class Tokens(Dataset):
    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (samples, TOKENS), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class FailAt(transformers.TrainerCallback):
    """Raises at the end of one global step, as a crash in training would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError("training failed on purpose")


def _model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32
    )
    return transformers.GPT2LMHeadModel(config)


def _trainer(output_dir, callbacks, accumulate=1, evaluate=False):
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        max_steps=MAX_STEPS,
        logging_steps=LOGGING_STEPS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=accumulate,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=EVAL_STEPS,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    return transformers.Trainer(
        model=_model(),
        args=args,
        train_dataset=Tokens(MAX_STEPS * accumulate * BATCH),
        eval_dataset=Tokens(2 * BATCH),
        callbacks=callbacks,
    )


def _logged(trainer, name):
    """``{layerscope step: value}`` of what the Trainer logged: its step G is step G - 1."""
    return {entry["step"] - 1: entry[name] for entry in trainer.state.log_history if name in entry}


def _recorded(run, name):
    scalars = run.scalars[run.scalars.name == name]
    return dict(zip(scalars.step, scalars.value, strict=True))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    callback = LayerscopeCallback(every=1)
    trainer = _trainer(tmp_path_factory.mktemp("out"), [callback], evaluate=True)
    trainer.train()
    assert trainer.state.global_step == MAX_STEPS
    return callback, trainer, layerscope.load(callback.run_dir)


def test_the_run_is_in_the_output_dir_and_finished(trained):
    callback, trainer, run = trained
    assert callback.run_dir == os.path.join(trainer.args.output_dir, "layerscope")
    assert run.meta["status"] == "finished"
    assert callback.failures == 0
    assert callback.scope.failures == 0
    assert has_no_hooks(trainer.model)


def test_steps_are_the_trainers_global_steps(trained):
    callback, trainer, run = trained
    train = select(run.stats, phase="train")
    assert sorted(set(train.step)) == list(range(trainer.state.global_step))
    assert callback.scope.current_step == trainer.state.global_step


@pytest.mark.parametrize("name", ["loss", "learning_rate", "grad_norm"])
def test_training_logs_are_recorded_at_the_step_they_were_logged(trained, name):
    _, trainer, run = trained
    logged = _logged(trainer, name)
    assert sorted(logged) == [1, 3, 5]  # every LOGGING_STEPS steps, and only then
    recorded = _recorded(run, name)
    assert sorted(recorded) == sorted(logged)
    for step, value in logged.items():
        assert recorded[step] == pytest.approx(value, rel=1e-12), (name, step)


def test_evaluation_is_eval_rows_and_eval_loss_at_the_step_it_follows(trained):
    _, trainer, run = trained
    logged = _logged(trainer, "eval_loss")
    assert sorted(logged) == [2, 5]  # after global steps 3 and 6
    assert _recorded(run, "eval_loss") == pytest.approx(logged)
    evaluation = select(run.stats, phase="eval")
    assert sorted(set(evaluation.step)) == [2, 5]
    assert set(evaluation.kind) == {"activation"}
    # Timings and bookkeeping are not recorded.
    assert not {"epoch", "eval_runtime", "total_flos"} & set(run.scalars.name)


def test_gradient_accumulation_keeps_steps_on_global_steps(tmp_path):
    callback = LayerscopeCallback(every=1, kinds=["activation", "weight_grad"])
    trainer = _trainer(tmp_path, [callback], accumulate=2)
    trainer.train()
    run = layerscope.load(callback.run_dir)
    assert trainer.state.global_step == MAX_STEPS
    assert sorted(set(run.stats.step)) == list(range(MAX_STEPS))
    # Two micro-batches merge into each step's rows.
    rows = select(run.stats, step=0, module="lm_head", kind="activation")
    assert rows.numel.tolist() == [2 * BATCH * TOKENS * VOCAB]
    assert _recorded(run, "loss") == pytest.approx(_logged(trainer, "loss"))


def test_training_is_bit_identical_to_an_unwatched_run(trained, tmp_path):
    _, watched, _ = trained
    unwatched = _trainer(tmp_path, [], evaluate=True)
    unwatched.train()
    assert_same_parameters(watched.model, unwatched.model)
    assert not torch.equal(watched.model.lm_head.weight, _model().lm_head.weight)  # it trained


def test_a_failed_train_closes_the_run_as_failed_inside_with(tmp_path):
    callback = LayerscopeCallback(every=1)
    trainer = _trainer(tmp_path, [callback, FailAt(step=3)])
    with pytest.raises(RuntimeError, match="on purpose"), callback:
        trainer.train()
    run = layerscope.load(callback.run_dir)
    assert run.meta["status"] == "failed"
    assert set(run.stats.step) == {0, 1, 2}
    assert has_no_hooks(trainer.model)


def test_the_next_train_closes_a_run_left_open_as_failed(tmp_path):
    callback = LayerscopeCallback(every=1)
    trainer = _trainer(tmp_path, [callback, FailAt(step=3)])
    with pytest.raises(RuntimeError, match="on purpose"):
        trainer.train()
    first = callback.run_dir
    trainer.callback_handler.pop_callback(FailAt)
    trainer.train()
    assert layerscope.load(first).meta["status"] == "failed"
    assert callback.run_dir == os.path.join(tmp_path, "layerscope-2")
    assert layerscope.load(callback.run_dir).meta["status"] == "finished"
    assert has_no_hooks(trainer.model)


def test_an_explicit_run_wins(tmp_path):
    callback = LayerscopeCallback(every=1, run=None)
    trainer = _trainer(tmp_path, [callback])
    trainer.train()
    assert callback.run_dir is None
    assert not (tmp_path / "layerscope").exists()
    assert sorted(set(callback.scope.frame().step)) == list(range(MAX_STEPS))


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"evry": 10}, TypeError, "unexpected keyword argument 'evry'"),
        ({"optimizer": None}, TypeError, "^optimizer: "),
        ({"every": 0}, ValueError, "^every: "),
        ({"exclude": "["}, ValueError, "^exclude: "),
        ({"stats": ["nope"]}, ValueError, "^stats: "),
    ],
)
def test_bad_options_fail_when_the_callback_is_made(options, error, match):
    with pytest.raises(error, match=match):
        LayerscopeCallback(**options)
