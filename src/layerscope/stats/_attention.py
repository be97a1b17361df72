"""Attention entropy per head, recomputed from a call's query and key on their device.

``attention_partials`` takes the arguments of ``scaled_dot_product_attention`` and returns,
per query head, a float64 row of mergeable partials over every (batch index, query) that
may attend to at least one key (``ATTENTION_WIDTH`` columns): the number of such queries,
the sum and the minimum of their entropies ``-sum_k p log p`` (nats, over the softmax of the
masked logits), the sum of ``entropy / log(allowed keys)`` and the number of queries it sums
(those with two allowed keys or more), and the sum of each query's largest probability.
``merge_attention`` adds two rows of one head (micro-batches of one call),
``finish_attention`` turns rows into means.

Nothing is read back to the host: branches depend on shapes and dtypes only, and masked keys
are dropped by arithmetic (``where``, ``masked_fill``), never by indexing with a mask.

Memory: the logits are computed for ``c`` queries at a time, with
``c = chunk_queries(B * H, S, chunk_elements) = max(1, chunk_elements // (B * H * S))``
(``B`` batch, ``H`` query heads, ``S`` keys). A chunk holds its logits and their exponentials
at once: ``2 * B * H * c * S`` elements of 4 bytes (8 for float64 inputs), at most
``8 * chunk_elements`` bytes in float32 (32 MiB by default) while ``c`` is above one (the allowed
keys are counted in the exponentials' buffer). Beside them come smaller, shorter-lived tensors:
the chunk's rows of a bool mask negated (a byte per mask element), the chunk's queries
(``B * H * c * E``) and, for inputs not already float32 or float64, one upcast copy of the key
(``B * Hk * S * E``). None of it grows with ``L``. A causal call's chunk takes only the keys up to
its last query, the others being barred to all of it: about half the work of a whole one.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Columns of ``attention_partials``' rows.
ATTENTION_WIDTH = 6
_COUNT, _ENTROPY_SUM, _ENTROPY_MIN, _FRAC_SUM, _FRAC_COUNT, _MAX_PROB_SUM = range(ATTENTION_WIDTH)
#: Elements of one chunk's float logits: 4M, 16 MiB in float32.
DEFAULT_CHUNK_ELEMENTS = 2**22
_INF = float("inf")


def chunk_queries(batch_heads: int, keys: int, chunk_elements: int) -> int:
    """Queries per chunk: as many as keep ``batch_heads * queries * keys`` within budget.

    Args:
        batch_heads: batch size times query heads.
        keys: keys per query.
        chunk_elements: logits a chunk may hold; at least one query is taken.

    Examples:
        >>> chunk_queries(batch_heads=32, keys=4096, chunk_elements=2**22)
        32
    """
    return max(1, chunk_elements // max(1, batch_heads * keys))


def attention_partials(
    query: Tensor,
    key: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> Tensor:
    """Per-head entropy partials of ``scaled_dot_product_attention(query, key, ...)``.

    The arguments mean what they mean to ``scaled_dot_product_attention``; dropout is left
    out (the entropy is the distribution's). A key is allowed to a query when its masked
    logit is not -inf, nor its float mask at most half its dtype's lowest value (masks made
    with ``finfo.min`` bar keys so); queries with no allowed key are left out of every column.

    Args:
        query: ``(..., H, L, E)``; every dimension before the heads is batch; ``(L, E)`` is
            one head.
        key: ``(..., Hk, S, E)``, its batch dimensions broadcastable to the query's.
        attn_mask: bool (True may attend) or float (added to the logits), broadcastable to
            ``(..., H, L, S)``.
        is_causal: query ``l`` attends to keys ``0..l`` (top-left aligned when ``L != S``).
        scale: the logits' factor; ``1 / sqrt(E)`` when None.
        enable_gqa: ``H`` may be a multiple of ``Hk``; query head ``h`` reads key head
            ``h // (H // Hk)``, as ``repeat_interleave`` gives.
        chunk_elements: logits computed at once (see the module's note on memory).

    Returns:
        float64 ``(H, 6)`` on ``query``'s device: count, entropy_sum, entropy_min (+inf with
        no query), frac_sum, frac_count, max_prob_sum. Logits are float32 (float64 when an
        input is float64) and the sums float64.

    Examples:
        >>> q, k = torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)  # uniform over 3 keys
        >>> rows = attention_partials(q, k, is_causal=True)  # 1, 2 and 3 allowed keys
        >>> rows[0, :3].tolist() == [3.0, math.log(2) + math.log(3), 0.0]
        True
    """
    with torch.no_grad(), _full_precision(query.device):
        query, key = _with_heads(query), _with_heads(key)
        heads, length, width = query.shape[-3:]
        key_heads, keys = key.shape[-3], key.shape[-2]
        _check_heads(heads, key_heads, enable_gqa)
        batch = torch.broadcast_shapes(  # type: ignore[no-untyped-call]  # unannotated in torch
            query.shape[:-3], key.shape[:-3]
        )
        dtype = torch.float64 if torch.float64 in (query.dtype, key.dtype) else torch.float32
        # (B, H, L, E) and (B, Hk, E, S); a view unless batch dimensions broadcast.
        size = math.prod(batch)
        query = query.expand(*batch, heads, length, width).reshape(size, heads, length, width)
        key_t = key.expand(*batch, key_heads, keys, width).reshape(size, key_heads, keys, width)
        key_t = key_t.to(dtype).transpose(-1, -2)
        mask = None if attn_mask is None else _batched_mask(attn_mask, batch)
        scale = 1.0 / math.sqrt(width) if scale is None else scale
        rows = _empty_rows(heads, query.device)
        if query.numel() == 0 or keys == 0:
            return rows  # no query has a key: nothing to reduce
        step = chunk_queries(query.shape[0] * heads, keys, chunk_elements)
        for start in range(0, length, step):
            stop = min(start + step, length)
            chunk = query[:, :, start:stop].to(dtype)
            # Causal: the keys after the chunk's last query are barred to all of it, and skipped.
            seen = min(keys, stop) if is_causal else keys
            # (B, Hk, H / Hk * c, E) @ (B, Hk, E, S): a key head serves its query heads, unrepeated.
            logits = torch.matmul(
                chunk.reshape(len(chunk), key_heads, -1, width), key_t[..., :seen]
            )
            logits = logits.reshape(len(chunk), heads, stop - start, seen).mul_(scale)
            if is_causal:
                later = torch.arange(seen, device=logits.device) > torch.arange(
                    start, stop, device=logits.device
                ).unsqueeze(-1)
                logits.masked_fill_(later, -_INF)
            if mask is not None:
                part = mask if mask.shape[-2] == 1 else mask[..., start:stop, :]
                part = part if part.shape[-1] == 1 else part[..., :seen]
                if part.dtype == torch.bool:
                    logits.masked_fill_(part.logical_not(), -_INF)
                else:
                    logits.add_(part)
                    # A mask of the dtype's lowest value (as Hugging Face's are) bars its keys
                    # as -inf does: they count as not allowed in the fraction's log(keys).
                    logits.masked_fill_(part <= torch.finfo(part.dtype).min / 2, -_INF)
            rows = merge_attention(rows, _chunk_rows(logits))
        return rows


def _full_precision(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Autocast off: a model's forward under autocast would make the logits bfloat16."""
    if device.type in ("cpu", "cuda", "xpu", "mps", "hpu"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _with_heads(x: Tensor) -> Tensor:
    """``x`` with a head dimension: ``(L, E)`` is one head."""
    if x.dim() < 2:
        raise ValueError(f"attention inputs are (..., L, E), got shape {tuple(x.shape)}")
    return x.unsqueeze(0) if x.dim() == 2 else x


def _check_heads(heads: int, key_heads: int, enable_gqa: bool) -> None:
    # One key head broadcasts to every query head, as matmul does without enable_gqa.
    if key_heads > 0 and heads % key_heads == 0 and (enable_gqa or key_heads in (1, heads)):
        return
    raise ValueError(
        f"{heads} query heads and {key_heads} key heads: "
        "the query heads must equal the key heads, or be a multiple of them with enable_gqa"
    )


def _batched_mask(mask: Tensor, batch: torch.Size) -> Tensor:
    """``mask`` as ``(B or 1, H or 1, L or 1, S or 1)``, copied only if batch dims cannot merge."""
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool or floating, got {mask.dtype}")
    ndim = len(batch) + 3
    if mask.dim() > ndim:
        raise ValueError(
            f"attn_mask of shape {tuple(mask.shape)} has more dimensions than the logits"
        )
    mask = mask.reshape((1,) * (ndim - mask.dim()) + tuple(mask.shape))
    if all(size == 1 for size in mask.shape[:-3]):
        return mask.reshape(1, *mask.shape[-3:])
    return mask.expand(*batch, *mask.shape[-3:]).reshape(math.prod(batch), *mask.shape[-3:])


def _empty_rows(heads: int, device: torch.device) -> Tensor:
    rows = torch.zeros(heads, ATTENTION_WIDTH, dtype=torch.float64, device=device)
    rows[:, _ENTROPY_MIN] = _INF
    return rows


def _chunk_rows(logits: Tensor) -> Tensor:
    """Rows of partials of masked ``(B, H, c, S)`` logits, which are overwritten.

    Entropy as ``log(s) - sum(e * z) / s`` with ``z`` the logits less the row's maximum,
    ``e = exp(z)`` and ``s = sum(e)``: the largest probability is ``1 / s`` and nothing is
    divided before the sums.
    """
    # The allowed keys counted in the buffer the exponentials reuse: a bool's sum would make
    # an int64 copy, 8 bytes a logit.
    weights = torch.ne(logits, -_INF, out=torch.empty_like(logits))
    allowed = weights.sum(-1)  # (B, H, c): float counts, exact below 2**24 keys
    top = logits.amax(-1, keepdim=True)
    logits.sub_(top.masked_fill_(top == -_INF, 0.0))  # a fully masked row stays -inf
    weights = torch.exp(logits, out=weights)
    total = weights.sum(-1).double()
    # Masked keys have e == 0; a finite stand-in for their -inf keeps 0 * z at 0, not NaN.
    logits.clamp_(min=torch.finfo(logits.dtype).min)
    weighted = logits.mul_(weights).sum(-1).double()
    entropy = total.log() - weighted / total
    some = allowed > 0
    spread = allowed > 1
    frac = entropy / allowed.double().log()
    zero = entropy.new_zeros(())
    per_query = torch.stack(
        [
            some.double(),
            torch.where(some, entropy, zero),
            torch.where(some, entropy, _INF),
            torch.where(spread, frac, zero),
            spread.double(),
            torch.where(some, total.reciprocal(), zero),
        ],
        dim=-1,
    )  # (B, H, c, 6)
    per_query = per_query.transpose(0, 1).reshape(per_query.shape[1], -1, ATTENTION_WIDTH)
    rows = per_query.sum(1)
    rows[:, _ENTROPY_MIN] = per_query[..., _ENTROPY_MIN].amin(1)
    return rows


def merge_attention(a: Tensor, b: Tensor) -> Tensor:
    """Rows of partials of the same heads over both parts: sums add, minima take the lower.

    Args:
        a: ``(..., 6)`` rows from ``attention_partials``.
        b: rows of the same shape.

    Examples:
        >>> a = torch.tensor([[2.0, 1.0, 0.25, 0.5, 1.0, 1.5]], dtype=torch.float64)
        >>> merge_attention(a, a.flip(0) * 2).tolist()
        [[6.0, 3.0, 0.25, 1.5, 3.0, 4.5]]
    """
    merged = a + b
    merged[..., _ENTROPY_MIN] = torch.minimum(a[..., _ENTROPY_MIN], b[..., _ENTROPY_MIN])
    return merged


def finish_attention(partials: Tensor) -> Tensor:
    """``(..., 4)``: entropy_mean, entropy_min, entropy_frac, max_prob of rows of partials.

    A head with no query that could attend reads NaN in every column, its minimum included;
    entropy_frac is NaN when no query had two allowed keys.

    Args:
        partials: ``(..., 6)`` float64 rows from ``attention_partials`` or ``merge_attention``.

    Examples:
        >>> rows = torch.tensor([[4.0, 2.0, 0.1, 1.5, 3.0, 2.0]], dtype=torch.float64)
        >>> finish_attention(rows).tolist()
        [[0.5, 0.1, 0.5, 0.5]]
    """
    count = partials[..., _COUNT]
    minimum = partials[..., _ENTROPY_MIN]
    return torch.stack(
        [
            partials[..., _ENTROPY_SUM] / count,
            torch.where(count > 0, minimum, torch.nan),
            partials[..., _FRAC_SUM] / partials[..., _FRAC_COUNT],
            partials[..., _MAX_PROB_SUM] / count,
        ],
        dim=-1,
    )


def multihead_query_key(
    module: nn.MultiheadAttention,
    query: Tensor,
    key: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The heads' query and key, and the mask, that ``module``'s forward attends with.

    Mirrors ``torch.nn.functional.multi_head_attention_forward``: the in-projections (packed
    or separate, with their biases), ``bias_k`` appended to the keys, then a zero key with
    ``add_zero_attn``, each with an allowed column in the masks. Bool masks in MHA's sense
    (True may not attend) come back in SDPA's (True may attend); a float mask, or a bool one
    beside a float one, comes back as one float mask added to the logits. ``is_causal`` is
    MHA's hint that ``attn_mask`` is the causal mask, so the mask given is the one used.

    Args:
        module: the attention module.
        query: its forward's query: ``(N, L, E)`` with ``batch_first``, ``(L, N, E)`` without,
            or ``(L, E)``.
        key: its forward's key, laid out as the query, with ``kdim`` features.
        key_padding_mask: ``(N, S)`` or ``(S,)``, bool or float.
        attn_mask: ``(L, S)`` or ``(N * num_heads, L, S)``, bool or float.
        is_causal: as passed to the forward; it needs ``attn_mask``, as there.

    Returns:
        ``(q, k, mask)``: ``q`` is ``(N, H, L, E / H)`` and ``k`` is ``(N, H, S', E / H)``,
        unscaled, so ``attention_partials(q, k, attn_mask=mask)`` scales as MHA does; ``mask``
        broadcasts to ``(N, H, L, S')`` or is None.

    Examples:
        >>> mha = nn.MultiheadAttention(8, 2, batch_first=True)
        >>> x = torch.randn(3, 5, 8)
        >>> q, k, mask = multihead_query_key(mha, x, x, key_padding_mask=torch.zeros(3, 5) > 0)
        >>> tuple(q.shape), tuple(k.shape), tuple(mask.shape), bool(mask.all())
        ((3, 2, 5, 4), (3, 2, 5, 4), (3, 1, 1, 5), True)
    """
    if is_causal and attn_mask is None:
        raise ValueError("is_causal is a hint that attn_mask is the causal mask: give attn_mask")
    with torch.no_grad(), _full_precision(query.device):
        if query.dim() == 2:  # unbatched: one batch of one
            query, key = query.unsqueeze(0), key.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not module.batch_first:
            query, key = query.transpose(0, 1), key.transpose(0, 1)
        batch, length, embed = query.shape  # (N, L, E), and key (N, S, kdim)
        heads = module.num_heads
        packed: Tensor | None = module.in_proj_weight  # None with kdim or vdim != embed_dim
        query_weight: Tensor
        key_weight: Tensor
        if packed is None:
            query_weight, key_weight = module.q_proj_weight, module.k_proj_weight
        else:
            query_weight, key_weight = packed[:embed], packed[embed : 2 * embed]
        bias = module.in_proj_bias
        query_bias, key_bias = (
            (None, None) if bias is None else (bias[:embed], bias[embed : 2 * embed])
        )
        q = F.linear(query, query_weight, query_bias)
        k = F.linear(key, key_weight, key_bias)
        extra_keys = 0
        if module.bias_k is not None:
            k = torch.cat([k, module.bias_k.expand(batch, 1, embed)], dim=1)
            extra_keys += 1
        q = q.reshape(batch, length, heads, -1).transpose(1, 2)
        k = k.reshape(batch, k.shape[1], heads, -1).transpose(1, 2)
        if module.add_zero_attn:
            k = torch.cat([k, k.new_zeros(batch, heads, 1, k.shape[-1])], dim=2)
            extra_keys += 1
        mask = _multihead_mask(attn_mask, key_padding_mask, batch, heads, query.dtype)
        if mask is not None and extra_keys:
            mask = F.pad(mask, (0, extra_keys), value=True if mask.dtype == torch.bool else 0.0)
        return q, k, mask


def _multihead_mask(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    batch: int,
    heads: int,
    dtype: torch.dtype,
) -> Tensor | None:
    """MHA's two masks as one in SDPA's sense, ``(N or 1, H or 1, L or 1, S)``.

    Both bool: the keys neither masks out. Otherwise float, as MHA adds them: a bool mask
    becomes -inf where True, in the query's dtype.
    """
    masks = []
    if attn_mask is not None:
        masks.append(
            attn_mask.reshape(batch, heads, *attn_mask.shape[-2:])
            if attn_mask.dim() == 3
            else attn_mask
        )
    if key_padding_mask is not None:
        masks.append(key_padding_mask.reshape(batch, 1, 1, -1))
    for mask in masks:
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"only bool and floating masks are supported, got {mask.dtype}")
    if not masks:
        return None
    if all(mask.dtype == torch.bool for mask in masks):
        hidden = masks[0] if len(masks) == 1 else masks[0] | masks[1]
        return hidden.logical_not()
    added = [
        torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, -_INF)
        if mask.dtype == torch.bool
        else mask
        for mask in masks
    ]
    return added[0] if len(added) == 1 else added[0] + added[1]
