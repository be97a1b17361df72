"""attention_partials and multihead_query_key against float64 numpy, one query at a time.

The reference walks every (batch, head, query), takes the softmax over the keys the masks
allow and sums its entropy, never chunking; the MHA tests read the weights that
``nn.MultiheadAttention`` itself returns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_reference import SETTINGS
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from layerscope.stats import (
    ATTENTION_WIDTH,
    attention_partials,
    chunk_queries,
    finish_attention,
    merge_attention,
    multihead_query_key,
)

_INF = float("inf")


def reference_rows(probs: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Rows of partials of ``(B, H, L, S)`` probabilities over the ``allowed`` keys."""
    heads = probs.shape[1]
    rows = np.zeros((heads, ATTENTION_WIDTH))
    rows[:, 2] = np.inf
    for b, h, query in np.ndindex(*probs.shape[:3]):
        keys = int(allowed[b, h, query].sum())
        if keys == 0:
            continue
        p = probs[b, h, query][allowed[b, h, query]]
        p = p[p > 0]
        entropy = float(-(p * np.log(p)).sum())
        rows[h, 0] += 1
        rows[h, 1] += entropy
        rows[h, 2] = min(rows[h, 2], entropy)
        if keys > 1:
            rows[h, 3] += entropy / math.log(keys)
            rows[h, 4] += 1
        rows[h, 5] += p.max()
    return rows


def softmax_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    allowed: np.ndarray,
    bias: np.ndarray,
    scale: float,
) -> np.ndarray:
    """``(B, H, L, S)`` softmax of ``q k^T * scale + bias`` over the allowed keys, by loops."""
    qs, ks = q.double().numpy(), k.double().numpy()
    probs = np.zeros(allowed.shape)
    for b, h, query in np.ndindex(*allowed.shape[:3]):
        keep = allowed[b, h, query]
        if not keep.any():
            continue
        logits = np.array([qs[b, h, query] @ ks[b, h, s] * scale for s in range(ks.shape[2])])
        logits = logits + bias[b, h, query]
        shifted = np.exp(logits[keep] - logits[keep].max())
        probs[b, h, query, keep] = shifted / shifted.sum()
    return probs


