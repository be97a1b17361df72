"""Watch a small CNN learn the handwritten digits bundled with scikit-learn.

Run: python examples/digits.py   (needs: pip install 'layerscope[demo]')
"""

import pandas as pd
import torch
from sklearn.datasets import load_digits
from torch import nn

import layerscope


def load(device: str = "cpu") -> tuple[torch.Tensor, ...]:
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32, device=device)[:, None] / 16.0
    labels = torch.tensor(digits.target, device=device)
    return images[:1500], labels[:1500], images[1500:], labels[1500:]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),  # (batch, 32, 4, 4)
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )


def main() -> None:
    torch.manual_seed(0)
    train_x, train_y, test_x, test_y = load()
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    kinds = ("activation", "grad", "weight", "weight_grad", "update")

    with layerscope.watch(model, optimizer=optimizer, kinds=kinds) as scope:
        for _ in range(5):  # epochs
            for batch in torch.randperm(len(train_x)).split(64):
                loss = nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
                loss.backward()
                optimizer.step()  # ends the step: gradients, weights and updates are read here
                optimizer.zero_grad()
                scope.step(loss=loss)  # records the loss of the step that just ended

    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    stats = scope.frame()
    print(f"trained {scope.current_step} steps, test accuracy {accuracy:.1%}")
    print(f"recorded {len(stats)} rows at steps {sorted(set(stats.step))}\n")

    # How each layer looks at the last recorded step.
    last = stats[stats.step == stats.step.max()]
    layer = last.pivot_table(index="module", columns="kind", values="l2", aggfunc="first")
    table = pd.DataFrame(
        {
            "type": last.groupby("module").module_type.first(),
            "act_std": last[last.kind == "activation"].set_index("module")["std"],
            "act_zero": last[last.kind == "activation"].set_index("module").zero_frac,
            "grad_l2": layer.get("grad"),
            "weight_grad_l2": last[(last.kind == "weight_grad") & (last.tensor == "weight")]
            .set_index("module")
            .l2,
            "update/weight": last[(last.kind == "update") & (last.tensor == "weight")]
            .set_index("module")
            .l2
            / last[(last.kind == "weight") & (last.tensor == "weight")].set_index("module").l2,
        }
    )
    with pd.option_context("display.float_format", "{:.3g}".format, "display.width", 120):
        print(f"layers at step {last.step.max()}:")
        print(table.to_string(na_rep="-"))

    losses = scope.frame("scalars")
    print("\nloss every 20 steps:", [round(v, 3) for v in losses.value[::20]])


if __name__ == "__main__":
    main()
