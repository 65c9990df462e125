"""Draft-tree build and greedy verify of the pure-torch sgl_kernel, against references that
start from the ground truth the inputs were generated from (each node's true parent) and
state the outputs as set definitions rather than walks."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import pytest
import torch

from pytest_osprey.engines.sglang.cpu import sgl_kernel  # noqa: F401  registers the ops

OPS = torch.ops.sgl_kernel


class TreeMaskMode(enum.IntEnum):  # SGLang passes its IntEnum straight to the op
    FULL_MASK = 0
    QLEN_ONLY = 1


@dataclass
class Drafts:
    """The drafter's output as SGLang lays it out, plus the true parent node of each node."""

    parent_list: torch.Tensor  # [bs, topk * (steps - 1) + 1]
    selected: torch.Tensor  # [bs, n - 1], sorted candidate indices
    parents: list[list[int]]  # [bs][n]: true parent node (-1 for the root)


def draw(gen: torch.Generator, bs: int, topk: int, steps: int, n: int) -> Drafts:
    """Step 0 offers ``topk`` candidates grown from the root; each later step expands
    ``topk`` chosen beams of the step before by ``topk`` children each. The selected
    ``n - 1`` candidates are closed under ancestry, as top cumulative scores are."""
    parent_rows, selected_rows, parent_nodes = [], [], []
    for _ in range(bs):
        owner = {c: -1 for c in range(topk)}  # candidate -> the candidate it grew from
        parent_row = [-1]  # parent_row[cand // topk] is the beam cand grew from
        prev, base = list(range(topk)), topk
        for step in range(1, steps):
            pick = torch.randperm(len(prev), generator=gen)[:topk].tolist()
            beams = prev if step == 1 else [prev[i] for i in sorted(pick)]
            parent_row += beams
            for r, beam in enumerate(beams):
                for c in range(topk):
                    owner[base + r * topk + c] = beam
            prev = list(range(base, base + topk * topk))
            base += topk * topk
        chosen: list[int] = []
        order = torch.randperm(base, generator=gen).tolist()
        while len(chosen) < n - 1:
            for cand in order:
                if cand not in chosen and (owner[cand] == -1 or owner[cand] in chosen):
                    chosen.append(cand)
                    break
        chosen.sort()
        node_of = {cand: i + 1 for i, cand in enumerate(chosen)}
        parent_nodes.append([-1] + [0 if owner[c] == -1 else node_of[owner[c]] for c in chosen])
        parent_rows.append(parent_row)
        selected_rows.append(chosen)
    width = max(len(r) for r in parent_rows)
    padded = [r + [0] * (width - len(r)) for r in parent_rows]
    return Drafts(
        torch.tensor(padded, dtype=torch.long),
        torch.tensor(selected_rows, dtype=torch.long).reshape(bs, n - 1),
        parent_nodes,
    )


def expected_tree(parents: list[int], seq: int) -> dict[str, list]:
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        if parents[i] >= 0:
            anc[i, parents[i]] = True
    for _ in range(n):  # transitive closure by repeated boolean products
        anc = anc | ((anc.int() @ anc.int()) > 0)
    mask = anc.clone()
    mask[:, 0] = True
    depth = (mask.sum(1) - 1).tolist()
    first = [min([k for k in range(n) if parents[k] == i], default=-1) for i in range(n)]
    sibling = [
        min([k for k in range(i + 1, n) if parents[k] == parents[i]], default=-1)
        if i > 0 and parents[i] >= 0 else -1
        for i in range(n)
    ]  # fmt: skip
    return {
        "mask": mask.tolist(),
        "positions": [seq + d for d in depth],
        "first": first,
        "sibling": sibling,
    }


