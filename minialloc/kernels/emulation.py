"""Run the CUDA kernels on the CPU: compile them with the host C++ compiler and cuda_emulation.h, call via ctypes.

    kernels = EmulatedKernels.build()          # g++ once per source version; the library is cached
    buf = np.zeros(1000, np.uint8)
    kernels.fill(buf, 3, 990, 0xDBDBDBDB, grid=2, block=32)   # a grid too small on purpose: the stride covers it

`order` picks how the emulated threads are sequenced (0 in order, 1 reversed, larger values shuffle with that
seed); running a check under several orders shows a kernel whose result depends on scheduling. Cooperative
kernels (KernelSpec.cooperative: __syncthreads, warp shuffles) run one block at a time, each thread a fiber, with
the order applied to the blocks and to the threads of every phase between barriers (see cuda_emulation.h).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from . import EMULATION_HEADER, KERNEL_DIR, KERNELS, KernelSpec
from .launch import Kernels

CXX_FLAGS = ("-std=c++17", "-O1", "-shared", "-fPIC")  # warnings are the tests' business (-Werror there)
_SCALARS = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "f32": ctypes.c_float}


class EmulationUnavailable(RuntimeError):
    """No host C++ compiler to build the emulation with."""


class EmulatedLaunchError(RuntimeError):
    """The emulation refused a launch: a barrier or shuffle not every thread reached, or one in a kernel not
    registered as cooperative. On a GPU that would hang or be undefined behaviour."""


def find_compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise EmulationUnavailable(f"no host C++ compiler: {cxx!r} is not on PATH (set CXX to one)")
    return path


def _macro(name: str) -> str:
    spec = KERNELS.get(name)
    return "MINIALLOC_EMULATE_COOPERATIVE" if spec is not None and spec.cooperative else "MINIALLOC_EMULATE"


def translation_unit(sources: dict[str, Path]) -> str:
    """The C++ the emulation compiles: the header, each kernel source once, and one exported launcher per kernel
    (cooperative for the kernels KERNELS marks so)."""
    unit = [f'#include "{EMULATION_HEADER}"']
    unit += [f'#include "{Path(path).resolve()}"' for path in dict.fromkeys(sources.values())]
    unit += [f"{_macro(name)}({name})" for name in sources]
    return "\n".join(unit) + "\n"


def compile_emulation(sources: dict[str, Path], build_dir: Path | None = None) -> ctypes.CDLL:
    """Compile each kernel's source (kernel name -> .cu file) with the emulation header into one shared library.

    The library is named after a hash of everything that goes into it, so an unchanged build is reused and
    concurrent builders never see a half-written file (each writes its own temporary file, then renames it).
    """
    cxx = find_compiler()
    text = translation_unit(sources)
    digest = hashlib.sha256(text.encode() + " ".join((cxx, *CXX_FLAGS)).encode())
    for path in [EMULATION_HEADER, *sources.values()]:
        digest.update(Path(path).read_bytes())
    build_dir = Path(build_dir or Path(tempfile.gettempdir()) / f"minialloc-emulation-{os.getuid()}")
    build_dir.mkdir(parents=True, exist_ok=True)
    library = build_dir / f"kernels-{digest.hexdigest()[:16]}.so"
    if not library.exists():
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=build_dir)
        os.close(fd)
        try:
            result = subprocess.run(
                [cxx, *CXX_FLAGS, "-x", "c++", "-", "-o", tmp], input=text, capture_output=True, text=True,
                cwd=KERNEL_DIR,
            )
            if result.returncode != 0:
                raise RuntimeError(f"building the kernel emulation failed:\n{result.stderr}")
            os.replace(tmp, library)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(library))
    for name in sources:
        fn = getattr(lib, f"emu_{name}")
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = ctypes.c_int
    lib.emu_last_error.argtypes = []
    lib.emu_last_error.restype = ctypes.c_char_p
    return lib


class EmulatedKernels(Kernels):
    """The kernels on the CPU, on NumPy arrays. Build with EmulatedKernels.build()."""

    xp = np

    def __init__(self, lib: ctypes.CDLL, order: int = 0, block: int = 256, max_grid: int = 1024) -> None:
        super().__init__(block, max_grid)
        self.lib = lib
        self.order = order

    @classmethod
    def build(cls, build_dir: Path | None = None, **kwargs) -> EmulatedKernels:
        return cls(compile_emulation({s.name: s.path for s in KERNELS.values()}, build_dir), **kwargs)

    def address(self, array: np.ndarray) -> int:
        return array.ctypes.data

    def synchronize(self) -> None:
        """Nothing to wait for: an emulated launch returns when its last thread has run."""

    def _launch(self, name: str, grid: int, block: int, args: list) -> None:
        spec: KernelSpec = KERNELS[name]
        holders = []  # the ctypes values the pointer array points at; they must outlive the call
        for (_, kind), value in zip(spec.params, args, strict=True):
            if kind == "ptr":
                holders.append(ctypes.c_void_p(value if isinstance(value, int) else self.address(value)))
            else:
                holders.append(_SCALARS[kind](float(value) if kind == "f32" else int(value)))
        slots = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        if getattr(self.lib, f"emu_{name}")(grid, block, self.order, slots) != 0:
            raise EmulatedLaunchError(f"{name}<<<{grid}, {block}>>>: {self.lib.emu_last_error().decode()}")
