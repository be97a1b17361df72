"""What a user of torchfunc's recorders wrote, with layerscope: forward inputs and outputs,
gradients of outputs and of inputs, a condition and a running sum, modules chosen by type or
by position, one module dropped midway, and what was kept saved and read back.

Run: python examples/migrating/from_torchfunc.py --out /tmp/torchfunc
(needs: pip install 'layerscope[capture]')

torchfunc's ``ForwardOutput``, ``ForwardInput``, ``BackwardOutput`` and ``BackwardInput``
recorders each hooked one kind of tensor; ``.modules(net, types=...)`` and
``.children(net, indices=...)`` chose the modules, ``condition=`` and ``reduction=`` what was
kept, ``recorder.remove(i)`` dropped one module and ``recorder.save(path)`` wrote the tensors.
One ``layerscope.capture`` keeps the four kinds at once, step by step, each input by its name.
"""

import argparse
from collections import Counter
from pathlib import Path

import torch
from torch import nn

import layerscope

KINDS = ("activation", "input", "grad", "input_grad")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("torchfunc-example"))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 2)

    # torchfunc: ForwardOutput, ForwardInput, BackwardOutput and BackwardInput, each
    # .modules(model, types=(nn.Linear,)): one capture keeps all four.
    linears = layerscope.capture(model, types=(nn.Linear,), kinds=KINDS)
    # torchfunc: ForwardOutput(condition=lambda: recording, reduction=lambda acc, new: acc + new)
    # .children(model, indices=[1, 3]): the two ReLUs, given as module objects.
    recording = False
    relus = layerscope.capture(
        model,
        include=[list(model.children())[i] for i in (1, 3)],
        kinds=["activation"],
        condition=lambda record: recording,  # the record's metadata is there if wanted
        reduction="sum",
    )
    print("Linears captured:", linears.modules)
    with linears, relus:
        for step in range(args.steps):
            if step == args.steps - 1:
                # torchfunc: recorder.remove(0); the others go on, its records stay
                linears.remove(0)
                print("after remove(0):", linears.modules)
            recording = step % 2 == 0  # the sums take the even steps only
            # The data asks for a gradient (a saliency map, say): the first Linear's input
            # then has one too.
            inputs = x.clone().requires_grad_()
            loss = (model(inputs) - y).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            linears.step()
            relus.step()

    first = {(r.kind, r.tensor): r.value for r in linears.records if (r.module, r.step) == ("0", 0)}
    for kind, tensor in sorted(first, key=lambda key: KINDS.index(key[0])):
        print(f"step 0, Linear 0: {kind} {tensor} {tuple(first[kind, tensor].shape)}")
    print(f"step 0, Linear 0: input_grad l2 {first['input_grad', 'in.input'].norm():.6f}")
    per_step = Counter(record.step for record in linears.records)
    print("records per step:", [per_step[step] for step in range(args.steps)])
    for record in relus.records:
        print(
            f"ReLU {record.module}: sum of {record.count} outputs {tuple(record.value.shape)}, "
            f"the last at step {record.step}"
        )

    # torchfunc: recorder.save(path), a .pt file per module; here safetensors and an index
    for name, cap in (("linears", linears), ("relus", relus)):
        loaded = layerscope.load_capture(cap.save(args.out / name, overwrite=True))
        same = all(
            torch.equal(a.value, b.value) and a.metadata() == b.metadata()
            for a, b in zip(cap.records, loaded.records, strict=True)
        )
        print(f"{name}: {len(loaded.records)} records read back", "as kept" if same else "CHANGED")


if __name__ == "__main__":
    main()
