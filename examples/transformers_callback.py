"""Watch a Hugging Face Trainer train a tiny GPT-2, with layerscope's Trainer callback.

Run: python examples/transformers_callback.py [--out DIR] [--steps N]
(needs: pip install 'layerscope[transformers,dataframe]' accelerate)

The model is a random-init GPT-2 of two small blocks and the data random token ids, so
nothing is downloaded. The run goes to <output_dir>/layerscope.
"""

from __future__ import annotations

import argparse

import torch
import transformers
from torch.utils.data import Dataset

import layerscope
from layerscope.integrations.transformers import LayerscopeCallback

VOCAB = 64
TOKENS = 16


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random token ids; the model learns their unigram frequencies, no more."""

    def __init__(self, samples: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB // 4, (samples, TOKENS), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/transformers", help="the Trainer's output_dir")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32
    )
    model = transformers.GPT2LMHeadModel(config)
    training = transformers.TrainingArguments(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,  # two micro-batches per step: merged into one
        learning_rate=3e-3,
        logging_steps=5,
        eval_strategy="steps",
        eval_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    # The Trainer evaluates after global step 10, 20...: layerscope's steps 9, 19... (it counts
    # from 0). Recording those steps puts training and evaluation rows under the same steps.
    callback = LayerscopeCallback(every=layerscope.Schedule(every=10, start=9))
    trainer = transformers.Trainer(
        model=model,
        args=training,
        train_dataset=Tokens(8 * args.steps, seed=1),
        eval_dataset=Tokens(16, seed=2),
        callbacks=[callback],
    )
    trainer.remove_callback(transformers.PrinterCallback)  # the run has what it prints
    with callback:  # closes the run as failed if training raises
        trainer.train()

    run = layerscope.load(callback.run_dir)
    stats = run.stats
    evaluation = stats[stats.phase == "eval"]
    print(f"run {callback.run_dir}: {run.meta['status']}, {trainer.state.global_step} steps")
    print(f"recorded steps {sorted(set(stats.step))}, evaluation at {sorted(set(evaluation.step))}")

    print("\nwhat the Trainer logged, at the step it logged it:")
    scalars = run.scalars.pivot_table(index="step", columns="name", values="value")
    print(scalars.to_string(float_format="{:.4g}".format, na_rep="-"))

    last = stats[(stats.step == stats.step.max()) & (stats.phase == "train")]
    blocks = last[last.module.str.fullmatch(r"transformer\.h\.\d\.(attn|mlp)\.c_proj")]
    table = blocks.pivot_table(index="module", columns="kind", values="l2", aggfunc="first")
    print(f"\nL2 norms of the blocks' output projections at step {last.step.max()}:")
    print(table[["activation", "grad", "weight_grad"]].to_string(float_format="{:.3g}".format))


if __name__ == "__main__":
    main()
