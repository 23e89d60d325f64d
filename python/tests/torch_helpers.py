"""What the torch tests' ranks share: joining (ringcc as the default group,
gloo beside it) and comparing a ringcc result with gloo's."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DTYPES = FLOATS + (torch.int8, torch.uint8, torch.int32, torch.int64)
# Where the reduction order is not fixed (floats over more than 2 ranks,
# where gloo and ringcc add in different orders): relative tolerance.
RTOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 4e-2}


def join(how: str = "env", timeout: float = 30.0):
    """ringcc as the default group (env://, init_method tcp:// or store=),
    and a gloo group of the same ranks."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Several ranks share this machine's cores: one compute thread each.
    torch.set_num_threads(1)
    t = datetime.timedelta(seconds=timeout)
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if how == "env":
        dist.init_process_group("ringcc", timeout=t)
    elif how == "tcp":
        dist.init_process_group("ringcc", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world, timeout=t)
    else:
        store = dist.TCPStore(addr, port, world, rank == 0, timeout=t)
        dist.init_process_group("ringcc", store=store, rank=rank, world_size=world, timeout=t)
    assert dist.get_backend() == "ringcc"
    return dist.new_group(backend="gloo", timeout=t)


def data(dtype, n: int, rank: int, seed: int, near_one: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float64)
        return (1 + 0.05 * x if near_one else x).to(dtype)
    lo, hi = (-128, 128) if dtype == torch.int8 else (0, 256) if dtype == torch.uint8 else (-1000, 1000)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def compare(got: torch.Tensor, want: torch.Tensor, exact: bool):
    """(bit-identical?, within the tolerance?, max |difference|)"""
    same = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    if same or exact:
        diff = 0.0 if same else float((got.double() - want.double()).abs().max()) if got.shape == want.shape else float("inf")
        return same, same, diff
    close = torch.allclose(got.double(), want.double(), rtol=RTOL[got.dtype], atol=RTOL[got.dtype])
    return False, close, float((got.double() - want.double()).abs().max())
