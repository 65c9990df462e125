"""``sgl_kernel.speculative``: where SGLang's NGRAM worker imports its tree helper from (the
parent package registered the op on import)."""

from __future__ import annotations

from typing import Any

import torch

reconstruct_indices_from_tree_mask: Any = torch.ops.sgl_kernel.reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]
