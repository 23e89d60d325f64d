"""Anything a collective takes, as a buffer-protocol object and, where its
format cannot say it, the element type's name.

numpy arrays and other buffer-protocol objects pass as they are; CPU torch
tensors as numpy views of their memory (bfloat16, which numpy lacks, as
16-bit integers named ``bfloat16``); other DLPack objects through
``numpy.from_dlpack``. Memory is never copied: a tensor or array that is
not contiguous is refused (the torch backend copies instead).
"""

from __future__ import annotations

import numpy as np

from .errors import BadBuffer

_CUDA_LATER = (
    "ringcc's Python package takes CPU memory only for now: CUDA tensors come "
    "with the CUDA per-process communicator (the CUDA per-process issue); "
    "copy to the CPU (.cpu()) or use NCCL meanwhile"
)

# DLPack device types that are not the host's memory.
_DLPACK_CPU = (1, 3)  # kDLCPU, kDLCUDAHost (pinned host memory)


def _is_tensor(obj) -> bool:
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "is_contiguous") and hasattr(obj, "device")


def tensor_buffer(t, which: str = "buffer"):
    """A CPU torch tensor's memory as ``(numpy view, dtype name or None)``."""
    if t.device.type != "cpu":
        raise BadBuffer(f"the {which} tensor is on {t.device}: {_CUDA_LATER}", kind="bad_buffer")
    if not t.is_contiguous():
        raise BadBuffer(
            f"the {which} tensor is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
            "pass t.contiguous() and copy back",
            kind="bad_buffer",
        )
    t = t.detach()
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    try:
        return t.numpy(), None
    except TypeError as e:  # a type numpy lacks
        raise BadBuffer(f"the {which} tensor's type {t.dtype} is no ringcc element type: {e}", kind="bad_buffer") from e


def as_buffer(obj, which: str = "buffer"):
    """``obj`` as ``(buffer-protocol object, dtype name or None)``."""
    if type(obj) is np.ndarray:
        return obj, None
    if _is_tensor(obj):
        return tensor_buffer(obj, which)
    try:
        memoryview(obj).release()
        return obj, None
    except TypeError:
        pass
    if hasattr(obj, "__dlpack__"):
        if hasattr(obj, "__dlpack_device__"):
            dev, _ = obj.__dlpack_device__()
            if int(dev) not in _DLPACK_CPU:
                raise BadBuffer(f"the {which} DLPack object is on device type {int(dev)}: {_CUDA_LATER}", kind="bad_buffer")
        try:
            return np.from_dlpack(obj), None
        except (TypeError, BufferError, RuntimeError) as e:
            raise BadBuffer(f"the {which} DLPack object cannot be read as host memory: {e}", kind="bad_buffer") from e
    raise BadBuffer(
        f"the {which} ({type(obj).__name__}) is neither a buffer-protocol object, a torch tensor nor a DLPack object",
        kind="bad_buffer",
    )
