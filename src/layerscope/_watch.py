"""``watch()``: the entry point that checks its arguments and starts a ``Scope``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from layerscope._config import WatchConfig, check_model
from layerscope._imports import require
from layerscope._schedule import Schedule
from layerscope.hooks import parse_optimizers
from layerscope.model import DEFAULT_KINDS, Kind, unwrap
from layerscope.scope import Scope
from layerscope.sinks import Sink
from layerscope.tensors import Record, parse_tensors

if TYPE_CHECKING:
    from layerscope.model import ModuleFilter


#: ``watch(if_exists=...)``: where ``run`` holds a run, raise, or write the next free ``run-N``.
IF_EXISTS = ("fail", "new")
#: ``kinds=``'s old name, still taken with a FutureWarning.
OLD_KINDS_NAME = "capture"


def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    run: object = None,
    every: int | Schedule | None = None,
    kinds: Sequence[str | Kind] = DEFAULT_KINDS,
    include: ModuleFilter | Sequence[ModuleFilter] | None = None,
    exclude: ModuleFilter | Sequence[ModuleFilter] | None = None,
    types: tuple[type[nn.Module], ...] | None = None,
    stats: object = None,
    histogram: object = "log2",
    alerts: bool | str | dict[str, Any] = True,
    sinks: Sequence[Sink] = (),
    ranks: str = "each",
    start_step: int = 0,
    tensors: str | Sequence[str] | Mapping[str, Any] | None = None,
    on_tensor: Callable[[Record, Path | None], object] | None = None,
    workers: int | None = None,
    noise_scale: bool | int = False,
    attention: bool = False,
    if_exists: str = "fail",
    *,
    storage_options: Mapping[str, Any] | None = None,
    capture: Sequence[str | Kind] | None = None,
) -> Scope:
    """Record statistics of every layer of ``model`` while it trains.

    Args:
        model: any ``nn.Module``; DDP and ``torch.compile`` wrappers are looked through for
            names. Hooks must be attached before a compiled model's first call.
        optimizer: if given, ``optimizer.step()`` ends each step; gradients are read just
            before it (after accumulation, unscaling and clipping), weights and updates just
            after. Wrappers (accelerate's, Lightning's) are looked through. A list of
            optimizers (a GAN's) is read around each one's step; the first one's step ends
            the training step, so list first the one that steps last in an iteration.
            Without one, the first optimizer seen to step every watched parameter that needs
            a gradient is followed as if it were given, unless ``scope.step()`` was called
            before that: a loop that calls neither still gets one step per iteration.
        run: the run's directory (a path or an fsspec URL such as ``memory://runs/a``), or a
            ``layerscope.store.ParquetStore`` for its flush settings; None keeps the run in
            memory. An existing run is never overwritten, nor one another process is starting
            or writing there: that raises FileExistsError. The run's ``run.json`` is written
            at once, so a directory that cannot be written raises here, before training.
        every: which steps get full statistics: an int N (every N-th step), a ``Schedule``, or
            None for the default ``Schedule(every=100, dense=10)``, with the gradients'
            sentinel between recorded steps where the model is on an accelerator.
        kinds: kinds to record: ``activation``, ``grad``, ``weight``, ``weight_grad`` by
            default; also ``input``, ``input_grad`` (the gradient with respect to each
            input that needs one, through the module alone), ``update`` (needs
            ``optimizer``) and ``buffer``.
        include: which modules to watch, one item or a list of them, any one of which may
            pick a module: a regex searched in qualified module names (one that matches a
            whole name picks that module even if it is a container or a block without
            parameters of its own; ``"^$"`` is the root); a module object of the model
            (``model.encoder``: that module itself, and the layers inside it as by default);
            or a callable ``fn(name, module) -> bool``, called once per module here (never
            while training), whose true answer picks that module whatever it is.
        exclude: modules to leave out, as ``include`` takes them: a regex found in the name,
            a module object (it and everything inside it), a callable answering true.
        types: module classes to keep.
        stats: None for every built-in statistic; a list of names to keep some; a dict
            ``{name: fn}`` to add custom ones, ``fn(tensor)`` returning a scalar or a 1-D
            tensor (merged by numel-weighted mean); or a list of names and a dict.
        histogram: ``"log2"`` (range-free magnitude bins), ``("linear", lo, hi, bins)`` or None.
        alerts: health rules, run off the training thread: True for all of them with their
            defaults, False for none, ``{rule: False | {option: value}}`` to leave out or tune
            each (``layerscope.health.RULES`` names them). An alert is a row of the run's
            ``alerts`` table and a line of the ``layerscope`` logger.
        sinks: extra outputs, e.g. ``layerscope.sinks.TensorBoard("tb/")``.
        ranks: under ``torch.distributed``, ``"each"`` keeps each rank's rows its own (a
            ``rank`` column tells them apart); ``"merge"`` merges every recorded step's
            statistics across ranks, exactly, into whole-job rows that rank 0 writes:
            activations and gradients of the whole batch, parameters whole where FSDP
            shards them. Every rank must call ``watch`` (it makes a process group) and
            record the same steps; rows then appear at every ``flush_steps``-th recorded
            step rather than on a timer. Scalars, sentinel rows and attention rows stay
            each rank's own.
        start_step: the number of the first step: a training resumed from a checkpoint
            passes the steps it had done, so that its steps (and ``every``) go on from there.
        tensors: whole tensors to keep in the run, beside the statistics: a regex (or list)
            of module names, or a dict with keys ``include``, ``exclude``, ``types``,
            ``kinds`` (some of ``activation``, ``grad``, ``input``, ``input_grad``, ``weight_grad``,
            ``weight``; default activations and output gradients; ``weight_grad`` is read
            where the statistics read it, just before the optimizer's step), ``every`` (keep
            them every N-th step; default: the steps that record statistics),
            ``every_seconds`` (of those steps, keep one at most every so many seconds),
            ``stash_value`` (``fn(tensor) -> Tensor`` applied on the device first),
            ``max_bytes`` (default 1 GiB; past it nothing more is kept, with one warning) and
            ``keep`` (False: only give them to ``on_tensor``). Copied on the device in the
            hook, to the host at the step's end without a sync, and written as safetensors
            under ``<run>/tensors/`` by a thread of their own; ``run.tensors`` and
            ``scope.tensors`` read them back. Needs ``layerscope[capture]``.
        on_tensor: ``fn(record, directory)`` called in worker processes on each tensor that
            ``tensors=`` keeps (a CPU copy), at its ``every`` and ``every_seconds``:
            ``directory`` is this rank's place in the run (None for a run in memory or on an
            object store), where results go; ``layerscope.tensors.HeatMap()`` and the other
            renderers are such callbacks, and ``layerscope.tensors.Video()`` films each tensor
            into an MP4 or GIF as the run trains. It must be picklable (a module-level
            function, a class instance, a ``functools.partial``); its ``close()``, if it has
            one, is called in the worker as the run closes. When the workers are busy a
            tensor is dropped and counted, so training never waits for them; a callback that
            raises is reported once and its worker restarted.
        workers: how many worker processes run ``on_tensor`` (default 1).
        noise_scale: estimate the gradient noise scale ``B_simple`` of each recorded step
            that accumulates gradients over micro-batches (two backward passes or more),
            for each watched module and the model, as the step's scalars
            ``noise/<module>/B_simple`` and ``noise/B_simple``, with the estimates of the
            squared gradient norm (``grad_norm_sq``) and the gradients' covariance trace
            (``trace_cov``) beside them (McCandlish et al. 2018, appendix A). True infers
            the micro-batch size from the first tensor the model's forward takes; an int
            gives it. Each micro-batch's loss is taken to be divided by their count. On
            recorded steps only, it costs two dot products per parameter and micro-batch
            and no copy of the gradients; unrecorded steps carry no hook for it.
        attention: record, for each head of every attention call on a recorded step (each
            ``torch.nn.functional.scaled_dot_product_attention`` call made inside the model,
            each ``nn.MultiheadAttention``), the entropy of its attention over the keys: mean
            and minimum over queries, as a fraction of the most it could be, and the mean
            largest probability (the ``attention`` table, ``scope.frame("attention")``,
            ``run.attention``; the rule ``attention_collapse`` watches it). The
            probabilities are recomputed from the call's query and key, a chunk of queries at
            a time, on their device; the call's result is untouched. It costs about the
            attention's own score computation once more on recorded steps, and nothing on
            the others: the hooks and the patch of the function are on only while a pass
            records. Attention written out by hand, or called through a name bound before
            the pass (``from torch.nn.functional import scaled_dot_product_attention``), is
            not seen; ``nn.MultiheadAttention`` always is.
        if_exists: what to do where ``run`` (a path or URL) holds a run already: ``"fail"``
            raises FileExistsError; ``"new"`` writes to the first of ``run-2``, ``run-3``...
            that holds none, as a notebook cell run again or a tracker's next run would
            (``scope.run_path`` says which). Never into an existing run. Under
            torch.distributed rank 0 chooses for every rank.
        storage_options: options of the filesystem of ``run``'s URL, as fsspec takes them:
            for s3fs ``key``, ``secret``, ``client_kwargs={"endpoint_url": ...}``; never
            written into the run (``layerscope.load(url, storage_options=...)`` reads it). A
            ``ParquetStore`` given as ``run`` takes its own.
        capture: the old name of ``kinds``, taken as it with a FutureWarning; it will be
            removed.

    Returns:
        A ``Scope``: a context manager whose exit removes every hook.

    Raises:
        TypeError: ``model`` is not a module, an argument has the wrong type, or both
            ``kinds`` and ``capture`` are given.
        FileExistsError: ``run`` holds a run (and ``if_exists`` is ``"fail"``), or another
            process is writing one there.
        OSError: ``run``'s files cannot be written (a full disk, no permission).
        ValueError: a number past its bound (``layerscope._limits``: steps up to 2**53, at
            most 4,096 linear histogram bins, each health rule option's range), a bad
            regex, an unknown statistic or kind, ``every <= 0``, ``update``
            without an optimizer, a selection that matches no module, a module object in
            ``include`` or ``exclude`` that is not the model's, a callable there that
            raised, ``ranks`` not ``"each"`` or ``"merge"``, or ``on_tensor`` without
            ``tensors``.

    Examples:
        >>> import torch, layerscope
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> with layerscope.watch(model, every=1) as scope:
        ...     model(torch.randn(16, 4)).pow(2).mean().backward()
        ...     scope.step()
        >>> frame = scope.frame()
        >>> sorted(set(zip(frame.module, frame.kind)))[:4]
        [('0', 'activation'), ('0', 'grad'), ('0', 'weight'), ('0', 'weight_grad')]
    """
    chosen_kinds = kinds_from_capture(
        kinds, capture, kinds_given=kinds is not DEFAULT_KINDS, caller="watch", stacklevel=2
    )
    model = check_model(model)
    optimizers = parse_optimizers(optimizer)
    checked_sinks = check_sinks(sinks)
    config = WatchConfig.from_arguments(
        has_optimizer=bool(optimizers),
        every=every,
        kinds=chosen_kinds,
        include=include,
        exclude=exclude,
        types=types,
        stats=stats,
        histogram=histogram,
        alerts=alerts,
        ranks=ranks,
        start_step=start_step,
        noise_scale=noise_scale,
        attention=attention,
        root=unwrap(model),
    )
    tensors_spec = parse_tensors(tensors)
    callback, worker_count = None, 0
    if on_tensor is not None or workers is not None:
        from layerscope.tensors import check_on_tensor

        callback, worker_count = check_on_tensor(on_tensor, workers)
    if callback is not None and tensors_spec is None:
        raise ValueError("on_tensor: needs tensors= to say which tensors go to it")
    if tensors_spec is not None and tensors_spec.keep:
        require("safetensors", "capture")
    if if_exists not in IF_EXISTS:
        raise ValueError(f"if_exists: expected one of {IF_EXISTS}, got {if_exists!r}")
    store = None
    if run is not None:
        from layerscope.store import ParquetStore

        if storage_options is not None and isinstance(run, ParquetStore):
            raise TypeError(
                "storage_options: a ParquetStore given as run= takes its own: "
                "ParquetStore(url, storage_options=...)"
            )
        if if_exists == "new":
            run = _first_free(run, storage_options)
        if isinstance(run, ParquetStore):
            store = run
        else:  # ParquetStore checks the type of run and of the options
            store = ParquetStore(run, storage_options=storage_options)  # type: ignore[arg-type]
    elif storage_options is not None:
        raise ValueError("storage_options: options of run='s filesystem, but run is None")
    return Scope(
        model,
        optimizers,
        config,
        sinks=checked_sinks,
        store=store,
        tensors=tensors_spec,
        on_tensor=callback,
        workers=worker_count,
    )


def _first_free(run: object, storage_options: Mapping[str, Any] | None) -> str:
    """``run``, or the first ``run-N`` that holds no run: rank 0's choice under a job."""
    from layerscope.distributed import rank_zero_choice
    from layerscope.store import ParquetStore, first_free_run

    if isinstance(run, ParquetStore):
        raise TypeError(
            'if_exists: "new" chooses the run\'s path; give run= a path or URL, not a ParquetStore'
        )
    if not isinstance(run, str | os.PathLike):
        raise TypeError(f"run: expected a path or URL, got {type(run).__name__}")
    return rank_zero_choice(lambda: first_free_run(run, storage_options))


def check_sinks(sinks: object) -> list[Sink]:
    """``watch()``'s ``sinks``: one sink or a list of them, as a list; else TypeError."""
    if isinstance(sinks, Sink):
        sinks = [sinks]
    if not isinstance(sinks, Sequence | tuple):
        raise TypeError(f"sinks: expected a list of sinks, got {type(sinks).__name__}")
    for sink in sinks:
        if not isinstance(sink, Sink):
            raise TypeError(
                f"sinks: {sink!r} is not a sink: it needs start, write, flush and close methods"
            )
    return list(sinks)


def kinds_from_capture(
    kinds: object, capture: object, *, kinds_given: bool, caller: str, stacklevel: int
) -> object:
    """``kinds``, or ``capture`` (its old name) given in its place, with a FutureWarning.

    A FutureWarning, which Python shows by default, since it is for whoever wrote the call (a
    DeprecationWarning is hidden outside ``__main__`` and tests). Passing both names is a
    mistake, never settled by taking one of them.

    Args:
        kinds: the value of ``kinds=``.
        capture: the value of ``capture=``; None where it was not given.
        kinds_given: whether ``kinds=`` was given too (not left at its default).
        caller: the name the warning and the error start with (``watch``).
        stacklevel: the frame that passed ``capture=``, which the warning points to: 1 for
            the caller of ``kinds_from_capture``, 2 for its caller...

    Raises:
        TypeError: both ``kinds=`` and ``capture=`` were given.
    """
    if capture is None:
        return kinds
    if kinds_given:
        raise TypeError(
            f"{caller}: kinds= and capture= were both given; capture= is the old name of "
            f"kinds=: pass kinds= only"
        )
    warnings.warn(
        f"{caller}: capture= is now kinds=; capture= will be removed, pass kinds= instead",
        FutureWarning,
        stacklevel=stacklevel + 1,
    )
    return capture


def options_with_kinds(options: Mapping[str, Any], caller: str, stacklevel: int) -> dict[str, Any]:
    """``watch()``'s ``options`` with ``capture`` given as ``kinds``, as ``kinds_from_capture``.

    ``stacklevel`` counts from the caller of ``options_with_kinds``, as there.
    """
    rest = {name: value for name, value in options.items() if name != OLD_KINDS_NAME}
    capture = options.get(OLD_KINDS_NAME)
    if capture is not None:
        rest["kinds"] = kinds_from_capture(
            rest.get("kinds"),
            capture,
            kinds_given="kinds" in rest,
            caller=caller,
            stacklevel=stacklevel + 1,
        )
    return rest
