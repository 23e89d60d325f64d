"""Under torchrun itself: `dist.init_process_group("ringcc")` with nothing
but torchrun's environment (its agent's store), the backend found through
the package's entry point (the script never imports ringcc)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    dist.init_process_group("ringcc")
    x = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    assert dist.get_backend() == "ringcc"
    assert float(x[0]) == sum(range(1, dist.get_world_size() + 1)), x[0]
    dist.destroy_process_group()
    print("rank", dist.get_rank() if dist.is_initialized() else "-", "ok", flush=True)
    """
)


@pytest.mark.deadline(120)
def test_init_process_group_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ok") == 2, p.stdout + p.stderr
