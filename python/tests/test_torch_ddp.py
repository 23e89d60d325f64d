"""DDP trains a small model (64-256-256-10 MLP, SGD with momentum,
synthetic data different on every rank) for 20 steps on the "ringcc"
group and on a gloo group in the same processes, from the same initial
parameters: over 2 ranks the parameters must be bit-identical (each
gradient bucket is a + b in either backend). Over 4 ranks the two
backends add the four gradients in different orders, so the parameters
agree to float32 rounding, and the test says whether they came out
identical anyway."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from ddp_model import model, train  # noqa: E402
from ranks import check, run  # noqa: E402
from torch_helpers import join  # noqa: E402

STEPS = 20


def _ddp(rank, world):
    gloo = join("env")
    a, b = model(), model()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    train(DDP(a), rank, STEPS)  # the default group: ringcc
    train(DDP(b, process_group=gloo), rank, STEPS)
    pa, pb = list(a.parameters()), list(b.parameters())
    same = all(torch.equal(p, q) for p, q in zip(pa, pb))
    diff = max(float((p - q).abs().max()) for p, q in zip(pa, pb))
    moved = float((pa[0] - model().state_dict()["0.weight"]).abs().max())
    # Every rank holds the same parameters (DDP's promise), on each backend.
    flat = torch.cat([p.detach().reshape(-1) for p in pa])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=gloo)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=gloo)
    dist.destroy_process_group()
    return same, diff, moved, torch.equal(lo, hi)


@pytest.mark.deadline(180)
def test_ddp_over_2_ranks_is_bit_identical_to_gloo():
    for same, diff, moved, agreed in check(run(_ddp, 2, deadline=150)):
        assert moved > 1e-3  # it trained
        assert agreed
        assert same, f"parameters differ from gloo's by up to {diff}"


@pytest.mark.deadline(240)
def test_ddp_over_4_ranks_agrees_with_gloo():
    res = check(run(_ddp, 4, deadline=200))
    for same, diff, moved, agreed in res:
        assert moved > 1e-3 and agreed
        assert diff < 1e-4, diff
    print(f"\n4 ranks: parameters bit-identical to gloo's: {res[0][0]} (max |difference| {res[0][1]:.3g})")
