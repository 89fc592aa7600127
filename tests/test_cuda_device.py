"""CudaGPU without a GPU: its ctypes structures against cuda.h, its error paths, and all of its bookkeeping run
over a fake CuPy and a fake libcuda; with a GPU, the allocator's invariants on the real thing."""

from __future__ import annotations

import ctypes
import inspect
import random
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from minialloc import (
    CachingAllocator,
    DeviceError,
    DeviceOutOfMemory,
    OutOfMemoryError,
    SimulatedGPU,
    backends,
)
from minialloc.cuda_device import (
    CudaGPU,
    CUmemAccessDesc,
    CUmemAllocationProp,
    CUmemLocation,
    Driver,
    NoCudaGPU,
    cuda_unavailable_reason,
)
from minialloc.devices import Device, StreamEvent
from minialloc.devices import cuda as cuda_device  # where CudaGPU's code lives: patch here, not minialloc.cuda_device
from minialloc.sizes import GiB, MiB

CUDA_H = next((p for p in (Path("/usr/local/cuda/include/cuda.h"),) if p.exists()), None)
HAS_GPU = cuda_unavailable_reason() is None

LAYOUT_PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
int main(void) {
    printf("CUmemLocation %zu\n", sizeof(CUmemLocation));
    printf("CUmemAccessDesc %zu\n", sizeof(CUmemAccessDesc));
    printf("CUmemAccessDesc.flags %zu\n", offsetof(CUmemAccessDesc, flags));
    printf("CUmemAllocationProp %zu\n", sizeof(CUmemAllocationProp));
    printf("CUmemAllocationProp.location %zu\n", offsetof(CUmemAllocationProp, location));
    printf("CUmemAllocationProp.win32HandleMetaData %zu\n", offsetof(CUmemAllocationProp, win32HandleMetaData));
    printf("CUmemAllocationProp.allocFlags %zu\n", offsetof(CUmemAllocationProp, allocFlags));
    printf("CU_MEM_ALLOCATION_TYPE_PINNED %d\n", (int)CU_MEM_ALLOCATION_TYPE_PINNED);
    printf("CU_MEM_LOCATION_TYPE_DEVICE %d\n", (int)CU_MEM_LOCATION_TYPE_DEVICE);
    printf("CU_MEM_HANDLE_TYPE_NONE %d\n", (int)CU_MEM_HANDLE_TYPE_NONE);
    printf("CU_MEM_ACCESS_FLAGS_PROT_READWRITE %d\n", (int)CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    printf("CU_MEM_ALLOC_GRANULARITY_MINIMUM %d\n", (int)CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    printf("CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED %d\n",
           (int)CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
    printf("CUDA_ERROR_OUT_OF_MEMORY %d\n", (int)CUDA_ERROR_OUT_OF_MEMORY);
    return 0;
}
"""


def test_ctypes_layouts_and_constants_match_cuda_h(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if CUDA_H is None or cc is None:
        pytest.skip("needs the CUDA headers (/usr/local/cuda/include) and a C compiler")
    (tmp_path / "layout.c").write_text(LAYOUT_PROGRAM)
    build = subprocess.run([cc, "-I", str(CUDA_H.parent), "layout.c", "-o", "layout"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout
    c = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert c["CUmemLocation"] == ctypes.sizeof(CUmemLocation)
    assert c["CUmemAccessDesc"] == ctypes.sizeof(CUmemAccessDesc)
    assert c["CUmemAccessDesc.flags"] == CUmemAccessDesc.flags.offset
    assert c["CUmemAllocationProp"] == ctypes.sizeof(CUmemAllocationProp)
    for field in ("location", "win32HandleMetaData", "allocFlags"):
        assert c[f"CUmemAllocationProp.{field}"] == getattr(CUmemAllocationProp, field).offset, field
    for name in ("CU_MEM_ALLOCATION_TYPE_PINNED", "CU_MEM_LOCATION_TYPE_DEVICE", "CU_MEM_HANDLE_TYPE_NONE",
                 "CU_MEM_ACCESS_FLAGS_PROT_READWRITE", "CU_MEM_ALLOC_GRANULARITY_MINIMUM",
                 "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", "CUDA_ERROR_OUT_OF_MEMORY"):
        assert c[name] == getattr(cuda_device, name), name


# -- no GPU ----------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_without_a_gpu_cuda_is_refused_in_one_clear_line(monkeypatch):
    reason = cuda_unavailable_reason()
    assert reason and "\n" not in reason
    with pytest.raises(NoCudaGPU):
        CudaGPU()
    monkeypatch.setenv("MINIALLOC_DEVICE", "cuda")
    with pytest.raises(RuntimeError) as info:
        backends.default_device()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("MINIALLOC_DEVICE=cuda but no CUDA GPU is available: ")
    assert message.endswith(". Unset it or set MINIALLOC_DEVICE=sim.") and ".." not in message


def test_default_device_choice(monkeypatch):
    monkeypatch.setattr(backends, "cuda_unavailable_reason", lambda: "no driver\n(details).")
    monkeypatch.delenv("MINIALLOC_DEVICE", raising=False)
    assert isinstance(backends.default_device(), SimulatedGPU)
    assert backends.default_device("2GiB").total_memory == 2 * GiB
    monkeypatch.setenv("MINIALLOC_DEVICE", "sim")
    assert backends.default_device("1GiB").total_memory == GiB
    monkeypatch.setenv("MINIALLOC_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match=r"^MINIALLOC_DEVICE=cuda but no CUDA GPU is available: no driver "
                                           r"\(details\)\. Unset it or set MINIALLOC_DEVICE=sim\.$"):
        backends.default_device()
    monkeypatch.setenv("MINIALLOC_DEVICE", "gpu")
    with pytest.raises(ValueError, match="'sim' or 'cuda'"):
        backends.default_device()


# -- a fake CuPy and a fake libcuda ----------------------------------------------------------------------------------
class FakeCudaError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


class FakeRuntime:
    """cudaMalloc with addresses that only grow, as SimulatedGPU's, so both lead the allocator alike."""

    CUDARuntimeError = FakeCudaError

    def __init__(self, total: int) -> None:
        self.total, self.used, self.next, self.live = total, 0, 0x7F00_0000_0000, {}

    def getDeviceCount(self) -> int:
        return 1

    def getDeviceProperties(self, index: int) -> dict:
        return {"name": b"Fake GPU"}

    def memGetInfo(self) -> tuple[int, int]:
        return self.total - self.used, self.total

    def malloc(self, n: int) -> int:
        n = -(-n // (2 * MiB)) * 2 * MiB
        if self.used + n > self.total:
            raise FakeCudaError(2)
        address, self.next = self.next, self.next + n
        self.live[address] = n
        self.used += n
        return address

    def free(self, address: int) -> None:
        self.used -= self.live.pop(address)


class FakeStream:
    count = 0

    def __init__(self, non_blocking: bool = False, ptr: int | None = None) -> None:
        FakeStream.count += 1
        self.ptr = FakeStream.count if ptr is None else ptr
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1

    def __enter__(self) -> FakeStream:
        FakeStream.current = self
        return self

    def __exit__(self, *exc) -> None:
        FakeStream.current = FakeStream.null


FakeStream.null = FakeStream(ptr=0)
FakeStream.current = FakeStream.null


class FakeEvent:
    def __init__(self, disable_timing: bool = False) -> None:
        self.done = False

    def record(self, stream: FakeStream) -> None:
        self.done = True  # the fake GPU has no queued work: an event is ready at once

    def synchronize(self) -> None:
        pass


class FakeDevice:
    def __init__(self, index: int) -> None:
        self.id = index

    def __enter__(self) -> FakeDevice:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def synchronize(self) -> None:
        pass


def fake_cupy(total: int) -> types.ModuleType:
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(runtime=FakeRuntime(total), Device=FakeDevice, Stream=FakeStream,
                                        Event=FakeEvent)
    return module


class FakeLibcuda:
    """The driver calls CudaGPU makes, with the driver's rules for page-aligned sizes and mappings."""

    def __init__(self, total: int) -> None:
        self.total, self.used, self.next_va, self.next_handle = total, 0, 0x7E00_0000_0000, 1
        self.handles: dict[int, int] = {}
        self.reserved: dict[int, int] = {}
        self.mapped: dict[int, int] = {}
        self.access: set[int] = set()
        self.pushes = 0
        for name in cuda_device._PROTOTYPES:
            # Driver sets argtypes/restype on each function, which a bound method refuses: wrap each in a lambda
            method = getattr(self, "_" + name)
            setattr(self, name, lambda *a, _m=method: _m(*a))

    def _cuInit(self, flags):
        return 0

    def _cuGetErrorName(self, code, out):
        out._obj.value = {1: b"CUDA_ERROR_INVALID_VALUE", 2: b"CUDA_ERROR_OUT_OF_MEMORY"}.get(code, b"?")
        return 0

    def _cuGetErrorString(self, code, out):
        out._obj.value = {1: b"invalid argument", 2: b"out of memory"}.get(code, b"?")
        return 0

    def _cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal
        return 0

    def _cuDeviceGetAttribute(self, out, attribute, device):
        out._obj.value = 1
        return 0

    def _cuDevicePrimaryCtxRetain(self, out, device):
        out._obj.value = 0xC0
        return 0

    def _cuCtxGetCurrent(self, out):
        out._obj.value = None  # no current context: CudaGPU must push its own around each call
        return 0

    def _cuCtxPushCurrent_v2(self, ctx):
        self.pushes += 1
        return 0 if getattr(ctx, "value", ctx) == 0xC0 else 201  # CUDA_ERROR_INVALID_CONTEXT

    def _cuCtxPopCurrent_v2(self, out):
        self.pushes -= 1
        return 0

    def _cuMemGetAllocationGranularity(self, out, prop, option):
        p = prop._obj
        assert (p.type, p.location.type, p.requestedHandleTypes, option) == (1, 1, 0, 0)
        out._obj.value = 2 * MiB
        return 0

    def _cuMemAddressReserve(self, out, size, alignment, addr, flags):
        out._obj.value = self.next_va
        self.reserved[self.next_va] = size
        self.next_va += size + 2 * MiB
        return 0

    def _cuMemAddressFree(self, va, size):
        return 0 if self.reserved.pop(va, None) == size else 1

    def _cuMemCreate(self, out, size, prop, flags):
        if size % (2 * MiB) or prop._obj.location.type != 1:
            return 1
        if self.used + size > self.total:
            return 2
        out._obj.value = self.next_handle
        self.handles[self.next_handle] = size
        self.next_handle += 1
        self.used += size
        return 0

    def _cuMemRelease(self, handle):
        self.used -= self.handles.pop(handle.value if hasattr(handle, "value") else handle)
        return 0

    def _cuMemMap(self, va, size, offset, handle, flags):
        pages = range(va, va + size, 2 * MiB)
        if any(p in self.mapped for p in pages) or not any(v <= va < v + s for v, s in self.reserved.items()):
            return 1
        self.mapped.update(dict.fromkeys(pages, handle))
        return 0

    def _cuMemSetAccess(self, va, size, desc, count):
        d = desc._obj
        if (d.location.type, d.flags, count) != (1, 3, 1):
            return 1
        self.access.update(range(va, va + size, 2 * MiB))
        return 0

    def _cuMemUnmap(self, va, size):
        pages = range(va, va + size, 2 * MiB)
        if not all(p in self.mapped for p in pages):
            return 1
        for p in pages:
            del self.mapped[p]
            self.access.discard(p)
        return 0


@pytest.fixture
def fake(monkeypatch):
    """Install a fake 8 GiB GPU: CudaGPU then runs all of its Python over it."""
    lib = FakeLibcuda(8 * GiB)
    cupy = fake_cupy(8 * GiB)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(cuda_device, "driver", lambda: Driver(lib))
    monkeypatch.setattr(cuda_device, "_contexts", {})
    return types.SimpleNamespace(lib=lib, cupy=cupy)


def test_driver_errors_become_minialloc_errors(fake):
    drv = Driver(fake.lib)
    with pytest.raises(DeviceOutOfMemory, match="CUDA_ERROR_OUT_OF_MEMORY"):
        prop = CUmemAllocationProp(type=1, location=CUmemLocation(type=1, id=0))
        drv("cuMemCreate", ctypes.byref(ctypes.c_ulonglong()), 16 * GiB, ctypes.byref(prop), 0)
    with pytest.raises(DeviceError, match=r"cuMemUnmap failed: CUDA_ERROR_INVALID_VALUE \(invalid argument\)"):
        drv("cuMemUnmap", 0x1000, 2 * MiB)


def _protocol_members(protocol: type) -> dict[str, inspect.Signature | None]:
    """The Device protocol's methods with their signatures (None for its data attributes)."""
    members: dict[str, inspect.Signature | None] = dict.fromkeys(getattr(protocol, "__annotations__", {}))
    for name, value in vars(protocol).items():
        if callable(value) and not name.startswith("_"):
            members[name] = inspect.signature(value)
    return members


def test_both_devices_implement_the_device_protocol(fake):
    """Device (minialloc.devices.base) is exactly what the allocator and expandable segments call: both devices
    offer every member, with the protocol's parameters, and record_event gives a StreamEvent."""
    gpu = CudaGPU()
    for device in (gpu, SimulatedGPU(2 * MiB), SimulatedGPU(2 * MiB, store_data=True)):
        assert isinstance(device, Device), type(device).__name__
        for name, signature in _protocol_members(Device).items():
            assert hasattr(device, name), (type(device).__name__, name)
            if signature is not None:
                expected = [(p.name, p.kind, p.default) for p in list(signature.parameters.values())[1:]]
                params = inspect.signature(getattr(device, name)).parameters.values()
                got = [(p.name, p.kind, p.default) for p in params]
                assert got == expected, (type(device).__name__, name, got, expected)
        assert isinstance(device.record_event(0), StreamEvent)
    sim = SimulatedGPU(2 * MiB)
    # replaying at recorded addresses is the simulator's alone: no part of the protocol, absent on a real GPU
    assert not set(sim.PLACEMENT_METHODS) & set(_protocol_members(Device))
    assert sim.supports_placement and not gpu.supports_placement
    assert not any(hasattr(gpu, name) for name in sim.PLACEMENT_METHODS)
    assert sim.data() is None and gpu.data() is not None  # bytes behind addresses: a real GPU has them
    assert (gpu.name, gpu.index, gpu.total_memory, gpu.granularity) == ("Fake GPU", 0, 8 * GiB, 2 * MiB)


def test_cudagpu_malloc_free_limit_and_injected_failures(fake):
    gpu = CudaGPU(limit="1GiB")
    assert gpu.mem_get_info() == (GiB, GiB)
    a = gpu.malloc(3 * MiB)
    assert gpu.used_bytes == 4 * MiB and gpu.mem_get_info()[0] == GiB - 4 * MiB
    with pytest.raises(DeviceOutOfMemory, match="limit"):
        gpu.malloc(GiB)
    gpu.fail_next_mallocs(1)
    with pytest.raises(DeviceOutOfMemory, match="injected"):
        gpu.malloc(MiB)
    b = gpu.malloc(MiB)
    gpu.free(a)
    with pytest.raises(DeviceError, match="invalid device pointer"):
        gpu.free(a)
    gpu.free(b)
    assert gpu.used_bytes == 0 and fake.cupy.cuda.runtime.live == {}
    with pytest.raises(DeviceOutOfMemory, match="cudaError 2"):  # the card itself is full: the runtime's OOM
        CudaGPU().malloc(9 * GiB)
    with pytest.raises(ValueError, match="limit"):
        CudaGPU(limit="16GiB")


def test_cudagpu_virtual_memory(fake):
    gpu = CudaGPU()
    va = gpu.mem_address_reserve(8 * MiB)
    h = gpu.mem_create(4 * MiB)
    gpu.mem_map(va + 2 * MiB, 4 * MiB, 0, h)
    assert not gpu.is_accessible(va + 2 * MiB)
    gpu.mem_set_access(va + 2 * MiB, 4 * MiB)
    assert gpu.is_accessible(va + 5 * MiB) and not gpu.is_accessible(va)
    assert gpu.mapped_pages == 2 and gpu.used_bytes == 4 * MiB
    with pytest.raises(DeviceError, match="cuMemMap failed"):
        gpu.mem_map(va + 2 * MiB, 2 * MiB, 0, h)
    with pytest.raises(DeviceError, match="multiple of the granularity"):
        gpu.mem_create(3 * MiB)
    with pytest.raises(DeviceOutOfMemory):
        gpu.mem_create(16 * GiB)
    gpu.mem_unmap(va + 2 * MiB, 4 * MiB)
    gpu.mem_release(h)
    gpu.mem_address_free(va, 8 * MiB)
    assert gpu.mapped_pages == 0 and gpu.used_bytes == 0
    assert fake.lib.handles == {} and fake.lib.reserved == {} and fake.lib.pushes == 0


def test_cudagpu_streams_and_events(fake):
    gpu = CudaGPU()
    assert gpu.stream(0) is FakeStream.null
    side = gpu.stream(3)
    assert gpu.stream(3) is side and gpu.stream_id(side) == 3
    outside = FakeStream()
    assert gpu.stream_id(outside) == 4 and gpu.stream(4) is outside
    assert gpu.stream_id(FakeStream.null) == 0
    event = gpu.record_event(3)
    assert event.stream == 3 and event.query()
    gpu.synchronize(3)
    assert side.synchronized == 1
    with pytest.raises(TypeError):
        gpu.stream(-1)


def test_launch_queues_an_empty_kernel_on_the_stream(fake, monkeypatch):
    """launch() is one real kernel launch on the right stream, with arguments of the kernel's exact C widths."""
    import numpy as np

    from minialloc.kernels import gpu as gpu_kernels

    launches = []

    def get_function(name):
        return lambda grid, block, args: launches.append((name, grid, block, args, FakeStream.current))

    monkeypatch.setattr(gpu_kernels, "module", lambda: types.SimpleNamespace(get_function=get_function))
    gpu = CudaGPU()
    gpu.launch(2)
    [(name, grid, block, args, stream)] = launches
    assert (name, grid, block, stream) == ("fill_pattern", (1,), (1,), gpu.stream(2))
    assert [type(a) for a in args] == [np.uint64, np.uint64, np.uint64, np.uint32]
    assert [int(a) for a in args] == [0, 0, 0, 0]


def run_random_trace(alloc: CachingAllocator, seed: int, steps: int = 400) -> list[tuple[int, int]]:
    """Mallocs on two streams, frees, record_stream and empty_cache; invariants after every step."""
    rng = random.Random(seed)
    live: list[int] = []
    seen = []
    for _ in range(steps):
        r = rng.random()
        if live and r < 0.4:
            alloc.free(live.pop(rng.randrange(len(live))))
        elif live and r < 0.45:
            alloc.record_stream(rng.choice(live), 1)
        elif r < 0.47:
            alloc.empty_cache()
        else:
            try:
                live.append(alloc.malloc(int(2 ** rng.uniform(9, 28)), rng.choice((0, 0, 1))))
            except OutOfMemoryError:
                pass
        alloc.process_events()
        alloc.check_invariants()
        seen.append((alloc.memory_allocated(), alloc.memory_reserved()))
    for p in live:
        alloc.free(p)
    alloc.device.synchronize()
    alloc.empty_cache()
    alloc.check_invariants()
    assert alloc.memory_reserved() == 0
    return seen


@pytest.mark.parametrize("config", ["", "expandable_segments:True"])
def test_allocator_on_fake_cudagpu_matches_the_simulator(fake, config):
    """The allocator cannot tell a CudaGPU from a SimulatedGPU: the same trace gives the same numbers."""
    gpu = CudaGPU(limit="1GiB")
    sim = SimulatedGPU("1GiB")
    for device in (gpu, sim):  # events on the simulator complete at synchronize; make both complete at once
        device.record_event = (lambda d: lambda stream=0: types.SimpleNamespace(
            query=lambda: True, synchronize=lambda: None))(device)
    on_cuda = CachingAllocator(gpu, config)
    seen = run_random_trace(on_cuda, seed=4)
    assert seen == run_random_trace(CachingAllocator(sim, config), seed=4)
    assert on_cuda.memory_stats()["num_ooms"] > 0  # the limit was reached: the OOM path ran too
    assert gpu.num_mallocs == gpu.num_frees > 10  # through cuMemCreate (expandable) or cudaMalloc
    assert gpu.used_bytes == 0 and fake.lib.handles == {} and fake.cupy.cuda.runtime.live == {}


# -- a real GPU ------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("config", ["", "expandable_segments:True"])
def test_allocator_invariants_on_a_real_gpu(config):
    gpu = CudaGPU(limit="2GiB")
    run_random_trace(CachingAllocator(gpu, config), seed=1, steps=1000)
    assert gpu.used_bytes == 0 and gpu.mapped_pages == 0


class FakeNvml:
    """nvmlDeviceGetHandleByPciBusId_v2 and nvmlDeviceGetComputeRunningProcesses_v3 with NVML's buffer protocol:
    too small a buffer answers NVML_ERROR_INSUFFICIENT_SIZE with the count needed."""

    def __init__(self, processes: list[tuple[int, int]], bus_id: str = "00000000:3B:00.0") -> None:
        self.processes, self.bus_id, self.calls = processes, bus_id, 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: bytes, handle) -> int:
        if bus_id.decode() != self.bus_id:
            return 13  # NVML_ERROR_NOT_FOUND
        handle._obj.value = 0xD0
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, infos) -> int:
        self.calls += 1
        if count._obj.value < len(self.processes):
            count._obj.value = len(self.processes)
            return cuda_device.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, used) in enumerate(self.processes):
            infos[i].pid, infos[i].usedGpuMemory = pid, used
        count._obj.value = len(self.processes)
        return 0


def test_nvml_lists_processes_by_pci_bus_id_and_retries_a_short_buffer():
    many = [(1000 + i, i * MiB) for i in range(20)]  # more than the first buffer of 16
    lib = FakeNvml(many + [(99, cuda_device.NVML_VALUE_NOT_AVAILABLE)])
    assert cuda_device.nvml_processes(lib, lib.bus_id) == many  # "not available" is left out, as nvidia-smi does
    assert lib.calls == 2
    assert cuda_device.nvml_processes(lib, "00000000:AF:00.0") == []  # another device: nothing, never an error


def test_cudagpu_oom_message_names_the_processes_nvml_lists(fake, monkeypatch):
    import os

    lib = FakeNvml([(os.getpid(), 3 * GiB), (4242, 2 * GiB)])
    monkeypatch.setattr(cuda_device, "nvml", lambda: lib)
    fake.cupy.cuda.runtime.deviceGetPCIBusId = lambda index: lib.bus_id
    gpu = CudaGPU(limit="1GiB")
    alloc = CachingAllocator(gpu)
    with pytest.raises(OutOfMemoryError) as err:
        alloc.malloc(2 * GiB)
    text = str(err.value)
    assert "Including non-PyTorch memory, this process has 3.00 GiB memory in use. " in text
    assert "Process 4242 has 2.00 GiB memory in use. " in text
    monkeypatch.setattr(cuda_device, "nvml", lambda: None)  # no NVML: no per-process sentence, as in PyTorch
    with pytest.raises(OutOfMemoryError) as err:
        alloc.malloc(2 * GiB)
    assert "memory in use" not in str(err.value)