def reference_call(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """Partials of an SDPA call on ``(B, H, L, E)`` and ``(B, H, S, E)``; masks as documented."""
    batch, heads, length, width = q.shape
    keys = k.shape[2]
    shape = (batch, heads, length, keys)
    allowed = np.ones(shape, dtype=bool)
    bias = np.zeros(shape)
    if is_causal:
        allowed &= np.tril(np.ones((length, keys), dtype=bool))
    if mask is not None and mask.dtype == torch.bool:
        allowed &= np.broadcast_to(mask.numpy(), shape)
    elif mask is not None:
        values = np.broadcast_to(mask.double().numpy(), shape)
        allowed &= values != -np.inf
        bias = np.where(allowed, values, 0.0)
    scale = 1 / math.sqrt(width) if scale is None else scale
    return reference_rows(softmax_rows(q, k, allowed, bias, scale), allowed)


def check_rows(got: torch.Tensor, want: np.ndarray, rtol: float = 1e-9) -> None:
    assert got.dtype == torch.float64
    assert got.shape == want.shape
    rows = got.numpy()
    np.testing.assert_array_equal(rows[:, [0, 4]], want[:, [0, 4]])  # counts are exact
    np.testing.assert_allclose(rows, want, rtol=rtol, atol=rtol)


def qk(
    batch: int, heads: int, length: int, keys: int, width: int = 4, key_heads: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randn(batch, heads, length, width, dtype=torch.float64) * 2
    k = torch.randn(batch, key_heads or heads, keys, width, dtype=torch.float64) * 2
    return q, k


@pytest.mark.parametrize(("length", "keys"), [(5, 7), (6, 6), (7, 4), (1, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_plain_and_causal_match_numpy(length: int, keys: int, is_causal: bool) -> None:
    q, k = qk(2, 3, length, keys)
    got = attention_partials(q, k, is_causal=is_causal)
    check_rows(got, reference_call(q, k, is_causal=is_causal))


def test_scale_given() -> None:
    q, k = qk(2, 2, 4, 5)
    check_rows(attention_partials(q, k, scale=0.9), reference_call(q, k, scale=0.9))


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (5, 7), (2, 1, 5, 7), (1, 3, 1, 7), (7,)])
def test_bool_mask_broadcasts(shape: tuple[int, ...]) -> None:
    q, k = qk(2, 3, 5, 7)
    mask = torch.rand(shape) > 0.4
    got = attention_partials(q, k, attn_mask=mask)
    check_rows(got, reference_call(q, k, mask))


def test_float_mask_adds_and_inf_disallows() -> None:
    q, k = qk(2, 3, 5, 7)
    mask = torch.randn(2, 1, 5, 7, dtype=torch.float64)
    mask[torch.rand(2, 1, 5, 7) > 0.6] = -_INF
    got = attention_partials(q, k, attn_mask=mask)
    check_rows(got, reference_call(q, k, mask))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_a_mask_of_the_lowest_value_bars_keys_as_inf_does(dtype: torch.dtype) -> None:
    # Hugging Face's causal masks hold finfo(dtype).min, not -inf, where a key is barred.
    q, k = qk(2, 3, 5, 5)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    lowest = torch.zeros(5, 5, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    got = attention_partials(q, k, attn_mask=lowest)
    check_rows(got, reference_call(q, k, allowed))
    assert got[:, 4].tolist() == [2 * 4] * 3  # the first query has one key: no fraction


def test_fully_masked_rows_are_left_out() -> None:
    q, k = qk(2, 2, 4, 3)
    mask = torch.ones(2, 2, 4, 3, dtype=torch.bool)
    mask[0, :, 1] = False  # no key at all
    mask[1, 0, 2, 1:] = False  # one key: entropy 0, no frac
    mask[1, 1] = False  # head 1 of batch 1: nothing
    got = attention_partials(q, k, attn_mask=mask)
    assert not got.isnan().any()
    assert got[:, 0].tolist() == [7.0, 3.0]
    assert got[:, 4].tolist() == [6.0, 3.0]
    assert got[0, 2] == 0.0  # the one-key query
    check_rows(got, reference_call(q, k, mask))
    float_mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, -_INF)
    check_rows(attention_partials(q, k, attn_mask=float_mask), reference_call(q, k, mask))


def test_no_query_at_all() -> None:
    q, k = qk(1, 2, 3, 4)
    got = attention_partials(q, k, attn_mask=torch.zeros(4, dtype=torch.bool))
    assert got.tolist() == [[0.0, 0.0, _INF, 0.0, 0.0, 0.0]] * 2
    assert finish_attention(got).isnan().all()
    empty = attention_partials(q[:, :, :0], k)
    assert empty.tolist() == got.tolist()
    assert attention_partials(q, k[:, :, :0]).tolist() == got.tolist()


def test_grouped_query_heads() -> None:
    q, k = qk(2, 6, 5, 7, key_heads=2)
    got = attention_partials(q, k, enable_gqa=True, is_causal=True)
    repeated = k.repeat_interleave(3, dim=1)  # as SDPA repeats the key heads
    check_rows(got, reference_call(q, repeated, is_causal=True))
    with pytest.raises(ValueError, match="enable_gqa"):
        attention_partials(q, k)


def test_three_and_five_dimensional_inputs() -> None:
    q, k = qk(1, 3, 5, 6)
    check_rows(attention_partials(q[0], k[0], is_causal=True), reference_call(q, k, is_causal=True))
    q5 = torch.randn(2, 3, 2, 4, 5, dtype=torch.float64)
    k5 = torch.randn(2, 3, 2, 6, 5, dtype=torch.float64)
    mask = torch.rand(3, 1, 4, 6) > 0.3
    got = attention_partials(q5, k5, attn_mask=mask)
    flat_mask = mask.expand(2, 3, 2, 4, 6).reshape(6, 2, 4, 6)
    want = reference_call(q5.reshape(6, 2, 4, 5), k5.reshape(6, 2, 6, 5), flat_mask)
    check_rows(got, want)


@pytest.mark.parametrize("chunk_elements", [1, 7, 40, 2**22])
def test_chunks_give_the_same_rows(chunk_elements: int) -> None:
    q, k = qk(2, 3, 9, 8, key_heads=1)
    mask = torch.randn(9, 8, dtype=torch.float64).masked_fill(torch.rand(9, 8) > 0.7, -_INF)
    got = attention_partials(q, k, attn_mask=mask, chunk_elements=chunk_elements)
    check_rows(got, reference_call(q, k.expand(2, 3, 8, 4), mask))
    causal = attention_partials(q, k, is_causal=True, chunk_elements=chunk_elements)
    check_rows(causal, reference_call(q, k.expand(2, 3, 8, 4), is_causal=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype: torch.dtype) -> None:
    q, k = qk(2, 3, 6, 7)
    q, k = q.to(dtype), k.to(dtype)  # the reference reads the rounded values
    mask = (torch.rand(6, 7) > 0.3).tril()
    got = attention_partials(q, k, attn_mask=mask, chunk_elements=50)
    check_rows(got, reference_call(q, k, mask), rtol=1e-5)


@settings(SETTINGS, max_examples=40)
@given(
    batch=st.integers(1, 2),
    key_heads=st.integers(1, 2),
    group=st.integers(1, 3),
    length=st.integers(1, 6),
    keys=st.integers(1, 6),
    mask_kind=st.sampled_from([None, "bool", "float"]),
    is_causal=st.booleans(),
    chunk_elements=st.integers(1, 64),
    seed=st.integers(0, 2**16),
)
def test_random_calls_match_numpy(
    batch: int,
    key_heads: int,
    group: int,
    length: int,
    keys: int,
    mask_kind: str | None,
    is_causal: bool,
    chunk_elements: int,
    seed: int,
) -> None:
    generator = torch.Generator().manual_seed(seed)
    heads = key_heads * group
    q = torch.randn(batch, heads, length, 3, dtype=torch.float64, generator=generator) * 3
    k = torch.randn(batch, key_heads, keys, 3, dtype=torch.float64, generator=generator) * 3
    shape = (batch, heads, length, keys)
    mask: torch.Tensor | None = None
    if mask_kind is not None:
        mask = torch.rand(shape, generator=generator) > 0.3
    if mask is not None and mask_kind == "float":
        values = torch.randn(shape, dtype=torch.float64, generator=generator)
        mask = values.masked_fill(~mask, -_INF)
    got = attention_partials(
        q, k, attn_mask=mask, is_causal=is_causal, enable_gqa=True, chunk_elements=chunk_elements
    )
    want = reference_call(q, k.repeat_interleave(group, dim=1), mask, is_causal)
    check_rows(got, want)


def test_inputs_are_not_modified() -> None:
    q, k = qk(2, 4, 5, 6, key_heads=2)
    q, k = q.float().transpose(2, 3).contiguous().transpose(2, 3), k.float()  # a strided query
    mask = torch.randn(5, 6).masked_fill(torch.rand(5, 6) > 0.5, -_INF)
    before = [t.clone() for t in (q, k, mask)]
    attention_partials(q, k, attn_mask=mask, enable_gqa=True, chunk_elements=10)
    for tensor, copy in zip((q, k, mask), before, strict=True):
        assert torch.equal(tensor, copy)
    assert not q.is_contiguous()


def test_merge_of_micro_batches_is_the_whole_batch() -> None:
    q, k = qk(4, 2, 5, 6)
    mask = torch.rand(4, 1, 5, 6) > 0.3
    whole = attention_partials(q, k, attn_mask=mask)
    halves = [
        attention_partials(q[i : i + 2], k[i : i + 2], attn_mask=mask[i : i + 2]) for i in (0, 2)
    ]
    merged = merge_attention(*halves)
    np.testing.assert_allclose(merged.numpy(), whole.numpy(), rtol=1e-12)
    assert merged[:, 2].tolist() == torch.minimum(halves[0][:, 2], halves[1][:, 2]).tolist()
    assert torch.equal(merged[:, 2], whole[:, 2])


def test_finish_divides_by_the_counts() -> None:
    q, k = qk(2, 3, 5, 5)
    rows = attention_partials(q, k, is_causal=True)
    want = reference_call(q, k, is_causal=True)
    finished = finish_attention(rows.cpu()).numpy()
    expected = np.stack(
        [want[:, 1] / want[:, 0], want[:, 2], want[:, 3] / want[:, 4], want[:, 5] / want[:, 0]], 1
    )
    np.testing.assert_allclose(finished, expected, rtol=1e-9)
    assert ((finished[:, 2] >= 0) & (finished[:, 2] <= 1)).all()
    no_spread = torch.tensor([[2.0, 0.0, 0.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    assert finish_attention(no_spread)[0].tolist()[:2] == [0.0, 0.0]
    assert math.isnan(finish_attention(no_spread)[0, 2])


def test_chunk_queries() -> None:
    assert chunk_queries(batch_heads=32, keys=4096, chunk_elements=2**22) == 32
    assert chunk_queries(batch_heads=32, keys=2**20, chunk_elements=2**22) == 1  # at least one
    assert chunk_queries(batch_heads=3, keys=5, chunk_elements=40) == 2
    assert chunk_queries(batch_heads=3, keys=0, chunk_elements=40) == 40


class _Allocations(TorchDispatchMode):
    """Records each op's name and the largest storage an op returns that the inputs do not own."""

    def __init__(self, *inputs: torch.Tensor | None) -> None:
        super().__init__()
        self.inputs = {t.untyped_storage().data_ptr() for t in inputs if t is not None}
        self.ops: set[str] = set()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.add(func.overloadpacket.__name__)
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in self.inputs:
                    self.largest = max(self.largest, storage.nbytes())
        return out


@pytest.mark.parametrize("mask_dtype", [None, torch.bool, torch.float32])
def test_a_chunk_bounds_the_largest_tensor_and_nothing_is_read_back(
    mask_dtype: torch.dtype | None,
) -> None:
    batch, heads, length, keys = 2, 4, 128, 64
    q = torch.randn(batch, heads, length, 8)
    k = torch.randn(batch, heads, keys, 8)
    mask = None if mask_dtype is None else torch.zeros(length, keys, dtype=mask_dtype)
    chunk_elements = 4096
    queries = chunk_queries(batch * heads, keys, chunk_elements)
    assert queries == 8
    with _Allocations(q, k, mask) as chunked:
        attention_partials(q, k, attn_mask=mask, is_causal=True, chunk_elements=chunk_elements)
    with _Allocations(q, k, mask) as whole:
        attention_partials(q, k, attn_mask=mask, is_causal=True, chunk_elements=2**30)
    chunk_logits = batch * heads * queries * keys * 4
    assert chunked.largest == chunk_logits  # the logits (and their exponentials) of one chunk
    assert whole.largest == batch * heads * length * keys * 4
    for reads_back in ("_local_scalar_dense", "item", "nonzero", "masked_select", "index"):
        assert reads_back not in chunked.ops | whole.ops


_MODULES = {
    "batch_first": {"batch_first": True},
    "sequence_first": {"batch_first": False},
    "unbatched": {"batch_first": True, "unbatched": True},
    "kdim_vdim": {"batch_first": True, "kdim": 5, "vdim": 3},
    "bias_kv_zero_attn": {"batch_first": False, "add_bias_kv": True, "add_zero_attn": True},
    "zero_attn_no_bias": {"batch_first": True, "add_zero_attn": True, "bias": False},
    "self_attention": {"batch_first": True, "self_attention": True},
    # Evaluation without autograd: torch's fused kernel (float masks fall back to the rest).
    "fast_path": {"batch_first": True, "self_attention": True, "fast_path": True},
}
_MASKS = [
    None,
    "padding_bool",
    "padding_float",
    "attn2_bool",
    "attn2_float",
    "attn3_bool",
    "attn3_float",
    "both_bool",
    "both_float",
    "causal",
]


def _mha_masks(
    case: str | None, batch: int, heads: int, length: int, keys: int
) -> tuple[torch.Tensor | None, torch.Tensor | None, np.ndarray]:
    """MHA's key_padding_mask and attn_mask for ``case``, and the (N, H, L, S) keys they allow."""
    padding = attn = None
    hidden = np.zeros((batch, heads, length, keys), dtype=bool)
    if case is not None and ("padding" in case or "both" in case):
        padding = torch.rand(batch, keys) > 0.7
        padding[0, 0] = True
        hidden |= padding.numpy()[:, None, None, :]
    if case is not None and ("attn" in case or "both" in case):
        shape = (batch * heads, length, keys) if "attn3" in case else (length, keys)
        attn = torch.rand(shape) > 0.6
        if "attn3" in case:
            hidden |= attn.numpy().reshape(batch, heads, length, keys)
        else:
            hidden |= attn.numpy()
    if case == "causal":
        attn = torch.ones(length, keys, dtype=torch.bool).triu(1)  # True: may not attend
        hidden |= attn.numpy()
    if case is not None and "float" in case:
        # Finite values beside -inf: they shift the logits without hiding keys.
        padding = None if padding is None else _as_float(padding)
        attn = None if attn is None else _as_float(attn)
    return padding, attn, ~hidden


def _as_float(hide: torch.Tensor) -> torch.Tensor:
    return torch.randn(hide.shape, dtype=torch.float64).masked_fill(hide, -_INF)


@pytest.mark.parametrize("mask_case", _MASKS)
@pytest.mark.parametrize("config", list(_MODULES))
def test_multihead_entropy_matches_its_own_weights(config: str, mask_case: str | None) -> None:
    options = dict(_MODULES[config])
    unbatched = options.pop("unbatched", False)
    self_attention = options.pop("self_attention", False)
    fast_path = options.pop("fast_path", False)
    heads, embed, batch, length = 2, 8, 1 if unbatched else 3, 4
    keys = length if self_attention or mask_case == "causal" else 5
    module = nn.MultiheadAttention(embed, heads, **options).double().train(not fast_path)
    kdim, vdim = options.get("kdim", embed), options.get("vdim", embed)

    def laid_out(sequence: int, features: int) -> torch.Tensor:
        if unbatched:
            return torch.randn(sequence, features, dtype=torch.float64)
        if options["batch_first"]:
            return torch.randn(batch, sequence, features, dtype=torch.float64)
        return torch.randn(sequence, batch, features, dtype=torch.float64)

    query, key, value = laid_out(length, embed), laid_out(keys, kdim), laid_out(keys, vdim)
    if self_attention:
        key = value = query
    padding, attn, allowed = _mha_masks(mask_case, batch, heads, length, keys)
    if unbatched and padding is not None:
        padding = padding[0]
    extra = int(module.bias_k is not None) + int(module.add_zero_attn)
    allowed = np.concatenate([allowed, np.ones((batch, heads, length, extra), dtype=bool)], -1)
    is_causal = mask_case == "causal"

    with torch.set_grad_enabled(not fast_path):
        _, weights = module(
            query,
            key,
            value,
            key_padding_mask=padding,
            attn_mask=attn,
            need_weights=True,
            average_attn_weights=False,
            is_causal=is_causal,
        )
    probs = weights.detach().reshape(batch, heads, length, keys + extra).numpy()
    want = reference_rows(probs, allowed)

    q, k, mask = multihead_query_key(
        module, query, key, key_padding_mask=padding, attn_mask=attn, is_causal=is_causal
    )
    assert q.shape == (batch, heads, length, embed // heads)
    assert k.shape == (batch, heads, keys + extra, embed // heads)
    if mask is not None:
        assert torch.broadcast_shapes(mask.shape, (batch, heads, length, keys + extra))
    check_rows(attention_partials(q, k, attn_mask=mask, chunk_elements=20), want)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
def test_multihead_bool_beside_float_mask() -> None:
    module = nn.MultiheadAttention(6, 3).double()
    query = torch.randn(4, 2, 6, dtype=torch.float64)
    padding = torch.tensor([[False, True, False, False], [True, True, True, True]])
    attn = torch.randn(4, 4, dtype=torch.float64).masked_fill(torch.eye(4, dtype=torch.bool), -_INF)
    _, weights = module(
        query, query, query, key_padding_mask=padding, attn_mask=attn, average_attn_weights=False
    )
    hidden = padding.numpy()[:, None, None, :] | np.eye(4, dtype=bool)
    want = reference_rows(weights.detach().numpy(), np.broadcast_to(~hidden, (2, 3, 4, 4)))
    q, k, mask = multihead_query_key(module, query, query, key_padding_mask=padding, attn_mask=attn)
    assert mask is not None
    assert mask.dtype == torch.float64
    got = attention_partials(q, k, attn_mask=mask)
    check_rows(got, want)
    assert got[:, 0].tolist() == [4.0] * 3  # batch 1 hides every key


def test_multihead_causal_hint_needs_its_mask() -> None:
    module = nn.MultiheadAttention(4, 2)
    x = torch.randn(3, 1, 4)
    with pytest.raises(ValueError, match="attn_mask"):
        multihead_query_key(module, x, x, is_causal=True)


def test_autocast_around_the_call_leaves_the_logits_in_float32() -> None:
    # The hook runs inside the model's forward, where autocast may be on: it must not lower
    # the recomputed logits to bfloat16.
    q, k = qk(2, 3, 6, 6)
    q, k = q.float(), k.float()
    plain = attention_partials(q, k, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = attention_partials(q, k, is_causal=True)
    assert torch.equal(plain, autocast)
