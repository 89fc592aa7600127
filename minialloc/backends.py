"""Pick the device minialloc runs on: a real CUDA GPU when there is one, else the simulator.

    device = default_device("8GiB")   # CudaGPU(limit=8 GiB) on a GPU machine, SimulatedGPU("8GiB") elsewhere

MINIALLOC_DEVICE forces the choice: "sim" always simulates (the course sets it, so every student sees the same
numbers), "cuda" insists on a GPU and fails with one clear line where there is none. On a GPU, `capacity`
becomes CudaGPU's limit, so the allocator sees a card of that size either way.
"""

from __future__ import annotations

import os

from .devices.cuda import CudaGPU, cuda_unavailable_reason
from .devices.simulated import SimulatedGPU

ENV_VAR = "MINIALLOC_DEVICE"
DEFAULT_CAPACITY = "8GiB"


def default_device(capacity: int | str | None = None) -> CudaGPU | SimulatedGPU:
    """CudaGPU when a GPU is present (or MINIALLOC_DEVICE=cuda), else SimulatedGPU(capacity or 8 GiB).

    Without a capacity the two differ in size: CudaGPU takes the whole card (its total memory as the driver reports
    it), while the simulator is an 8 GiB card, the size the course's scenarios are written for. Pass a capacity
    (e.g. "8GiB") to make a real GPU behave like the course's card: allocations past it fail as on a full card.
    """
    choice = os.environ.get(ENV_VAR, "").strip().lower()
    if choice not in ("", "sim", "cuda"):
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r} is not understood: set it to 'sim' or 'cuda', "
                         "or unset it to use a GPU when there is one")
    if choice != "sim":
        reason = cuda_unavailable_reason()
        if reason is None:
            return CudaGPU(limit=capacity)
        if choice == "cuda":
            reason = " ".join(reason.split()).rstrip(".")
            raise RuntimeError(f"{ENV_VAR}=cuda but no CUDA GPU is available: {reason}. "
                               f"Unset it or set {ENV_VAR}=sim.")
    return SimulatedGPU(DEFAULT_CAPACITY if capacity is None else capacity)
