"""Paged attention over SGLang's KV pool: extend (prefill, draft extend, tree verify) and decode.

The KV pool holds one row per token slot (``k_buffer[slot] -> [kv_heads, head_dim]``); a
request's slots are ``req_to_token[req_pool_indices[b], :seq_len]``. Both ops gather each
request's keys into a padded batch and run one attention call over it, so a forward pass costs
a handful of tensor ops per layer rather than a loop over requests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_FP8 = {torch.float8_e4m3fn, torch.float8_e5m2}


def _slots(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, lengths: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slot per (request, position) up to ``width`` and which of them exist.

    Entries past a request's length may hold anything (stale or never written), so they are
    replaced by slot 0 before indexing the pool and masked out afterwards.
    """
    cols = torch.arange(width, device=lengths.device)
    valid = cols[None, :] < lengths[:, None]
    rows = req_to_token[req_pool_indices.long(), :width].long()
    return torch.where(valid, rows, 0), valid


def _read_pool(
    buffer: torch.Tensor, slots: torch.Tensor, scale: float, dtype: torch.dtype
) -> torch.Tensor:
    """Pool rows at ``slots`` in ``dtype``; an fp8 pool stores value / scale."""
    rows = buffer[slots]
    if buffer.dtype in _FP8:
        return (rows.float() * scale).to(dtype)
    return rows.to(dtype)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """softmax(q k^T * scale) v per (batch, head): q [B, Lq, H, D], k/v [B, Lk, Hkv, D*],
    visible [B, Lq, Lk] (None: every key; ``causal`` with Lq == Lk: the earlier ones) ->
    [B, Lq, H, Dv]. Every row must see at least one key. Computed in q's dtype through
    PyTorch's fused attention, as SGLang's torch_native backend does, so that plain and
    speculative serving round alike."""
    b, lq, h, _ = q.shape
    hkv = k.shape[2]
    if logit_cap <= 0 and sinks is None:
        return F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=None if visible is None else visible[:, None],
            is_causal=causal and visible is None,
            scale=sm_scale,
            enable_gqa=h != hkv,
        ).transpose(1, 2)
    # Soft-capped logits and attention sinks have no fused kernel: plain float32 math.
    if visible is None and causal:
        visible = torch.ones(lq, k.shape[1], dtype=torch.bool).tril()[None]
    group = h // hkv
    qf = q.float().reshape(b, lq, hkv, group, -1).permute(0, 2, 3, 1, 4)
    kf = k.float().permute(0, 2, 1, 3)[:, :, None]
    vf = v.float().permute(0, 2, 1, 3)[:, :, None]
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    if sinks is not None:
        # A sink is one more logit in the softmax's denominator, with no value.
        sink = sinks.float().reshape(1, hkv, group, 1, 1).expand(b, hkv, group, lq, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf).permute(0, 3, 1, 2, 4).reshape(b, lq, h, -1)
    return out.to(q.dtype)


