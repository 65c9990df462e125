"""Several sequences' KV caches as one batched cache, so that one forward pass serves them all.

Rows are left-padded to one length, and every forward appends the same number of columns to
every row (a row with fewer new tokens is padded on the right). A column a row does not own (its
padding, drafts the target rejected) is not removed but masked: the row's attention never sees
it again. The model's causal mask then only has to compare column indices, and the position ids
are each row's own count of real tokens, so a row computes what it would alone. Columns no row
owns are dropped whenever a row leaves, so the cache stays as long as its longest row plus the
holes of rows still running.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def new_cache(model: Any) -> Any:
    """A DynamicCache whose layers append in place (:func:`growing_layer`), where every layer
    is a plain DynamicLayer; as transformers makes it otherwise."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers: no config argument
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if layers and all(type(layer) is DynamicLayer for layer in layers):
        grow = growing_layer()
        cache.layers = [grow() for _ in layers]
    return cache


def growing_layer() -> type:
    """A DynamicLayer that writes new keys and values into spare room at its end, doubling it
    when full, instead of concatenating: a batch appends to every row at every forward, and a
    concatenation copies the whole batch's cache each time. Keys and values stay views of the first
    ``length`` columns; whoever replaces them (rows leaving, rows joining) hands the layer a
    new tensor, which the next update moves into a new room."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
        room_keys: Any = None
        room_values: Any = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            mine: Any = self.keys
            have = int(mine.shape[-2]) if mine.dim() == 4 else 0
            n = int(key_states.shape[-2])
            room = self.room_keys
            if (room is None or have + n > room.shape[-2] or room.shape[0] != key_states.shape[0]
                    or (have and mine.data_ptr() != room.data_ptr())):
                shape = (*key_states.shape[:2], max(64, 2 * (have + n)), key_states.shape[-1])
                keys, values = key_states.new_empty(shape), value_states.new_empty(shape)
                if have:
                    keys[:, :, :have] = mine
                    values[:, :, :have] = self.values  # type: ignore[assignment]
                self.room_keys, self.room_values = keys, values
            self.room_keys[:, :, have: have + n] = key_states
            self.room_values[:, :, have: have + n] = value_states
            self.keys = self.room_keys[:, :, : have + n]
            self.values = self.room_values[:, :, : have + n]
            return self.keys, self.values

    return GrowingLayer


class KVRows:
    """One model's cache for a batch of sequences, with which columns each row owns."""

    def __init__(self, model: Any, rows: int = 0) -> None:
        import torch

        self.model = model
        self.device = model.device
        self.cache = new_cache(model)
        self.valid = torch.zeros((rows, 0), dtype=torch.bool)  # [rows, columns], on the CPU
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    @property
    def rows(self) -> int:
        return int(self.valid.shape[0])

    @property
    def columns(self) -> int:
        return int(self.valid.shape[1])

    def forward(self, tokens: list[list[int]], need_from: list[int | None]) -> tuple[
            torch.Tensor, int, int]:
        """Run the model once over every row's new ``tokens`` (rows may have none). Returns
        (logits, first new column, offset): row b's logits for its j-th new token are
        ``logits[b, j - offset]``, for j >= ``need_from[b]`` (None: none needed)."""
        import torch

        n = max(len(t) for t in tokens)
        rows = len(tokens)
        if rows == 0 or n == 0:
            raise ValueError("a forward needs at least one new token")
        if self.rows == 0 and self.columns == 0:
            self.valid = torch.zeros((rows, 0), dtype=torch.bool)
        assert rows == self.rows, (rows, self.rows)
        ids = torch.zeros((rows, n), dtype=torch.long)
        new = torch.zeros((rows, n), dtype=torch.bool)
        for b, t in enumerate(tokens):
            if t:
                ids[b, : len(t)] = torch.tensor(t, dtype=torch.long)
                new[b, : len(t)] = True
        pos = self.valid.sum(dim=1, keepdim=True) + torch.arange(n)[None, :]
        first = int(self.valid.shape[1])
        self.valid = torch.cat([self.valid, new], dim=1)
        wanted = [j for j in need_from if j is not None]
        offset = min(wanted) if wanted else n - 1
        out = self.model(input_ids=ids.to(self.device),
                         attention_mask=self.valid.to(self.device, torch.long),
                         position_ids=pos.to(self.device), use_cache=True,
                         logits_to_keep=n - offset, **{self.cache_arg: self.cache})
        return out.logits, first, offset

    def drop(self, row: int, columns: list[int]) -> None:
        """Row ``row`` no longer owns ``columns`` (drafts that were rejected)."""
        if columns:
            self.valid[row, columns] = False

    def owned(self, row: int) -> int:
        return int(self.valid[row].sum())

    def keep_rows(self, rows: list[int]) -> None:
        """Only ``rows`` stay (in that order); columns that no remaining row owns go."""
        import torch

        if not rows:
            self.cache = new_cache(self.model)
            self.valid = torch.zeros((0, 0), dtype=torch.bool)
            return
        index = torch.tensor(rows, dtype=torch.long)
        valid = self.valid.index_select(0, index)
        cols = torch.nonzero(valid.any(dim=0)).flatten()
        self.valid = valid.index_select(1, cols)
        on = index.to(self.device), cols.to(self.device)
        for layer in self._layers() if self.columns else []:
            layer.keys = layer.keys.index_select(0, on[0]).index_select(2, on[1])
            layer.values = layer.values.index_select(0, on[0]).index_select(2, on[1])

    def absorb(self, others: list[KVRows]) -> None:
        """Append ``others``' rows (sequences prefilled on their own), left-padding every row
        to the longest: one copy of the cache for all who join at once."""
        import torch
        import torch.nn.functional as F

        parts = [kv for kv in [self, *others] if kv.rows]
        if not others or not parts:  # nothing joins: no copy (a copy costs the cache's room)
            return
        width = max(kv.columns for kv in parts)
        valid = torch.cat([F.pad(kv.valid, (width - kv.columns, 0)) for kv in parts], dim=0)
        if width == 0:  # nobody has run a forward yet
            self.valid = valid
            return
        shaped = next(kv for kv in parts if kv.columns)
        stacks = [kv._layers() if kv.columns else None for kv in parts]
        for i, layer in enumerate(shaped._layers()):
            for name in ("keys", "values"):
                like = getattr(layer, name)
                blocks = []
                for kv, stack in zip(parts, stacks, strict=True):
                    if stack is None:  # rows without a column yet: all padding
                        blocks.append(like.new_zeros((kv.rows, like.shape[1], width,
                                                      like.shape[3])))
                    else:
                        t = getattr(stack[i], name)
                        blocks.append(F.pad(t, (0, 0, width - kv.columns, 0)))
                setattr(layer, name, torch.cat(blocks, dim=0))
        self.cache, self.valid = shaped.cache, valid

    def _layers(self) -> list[Any]:
        layers = list(getattr(self.cache, "layers", []))
        for layer in layers:
            if not hasattr(layer, "keys") or getattr(layer, "is_sliding", False):
                raise RuntimeError(f"cannot batch a cache of {type(layer).__name__} layers")
        return layers
