"""The entropy of each attention head, on recorded steps: ``watch(attention=True)``.

On a recorded step, every ``scaled_dot_product_attention`` call made inside the model and
every ``nn.MultiheadAttention`` forward gives per-head partials: the attention distribution is
recomputed from the call's query and key in chunks of queries (``layerscope.stats``), on their
device, and the partials go to the recorder like any reading. The call's own result is not
touched: it is computed first, by torch, from the same tensors.

A call is named after the innermost module whose forward made it. For that, forward hooks
keep a stack of the modules running, on the model's modules that may call attention (those
not of ``torch.nn``'s own layers, which never do, and ``nn.MultiheadAttention``). They, and
the patch of ``scaled_dot_product_attention``, are there only while a pass may record: an
unrecorded step carries none of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from torch import nn

from layerscope.distributed import local_tensor
from layerscope.hooks._cost import CostMeter
from layerscope.hooks._handles import HookHandles, in_backward, weak_hook
from layerscope.hooks._layers import EVAL, TRAIN
from layerscope.hooks._sdpa_patch import AttentionCall, observe_attention, stop_observing
from layerscope.hooks._steps import StepClock
from layerscope.model import clean_name
from layerscope.recording import Recorder
from layerscope.stats import attention_partials, multihead_query_key

_MHA_INPUTS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask")


class AttentionWatch:
    """Per-head attention entropy of each recorded pass's attention calls; off: does nothing.

    Args:
        root: the model.
        on: whether to record attention at all.
        clock: steps and gates.
        recorder: where the partials go.
        meter: the training thread's cost.
        fail: counts and warns of a monitoring failure.
    """

    def __init__(
        self,
        root: nn.Module,
        on: bool,
        clock: StepClock,
        recorder: Recorder,
        meter: CostMeter,
        fail: Callable[[str, BaseException], None],
    ) -> None:
        self._on = on
        self._clock = clock
        self._recorder = recorder
        self._meter = meter
        self._fail = fail
        self._modules: list[tuple[str, nn.Module]] = []
        if on:
            self._modules = [
                (clean_name(name), module)
                for name, module in root.named_modules()
                if _may_attend(module) and module is not root
            ]
        self._handles = HookHandles()
        self._observer = weak_hook(self._on_call)
        self._thread = threading.get_ident()
        self._running: list[str] = []  # the modules whose forward runs, innermost last
        self._in_multihead = 0  # SDPA calls inside an nn.MultiheadAttention are its own
        self._calls: dict[tuple[str, str], int] = {}  # (module, phase) -> calls this pass

    def __len__(self) -> int:
        """How many hooks are on now."""
        return len(self._handles)

    def sync(self) -> None:
        """A pass begins or a step ends: hook on if the next pass may record, off if not."""
        self._calls.clear()
        self._running.clear()
        self._in_multihead = 0
        wanted = self._on and self._clock.recording
        if wanted and not len(self._handles):
            self._attach()
        elif not wanted and len(self._handles):
            self.remove()

    def remove(self) -> None:
        """Take every hook off, and the patch if no other scope wants it."""
        self._handles.remove()
        stop_observing(self._observer)

    def _attach(self) -> None:
        self._thread = threading.get_ident()
        for name, module in self._modules:
            if isinstance(module, nn.MultiheadAttention):
                enter = partial(weak_hook(self._on_multihead), name)
                self._handles.add(module.register_forward_pre_hook(enter, with_kwargs=True))
                leave = weak_hook(self._left_multihead)
                self._handles.add(module.register_forward_hook(leave, always_call=True))
            else:
                enter = partial(weak_hook(self._on_enter), name)
                self._handles.add(module.register_forward_pre_hook(enter))
                leave = partial(weak_hook(self._on_leave), name)
                self._handles.add(module.register_forward_hook(leave, always_call=True))
        observe_attention(self._observer)

    # ---------------------------------------------------------------- hooks

    def _on_enter(self, name: str, module: nn.Module, args: Any) -> None:
        self._running.append(name)

    def _on_leave(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if self._running and self._running[-1] == name:
            self._running.pop()

    def _on_call(self, call: AttentionCall) -> None:
        """A ``scaled_dot_product_attention`` call has returned."""
        if not self._in_multihead:
            self._record(self._running[-1] if self._running else "", call)

    def _on_multihead(
        self, name: str, module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        self._in_multihead += 1
        if not self._wanted():
            return
        given = dict(zip(_MHA_INPUTS, args, strict=False))
        given.update(kwargs)
        try:
            assert isinstance(module, nn.MultiheadAttention)
            query, key, mask = multihead_query_key(
                module,
                given["query"],
                given["key"],
                key_padding_mask=given.get("key_padding_mask"),
                attn_mask=given.get("attn_mask"),
                is_causal=bool(given.get("is_causal", False)),
            )
        except Exception as error:
            self._fail(f"reading the attention of {name!r}", error)
            return
        self._record(name, AttentionCall(query, key, mask, False, None, False))

    def _left_multihead(self, module: nn.Module, args: Any, output: Any) -> None:
        self._in_multihead = max(0, self._in_multihead - 1)

    # ---------------------------------------------------------------- partials

    def _wanted(self) -> bool:
        clock = self._clock
        return clock.recording and not in_backward() and threading.get_ident() == self._thread

    def _record(self, module: str, call: AttentionCall) -> None:
        if not self._wanted():
            return
        start = time.perf_counter()
        try:
            phase = TRAIN if self._clock.training else EVAL
            count = self._calls.get((module, phase), 0)
            self._calls[(module, phase)] = count + 1
            # A DTensor (tensor parallelism) is read as its local heads: a matmul of DTensors
            # would be a collective that the other ranks never make.
            mask = call.attn_mask
            partials = attention_partials(
                local_tensor(call.query).detach(),
                local_tensor(call.key).detach(),
                attn_mask=None if mask is None else local_tensor(mask).detach(),
                is_causal=call.is_causal,
                scale=call.scale,
                enable_gqa=call.enable_gqa,
            )
            keys = int(call.key.shape[-2])
            step = self._clock.pass_step
            self._recorder.add_attention(step, phase, module, count, keys, partials)
        except Exception as error:
            self._fail(f"reading the attention of {module or 'the model'!r}", error)
        finally:
            self._meter.seconds += time.perf_counter() - start


def _may_attend(module: nn.Module) -> bool:
    """Whether ``module``'s forward may call attention: not one of torch's plain layers."""
    if isinstance(module, nn.MultiheadAttention):
        return True
    return not type(module).__module__.startswith("torch.nn.modules.")