@pytest.mark.parametrize(("topk", "steps", "n"), [(1, 3, 4), (2, 3, 6), (2, 4, 8), (4, 3, 10)])
@pytest.mark.parametrize("mode", [TreeMaskMode.QLEN_ONLY, TreeMaskMode.FULL_MASK])
def test_build_tree_matches_ground_truth(topk: int, steps: int, n: int, mode: TreeMaskMode) -> None:
    gen = torch.Generator().manual_seed(topk * 100 + n)
    bs = 3
    drafts = draw(gen, bs, topk, steps, n)
    seqs = [5, 1, 12]
    seq_lens = torch.tensor(seqs)
    if mode == TreeMaskMode.QLEN_ONLY:
        tree_mask = torch.ones(bs * n * n, dtype=torch.bool)
    else:
        # FULL_MASK leaves the prefix columns as the caller filled them: fill with False here
        # so a write there shows.
        tree_mask = torch.zeros(sum(seqs) * n + n * n * bs, dtype=torch.bool)
    positions = torch.empty(bs * n, dtype=torch.long)
    ri, nt, ns = torch.full((3, bs, n), -1, dtype=torch.long)
    OPS.build_tree_kernel_efficient_cpu(drafts.parent_list, drafts.selected, seq_lens, tree_mask,
                                        positions, ri, nt, ns, topk, steps, n, mode)  # fmt: skip
    base = 0
    for b in range(bs):
        want = expected_tree(drafts.parents[b], seqs[b])
        assert positions[b * n : (b + 1) * n].tolist() == want["positions"]
        assert ri[b].tolist() == [b * n + i for i in range(n)]
        assert nt[b].tolist() == want["first"]
        assert ns[b].tolist() == want["sibling"]
        if mode == TreeMaskMode.QLEN_ONLY:
            got = tree_mask[b * n * n : (b + 1) * n * n].view(n, n)
        else:
            rows = tree_mask[base : base + (seqs[b] + n) * n].view(n, seqs[b] + n)
            assert not rows[:, : seqs[b]].any(), "prefix columns are the caller's"
            got = rows[:, seqs[b] :]
            base += (seqs[b] + n) * n
        assert got.tolist() == want["mask"]


def test_build_tree_single_node_and_empty_batch() -> None:
    one = torch.ones(1, dtype=torch.bool)
    pos = torch.empty(1, dtype=torch.long)
    ri, nt, ns = torch.full((3, 1, 1), -1, dtype=torch.long)
    OPS.build_tree_kernel_efficient_cpu(torch.zeros(1, 1, dtype=torch.long),
                                        torch.zeros(1, 0, dtype=torch.long), torch.tensor([7]),
                                        one, pos, ri, nt, ns, 1, 1, 1, 1)  # fmt: skip
    assert pos.tolist() == [7] and ri.tolist() == [[0]] and nt.tolist() == [[-1]] and one.item()
    empty = torch.empty(0, dtype=torch.long)
    OPS.build_tree_kernel_efficient_cpu(empty.view(0, 1), empty.view(0, 0), empty,
                                        torch.ones(0, dtype=torch.bool), empty, empty.view(0, 4),
                                        empty.view(0, 4), empty.view(0, 4), 1, 3, 4, 1)  # fmt: skip


def expected_verify(parents: list[int], cand: list[int], target: list[int], b: int,
                    max_depth: int) -> tuple[list[int], dict[int, int]]:  # fmt: skip
    """Accepted nodes level by level: the lowest-numbered child of the last accepted node whose
    draft token is the target's token there (``target`` indexed by flat node b * n + i)."""
    n = len(parents)
    path, written, node = [0], {}, 0
    while len(path) < max_depth:
        want = target[b * n + node]
        matches = [k for k in range(1, n) if parents[k] == node and cand[k] == want]
        if not matches:
            break
        written[b * n + node] = want
        node = min(matches)
        path.append(node)
    written[b * n + node] = target[b * n + node]
    return [b * n + i for i in path], written