def _window(visible: torch.Tensor, q_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Keep keys within ``window`` positions of each query (window <= 0: no limit)."""
    if window <= 0:
        return visible
    k_pos = torch.arange(visible.shape[-1], device=visible.device)
    return visible & (k_pos[None, None, :] > q_pos[..., None] - window)


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Attention of each request's new tokens over its whole sequence, into ``o_extend``.

    Request b owns query rows ``extend_start_loc[b] + [0, extend_seq_lens[b])``; its sequence
    is ``seq_lens[b]`` slots long, the last ``extend_seq_lens[b]`` of them the new tokens (taken
    from ``k_extend``/``v_extend`` when given, else from the pool). The prefix is always
    visible; among the new tokens a query sees the earlier ones (causal), all of them (not
    causal), or those its row of ``tree_mask`` marks: per request a row-major
    ``extend_len x extend_len`` block, the blocks back to back (speculative verify).
    """
    del max_len_extend, encoder_lens  # derived from the lengths; encoders are not served
    if is_cross_attention:
        raise NotImplementedError("sgl_kernel (CPU, pure torch): cross-attention is not supported")
    bs = seq_lens.numel()
    if bs == 0 or q_extend.shape[0] == 0:
        return
    device = q_extend.device
    seq = seq_lens.long()
    ext = extend_seq_lens.long()
    start = extend_start_loc.long()
    prefix = seq - ext
    lk, lq = int(seq.max()), int(ext.max())

    slots, k_valid = _slots(req_to_token, req_pool_indices, seq, lk)
    keys = _read_pool(k_buffer, slots, k_scale, q_extend.dtype)
    values = _read_pool(v_buffer, slots, v_scale, q_extend.dtype)

    rows = torch.arange(lq, device=device)
    q_valid = rows[None, :] < ext[:, None]
    q_index = torch.where(q_valid, start[:, None] + rows[None, :], 0)
    if k_extend is not None and v_extend is not None:
        # The new tokens' own K/V, as the model computed them this pass.
        b_idx = torch.arange(bs, device=device)[:, None].expand(bs, lq)[q_valid]
        pos = (prefix[:, None] + rows[None, :])[q_valid]
        src = q_index[q_valid]
        keys[b_idx, pos] = k_extend.reshape(k_extend.shape[0], *keys.shape[2:])[src].to(keys.dtype)
        values[b_idx, pos] = v_extend.reshape(v_extend.shape[0], *values.shape[2:])[src].to(
            values.dtype
        )
    queries = q_extend[q_index]

    if bs == 1 and tree_mask is None and is_causal and sliding_window_size <= 0 and lk == lq:
        # One request, no cached prefix: plain causal attention, no mask to build.
        out = _attend(queries, keys, values, None, sm_scale, logit_cap, sinks, causal=True)
        o_extend[q_index[0]] = out[0].to(o_extend.dtype)
        return
    # Column j of request b is new token c = j - prefix[b] when c >= 0.
    cols = torch.arange(lk, device=device)
    c = cols[None, None, :] - prefix[:, None, None]  # [bs, 1, lk]
    i = rows[None, :, None]  # [1, lq, 1]
    if tree_mask is not None:
        offsets = torch.cumsum(ext * ext, 0) - ext * ext
        cc = c.clamp(min=0)
        flat = offsets[:, None, None] + i * ext[:, None, None] + cc
        inside = (c >= 0) & (cc < ext[:, None, None]) & (i < ext[:, None, None])
        flat = torch.where(inside, flat, 0)
        new_visible = tree_mask.reshape(-1)[flat].bool() & inside
    elif is_causal:
        new_visible = c <= i
    else:
        new_visible = torch.ones_like(c, dtype=torch.bool)
    visible = k_valid[:, None, :] & ((c < 0) | new_visible)
    visible = _window(visible, prefix[:, None] + rows[None, :], sliding_window_size)
    # Padding rows (past a request's new tokens) see everything and are dropped below.
    visible = visible | ~q_valid[:, :, None]

    out = _attend(queries, keys, values, visible, sm_scale, logit_cap, sinks)
    o_extend[q_index[q_valid]] = out[q_valid].to(o_extend.dtype)


def decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One new token per request: store its K/V at ``loc`` (when given), then attend over
    the request's ``seq_lens[b]`` slots (the new one included) into ``output``.
    ``attn_logits`` is the native kernel's split-K scratch; nothing reads it back."""
    del attn_logits, encoder_lens
    if is_cross_attention:
        raise NotImplementedError("sgl_kernel (CPU, pure torch): cross-attention is not supported")
    if key is not None and value is not None:
        slots = loc.long()
        kv_shape = k_cache.shape[1:]
        new_k = key.reshape(key.shape[0], *kv_shape)
        new_v = value.reshape(value.shape[0], *v_cache.shape[1:])
        if k_cache.dtype in _FP8:
            new_k, new_v = new_k.float() / k_scale, new_v.float() / v_scale
        k_cache[slots] = new_k.to(k_cache.dtype)
        v_cache[slots] = new_v.to(v_cache.dtype)
    bs = seq_lens.numel()
    if bs == 0:
        return
    seq = seq_lens.long()
    lk = int(seq.max())
    empty = seq == 0
    has_empty = bool(empty.any())
    slots, valid = _slots(req_to_token, req_pool_indices, seq, lk)
    keys = _read_pool(k_cache, slots, k_scale, query.dtype)
    values = _read_pool(v_cache, slots, v_scale, query.dtype)
    q = query.reshape(bs, 1, -1, keys.shape[-1])
    visible: torch.Tensor | None = None
    if sliding_window_size > 0 or has_empty or int(seq.min()) != lk:
        # An empty sequence (never sent by SGLang) reads slot 0 and gets zeros below.
        valid[:, 0] |= empty
        visible = _window(valid[:, None, :], (seq - 1)[:, None], sliding_window_size)
    out = _attend(q, keys, values, visible, sm_scale, logit_cap, sinks)
    if has_empty:
        out = torch.where(empty[:, None, None, None], 0, out)
    output.copy_(out.reshape(output.shape).to(output.dtype))
