"""Hugging Face Trainer: layerscope attached from a TrainerCallback.

``on_train_begin`` receives ``model`` (the unwrapped ``PreTrainedModel``) and ``optimizer``,
which by then is accelerate's ``AcceleratedOptimizer``: a ``torch.optim.Optimizer`` subclass
that never calls ``Optimizer.__init__``, so it has no step-hook dictionaries of its own; the
torch optimizer is its ``.optimizer``. With ``gradient_accumulation_steps=2`` the Trainer calls
``optimizer.step()`` once per two micro-batches, between ``on_pre_optimizer_step`` and
``on_optimizer_step``, then ``model.zero_grad()`` and ``on_step_end``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

import layerscope
from tests.integration._util import (
    assert_one_merged_row,
    assert_same_parameters,
    calls_per_forward,
    has_no_hooks,
    select,
)

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("pandas")

MAX_STEPS = 4
ACCUMULATE = 2
BATCH = 2
EVAL_EVERY = 2  # evaluation after global steps 2 and 4: after layerscope's steps 1 and 3
EVAL_BATCHES = 2
TOKENS = 16
VOCAB = 100


class Tokens(Dataset):
    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (samples, TOKENS), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class Watch(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.scope = None
        self.optimizer_type = None
        self.step_at_end = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.optimizer_type = type(optimizer).__name__
        self.scope = layerscope.watch(model, optimizer=optimizer, every=1)

    def on_train_end(self, args, state, control, **kwargs):
        self.step_at_end = self.scope.current_step
        self.scope.close()


def _model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32
    )
    return transformers.GPT2LMHeadModel(config)


def _train(tmp_path, callbacks):
    model = _model()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        max_steps=MAX_STEPS,
        gradient_accumulation_steps=ACCUMULATE,
        per_device_train_batch_size=BATCH,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        eval_strategy="steps",
        eval_steps=EVAL_EVERY,
        per_device_eval_batch_size=BATCH,
        disable_tqdm=True,
        seed=0,
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(MAX_STEPS * ACCUMULATE * BATCH),
        eval_dataset=Tokens(EVAL_BATCHES * BATCH),
        callbacks=callbacks,
    )
    trainer.train()
    assert trainer.state.global_step == MAX_STEPS
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    watch = Watch()
    model = _train(tmp_path_factory.mktemp("watched"), [watch])
    return watch, model


def test_watch_accepts_the_trainers_accelerated_optimizer(trained):
    watch, _ = trained
    assert watch.optimizer_type == "AcceleratedOptimizer"
    assert watch.scope is not None
    assert watch.step_at_end == MAX_STEPS
    assert watch.scope.current_step == MAX_STEPS
    assert watch.scope.failures == 0


def test_every_optimizer_step_is_a_step(trained):
    watch, model = trained
    frame = watch.scope.frame()
    assert sorted(set(frame.step)) == list(range(MAX_STEPS))
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    for step in range(MAX_STEPS):
        grads = select(frame, step=step, kind="weight_grad")
        # Every parameter's gradient, once: lm_head's weight is tied to wte's.
        read = {f"{m}.{t}" for m, t in zip(grads.module, grads.tensor, strict=True)}
        assert names <= read | {"lm_head.weight"}, (step, names - read)
        assert (grads.call == 0).all()
        weights = select(frame, step=step, kind="weight")
        assert len(weights), step


def test_micro_batches_merge_per_step(trained):
    watch, model = trained
    ids = Tokens(BATCH).ids
    calls = calls_per_forward(model, lambda: model(input_ids=ids, labels=ids))
    frame = watch.scope.frame()
    train = select(frame, phase="train", kind="activation")
    assert set(train.module) <= set(calls)
    once = [name for name in sorted(set(train.module)) if calls[name] == 1]
    assert "transformer.h.0.mlp.c_fc" in once
    assert "lm_head" in once
    for step in range(MAX_STEPS):
        for module in once:
            assert_one_merged_row(
                frame,
                step=step,
                module=module,
                kind="activation",
                phase="train",
                passes=ACCUMULATE,
            )
        at_step = select(train, step=step)
        for module in set(at_step.module):
            assert set(select(at_step, module=module).call) <= set(range(calls[module]))


@pytest.fixture(scope="module")
def unwatched(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("unwatched"), [])


def test_evaluation_belongs_to_the_step_before_it(trained):
    # The Trainer evaluates after optimizer.step(), zero_grad() and on_step_end.
    watch, model = trained
    ids = Tokens(BATCH).ids
    calls = calls_per_forward(model, lambda: model(input_ids=ids, labels=ids))
    frame = watch.scope.frame()
    evaluation = select(frame, phase="eval")
    assert set(evaluation.kind) == {"activation"}
    after = [step - 1 for step in range(EVAL_EVERY, MAX_STEPS + 1, EVAL_EVERY)]
    assert sorted(set(evaluation.step)) == after
    for step in after:
        for module in sorted(set(evaluation.module)):
            if calls[module] == 1:
                assert_one_merged_row(
                    frame,
                    step=step,
                    module=module,
                    kind="activation",
                    phase="eval",
                    passes=EVAL_BATCHES,
                )


def test_training_is_bit_identical_to_an_unwatched_run(trained, unwatched):
    _, watched = trained
    assert_same_parameters(watched, unwatched)
    initial = _model()
    assert not torch.equal(watched.lm_head.weight, initial.lm_head.weight)  # it did train
    assert has_no_hooks(watched)
