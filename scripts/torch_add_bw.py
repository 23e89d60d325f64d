"""Bandwidth of torch adding two tensors in place (a.add_(b): reads 2 S,
writes S bytes), and of torch copying S bytes, on GPU 0, for the fused
kernels' comparison in scripts/gpu-check.sh. Prints RESULT lines like the
Rust benchmark, or TORCH_UNAVAILABLE and exits 0."""
import sys

try:
    import torch
except ImportError:
    print("TORCH_UNAVAILABLE: torch is not importable")
    sys.exit(0)
if not torch.cuda.is_available():
    print("TORCH_UNAVAILABLE: torch sees no CUDA device")
    sys.exit(0)

WARMUP, ITERS = 3, 20
nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20


def timed(fn):
    for _ in range(WARMUP):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / ITERS


print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
for dt, name in [(torch.float32, "float"), (torch.bfloat16, "bfloat16")]:
    n = nbytes // torch.empty((), dtype=dt).element_size()
    a = torch.zeros(n, dtype=dt, device="cuda")
    b = torch.zeros(n, dtype=dt, device="cuda")
    t = timed(lambda: a.add_(b))
    traffic = 3 * nbytes
    print(f"RESULT name=torch_add_{name}_{nbytes} bytes={nbytes} traffic_bytes={traffic} "
          f"time_us={t * 1e6:.2f} gbps={traffic / t / 1e9:.1f}")
c = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
d = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
t = timed(lambda: d.copy_(c))
print(f"RESULT name=torch_copy_{nbytes} bytes={nbytes} traffic_bytes={2 * nbytes} "
      f"time_us={t * 1e6:.2f} gbps={2 * nbytes / t / 1e9:.1f}")
