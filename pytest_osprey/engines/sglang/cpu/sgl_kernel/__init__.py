"""A CPU ``sgl_kernel`` for SGLang 0.5.23, in pure torch (the project's own code).

Importing it registers, under ``torch.ops.sgl_kernel``, the CPU ops that SGLang's CPU path
calls for plain and speculative serving (paged attention with tree masks, draft-tree build and
greedy verify, KV-slot bookkeeping), and exposes them as module attributes for SGLang's
``from sgl_kernel import ...`` lines. No native op that SGLang probes for (for example
``convert_weight_packed``) is defined, so SGLang keeps its plain torch layers.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import SCHEMAS, register

__version__ = "0.5.23+cpu.torch"

register()

_ops = torch.ops.sgl_kernel
extend_attention_cpu: Any = _ops.extend_attention_cpu
decode_attention_cpu: Any = _ops.decode_attention_cpu
build_tree_kernel_efficient_cpu: Any = _ops.build_tree_kernel_efficient_cpu
verify_tree_greedy_cpu: Any = _ops.verify_tree_greedy_cpu
reconstruct_indices_from_tree_mask: Any = _ops.reconstruct_indices_from_tree_mask
assign_req_to_token_pool_cpu: Any = _ops.assign_req_to_token_pool_cpu
assign_extend_cache_locs_cpu: Any = _ops.assign_extend_cache_locs_cpu
assign_draft_cache_locs_contiguous_cpu: Any = _ops.assign_draft_cache_locs_contiguous_cpu
build_draft_decode_metadata_cpu: Any = _ops.build_draft_decode_metadata_cpu
fill_bonus_tokens_cpu: Any = _ops.fill_bonus_tokens_cpu
fill_accept_out_cache_loc_cpu: Any = _ops.fill_accept_out_cache_loc_cpu
rotate_input_ids_cpu: Any = _ops.rotate_input_ids_cpu
copy_all_layer_kv_cache_cpu: Any = _ops.copy_all_layer_kv_cache_cpu

__all__ = ["SCHEMAS", *SCHEMAS]
