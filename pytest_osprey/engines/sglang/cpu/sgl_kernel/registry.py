"""The ``sgl_kernel`` operator schemas SGLang 0.5.23's CPU path calls, bound to the pure-torch
implementations. Names, argument order and types follow the call sites in SGLang's Python
(argument names only matter where a caller passes keywords: verify_tree_greedy_cpu)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import attention, bookkeeping, tree

NAMESPACE = "sgl_kernel"

SCHEMAS: dict[str, tuple[str, Callable[..., Any]]] = {
    "extend_attention_cpu": (
        "(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
        "Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
        "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, "
        "float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()",
        attention.extend_attention_cpu,
    ),
    "decode_attention_cpu": (
        "(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float k_scale, float v_scale, "
        "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, "
        "float logit_cap, bool is_cross_attention, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks) -> ()",
        attention.decode_attention_cpu,
    ),
    "build_tree_kernel_efficient_cpu": (
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, "
        "Tensor(a!) tree_mask, Tensor(b!) positions, Tensor(c!) retrive_index, "
        "Tensor(d!) retrive_next_token, Tensor(e!) retrive_next_sibling, int topk, int depth, "
        "int draft_token_num, int tree_mask_mode) -> ()",
        tree.build_tree_kernel_efficient_cpu,
    ),
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, "
        "Tensor retrive_next_sibling, Tensor target_predict) -> ()",
        tree.verify_tree_greedy_cpu,
    ),
    "reconstruct_indices_from_tree_mask": (
        "(Tensor tree_mask, Tensor verified_seq_len, Tensor(a!) positions, "
        "Tensor(b!) retrive_index, Tensor(c!) retrive_next_token, "
        "Tensor(d!) retrive_next_sibling, int batch_size, int draft_token_num) -> ()",
        tree.reconstruct_indices_from_tree_mask,
    ),
    "assign_req_to_token_pool_cpu": (
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()",
        bookkeeping.assign_req_to_token_pool_cpu,
    ),
    "assign_extend_cache_locs_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()",
        bookkeeping.assign_extend_cache_locs_cpu,
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, "
        "Tensor(a!) out_cache_loc, int pool_len, int topk, int speculative_num_steps) -> ()",
        bookkeeping.assign_draft_cache_locs_contiguous_cpu,
    ),
    "build_draft_decode_metadata_cpu": (
        "(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, "
        "int num_steps, int pool_len) -> Tensor",
        bookkeeping.build_draft_decode_metadata_cpu,
    ),
    "fill_bonus_tokens_cpu": (
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, "
        "int accept_stride) -> ()",
        bookkeeping.fill_bonus_tokens_cpu,
    ),
    "fill_accept_out_cache_loc_cpu": (
        "(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc) -> ()",
        bookkeeping.fill_accept_out_cache_loc_cpu,
    ),
    "rotate_input_ids_cpu": (
        "(Tensor(a!) input_ids, Tensor extend_start_loc, Tensor extend_seq_lens, "
        "Tensor topk_index, Tensor? select_index) -> ()",
        bookkeeping.rotate_input_ids_cpu,
    ),
    "copy_all_layer_kv_cache_cpu": (
        "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        bookkeeping.copy_all_layer_kv_cache_cpu,
    ),
}

_LIBRARY: torch.library.Library | None = None  # kept alive: dropping it unregisters the ops


def _defined(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def register() -> list[str]:
    """Define and implement every op not already defined (a second import, or a native
    build loaded first, keeps what is there). Returns the names this call registered."""
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")  # type: ignore[no-untyped-call]
    done = []
    for name, (schema, impl) in SCHEMAS.items():
        if _defined(name):
            continue
        _LIBRARY.define(name + schema)  # type: ignore[no-untyped-call]
        _LIBRARY.impl(name, impl, "CPU")  # type: ignore[no-untyped-call]
        done.append(name)
    return done
