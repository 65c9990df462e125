"""KV-slot bookkeeping ops of the pure-torch sgl_kernel against element-by-element loops."""

from __future__ import annotations

import pytest
import torch

from pytest_osprey.engines.sglang.cpu import sgl_kernel  # noqa: F401  registers the ops

OPS = torch.ops.sgl_kernel
POOL_ROWS, POOL_LEN = 6, 32


def table(gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 10_000, (POOL_ROWS, POOL_LEN), generator=gen, dtype=torch.int32)


def ranges(gen: torch.Generator, bs: int, *, allow_empty: bool) -> tuple[torch.Tensor, ...]:
    rows = torch.randperm(POOL_ROWS, generator=gen)[:bs]
    start = torch.randint(0, 12, (bs,), generator=gen)
    length = torch.randint(0 if allow_empty else 1, 9, (bs,), generator=gen)
    return rows, start, start + length


@pytest.mark.parametrize("bs", [0, 1, 4])
def test_assign_req_to_token_pool(bs: int) -> None:
    gen = torch.Generator().manual_seed(bs)
    req_to_token = table(gen)
    rows, start, end = ranges(gen, bs, allow_empty=True)
    total = int((end - start).sum())
    out_cache_loc = torch.randint(0, 10_000, (total + 3,), generator=gen)  # longer than used
    want = req_to_token.clone()
    k = 0
    for b in range(bs):
        for p in range(int(start[b]), int(end[b])):
            want[rows[b], p] = out_cache_loc[k]
            k += 1
    OPS.assign_req_to_token_pool_cpu(rows, req_to_token, start, end, out_cache_loc, POOL_LEN)
    assert torch.equal(req_to_token, want)


@pytest.mark.parametrize("bs", [0, 1, 5])
def test_assign_extend_cache_locs(bs: int) -> None:
    gen = torch.Generator().manual_seed(10 + bs)
    req_to_token = table(gen)
    rows, start, end = ranges(gen, bs, allow_empty=True)
    total = int((end - start).sum())
    out = torch.full((total + 2,), -5, dtype=torch.int64)
    want = [int(req_to_token[rows[b], p]) for b in range(bs) for p in range(start[b], end[b])]
    OPS.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, out, POOL_LEN)
    assert out.tolist() == [*want, -5, -5]


@pytest.mark.parametrize(("topk", "steps"), [(1, 3), (2, 3), (4, 2)])
def test_assign_draft_cache_locs_contiguous(topk: int, steps: int) -> None:
    gen = torch.Generator().manual_seed(topk)
    req_to_token = table(gen)
    rows = torch.tensor([3, 0, 5])
    seq_lens = torch.tensor([1, 9, 4])
    out = torch.full((3 * topk * steps,), -1, dtype=torch.int64)
    want = []
    for b in range(3):
        for i in range(topk * steps):
            want.append(int(req_to_token[rows[b], int(seq_lens[b]) + i]))
    OPS.assign_draft_cache_locs_contiguous_cpu(rows, req_to_token, seq_lens, out, POOL_LEN,
                                               topk, steps)  # fmt: skip
    assert out.tolist() == want


@pytest.mark.parametrize(("topk", "steps"), [(1, 3), (2, 3), (3, 4)])
def test_build_draft_decode_metadata(topk: int, steps: int) -> None:
    gen = torch.Generator().manual_seed(20 + topk)
    req_to_token = table(gen)
    rows = torch.tensor([4, 1])
    seq_lens = torch.tensor([6, 2])
    out = OPS.build_draft_decode_metadata_cpu(req_to_token, rows, seq_lens, topk, steps, POOL_LEN)
    assert out.shape == (2 * topk, POOL_LEN) and out.dtype == req_to_token.dtype
    for b in range(2):
        seq = int(seq_lens[b])
        for t in range(topk):
            line = out[b * topk + t]
            assert line[:seq].tolist() == req_to_token[rows[b], :seq].tolist()
            draft = [int(req_to_token[rows[b], seq + t * steps + s]) for s in range(steps)]
            assert line[seq : seq + steps].tolist() == draft


def test_fill_bonus_tokens() -> None:
    gen = torch.Generator().manual_seed(1)
    stride = 4
    accept_tokens = torch.randint(0, 100, (5, stride), generator=gen)
    accept_lens = torch.tensor([1, 4, 2, 3, 1], dtype=torch.int32)
    bonus = torch.full((5,), -1, dtype=torch.int64)
    OPS.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, stride)
    assert bonus.tolist() == [int(accept_tokens[b, int(accept_lens[b]) - 1]) for b in range(5)]
    empty = torch.empty(0, dtype=torch.int64)
    OPS.fill_bonus_tokens_cpu(empty, empty.int(), empty, stride)


def test_fill_accept_out_cache_loc() -> None:
    gen = torch.Generator().manual_seed(2)
    accept_index = torch.tensor([[0, 2, -1, -1], [4, 5, 7, -1], [8, -1, -1, -1]], dtype=torch.int32)
    out_cache_loc = torch.randint(0, 1000, (12,), generator=gen)
    dst = torch.full((12,), -3, dtype=torch.int64)
    want = [int(out_cache_loc[i]) for i in accept_index.reshape(-1).tolist() if i != -1]
    OPS.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dst)
    assert dst.tolist() == want + [-3] * (12 - len(want))


@pytest.mark.parametrize("with_select", [False, True])
def test_rotate_input_ids(with_select: bool) -> None:
    lens = [3, 0, 1, 5]
    starts = [0, 3, 3, 4]
    ids = torch.arange(100, 109)
    new = torch.tensor([[-1], [-2], [-3], [-4]])
    select = torch.tensor([1, 3, 3, 6]) if with_select else None
    want = ids.tolist()
    for b, (s, n) in enumerate(zip(starts, lens, strict=True)):
        if n == 0:
            continue
        segment = want[s : s + n]
        want[s : s + n - 1] = segment[1:]
        want[int(select[b]) if select is not None else s + n - 1] = int(new[b, 0])
    OPS.rotate_input_ids_cpu(ids, torch.tensor(starts, dtype=torch.int32),
                             torch.tensor(lens, dtype=torch.int32), new, select)  # fmt: skip
    assert ids.tolist() == want


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer() -> None:
    gen = torch.Generator().manual_seed(3)
    buffers = [
        torch.randn(10, 2, 4, generator=gen),
        torch.randn(10, 3, generator=gen).to(torch.bfloat16),
        torch.randint(0, 9, (10, 5), generator=gen, dtype=torch.int8),
    ]
    wants = [b.clone() for b in buffers]
    # A swap and a chain: every source is read before any target is written.
    src = torch.tensor([1, 2, 3, 7])
    tgt = torch.tensor([2, 1, 4, 3])
    for w in wants:
        w[tgt] = w[src].clone()
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])
    OPS.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for got, want in zip(buffers, wants, strict=True):
        assert torch.equal(got, want)
    OPS.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt[:0], src[:0])  # nothing to move
