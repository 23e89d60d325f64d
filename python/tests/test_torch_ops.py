"""Every op × type of the "ringcc" backend against gloo, in the same
processes (a gloo group beside the ringcc default group), 2 and 4 ranks.

Bit for bit where the order of the reduction is fixed: integers always
(wrapping arithmetic does not care about order), MIN and MAX always, data
movement (broadcast, gathers) always, and floats over 2 ranks (a + b and
a * b are commutative in IEEE arithmetic; AVG is SUM then the same
division on both). Floats' SUM, PRODUCT and AVG over 4 ranks are compared
within a tolerance (torch_helpers.RTOL): gloo and ringcc's ring add in
different orders; the test reports how many still came out identical.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ranks import check, run  # noqa: E402
from torch_helpers import DTYPES, FLOATS, compare, data, join  # noqa: E402

R = dist.ReduceOp
OPS = {"SUM": R.SUM, "PRODUCT": R.PRODUCT, "MIN": R.MIN, "MAX": R.MAX, "AVG": R.AVG}
SIZES = (1, 1003, 300_001)


def _reference_reduce(t, name, world, group, call):
    """gloo's result for reduction ``name`` (AVG: SUM, then the division)."""
    if name != "AVG":
        return call(t, OPS[name], group)
    call(t, R.SUM, group)
    if t.dtype.is_floating_point:
        return t.div_(world)
    return t.copy_(torch.div(t, world, rounding_mode="trunc"))


def _suite(rank, world, how):
    gloo = join(how)
    report = []

    def record(what, dt, n, got, want, fixed):
        same, ok, diff = compare(got, want, exact=fixed)
        report.append((what, str(dt).replace("torch.", ""), n, fixed, same, ok, diff))

    seed = 0
    for dt in DTYPES:
        for n in SIZES:
            seed += 1
            fl = dt in FLOATS
            for name in OPS:
                ordered = not fl or world == 2 or name in ("MIN", "MAX")
                x = data(dt, n, rank, seed, near_one=name == "PRODUCT")
                # allreduce
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=OPS[name])
                _reference_reduce(b, name, world, gloo, lambda t, op, g: dist.all_reduce(t, op=op, group=g))
                record(f"allreduce {name}", dt, n, a, b, ordered)
                # reduce to the last rank
                root = world - 1
                a, b = x.clone(), x.clone()
                dist.reduce(a, root, op=OPS[name])
                _reference_reduce(b, name, world, gloo, lambda t, op, g: dist.reduce(t, root, op=op, group=g))
                if rank == root:
                    record(f"reduce {name}", dt, n, a, b, ordered)
                # reduce_scatter_tensor (input: world blocks of n)
                xs = torch.cat([data(dt, n, rank, seed * 31 + k, near_one=name == "PRODUCT") for k in range(world)])
                a, b = torch.empty(n, dtype=dt), torch.empty(n, dtype=dt)
                dist.reduce_scatter_tensor(a, xs, op=OPS[name])
                if name == "AVG":
                    dist.reduce_scatter_tensor(b, xs.clone(), op=R.SUM, group=gloo)
                    b = b.div_(world) if fl else torch.div(b, world, rounding_mode="trunc")
                else:
                    dist.reduce_scatter_tensor(b, xs.clone(), op=OPS[name], group=gloo)
                record(f"reduce_scatter_tensor {name}", dt, n, a, b, ordered)
            # list reduce_scatter, SUM
            ins = [data(dt, n, rank, seed * 17 + k) for k in range(world)]
            a, b = torch.empty(n, dtype=dt), torch.empty(n, dtype=dt)
            dist.reduce_scatter(a, [t.clone() for t in ins])
            dist.reduce_scatter(b, [t.clone() for t in ins], group=gloo)
            record("reduce_scatter SUM", dt, n, a, b, not fl or world == 2)
            # allreduce_coalesced, SUM
            pair = [data(dt, n, rank, seed + 5), data(dt, 7, rank, seed + 6)]
            a, b = [t.clone() for t in pair], [t.clone() for t in pair]
            with pytest.warns(FutureWarning):
                dist.all_reduce_coalesced(a)
            with pytest.warns(FutureWarning):
                dist.all_reduce_coalesced(b, group=gloo)
            for k in range(2):
                record(f"allreduce_coalesced[{k}]", dt, a[k].numel(), a[k], b[k], not fl or world == 2)
            # broadcast from rank 1
            a, b = data(dt, n, rank, seed + 7), data(dt, n, rank, seed + 7)
            dist.broadcast(a, 1 % world)
            dist.broadcast(b, 1 % world, group=gloo)
            record("broadcast", dt, n, a, b, True)
            # all_gather (list) and all_gather_into_tensor
            x = data(dt, n, rank, seed + 8)
            la, lb = [torch.empty(n, dtype=dt) for _ in range(world)], [torch.empty(n, dtype=dt) for _ in range(world)]
            dist.all_gather(la, x)
            dist.all_gather(lb, x, group=gloo)
            record("all_gather", dt, n, torch.cat(la), torch.cat(lb), True)
            ta, tb = torch.empty(n * world, dtype=dt), torch.empty(n * world, dtype=dt)
            dist.all_gather_into_tensor(ta, x)
            dist.all_gather_into_tensor(tb, x, group=gloo)
            record("all_gather_into_tensor", dt, n, ta, tb, True)
    dist.barrier()
    dist.destroy_process_group()
    return report


@pytest.mark.parametrize("world,how", [(2, "env"), (4, "tcp")])
@pytest.mark.deadline(300)
def test_every_op_and_type_against_gloo(world, how):
    reports = check(run(_suite, world, how, deadline=240))
    rows = [row for rep in reports for row in rep]
    bad = [r for r in rows if not r[5]]
    assert not bad, "ringcc differs from gloo:\n" + "\n".join(map(str, bad[:30]))
    fixed = [r for r in rows if r[3]]
    assert all(r[4] for r in fixed)
    loose = [r for r in rows if not r[3]]
    print(
        f"\n{world} ranks: {len(rows)} comparisons; {len(fixed)} with a fixed order, all bit-identical; "
        f"{len(loose)} float SUM/PRODUCT/AVG within tolerance, {sum(r[4] for r in loose)} of them bit-identical anyway"
    )
    # Every combination was exercised on some rank.
    names = {(r[0], r[1]) for r in rows}
    assert len(names) == (3 * 5 + 1 + 2 + 3) * 8, len(names)
