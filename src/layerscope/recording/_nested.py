"""Nested tensors: their elements as one dense tensor, and the shape their rows show.

A nested tensor (``torch.nested``) holds components whose lengths differ; PyTorch makes one,
for instance, inside ``nn.TransformerEncoder``'s fast path (eval mode, no autograd, a padding
mask). Its statistics are those of its components' elements: a padded copy would add zeros
to the mean, ``zero_frac`` and the histogram.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor


def values_of(tensor: Tensor) -> Tensor:
    """The elements of a nested ``tensor`` as one dense 1-D tensor; any other tensor as it is.

    The elements come in no particular order, and the padding of a padded copy is never among
    them. Most nested tensors give a view of their memory, with no host sync; a narrowed or
    transposed strided one gives a copy, and a narrowed jagged one (with ``lengths()``) a copy
    that reads its lengths back from the device. A plain tensor costs one attribute check.

    Examples:
        >>> import torch
        >>> nested = torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(1, 3)])
        >>> values_of(nested).tolist()
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    """
    if not tensor.is_nested:
        return tensor
    nested = tensor.detach()
    if nested.layout is torch.jagged:
        # values() holds every element unless narrowing left gaps between the components (and
        # gave the tensor lengths()); a transposed one's values() are a view in another order.
        if cast(Any, nested).lengths() is None:
            return nested.values().reshape(-1)
        return _concatenated(nested)  # reads the lengths back from the device
    # The strided layout's values() is its whole buffer: the components one after the other
    # where the tensor is contiguous, but a tensor narrowed along its components still calls
    # itself contiguous while it uses only part of that buffer, so its numel() must match too.
    buffer = nested.values()
    if nested.is_contiguous() and buffer.numel() == nested.numel():
        return buffer
    return _concatenated(nested)


def _concatenated(nested: Tensor) -> Tensor:
    """The components' elements, copied one component after the other."""
    components = [component.reshape(-1) for component in nested.unbind()]
    if not components:
        return torch.empty(0, dtype=nested.dtype, device=nested.device)
    return torch.cat(components)


def shape_of(tensor: Tensor) -> tuple[int, ...]:
    """The shape a row shows: a nested tensor's has -1 for each ragged dimension.

    The first dimension of a nested tensor counts its components; a later one is their common
    size, or -1 where the components differ in it (jagged ones always do in their ragged
    dimension). ``numel`` tells how many elements there are. No host sync: the strided
    layout keeps its components' sizes on the host, the jagged one its ragged size symbolic.

    Examples:
        >>> import torch
        >>> shape_of(torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)]))
        (2, -1, 3)
        >>> shape_of(torch.ones(4, 5))
        (4, 5)
    """
    if not tensor.is_nested:
        return tuple(tensor.shape)
    if tensor.layout is torch.jagged:
        # The ragged dimension's size is a symbolic "nested int", not an int.
        return tuple(size if isinstance(size, int) else -1 for size in tensor.shape)
    components = tensor.size(0)
    if components == 0:
        return (0,) + (-1,) * (tensor.dim() - 1)
    sizes = tensor._nested_tensor_size().tolist()  # (components, dims - 1), on the host
    by_dimension = zip(*sizes, strict=True)  # each dimension: its size in every component
    return (components, *(dim[0] if len(set(dim)) == 1 else -1 for dim in by_dimension))
