"""Draft-token trees: build one from the drafter's top-k choices, and verify it greedily.

A request's tree has ``n`` nodes: node 0 is the last verified token (the root), node i >= 1
the i-th selected draft token. Trees are small (n <= a few dozen) and walked node by node, so
both ops work on Python lists per request and write each output back in one copy.
"""

from __future__ import annotations

import torch

# TreeMaskMode in SGLang: the full per-request mask (prefix columns included), or only the
# draft-by-draft block. The bit-packed variant is a GPU layout; the CPU verify never asks for it.
FULL_MASK = 0
QLEN_ONLY = 1


def _parents(selected: list[int], parent_row: list[int], topk: int, n: int) -> list[int]:
    """Parent node of every node (-1 for the root and for a node whose parent is absent).

    ``selected[i - 1]`` indexes node i in the drafter's flattened (step, branch) candidate
    list; ``// topk`` names the candidate it grew from, 0 meaning the root, else an index into
    ``parent_row`` that gives the parent's own candidate index, found among ``selected``.
    """
    node_of: dict[int, int] = {}
    for pos, cand in enumerate(selected[: n - 1]):
        node_of.setdefault(cand, pos + 1)
    parents = [-1] * n
    for i in range(1, n):
        grown_from = selected[i - 1] // topk
        if grown_from == 0:
            parents[i] = 0
        else:
            parents[i] = node_of.get(parent_row[grown_from], -1)
    return parents


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Per request: node positions (sequence length + depth), the retrieval links (flat node
    index, first child, next sibling; children in ascending node order) and the attention
    mask (a node sees the root, itself and its ancestors)."""
    mode = int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(
            f"sgl_kernel (CPU, pure torch): tree mask mode {mode} is not supported"
        )
    n = draft_token_num
    bs = verified_seq_len.numel()
    if bs == 0 or n == 0:
        return
    seqs = verified_seq_len.tolist()
    selected = selected_index.reshape(bs, -1).tolist()
    parent_rows = parent_list.reshape(bs, -1).tolist()
    index, first_child, sibling, pos_out, masks = [], [], [], [], []
    for b in range(bs):
        parents = _parents(selected[b], parent_rows[b], topk, n)
        child = [-1] * n
        nxt = [-1] * n
        for i in range(n - 1, 0, -1):
            p = parents[i]
            if p >= 0:
                nxt[i] = child[p]
                child[p] = i
        mask = [[False] * n for _ in range(n)]
        depths = [0] * n
        for x in range(n):
            mask[x][0] = True
            node, steps = x, 0
            while node > 0 and steps < depth:
                mask[x][node] = True
                steps += 1
                node = parents[node]
            depths[x] = steps
        index.append([b * n + i for i in range(n)])
        first_child.append(child)
        sibling.append(nxt)
        pos_out.append([seqs[b] + d for d in depths])
        masks.append(mask)
    retrive_index.copy_(torch.tensor(index).reshape(retrive_index.shape))
    retrive_next_token.copy_(torch.tensor(first_child).reshape(retrive_next_token.shape))
    retrive_next_sibling.copy_(torch.tensor(sibling).reshape(retrive_next_sibling.shape))
    positions[: bs * n] = torch.tensor(pos_out).reshape(-1).to(positions.dtype)
    block = torch.tensor(masks, dtype=torch.bool)
    flat = tree_mask.reshape(-1)
    if mode == QLEN_ONLY:
        flat[: bs * n * n] = block.reshape(-1).to(flat.dtype)
        return
    # FULL_MASK: request b's rows are seq_len + n wide, the prefix columns left as filled.
    base = 0
    for b in range(bs):
        width = seqs[b] + n
        rows = flat[base : base + width * n].view(n, width)
        rows[:, seqs[b] :] = block[b].to(flat.dtype)
        base += width * n


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Walk each request's tree from the root, descending into the child whose draft token
    equals the target's greedy token at the current node, for at most
    ``accept_index.shape[1] - 1`` levels.

    Writes the accepted nodes' flat indices (root first) into ``accept_index``, their count
    (root excluded) into ``accept_token_num``, and the target's token at every accepted node
    and the root into ``predicts`` (flat, indexed like ``target_predict``)."""
    bs = candidates.shape[0]
    if bs == 0:
        return
    max_depth = accept_index.shape[1]
    cand = candidates.reshape(bs, -1).tolist()
    index = retrive_index.reshape(bs, -1).tolist()
    child = retrive_next_token.reshape(bs, -1).tolist()
    nxt = retrive_next_sibling.reshape(bs, -1).tolist()
    target = target_predict.reshape(-1).tolist()
    accepted_rows = accept_index.tolist()
    counts = []
    written: dict[int, int] = {}
    for b in range(bs):
        last = index[b][0]
        row = accepted_rows[b]
        row[0] = last
        count, node = 0, 0
        for _ in range(1, max_depth):
            want = target[last]
            node = child[b][node]
            while node != -1 and cand[b][node] != want:
                node = nxt[b][node]
            if node == -1:
                break
            written[last] = want
            count += 1
            last = index[b][node]
            row[count] = last
        written[last] = target[last]
        counts.append(count)
    accept_index.copy_(torch.tensor(accepted_rows, dtype=accept_index.dtype))
    accept_token_num.copy_(torch.tensor(counts, dtype=accept_token_num.dtype))
    if written:
        flat = predicts.reshape(-1)
        where = torch.tensor(list(written.keys()), dtype=torch.long)
        flat[where] = torch.tensor(list(written.values()), dtype=flat.dtype)


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """The retrieval links and positions of trees given only as masks (NGRAM's drafts).

    ``tree_mask`` holds per request an ``n x n`` block whose row i marks node i's ancestors
    (earlier nodes; the root, itself or later nodes may be marked too and are ignored). A
    node's position is the sequence length plus its ancestor count; its parent is its latest
    ancestor; its first child the earliest later node below it; its next sibling the earliest
    later node with the same parent (none for the root).
    """
    bs, n = batch_size, draft_token_num
    if bs == 0 or n == 0:
        return
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).bool()
    idx = torch.arange(n)
    below = mask & (idx[None, None, :] < idx[None, :, None])  # [b, node, earlier node]
    depth = below.sum(-1)
    positions[: bs * n] = (
        (depth + verified_seq_len.reshape(bs, 1).long()).reshape(-1).to(positions.dtype)
    )
    parent = torch.where(below, idx[None, None, :], -1).amax(-1)  # [b, node]
    nodes = idx[None, :, None].expand(bs, n, n)
    first = torch.where(below, nodes, n).amin(1)  # earliest node having column t as ancestor
    same = (parent[:, :, None] == parent[:, None, :]) & (idx[:, None] > idx[None, :])[None]
    sibling = torch.where(same, nodes, n).amin(1)
    sibling = torch.where((parent >= 0) & (sibling < n), sibling, -1)
    retrive_index.copy_((torch.arange(bs)[:, None] * n + idx[None, :]).reshape(retrive_index.shape))
    retrive_next_token.copy_(torch.where(first < n, first, -1).reshape(retrive_next_token.shape))
    retrive_next_sibling.copy_(sibling.reshape(retrive_next_sibling.shape))
