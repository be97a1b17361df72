"""What users of Graphcore's tensor_tracker and torchfunc's recorders wrote, with layerscope.

Run: python examples/migrating/from_tensor_tracker.py   (needs: pip install 'layerscope[dataframe]')

tensor_tracker's ``track(model, include=..., stash_value=...)`` kept one value per module call
and ``to_frame(stat)`` tabled them; its ``stash=fn`` saw the whole event. torchfunc's
recorders chose modules by ``indices=`` and kept a running ``reduction``. ``layerscope.capture``
does all of these, marks steps, and takes module objects and predicates besides regexes.
"""

import torch
from torch import nn

import layerscope


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(32, 4)

    # tensor_tracker: track(model, include=r"^\d$", stash_value=lambda t: t.std().item())
    with layerscope.capture(
        model, include=r"^[02]$", kinds="activation", stash_value=lambda t: t.std().item()
    ) as cap:
        model(x)
    print("stash_value kept:", [(r.module, type(r.value).__name__) for r in cap.records])

    # tensor_tracker: track(model, stash=fn), fn seeing the module, its arguments and value
    def stash(event: layerscope.tensors.Event) -> tuple[str, float]:
        return type(event.module).__name__, float(event.value.abs().max())

    with layerscope.capture(
        model, include=r"^4$", kinds=("activation", "grad"), stash=stash
    ) as cap:
        model(x).sum().backward()
    print("stash kept:", [(r.kind, r.value[0]) for r in cap.records])

    # torchfunc: ForwardOutput(reduction=...).children(model, indices=[1, 3]): the ReLUs
    relus = [model[1], model[3]]
    with layerscope.capture(model, include=relus, kinds="activation", reduction="sum") as cap:
        for _ in range(3):
            model(x)
            cap.step()
    frame = cap.to_frame(stat=torch.mean)
    print(frame[["module", "kind", "count"]].to_string(index=False))

    # tensor_tracker and torchfunc filters as a predicate
    with layerscope.capture(
        model, include=lambda name, module: isinstance(module, nn.Linear) and name != "4"
    ) as cap:
        model(x)
    print("predicate picked:", sorted({r.module for r in cap.records}))


if __name__ == "__main__":
    main()
