"""KV-slot bookkeeping around speculative steps: which pool slots hold which tokens.

``req_to_token[r, p]`` is the pool slot of position p of the request in row r. The ops below
copy ranges between that table and flat slot lists, rearrange draft slots per branch, and
move pool rows; each is a gather or scatter over index tensors built in one go.
"""

from __future__ import annotations

import ctypes

import torch


def _ranges(
    start: torch.Tensor, end: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For ranges [start[b], end[b]) laid back to back: the owner b and the position of every
    element, and its index in the packed list."""
    lengths = (end.long() - start.long()).clamp(min=0)
    owner = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    packed_start = torch.cumsum(lengths, 0) - lengths
    packed = torch.arange(int(lengths.sum()))
    position = start.long()[owner] + packed - packed_start[owner]
    return owner, position, packed


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[req_pool_indices[b], start[b]:end[b]]`` <- the next slots of the packed
    ``out_cache_loc`` (request 0's first)."""
    owner, position, packed = _ranges(start_offset, end_offset)
    table = req_to_token.view(-1, pool_len)
    table[req_pool_indices.long()[owner], position] = out_cache_loc[packed].to(table.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The reverse: packed ``out_cache_loc`` <- ``req_to_token[...][start[b]:end[b]]``."""
    owner, position, packed = _ranges(start_offset, end_offset)
    table = req_to_token.reshape(-1, pool_len)
    out_cache_loc[packed] = table[req_pool_indices.long()[owner], position].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    speculative_num_steps: int,
) -> None:
    """Request b's ``topk * num_steps`` draft slots, the ones right after its sequence in
    ``req_to_token``, into row b of ``out_cache_loc`` (viewed as [bs, topk * num_steps])."""
    width = topk * speculative_num_steps
    bs = seq_lens.numel()
    if bs == 0 or width == 0:
        return
    table = req_to_token.reshape(-1, pool_len)
    cols = seq_lens.long()[:, None] + torch.arange(width)[None, :]
    rows = table[req_pool_indices.long()[:, None], cols]
    out_cache_loc[: bs * width] = rows.reshape(-1).to(out_cache_loc.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """A ``[bs * topk, pool_len]`` table for the draft decode steps: row ``b * topk + t`` is
    request b's sequence followed by branch t's draft slots (branch t owns
    ``num_steps`` slots from ``seq_len + t * num_steps``). Columns past
    ``seq_len + num_steps`` are unspecified."""
    bs = seq_lens.numel()
    table = req_to_token.reshape(-1, pool_len)
    base = table[req_pool_indices.long()]
    out = base.repeat_interleave(topk, dim=0)
    if bs == 0 or topk <= 1 or num_steps == 0:
        return out
    seq = seq_lens.long()
    step = torch.arange(num_steps)
    branch = torch.arange(topk)
    src = seq[:, None, None] + branch[None, :, None] * num_steps + step[None, None, :]
    drafts = torch.gather(base, 1, src.reshape(bs, -1)).reshape(bs * topk, num_steps)
    dst = seq.repeat_interleave(topk)[:, None] + step[None, :]
    out.scatter_(1, dst, drafts)
    return out


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[b]`` <- request b's last accepted token (its accepted count includes
    the bonus), from rows of ``accept_stride`` tokens."""
    bs = accept_lens.numel()
    if bs == 0:
        return
    where = torch.arange(bs) * accept_stride + accept_lens.long() - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[where].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Pack the slots of the accepted nodes (``accept_index`` entries other than -1, in
    order) into the front of ``accept_out_cache_loc``."""
    index = accept_index.reshape(-1).long()
    kept = index[index != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc.reshape(-1)[kept].to(
        accept_out_cache_loc.dtype
    )


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None,
) -> None:
    """Shift each request's ids left by one within its segment, then write its new token at
    ``select_index[b]`` if given, else at the segment's last position (empty segments are
    left alone)."""
    bs = extend_seq_lens.numel()
    if bs == 0:
        return
    start = extend_start_loc.long()
    lengths = extend_seq_lens.long()
    owner, position, _ = _ranges(start, start + (lengths - 1).clamp(min=0))
    del owner
    input_ids[position] = input_ids[position + 1].clone()
    present = lengths > 0
    last = start + lengths - 1 if select_index is None else select_index.reshape(-1).long()[:bs]
    new = topk_index.reshape(bs, -1)[:, 0]
    input_ids[last[present]] = new[present].to(input_ids.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """In every pool buffer (given by address and row size in bytes), row ``tgt_loc[i]`` <-
    row ``src_loc[i]``; all rows are read before any is written."""
    src = src_loc.reshape(-1).long()
    tgt = tgt_loc.reshape(-1).long()
    if src.numel() == 0:
        return
    rows = int(torch.maximum(src.max(), tgt.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        # The pool hands over raw addresses; view each buffer's first `rows` rows as bytes.
        raw = (ctypes.c_uint8 * (rows * int(stride))).from_address(int(address))
        buffer = torch.frombuffer(raw, dtype=torch.uint8).view(rows, int(stride))
        buffer[tgt] = buffer[src]