@pytest.mark.parametrize(("topk", "steps", "n"), [(1, 3, 4), (2, 3, 6), (4, 3, 10), (1, 1, 1)])
def test_verify_tree_greedy_matches_ground_truth(topk: int, steps: int, n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    bs, vocab, max_depth = 5, 3, steps + 1  # a tiny vocab makes long accepts common
    drafts = draw(gen, bs, topk, steps, n) if n > 1 else Drafts(
        torch.zeros(bs, 1, dtype=torch.long), torch.zeros(bs, 0, dtype=torch.long), [[-1]] * bs
    )  # fmt: skip
    ri, nt, ns = torch.full((3, bs, n), -1, dtype=torch.long)
    OPS.build_tree_kernel_efficient_cpu(drafts.parent_list, drafts.selected, torch.full((bs,), 3),
                                        torch.ones(bs * n * n, dtype=torch.bool),
                                        torch.empty(bs * n, dtype=torch.long), ri, nt, ns, topk,
                                        steps, n, TreeMaskMode.QLEN_ONLY)  # fmt: skip
    candidates = torch.randint(0, vocab, (bs, n), generator=gen)
    target = torch.randint(0, vocab, (bs, n), generator=gen)
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, max_depth), -1, dtype=torch.int32)
    accept_num = torch.empty(bs, dtype=torch.int32)
    OPS.verify_tree_greedy_cpu(predicts=predicts, accept_index=accept_index,
                               accept_token_num=accept_num, candidates=candidates,
                               retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns,
                               target_predict=target)  # fmt: skip
    want_predicts = [0] * (bs * n)
    for b in range(bs):
        path, written = expected_verify(drafts.parents[b], candidates[b].tolist(),
                                        target.reshape(-1).tolist(), b, max_depth)  # fmt: skip
        assert accept_index[b].tolist() == path + [-1] * (max_depth - len(path))
        assert int(accept_num[b]) == len(path) - 1
        for where, token in written.items():
            want_predicts[where] = token
    assert predicts.tolist() == want_predicts


def test_verify_accepts_the_full_chain_and_stops_at_the_first_mismatch() -> None:
    # A chain 0 -> 1 -> 2 -> 3 whose drafts agree with the target up to node 2.
    ri = torch.tensor([[0, 1, 2, 3]])
    nt = torch.tensor([[1, 2, 3, -1]])
    ns = torch.full((1, 4), -1)
    target = torch.tensor([[11, 12, 99, 14]])
    candidates = torch.tensor([[10, 11, 12, 13]])
    predicts = torch.zeros(4, dtype=torch.int32)
    accept_index = torch.full((1, 4), -1, dtype=torch.int32)
    accept_num = torch.empty(1, dtype=torch.int32)
    OPS.verify_tree_greedy_cpu(predicts, accept_index, accept_num, candidates, ri, nt, ns, target)
    assert accept_index.tolist() == [[0, 1, 2, -1]] and accept_num.tolist() == [2]
    assert predicts.tolist() == [11, 12, 99, 0]  # the bonus token is the target's at node 2


def test_verify_stops_at_the_accept_index_width() -> None:
    # Every draft matches, but accept_index holds the root and two more nodes only.
    ri = torch.tensor([[0, 1, 2, 3]])
    nt = torch.tensor([[1, 2, 3, -1]])
    ns = torch.full((1, 4), -1)
    candidates = torch.tensor([[10, 11, 12, 13]])
    target = torch.tensor([[11, 12, 13, 14]])
    predicts = torch.zeros(4, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    accept_num = torch.empty(1, dtype=torch.int32)
    OPS.verify_tree_greedy_cpu(predicts, accept_index, accept_num, candidates, ri, nt, ns, target)
    assert accept_index.tolist() == [[0, 1, 2]] and accept_num.tolist() == [2]
    assert predicts.tolist() == [11, 12, 13, 0]


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_reconstruct_from_mask_matches_the_parent_array(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    bs = 4
    parents = [
        [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        for _ in range(bs)
    ]
    seqs = [3, 9, 1, 20]
    # NGRAM's rows mark the root, the node itself and its ancestors.
    mask = torch.tensor([expected_tree(p, 0)["mask"] for p in parents], dtype=torch.bool)
    positions = torch.empty(bs * n, dtype=torch.long)
    ri, nt, ns = torch.full((3, bs, n), -7, dtype=torch.long)
    OPS.reconstruct_indices_from_tree_mask(mask.reshape(-1), torch.tensor(seqs, dtype=torch.int32),
                                           positions, ri, nt, ns, bs, n)  # fmt: skip
    for b in range(bs):
        want = expected_tree(parents[b], seqs[b])
        assert positions[b * n : (b + 1) * n].tolist() == want["positions"]
        assert ri[b].tolist() == [b * n + i for i in range(n)]
        assert nt[b].tolist() == want["first"]
        assert ns[b].tolist() == want["sibling"]


def test_speculative_submodule_exposes_the_mask_helper() -> None:
    from pytest_osprey.engines.sglang.cpu.sgl_kernel import speculative

    assert speculative.reconstruct_indices_from_tree_mask is OPS.reconstruct_indices_from_tree_mask
