"""Run the CUDA kernels on a real GPU through CuPy.

Nothing is compiled or loaded until the first launch: importing this module, or building a CupyKernels, costs
nothing and works without a GPU. The first launch on a device compiles every .cu file as one module with
NVRTC (CuPy caches the binary on disk).

Arguments go to the kernel with exact C widths: arrays as their device pointers, integer addresses as 64-bit
pointers, scalars as numpy.uint64 / numpy.uint32 / numpy.float32, because CuPy would otherwise pick a width from
the value.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np

from . import KERNELS
from .launch import Kernels

_SCALARS = {"ptr": np.uint64, "u64": np.uint64, "u32": np.uint32, "f32": np.float32}
_module = None  # one RawModule for the process: CuPy compiles it once per device, on first use there
_module_lock = threading.Lock()


def kernel_source() -> str:
    """All kernels as one translation unit, each file once (each .cu also compiles on its own; the tests check
    both). Several kernels may share a file (paged_attention.cu holds the paged and the dense kernel)."""
    return "\n".join(path.read_text() for path in dict.fromkeys(spec.path for spec in KERNELS.values()))


def module():
    """The kernels as a cupy.RawModule, created on first use (compiling waits for the first get_function)."""
    global _module
    with _module_lock:
        if _module is None:
            import cupy

            from ..cuda_toolkit import MissingCudaLibrary, toolkit_problem

            problem = toolkit_problem()  # else a missing NVRTC surfaces as a loader traceback at the first launch
            if problem is not None:
                raise MissingCudaLibrary(problem)
            _module = cupy.RawModule(code=kernel_source())
        return _module


class CupyKernels(Kernels):
    """The kernels on CuPy arrays or raw device addresses, launched on `stream` (a cupy Stream; None: current)."""

    def __init__(self, stream: Any = None, block: int = 256, max_grid: int = 1024) -> None:
        super().__init__(block, max_grid)
        self.stream = stream

    @property
    def xp(self):
        import cupy

        return cupy

    def _on_stream(self) -> contextlib.AbstractContextManager:
        """Make self.stream current, so uploads, launches and downloads are ordered on it."""
        return self.stream if self.stream is not None else contextlib.nullcontext()

    def address(self, array) -> int:
        return int(array.data.ptr)

    def to_device(self, host: np.ndarray):
        with self._on_stream():
            return self.xp.array(host, copy=True)

    def to_host(self, array) -> np.ndarray:
        with self._on_stream():
            return self.xp.asnumpy(array, blocking=True)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        else:
            self.xp.cuda.get_current_stream().synchronize()

    def _launch(self, name: str, grid: int, block: int, args: list) -> None:
        spec = KERNELS[name]
        packed = [
            value if not isinstance(value, (int, float, np.integer, np.floating)) else _SCALARS[kind](value)
            for (_, kind), value in zip(spec.params, args, strict=True)
        ]
        kernel = module().get_function(name)
        with self._on_stream():
            kernel((grid,), (block,), tuple(packed))
