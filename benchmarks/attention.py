"""What ``watch(attention=True)`` costs: a recorded step's recompute of every head's attention,
nothing on an unrecorded step, and the recompute's memory as the sequence grows.

    python benchmarks/attention.py                  # prints the tables (about 2.5 minutes)
    python benchmarks/attention.py --small          # small models, one round: a check
    python benchmarks/attention.py --write          # also updates its section of BENCHMARKS.md
    python benchmarks/attention.py --json out.json  # every figure as JSON

``gpt2`` is skipped without transformers. ``section`` says how each figure is taken and what
it means. The writer thread runs beside the timed steps; what it has left at a block's end is
not timed (attention adds a few rows a step to its work).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import layerscope
import report  # run as a script

VOCAB = 1024
CONFIGS = ("unwatched", "recorded", "recorded+attention", "unrecorded", "unrecorded+attention")
HEADS, WIDTH = 4, 64  # of the memory measure's query and key
SDPA = F.scaled_dot_product_attention  # torch's own


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        qkv = self.c_attn(x).view(batch, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, length, width)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(out.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, layers: int, dim: int, heads: int, context: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, dim)
        self.wpe = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        return self.lm_head(self.ln_f(self.blocks(x)))


class HFGPT2(nn.Module):
    """transformers' GPT-2 returning its logits, random weights, attention through SDPA."""

    def __init__(self, layers: int, dim: int, heads: int, context: int) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.model = GPT2LMHeadModel(GPT2Config(
            n_layer=layers, n_embd=dim, n_head=heads, n_positions=context, vocab_size=VOCAB,
            bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
        ))  # fmt: skip

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens).logits  # type: ignore[no-any-return]


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` under a causal mask: its attention is nn.MultiheadAttention."""

    def __init__(self, layers: int, dim: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Parameter(0.02 * torch.randn(context, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])  # 0 and -inf
        x = self.embed(tokens) + self.position
        return self.head(self.encoder(x, mask=mask, is_causal=True))


@dataclass(frozen=True)
class Sizes:
    layers: int
    dim: int
    heads: int
    length: int
    batch: int


FULL = Sizes(layers=4, dim=128, heads=4, length=256, batch=8)
SMALL = Sizes(layers=2, dim=64, heads=4, length=64, batch=4)
MODELS: dict[str, type[nn.Module]] = {"nanogpt": NanoGPT, "gpt2": HFGPT2, "encoder": Encoder}


def block_seconds(model: nn.Module, config: str, sizes: Sizes, steps: int) -> tuple[float, Any]:
    """The median seconds of ``steps`` steps under ``config``, and what the watch left: attention
    rows of the warm-up step and per timed step, hooks on the model and whether SDPA is ours."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    shape, generator = (sizes.batch, sizes.length + 1), torch.Generator().manual_seed(0)
    batches = [torch.randint(0, VOCAB, shape, generator=generator) for _ in range(steps + 1)]
    scope = None
    if config != "unwatched":
        idle = layerscope.Schedule(every=10**9, sentinel=False)
        every = 1 if config.startswith("recorded") else idle
        scope = layerscope.watch(
            model, optimizer=optimizer, every=every, attention=config.endswith("+attention")
        )

    def step(tokens: torch.Tensor) -> None:
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad()

    step(batches[0])  # warm-up, and the one recorded step of "unrecorded"
    if scope is not None:
        scope.flush()
    times = []
    for tokens in batches[1:]:
        start = time.perf_counter()
        step(tokens)
        times.append(time.perf_counter() - start)
    # After a step, before the next: what an unrecorded step runs with.
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    patched = F.scaled_dot_product_attention is not SDPA
    if scope is None:
        return statistics.median(times), (0, 0, hooks, patched)
    scope.close()
    attention = scope.frame("attention")
    rows = (int((attention.step == 0).sum()), int((attention.step > 0).sum()) // steps)
    return statistics.median(times), (*rows, hooks, patched)


def measure(name: str, sizes: Sizes, rounds: int, steps: int) -> dict[str, Any]:
    """Median times and within-round ratios of every configuration, for one workload."""
    torch.manual_seed(0)
    made = MODELS[name]
    initial = made(sizes.layers, sizes.dim, sizes.heads, sizes.length).state_dict()
    times: dict[str, list[float]] = {config: [] for config in CONFIGS}
    seen: dict[str, tuple[int, int, int, bool]] = {}
    order = list(CONFIGS)
    shuffle = random.Random(0)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for config in order:
            model = made(sizes.layers, sizes.dim, sizes.heads, sizes.length)
            model.load_state_dict(initial)
            seconds, seen[config] = block_seconds(model, config, sizes, steps)
            times[config].append(seconds)

    def ratio(top: str, bottom: str) -> float:
        pairs = zip(times[top], times[bottom], strict=True)
        return statistics.median(a / b for a, b in pairs)

    # A row per head and layer on each recorded step with attention, none on another: else
    # the figures measure a watch that saw no attention call, or one that saw it unrecorded.
    heads = sizes.layers * sizes.heads
    expected = {"recorded+attention": (heads, heads), "unrecorded+attention": (heads, 0)}
    rows = {config: seen[config][:2] for config in CONFIGS}
    assert rows == {config: expected.get(config, (0, 0)) for config in CONFIGS}, (name, seen)
    # Between recorded steps, attention=True leaves no hook and no patch of its own.
    idle = seen["unrecorded+attention"][2:]
    assert idle == (seen["unrecorded"][2], False), (name, seen)
    return {
        "ms": {config: 1e3 * statistics.median(values) for config, values in times.items()},
        "recorded_attention_vs_recorded": ratio("recorded+attention", "recorded"),
        "recorded_attention_vs_unwatched": ratio("recorded+attention", "unwatched"),
        "recorded_vs_unwatched": ratio("recorded", "unwatched"),
        "unrecorded_attention_vs_unrecorded": ratio("unrecorded+attention", "unrecorded"),
        "unrecorded_attention_vs_unwatched": ratio("unrecorded+attention", "unwatched"),
        "attention_rows_per_step": heads,
        "unrecorded_hooks": idle[0],
    }


def _status_kib(field: str) -> int:
    lines = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in lines if line.startswith(f"{field}:")).split()[1])


def child(length: int, chunk_elements: int, threads: int) -> dict[str, float]:
    """One recompute's peak resident growth and seconds, and the call's, on inputs of
    ``(1, HEADS, length, WIDTH)``; in a fresh process."""
    from layerscope.stats import attention_partials

    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    query, key, value = torch.randn(3, 1, HEADS, length, WIDTH, generator=generator).unbind()
    few = [x[..., :8, :] for x in (query, key, value)]
    attention_partials(*few[:2], is_causal=True)  # loads the code of both
    F.scaled_dot_product_attention(*few, is_causal=True)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    rows = attention_partials(query, key, is_causal=True, chunk_elements=chunk_elements)
    seconds = time.perf_counter() - start
    grown = _status_kib("VmHWM") - before
    assert torch.isfinite(rows).all()
    start = time.perf_counter()
    F.scaled_dot_product_attention(query, key, value, is_causal=True)
    call = time.perf_counter() - start
    return {"peak_mib": grown / 1024, "seconds": seconds, "call_seconds": call}


def peak(length: int, chunk_elements: int, threads: int, fixed: bool = False) -> dict[str, float]:
    """``child`` in a fresh process; ``fixed``: with glibc's mmap threshold fixed at 128 KiB."""
    command = [sys.executable, __file__, "--child", str(length), str(chunk_elements)]
    command += ["--threads", str(threads)]
    # By default glibc raises its threshold when a large block is freed, and the next chunks
    # come from a heap that keeps freed memory: the process's peak, not the tensors'.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)} if fixed else None
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def memory(lengths: list[int], unchunked_up_to: int, threads: int) -> list[dict[str, Any]]:
    """The recompute's peak memory and time by sequence length, against the chunk's size."""
    from layerscope.stats import attention_partials, chunk_queries

    default = inspect.signature(attention_partials).parameters["chunk_elements"].default
    results = []
    for length in lengths:
        chunk = min(length, chunk_queries(HEADS, length, default))
        result: dict[str, Any] = {
            "keys": length,
            "queries_per_chunk": chunk,
            # A chunk's float32 logits and their exponentials, both alive at the peak.
            "formula_mib": 8 * HEADS * chunk * length / 2**20,
            "full_matrix_mib": 4 * HEADS * length * length / 2**20,
            "chunked": peak(length, default, threads),
            "chunked_fixed_threshold": peak(length, default, threads, fixed=True),
        }
        if length <= unchunked_up_to:
            result["unchunked"] = peak(length, HEADS * length * length, threads, fixed=True)
        results.append(result)
        print(f"memory: {length} keys done", file=sys.stderr)
    return results


def tables(steps: dict[str, dict[str, Any]], memory_rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | unwatched | recorded | recorded, attention | on / off | vs unwatched "
        "| unrecorded | unrecorded, attention | on / off | vs unwatched | rows a recorded step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in steps.items():
        ms = r["ms"]
        lines.append(
            f"| {name} | {ms['unwatched']:.1f} ms | {ms['recorded']:.1f} ms "
            f"| {ms['recorded+attention']:.1f} ms | {r['recorded_attention_vs_recorded']:.2f}x "
            f"| {r['recorded_attention_vs_unwatched']:.2f}x | {ms['unrecorded']:.1f} ms "
            f"| {ms['unrecorded+attention']:.1f} ms "
            f"| {r['unrecorded_attention_vs_unrecorded']:.2f}x "
            f"| {r['unrecorded_attention_vs_unwatched']:.2f}x | {r['attention_rows_per_step']} |"
        )
    lines += [
        "",
        "| keys (= queries) | queries a chunk | a chunk's logits and exponentials "
        "| peak growth | peak growth, threshold fixed | one chunk of all queries, threshold "
        "fixed | full (L, S) float32 matrix | recompute | the SDPA call itself |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in memory_rows:
        unchunked = m.get("unchunked")
        whole = "not run" if unchunked is None else f"{unchunked['peak_mib']:.0f} MiB"
        chunked = m["chunked"]
        lines.append(
            f"| {m['keys']:,} | {m['queries_per_chunk']} | {m['formula_mib']:.0f} MiB "
            f"| {chunked['peak_mib']:.0f} MiB | {m['chunked_fixed_threshold']['peak_mib']:.0f} MiB "
            f"| {whole} | {m['full_matrix_mib']:,.0f} MiB | {chunked['seconds']:.2f} s "
            f"| {chunked['call_seconds']:.2f} s |"
        )
    return "\n".join(lines)


def section(figures: dict[str, Any], threads: int) -> str:
    """The section's text above its tables: what was run and what the figures mean."""
    workloads, sizes, longest = figures["workloads"], figures["sizes"], figures["memory"][-1]
    on_off = [r["recorded_attention_vs_recorded"] for r in workloads.values()]
    idle = [r["unrecorded_attention_vs_unrecorded"] for r in workloads.values()]
    hooks = ", ".join(f"{r['unrecorded_hooks']} on {name}" for name, r in workloads.items())
    logits = HEADS * longest["queries_per_chunk"] * longest["keys"]
    per_logit = longest["chunked_fixed_threshold"]["peak_mib"] * 2**20 / logits
    slower = longest["chunked"]["seconds"] / longest["chunked"]["call_seconds"]
    shape = "{layers} layers, d={dim}, {heads} heads, batch {batch}, sequence {length}"
    return (
        f"Machine: {report.machine(threads)}. Command: `{report.command('attention.py')}`.\n\n"
        f"Language models trained with AdamW on random tokens ({shape.format(**sizes)}): "
        "nanogpt (`F.scaled_dot_product_attention(is_causal=True)`), gpt2 (transformers' "
        'GPT-2, random weights, `attn_implementation="sdpa"`), encoder (`nn.TransformerEncoder`'
        ", a causal mask: `nn.MultiheadAttention`); watched with the default kinds on recorded "
        "steps (`every=1`) and on unrecorded ones (`Schedule(every=10**9, sentinel=False)`), "
        f"without and with `attention=True`. Medians over {figures['rounds']} interleaved "
        f"rounds (a fresh model each block) of the median of {figures['steps']} steps; "
        'ratios within a round, then their median. "on / off": with attention over the same '
        "watch without.\n\n"
        "A recorded step with `attention=True` recomputes each head's attention from the "
        f"call's query and key: {min(on_off):.2f}x to {max(on_off):.2f}x the same recorded "
        "step here. Each chunk of queries takes the keys up to its last query (a causal call: "
        "about half the pairs; every key otherwise), in several passes over the chunk, where "
        f"torch's CPU kernel is fused: at {longest['keys']:,} keys, "
        f"{slower:.0f}x the call it reads (the last two columns below). An unrecorded step "
        "runs none of it: SDPA is torch's own function and the model carries as many hooks "
        f"as without attention ({hooks}, layerscope's idle ones); its on / off, "
        f"{min(idle):.2f}x to {max(idle):.2f}x, is the machine's noise. Recording one step in "
        "N costs about (on / off - 1) / N of a recorded step: under 0.5% at the default "
        "schedule's one in 100.\n\n"
        "Memory: the recompute alone (`layerscope.stats.attention_partials`, causal, one "
        f"sequence of {HEADS} heads of {WIDTH}) in a fresh process per length: the growth of "
        "the process's peak resident memory (VmHWM, reset before the call) over the call; "
        "tracemalloc does not see torch's memory, the profiler misses what an operator frees "
        "before it returns. glibc keeps freed chunks in its heap for the next ones; with its "
        "mmap threshold fixed (`MALLOC_MMAP_THRESHOLD_=131072`) the peak is the tensors'. "
        f"Past one chunk it stops growing: at the longest, {per_logit:.1f} bytes per logit of "
        "a chunk, threshold fixed, where the kernel's notes count 8 (float32 logits and "
        "exponentials) and a few MiB of queries, masks and rows.\n\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--small", action="store_true", help="small models, one round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (5; 1 with --small)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per block")
    parser.add_argument("--lengths", type=int, nargs="+", help="keys of the memory measure")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every figure here as JSON")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--child", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        length, chunk_elements = args.child
        print(json.dumps(child(length, chunk_elements, args.threads)))
        return
    torch.set_num_threads(args.threads)
    sizes = SMALL if args.small else FULL
    rounds = args.rounds or (1 if args.small else 5)
    figures: dict[str, Any] = {"sizes": vars(sizes), "rounds": rounds, "steps": args.steps}
    figures["workloads"], figures["skipped"] = {}, []
    for name in args.workloads:
        try:
            figures["workloads"][name] = measure(name, sizes, rounds, args.steps)
        except ImportError as error:
            figures["skipped"].append(f"{name}: not installed ({error.name})")
            continue
        print(f"{name}: done", file=sys.stderr)
    lengths = args.lengths or ([256, 1024] if args.small else [512, 2048, 8192])
    figures["memory"] = memory(lengths, unchunked_up_to=2048, threads=args.threads)
    text = tables(figures["workloads"], figures["memory"])
    if figures["skipped"]:
        text += "\n\nSkipped: " + "; ".join(figures["skipped"]) + "."
    print(text)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if args.write:
        title = "Attention entropy: what attention=True costs (CPU)"
        report.replace_section(title, section(figures, args.threads) + text)


if __name__ == "__main__":
    main()
