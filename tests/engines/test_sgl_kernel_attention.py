"""The pure-torch sgl_kernel attention ops against a naive reference (float64, one query and
one head at a time, visibility spelled out position by position)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from pytest_osprey.engines.sglang.cpu import sgl_kernel  # registers torch.ops.sgl_kernel

OPS = torch.ops.sgl_kernel
POOL, WIDTH = 96, 40  # KV slots; req_to_token row width
GARBAGE = 10**6  # table entries past a sequence: must never be used as slots


@dataclass
class Batch:
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    k_pool: torch.Tensor
    v_pool: torch.Tensor


def make_batch(gen: torch.Generator, seq_lens: list[int], hkv: int, d: int, dv: int,
               dtype: torch.dtype = torch.float32) -> Batch:  # fmt: skip
    bs = len(seq_lens)
    table = torch.full((bs + 2, WIDTH), GARBAGE, dtype=torch.int32)
    rows = torch.randperm(bs + 2, generator=gen)[:bs]
    slots = torch.randperm(POOL, generator=gen)
    used = 0
    for b, n in enumerate(seq_lens):
        table[rows[b], :n] = slots[used : used + n].int()
        used += n
    return Batch(
        table,
        rows.long(),
        torch.tensor(seq_lens, dtype=torch.int64),
        torch.randn(POOL, hkv, d, generator=gen).to(dtype),
        torch.randn(POOL, hkv, dv, generator=gen).to(dtype),
    )


def naive_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                    scale: float, cap: float, sink: float | None) -> torch.Tensor:  # fmt: skip
    """One query vector over an explicit, non-empty list of visible (key, value) vectors."""
    logits = []
    for k in keys:
        s = float((q.double() * k.double()).sum()) * scale
        logits.append(cap * math.tanh(s / cap) if cap > 0 else s)
    top = max(logits + ([sink] if sink is not None else []))
    weights = [math.exp(s - top) for s in logits]
    total = sum(weights) + (math.exp(sink - top) if sink is not None else 0.0)
    out = torch.zeros_like(values[0], dtype=torch.float64)
    for w, v in zip(weights, values, strict=True):
        out += (w / total) * v.double()
    return out


def reference_extend(batch: Batch, q: torch.Tensor, k_new: torch.Tensor | None,
                     v_new: torch.Tensor | None, ext: list[int], *, scale: float, cap: float,
                     window: int, sinks: torch.Tensor | None, tree: list[list[list[bool]]] | None,
                     causal: bool) -> torch.Tensor:  # fmt: skip
    h, hkv = q.shape[1], batch.k_pool.shape[1]
    out = torch.zeros(q.shape[0], h, batch.v_pool.shape[2], dtype=torch.float64)
    start = 0
    for b, n_new in enumerate(ext):
        seq = int(batch.seq_lens[b])
        prefix = seq - n_new
        row = batch.req_to_token[batch.req_pool_indices[b]]
        for i in range(n_new):
            pos_i = prefix + i
            for head in range(h):
                kv = head // (h // hkv)
                keys, values = [], []
                for j in range(seq):
                    if j >= prefix:
                        c = j - prefix
                        if tree is not None:
                            if not tree[b][i][c]:
                                continue
                        elif causal and c > i:
                            continue
                    if window > 0 and j <= pos_i - window:
                        continue
                    if j >= prefix and k_new is not None and v_new is not None:
                        keys.append(k_new[start + j - prefix, kv])
                        values.append(v_new[start + j - prefix, kv])
                    else:
                        slot = int(row[j])
                        keys.append(batch.k_pool[slot, kv])
                        values.append(batch.v_pool[slot, kv])
                sink = float(sinks[head]) if sinks is not None else None
                assert keys, "every query sees at least itself"
                out[start + i, head] = naive_attention(
                    q[start + i, head], keys, values, scale, cap, sink
                )
        start += n_new
    return out


def run_extend(batch: Batch, ext: list[int], h: int, *, with_new_kv: bool = True,
               cap: float = 0.0, window: int = 0, sinks: torch.Tensor | None = None,
               tree: list[list[list[bool]]] | None = None, causal: bool = True,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    n = sum(ext)
    d, dv, hkv = batch.k_pool.shape[2], batch.v_pool.shape[2], batch.k_pool.shape[1]
    dtype = batch.k_pool.dtype
    q = torch.randn(n, h, d, generator=gen).to(dtype)
    k_new = torch.randn(n, hkv, d, generator=gen).to(dtype) if with_new_kv else None
    v_new = torch.randn(n, hkv, dv, generator=gen).to(dtype) if with_new_kv else None
    o = torch.full((n, h, dv), float("nan"), dtype=dtype)
    starts = torch.tensor([sum(ext[:b]) for b in range(len(ext))], dtype=torch.int32)
    flat_tree = None
    if tree is not None:
        flat_tree = torch.tensor([c for blk in tree for r in blk for c in r], dtype=torch.bool)
    scale = 1 / math.sqrt(d)
    OPS.extend_attention_cpu(
        q, k_new, v_new, o, batch.k_pool, batch.v_pool, 1.0, 1.0,
        batch.req_to_token, batch.req_pool_indices, batch.seq_lens,
        torch.tensor(ext, dtype=torch.int32), starts, max(ext, default=0), scale, cap,
        False, window, None, sinks, flat_tree, causal,
    )  # fmt: skip
    want = reference_extend(batch, q, k_new, v_new, ext, scale=scale, cap=cap, window=window,
                            sinks=sinks, tree=tree, causal=causal)  # fmt: skip
    return o, want


@pytest.mark.parametrize("hkv", [1, 2, 4])
@pytest.mark.parametrize("with_new_kv", [True, False])
def test_extend_causal_with_prefix_matches_reference(hkv: int, with_new_kv: bool) -> None:
    gen = torch.Generator().manual_seed(hkv)
    # Prefill with and without a cached prefix, and a one-token extend.
    seq, ext = [9, 14, 3], [9, 5, 1]
    batch = make_batch(gen, seq, hkv, 8, 8)
    got, want = run_extend(batch, ext, 4, with_new_kv=with_new_kv, seed=hkv)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def random_tree_masks(gen: torch.Generator, bs: int, n: int) -> list[list[list[bool]]]:
    """Row i: the root, node i and its ancestors (a random tree with parents before children)."""
    masks = []
    for _ in range(bs):
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        block = []
        for i in range(n):
            row = [False] * n
            row[0] = True
            node = i
            while node > 0:
                row[node] = True
                node = parent[node]
            block.append(row)
        masks.append(block)
    return masks


@pytest.mark.parametrize("cap", [0.0, 3.0])
def test_extend_single_prefill_without_prefix(cap: float) -> None:
    gen = torch.Generator().manual_seed(8)
    batch = make_batch(gen, [7], 2, 8, 8)
    got, want = run_extend(batch, [7], 4, cap=cap, seed=8)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_extend_tree_mask_verify_matches_reference() -> None:
    gen = torch.Generator().manual_seed(7)
    n = 6  # a verify step: every request extends by the same number of draft tokens
    seq = [n + 11, n + 4, n]
    batch = make_batch(gen, seq, 2, 16, 16)
    tree = random_tree_masks(gen, 3, n)
    got, want = run_extend(batch, [n] * 3, 4, tree=tree, seed=1)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_extend_not_causal_window_cap_and_sinks() -> None:
    gen = torch.Generator().manual_seed(11)
    batch = make_batch(gen, [12, 7], 2, 8, 4)  # value head narrower than key head
    got, want = run_extend(batch, [5, 7], 4, causal=False, seed=2)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    got, want = run_extend(batch, [5, 7], 4, window=4, seed=3)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    sinks = torch.randn(4, generator=gen)
    got, want = run_extend(batch, [5, 7], 4, cap=2.5, sinks=sinks, seed=4)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_extend_bfloat16_close_to_reference() -> None:
    gen = torch.Generator().manual_seed(5)
    batch = make_batch(gen, [10, 6], 1, 16, 16, dtype=torch.bfloat16)
    got, want = run_extend(batch, [4, 6], 2, seed=5)
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)


def test_extend_empty_batch_is_a_no_op() -> None:
    gen = torch.Generator().manual_seed(0)
    batch = make_batch(gen, [], 1, 8, 8)
    got, want = run_extend(batch, [], 2)
    assert got.shape == want.shape == (0, 2, 8)


def run_decode(batch: Batch, h: int, *, cap: float = 0.0, window: int = 0,
               sinks: torch.Tensor | None = None, seed: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    bs = batch.seq_lens.numel()
    hkv, d, dv = batch.k_pool.shape[1], batch.k_pool.shape[2], batch.v_pool.shape[2]
    q = torch.randn(bs, h, d, generator=gen)
    k_new = torch.randn(bs, hkv, d, generator=gen)
    v_new = torch.randn(bs, hkv, dv, generator=gen)
    # The new token's slot is the last of its sequence.
    rows = batch.req_to_token[batch.req_pool_indices]
    loc = rows.gather(1, (batch.seq_lens - 1).clamp(min=0)[:, None]).reshape(-1).long()
    before_k, before_v = batch.k_pool.clone(), batch.v_pool.clone()
    o = torch.full((bs, h, dv), float("nan"))
    scale = 1 / math.sqrt(d)
    OPS.decode_attention_cpu(
        q, batch.k_pool, batch.v_pool, 1.0, 1.0, o, k_new, v_new, loc,
        torch.empty(bs, h, 8, dv + 1), batch.req_to_token, batch.req_pool_indices,
        batch.seq_lens, scale, cap, False, window, None, sinks,
    )  # fmt: skip
    # Reference: write the new K/V into a copy of the pool, then attend one query at a time.
    before_k[loc], before_v[loc] = k_new, v_new
    ref = Batch(batch.req_to_token, batch.req_pool_indices, batch.seq_lens, before_k, before_v)
    want = reference_extend(ref, q, None, None, [1] * bs, scale=scale, cap=cap, window=window,
                            sinks=sinks, tree=None, causal=True)  # fmt: skip
    return o, want, before_k, before_v


@pytest.mark.parametrize("hkv", [1, 4])
def test_decode_writes_new_kv_then_attends(hkv: int) -> None:
    gen = torch.Generator().manual_seed(20 + hkv)
    batch = make_batch(gen, [1, 17, 5, 30], hkv, 8, 8)  # a one-token sequence included
    got, want, k_after, v_after = run_decode(batch, 4, seed=hkv)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(batch.k_pool, k_after) and torch.equal(batch.v_pool, v_after)


def test_decode_equal_lengths_and_an_empty_sequence() -> None:
    gen = torch.Generator().manual_seed(4)
    batch = make_batch(gen, [9, 9, 9], 2, 8, 8)  # no padding: no mask
    got, want, _, _ = run_decode(batch, 4, seed=4)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    batch = make_batch(gen, [0, 5], 2, 8, 8)
    o = torch.full((2, 4, 8), float("nan"))
    OPS.decode_attention_cpu(
        torch.randn(2, 4, 8), batch.k_pool, batch.v_pool, 1.0, 1.0, o, None, None,
        torch.zeros(2, dtype=torch.long), torch.empty(2, 4, 8, 9), batch.req_to_token,
        batch.req_pool_indices, batch.seq_lens, 0.3, 0.0, False, 0, None, None,
    )  # fmt: skip
    assert torch.equal(o[0], torch.zeros(4, 8)) and torch.isfinite(o[1]).all()


def test_decode_window_cap_sinks_and_draft_rows() -> None:
    gen = torch.Generator().manual_seed(3)
    batch = make_batch(gen, [6, 9, 9, 12], 2, 8, 8)
    got, want, _, _ = run_decode(batch, 4, window=3, seed=1)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    batch = make_batch(gen, [6, 9, 9, 12], 2, 8, 8)
    sinks = torch.randn(4, generator=gen)
    got, want, _, _ = run_decode(batch, 4, cap=1.5, sinks=sinks, seed=2)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_decode_empty_batch_is_a_no_op() -> None:
    gen = torch.Generator().manual_seed(0)
    batch = make_batch(gen, [], 2, 8, 8)
    got, _, k_after, _ = run_decode(batch, 4)
    assert got.shape == (0, 4, 8) and torch.equal(batch.k_pool, k_after)


def test_module_exposes_every_op_under_sglang_names() -> None:
    for name in sgl_kernel.SCHEMAS:
        assert getattr(sgl_kernel, name) is getattr(OPS, name)
        assert getattr(OPS, name).default._schema.name == f"sgl_kernel::{name}"
