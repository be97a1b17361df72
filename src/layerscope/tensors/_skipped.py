"""``SkippedTensorError``: what an ``on_tensor`` callback raises to pass over one tensor."""

from __future__ import annotations


class SkippedTensorError(Exception):
    """One tensor an ``on_tensor`` callback cannot use (a video's renderer cannot draw it).

    Raised in a worker, it skips that record: the run warns once with its message, counts it
    in ``TensorWorkers.skipped``, and the worker goes on with the next. Any other error is a
    failure, which replaces the worker.

    Examples:
        >>> raise SkippedTensorError("fc.bias (weight_grad): 1-D, no picture")
        Traceback (most recent call last):
        ...
        layerscope.tensors.SkippedTensorError: fc.bias (weight_grad): 1-D, no picture
    """

    __module__ = "layerscope.tensors"  # where users import it from
