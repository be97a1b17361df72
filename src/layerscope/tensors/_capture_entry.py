"""``capture()``: the entry point, which checks its arguments into ``CaptureOptions``.

The hooks and what they keep are ``_capture.Capture``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from layerscope._config import check_model
from layerscope.model import Kind, unwrap
from layerscope.tensors._capture import Capture
from layerscope.tensors._event import Event
from layerscope.tensors._options import CaptureOptions
from layerscope.tensors._records import Record

if TYPE_CHECKING:
    from layerscope.model import ModuleFilter


def capture(
    model: nn.Module,
    include: ModuleFilter | Sequence[ModuleFilter] | None = None,
    exclude: ModuleFilter | Sequence[ModuleFilter] | None = None,
    types: type[nn.Module] | tuple[type[nn.Module], ...] | None = None,
    kinds: Sequence[str | Kind] = ("activation", "grad"),
    condition: Callable[[Record], object] | None = None,
    reduction: str | Callable[[Tensor, Tensor], Tensor] | None = None,
    stash_value: Callable[[Tensor], Any] | None = None,
    every: int = 1,
    device: str | torch.device | None = "cpu",
    max_bytes: int | None = None,
    stash: Callable[[Event], Any] | None = None,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    whole_outputs: bool = False,
) -> Capture:
    """Keep whole tensors of chosen modules: outputs, output gradients, inputs, weight gradients.

    Each kept value is detached and copied (compact: never a view holding a whole batch) to
    ``device``, inside the hook, before a later in-place op can change it. Steps are yours to
    mark with ``cap.step()``. For statistics of every layer at a cost you can leave on, use
    ``layerscope.watch``; ``capture`` is for looking at the tensors themselves.

    Args:
        model: any ``nn.Module`` (DDP and ``torch.compile`` wrappers are looked through).
        include: which modules, as ``watch`` takes them: a regex (or list of them) searched
            in qualified module names, one that matches a whole name picking that module
            even if it is a container (``"^$"``: the root); module objects of the model
            (``model.encoder``: itself, and the layers inside it as by default); callables
            ``fn(name, module) -> bool``, called once per module here, whose true answer
            picks that module whatever it is; or a list mixing them.
        exclude: modules to leave out, as ``include`` takes them: a regex found in the name,
            a module object (it and everything inside it), a callable answering true.
        types: module classes to keep. By default every module that owns parameters or has
            no children, as ``watch`` chooses.
        kinds: some of ``"activation"`` (forward output), ``"grad"`` (gradient with respect
            to the forward output, through a tensor hook, so in-place ops are safe),
            ``"input"`` (forward input, before the module runs), ``"input_grad"`` (the
            gradient with respect to each input that needs one, through this module alone,
            as torchfunc's ``BackwardInput`` gives it; an input the module changes in place
            has none) and ``"weight_grad"`` (each
            parameter's gradient as the optimizer sees it, one record per parameter and step:
            read where ``watch`` reads it for statistics, just before ``optimizer``'s step,
            or without one when each backward pass ends, after DDP's all-reduce; the last
            reading of a step is kept, so with gradient accumulation the accumulated one).
        condition: ``fn(record) -> bool``, called before each value is kept; the ``Record``
            carries the metadata (``module``, ``kind``, ``step``, ``phase``, ...) and, as
            ``value``, the live tensor, detached (reading it is a host sync on a GPU; do not
            keep it). Ignore the record to gate on outside state: ``lambda record: flag``.
        reduction: keep one running tensor per (module, kind, tensor) instead of one per
            call: ``"sum"``, ``"mean"`` (running mean; ``record.count`` says of how many),
            ``"max"``, ``"min"`` (shapes must agree), or ``fn(accumulated, new) -> Tensor``.
            The record's ``step``, ``phase`` and ``call`` are those of its latest value.
        stash_value: ``fn(tensor) -> value`` applied, on the tensor's device, before the
            value is kept (e.g. ``lambda t: t.std(dim=0)``, ``lambda t: t[:4]``); it may
            return any value (``lambda t: t.std().item()``, a tuple): tensors in tuples,
            lists and dicts are copied as tensors are, anything else is kept as it is.
        every: keep values in every N-th step only (0, N, 2N, ...); the others carry no hook.
        device: where kept values go; None keeps each on its own device.
        max_bytes: stop keeping new values once they would hold more than this many bytes:
            one ``LayerscopeWarning``, and ``cap.skipped`` counts what was not kept (tensors
            count; other objects a stash returns count nothing).
        stash: ``fn(event) -> value``, tensor_tracker's full form: ``event`` (an ``Event``)
            holds the module, its name, the kind, the tensor's name, the step, the call's
            ``args`` and ``kwargs`` and, as ``value``, the output, input or gradient tensor;
            what ``fn`` returns is kept, as ``stash_value``'s is. Not with ``stash_value``.
        optimizer: the optimizer (or a list) whose step reads ``"weight_grad"``: after
            accumulation, unscaling and clipping. Without one, gradients are read when each
            backward ends.
        whole_outputs: keep each call's output whole, as tensor_tracker does: one
            ``activation`` record (``tensor="out"``, ``record.whole`` True) holding the tuple,
            list, dict, dataclass or Hugging Face ``ModelOutput`` the module returned, its
            non-tensor fields as they are and each tensor copied (``stash_value`` applied to
            each). ``save()`` keeps the structure (a dataclass or ``ModelOutput`` loads as a
            ``SavedObject``: its fields by name, as items and attributes); ``to_frame()``
            still gives a row per tensor (``out.0``, ``out.logits``). Not with ``reduction``.

    Returns:
        A ``Capture``: ``records`` (a list of ``Record``), ``step()``, ``to_frame()``,
        ``save(dir)``, ``clear()``, ``close()``; a context manager whose exit removes every
        hook. Monitoring failures (a ``stash_value`` that raises, shapes that change under a
        reduction) warn once, are counted in ``cap.failures``, and never stop training.

    Raises:
        TypeError: ``model`` is not a module, or an argument has the wrong type.
        ValueError: a bad regex, an unknown kind or reduction, ``every < 1``,
            ``max_bytes < 0``, an unusable device, a selection that matches no module, a
            module object in ``include`` or ``exclude`` that is not the model's, a
            callable there that raised, or both ``stash`` and ``stash_value``.

    Examples:
        >>> import torch, layerscope
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 1))
        >>> with layerscope.capture(model, include=r"^0$") as cap:
        ...     for _ in range(3):
        ...         model(torch.randn(16, 4)).pow(2).mean().backward()
        ...         cap.step()
        >>> [(r.step, r.kind, r.tensor, tuple(r.value.shape)) for r in cap.records][:2]
        [(0, 'activation', 'out', (16, 8)), (0, 'grad', 'out', (16, 8))]
        >>> cap.hooks, len(cap.records)
        (0, 6)
    """
    model = check_model(model)
    options = CaptureOptions.from_arguments(
        include=include,
        exclude=exclude,
        types=types,
        kinds=kinds,
        condition=condition,
        reduction=reduction,
        stash_value=stash_value,
        every=every,
        device=device,
        max_bytes=max_bytes,
        root=unwrap(model),
        stash=stash,
        optimizer=optimizer,
        whole_outputs=whole_outputs,
    )
    return Capture(model, options)
