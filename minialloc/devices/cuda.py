"""CudaGPU: the Device protocol (base.py) on a real NVIDIA GPU, so the same allocator runs on real memory.

Two driver interfaces, as on the simulator:
- runtime malloc/free through CuPy (cudaMalloc, cudaFree, cudaMemGetInfo); cudaErrorMemoryAllocation becomes
  DeviceOutOfMemory, exactly what the allocator catches on the simulator;
- virtual memory management through ctypes on libcuda.so.1, because CuPy does not wrap cuMemCreate and friends.
  Every return code is checked: CUDA_ERROR_OUT_OF_MEMORY becomes DeviceOutOfMemory, anything else DeviceError
  named by cuGetErrorName, with cuGetErrorString's explanation.

CuPy wheels bring the CUDA runtime but load NVRTC and cuRAND at first use: minialloc.cuda_toolkit says in one line
when they are missing (`pip install "minialloc[cuda12]"` or `"minialloc[cuda13]"` brings them).

Streams: minialloc names streams by int; 0 is CUDA's null stream and every other id gets its own non-blocking
cupy Stream on first use (stream_id() maps a cupy Stream back, registering streams created elsewhere).

`limit` makes the GPU behave like a card of that size: allocations that would take this process past it fail
with DeviceOutOfMemory, counting whole 2 MiB pages as the simulator does, so a CudaGPU(limit="8GiB") and a
SimulatedGPU("8GiB") refuse the same requests. Differences from the simulator that remain: the real driver
defers cuMemRelease of a mapped handle instead of refusing it, and addresses are the driver's.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..sizes import PAGE_SIZE, format_size, parse_size
from .base import DeviceError, DeviceOutOfMemory, PageBudget
from .data import KernelData

# cuda.h and driver_types.h values (CUDA 12 and 13 agree on all of them)
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation, the runtime's name for the same failure
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_HANDLE_TYPE_NONE = 0
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class CUmemAllocationFlags(ctypes.Structure):
    """The anonymous allocFlags struct inside CUmemAllocationProp."""

    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", CUmemLocation),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", CUmemAllocationFlags),
    ]


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CUmemLocation), ("flags", ctypes.c_int)]


class NoCudaGPU(RuntimeError):
    """No usable CUDA GPU here; the message says why."""


_P = ctypes.POINTER
# name -> argument types; every call returns a CUresult (int)
_PROTOTYPES: dict[str, list] = {
    "cuInit": [ctypes.c_uint],
    "cuGetErrorName": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuGetErrorString": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuDeviceGet": [_P(ctypes.c_int), ctypes.c_int],
    "cuDeviceGetAttribute": [_P(ctypes.c_int), ctypes.c_int, ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [_P(ctypes.c_void_p), ctypes.c_int],
    "cuCtxGetCurrent": [_P(ctypes.c_void_p)],
    "cuCtxPushCurrent_v2": [ctypes.c_void_p],
    "cuCtxPopCurrent_v2": [_P(ctypes.c_void_p)],
    "cuMemGetAllocationGranularity": [_P(ctypes.c_size_t), _P(CUmemAllocationProp), ctypes.c_int],
    "cuMemAddressReserve": [_P(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64,
                            ctypes.c_ulonglong],
    "cuMemAddressFree": [ctypes.c_uint64, ctypes.c_size_t],
    "cuMemCreate": [_P(ctypes.c_ulonglong), ctypes.c_size_t, _P(CUmemAllocationProp), ctypes.c_ulonglong],
    "cuMemRelease": [ctypes.c_ulonglong],
    "cuMemMap": [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_ulonglong, ctypes.c_ulonglong],
    "cuMemSetAccess": [ctypes.c_uint64, ctypes.c_size_t, _P(CUmemAccessDesc), ctypes.c_size_t],
    "cuMemUnmap": [ctypes.c_uint64, ctypes.c_size_t],
}


class Driver:
    """The driver calls minialloc needs, each checked."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        for name, argtypes in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int

    def _error_text(self, fn: str, code: int) -> str | None:
        text = ctypes.c_char_p()
        if getattr(self.lib, fn)(code, ctypes.byref(text)) != 0 or not text.value:
            return None
        return text.value.decode(errors="replace")

    def error_name(self, code: int) -> str:
        """'CUDA_ERROR_NOT_SUPPORTED (operation not supported)': the enum's name and the driver's explanation."""
        name = self._error_text("cuGetErrorName", code) or f"CUresult {code}"
        explanation = self._error_text("cuGetErrorString", code)
        return f"{name} ({explanation})" if explanation else name

    def __call__(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code == CUDA_ERROR_OUT_OF_MEMORY:
            raise DeviceOutOfMemory(f"{name}: CUDA_ERROR_OUT_OF_MEMORY")
        if code != 0:
            raise DeviceError(f"{name} failed: {self.error_name(code)}")


class NvmlProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t (nvml.h, the _v2/_v3 process queries): one process using the device."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


NVML_VALUE_NOT_AVAILABLE = 2**64 - 1  # usedGpuMemory when the driver cannot say (e.g. Windows WDDM)
NVML_ERROR_INSUFFICIENT_SIZE = 7


@functools.lru_cache(maxsize=1)
def nvml() -> ctypes.CDLL | None:
    """libnvidia-ml with nvmlInit_v2 done, or None where NVML cannot be loaded (then, as PyTorch without NVML, the
    OOM message has no per-process lines)."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        lib.nvmlInit_v2.restype = ctypes.c_int
        lib.nvmlDeviceGetHandleByPciBusId_v2.argtypes = [ctypes.c_char_p, _P(ctypes.c_void_p)]
        lib.nvmlDeviceGetComputeRunningProcesses_v3.argtypes = [ctypes.c_void_p, _P(ctypes.c_uint),
                                                                 _P(NvmlProcessInfo)]
        if lib.nvmlInit_v2() != 0:
            return None
    except (OSError, AttributeError):
        return None
    return lib


def nvml_processes(lib: Any, pci_bus_id: str) -> list[tuple[int, int]]:
    """[(pid, bytes)] of the compute processes on the device at pci_bus_id; [] when NVML cannot tell.

    The device is found by PCI bus id, as PyTorch's reportProcessMemoryInfo does, because NVML's indices ignore
    CUDA_VISIBLE_DEVICES. The list is asked for twice at most: the first answer may be "buffer too small"."""
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle)) != 0:
        return []
    count = ctypes.c_uint(16)
    for _ in range(2):
        infos = (NvmlProcessInfo * max(count.value, 1))()
        code = lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos)
        if code == NVML_ERROR_INSUFFICIENT_SIZE:
            count = ctypes.c_uint(count.value + 8)  # processes may start meanwhile
            continue
        if code != 0:
            return []
        return [(int(i.pid), int(i.usedGpuMemory)) for i in infos[: count.value]
                if i.usedGpuMemory != NVML_VALUE_NOT_AVAILABLE]
    return []


@functools.lru_cache(maxsize=1)
def driver() -> Driver:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise NoCudaGPU(f"the CUDA driver library libcuda.so.1 cannot be loaded ({e})") from None
    return Driver(lib)


def _import_cupy():
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken install failing inside its own imports
        raise NoCudaGPU(f'CuPy is not installed ({e}): pip install "minialloc[cuda12]" (or [cuda13] for a CUDA 13 '
                        "driver)") from None
    return cupy


def cuda_unavailable_reason() -> str | None:
    """None when a CUDA GPU can be used here, else one line saying why not."""
    try:
        driver()  # first: without the driver library nothing else can work, and its absence says the most
        cupy = _import_cupy()
    except NoCudaGPU as e:
        return str(e)
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError, or a runtime library that fails to load: either way, no GPU
        return str(e).strip().rstrip(".")
    return None if count > 0 else "no CUDA device found"


_contexts: dict[int, tuple[int, int]] = {}
_contexts_lock = threading.Lock()


def _primary_context(index: int) -> tuple[int, int]:
    """(CUdevice, its primary context): the context the runtime, and so CuPy and PyTorch, uses. Retained once
    per process and never released, so it outlives every CudaGPU."""
    with _contexts_lock:
        if index not in _contexts:
            drv = driver()
            drv("cuInit", 0)
            dev = ctypes.c_int()
            drv("cuDeviceGet", ctypes.byref(dev), index)
            ctx = ctypes.c_void_p()
            drv("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev.value)
            _contexts[index] = (dev.value, ctx.value or 0)
        return _contexts[index]


@dataclass
class CudaEvent:
    """A CUDA event recorded on a stream; the allocator only asks whether it has completed."""

    stream: int
    event: Any

    def query(self) -> bool:
        return bool(self.event.done)

    def synchronize(self) -> None:
        self.event.synchronize()


class CudaGPU(PageBudget):
    """GPU `index` behind the Device protocol (base.py); `limit` (bytes or "8GiB") caps what this object hands out.
    The limit, injected failures and counters are PageBudget's, as on the simulator."""

    _room_phrase = "left under the limit"
    kind = "cuda"
    supports_placement = False  # the driver chooses addresses: a recorded state cannot be rebuilt on a real GPU

    def __init__(self, index: int = 0, limit: int | str | None = None) -> None:
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise NoCudaGPU(reason)
        self._cupy = cupy = _import_cupy()
        count = cupy.cuda.runtime.getDeviceCount()
        if not 0 <= index < count:
            raise ValueError(f"no CUDA device {index}: this machine has {count}")
        self.index = index
        self._device = cupy.cuda.Device(index)
        with self._device:
            props = cupy.cuda.runtime.getDeviceProperties(index)
            _, physical = cupy.cuda.runtime.memGetInfo()
        name = props["name"]
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.physical_memory = physical
        self.limit = None if limit is None else parse_size(limit)
        if self.limit is not None and not PAGE_SIZE <= self.limit <= physical:
            raise ValueError(f"limit must be between 2 MiB and the card's {format_size(physical)}")
        self.total_memory = physical if self.limit is None else self.limit
        self._driver = driver()
        cu_device, self._ctx = _primary_context(index)
        flag = ctypes.c_int()
        self._driver("cuDeviceGetAttribute", ctypes.byref(flag),
                     CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device)
        self.supports_vmm = bool(flag.value)
        self.granularity = self._query_granularity() if self.supports_vmm else PAGE_SIZE
        self._lock = threading.RLock()
        self._init_budget(self.limit)  # bytes held through this object, in whole pages, against `limit`
        self._reservations: dict[int, int] = {}  # va -> size
        self._handles: dict[int, int] = {}  # handle -> size
        self._mapped: dict[int, tuple[int, int]] = {}  # page va -> (handle, offset in the handle)
        self._accessible: set[int] = set()
        self._streams: dict[int, Any] = {0: cupy.cuda.Stream.null}

    def __repr__(self) -> str:
        free, total = self.mem_get_info()
        return f"CudaGPU({self.index}: {self.name}, {format_size(total)}, {format_size(free)} free)"

    def data(self) -> KernelData:
        """The bytes, reached by the CUDA kernels (cupy arrays over raw addresses, launched on the streams)."""
        return KernelData.for_cuda(self)

    def process_memory_info(self) -> list[tuple[int, int]]:
        """[(pid, bytes in use)] for every process on this GPU, from NVML (the OOM message's per-process lines);
        [] without NVML."""
        lib = nvml()
        if lib is None:
            return []
        return nvml_processes(lib, self._cupy.cuda.runtime.deviceGetPCIBusId(self.index))

    # -- runtime API -------------------------------------------------------------------------------------------
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total): the card's cudaMemGetInfo, or the room left under `limit` when one is set."""
        with self._device:
            free, total = self._cupy.cuda.runtime.memGetInfo()
        if self.limit is None:
            return free, total
        return max(0, min(free, self.limit - self._used)), self.limit

    def malloc(self, nbytes: int) -> int:
        """cudaMalloc; DeviceOutOfMemory when the card (or the limit) has no room."""
        self._check_malloc_size(nbytes)
        runtime = self._cupy.cuda.runtime
        with self._lock:
            charge = self._charge(nbytes, "malloc")
            try:
                with self._device:
                    address = runtime.malloc(nbytes)
            except runtime.CUDARuntimeError as e:
                self._refund(charge)
                if e.status == CUDA_ERROR_MEMORY_ALLOCATION:
                    raise DeviceOutOfMemory(f"malloc({nbytes}): {e}") from None
                raise DeviceError(f"malloc({nbytes}): {e}") from None
            return self._malloc_done(address, nbytes)

    def free(self, address: int) -> None:
        """cudaFree: only an address malloc returned (checked here, before the driver sees it)."""
        with self._lock:
            nbytes = self._malloc_taken_back(address)
            try:
                with self._device:
                    self._cupy.cuda.runtime.free(address)
            except self._cupy.cuda.runtime.CUDARuntimeError as e:
                raise DeviceError(f"free({address:#x}): {e}") from None
            self._free_done(nbytes)

    # -- virtual memory management -------------------------------------------------------------------------------
    @contextmanager
    def _context(self) -> Iterator[None]:
        """Driver calls act on the calling thread's current context: make it this device's primary one."""
        current = ctypes.c_void_p()
        self._driver("cuCtxGetCurrent", ctypes.byref(current))
        if (current.value or 0) == self._ctx:
            yield
            return
        self._driver("cuCtxPushCurrent_v2", ctypes.c_void_p(self._ctx))
        try:
            yield
        finally:
            self._driver("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))

    def _prop(self) -> CUmemAllocationProp:
        prop = CUmemAllocationProp()
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.index
        return prop

    def _query_granularity(self) -> int:
        size = ctypes.c_size_t()
        prop = self._prop()
        with self._context():
            self._driver("cuMemGetAllocationGranularity", ctypes.byref(size), ctypes.byref(prop),
                         CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        return size.value

    def mem_get_allocation_granularity(self) -> int:
        return self.granularity

    def _check_vmm(self, what: str, size: int) -> None:
        if not self.supports_vmm:
            raise DeviceError(f"{what}: {self.name} does not support virtual memory management")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % self.granularity:
            raise DeviceError(f"{what}: size {size!r} is not a positive multiple of the granularity "
                              f"({format_size(self.granularity)})")

    def mem_address_reserve(self, size: int) -> int:
        """cuMemAddressReserve: address space only."""
        self._check_vmm("mem_address_reserve", size)
        va = ctypes.c_uint64()
        with self._lock, self._context():
            self._driver("cuMemAddressReserve", ctypes.byref(va), size, 0, 0, 0)
            self._reservations[va.value] = size
        return va.value

    def mem_address_free(self, va: int, size: int) -> None:
        with self._lock:
            if self._reservations.get(va) != size:
                raise DeviceError(f"mem_address_free({va:#x}, {size}): no reservation of that size there")
            with self._context():
                self._driver("cuMemAddressFree", va, size)
            del self._reservations[va]

    def mem_create(self, size: int) -> int:
        """cuMemCreate: physical memory on this device; returns the handle."""
        self._check_vmm("mem_create", size)
        handle = ctypes.c_ulonglong()
        prop = self._prop()
        with self._lock:
            charge = self._charge(size, "mem_create")
            try:
                with self._context():
                    self._driver("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(prop), 0)
            except (DeviceOutOfMemory, DeviceError):
                self._refund(charge)
                raise
            self._handles[handle.value] = size
            self.num_mallocs += 1
            return handle.value

    def mem_release(self, handle: int) -> None:
        """cuMemRelease (the driver frees the memory once the last mapping of it is gone)."""
        with self._lock:
            size = self._handles.get(handle)
            if size is None:
                raise DeviceError(f"mem_release({handle}): unknown handle")
            with self._context():
                self._driver("cuMemRelease", ctypes.c_ulonglong(handle))
            del self._handles[handle]
            self._refund(self._pages(size))
            self.num_frees += 1

    def mem_map(self, va: int, size: int, offset: int, handle: int) -> None:
        self._check_vmm("mem_map", size)
        with self._lock:
            with self._context():
                self._driver("cuMemMap", va, size, offset, ctypes.c_ulonglong(handle), 0)
            for i, page in enumerate(range(va, va + size, self.granularity)):
                self._mapped[page] = (handle, offset + i * self.granularity)

    def mem_set_access(self, va: int, size: int) -> None:
        """cuMemSetAccess: read-write for this device; a mapping is unusable until this is done."""
        self._check_vmm("mem_set_access", size)
        desc = CUmemAccessDesc()
        desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.index
        desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        with self._lock:
            with self._context():
                self._driver("cuMemSetAccess", va, size, ctypes.byref(desc), 1)
            self._accessible.update(range(va, va + size, self.granularity))

    def mem_unmap(self, va: int, size: int) -> None:
        self._check_vmm("mem_unmap", size)
        with self._lock:
            with self._context():
                self._driver("cuMemUnmap", va, size)
            for page in range(va, va + size, self.granularity):
                self._mapped.pop(page, None)
                self._accessible.discard(page)

    def is_accessible(self, va: int) -> bool:
        return (va - va % self.granularity) in self._accessible

    def mapping(self, va: int) -> tuple[int, int] | None:
        """(handle, offset in the handle) behind address va, as this process mapped it, or None."""
        return self._mapped.get(va - va % self.granularity)

    def mapped_addresses(self) -> list[int]:
        """The start address of every mapped page (of the driver's granularity), in order."""
        return sorted(self._mapped)

    @property
    def mapped_pages(self) -> int:
        """Mapped memory in units of 2 MiB pages, as SimulatedGPU counts it."""
        return len(self._mapped) * self.granularity // PAGE_SIZE

    # -- streams and events --------------------------------------------------------------------------------------
    def stream(self, stream_id: int = 0) -> Any:
        """The cupy Stream behind a minialloc stream id (0: the null stream; others created on first use)."""
        if isinstance(stream_id, bool) or not isinstance(stream_id, int) or stream_id < 0:
            raise TypeError(f"stream must be a non-negative int (0 is the default stream), got {stream_id!r}")
        with self._lock:
            if stream_id not in self._streams:
                with self._device:
                    self._streams[stream_id] = self._cupy.cuda.Stream(non_blocking=True)
            return self._streams[stream_id]

    def stream_id(self, stream: Any) -> int:
        """The minialloc id of a cupy Stream; a stream seen for the first time gets the next free id."""
        with self._lock:
            if stream.ptr == 0:
                return 0
            for sid, s in self._streams.items():
                if s.ptr == stream.ptr:
                    return sid
            sid = max(self._streams) + 1
            self._streams[sid] = stream
            return sid

    def kernels(self, stream_id: int = 0) -> Any:
        """minialloc's kernels (minialloc.kernels.gpu.CupyKernels) launching on one of this GPU's streams."""
        from ..kernels.gpu import CupyKernels

        return CupyKernels(stream=self.stream(stream_id))

    def launch(self, stream: int = 0) -> None:
        """Queue a unit of work on a stream: an empty kernel (fill_pattern over 0 bytes)."""
        with self._device:
            self.kernels(stream).launch_empty()

    def record_event(self, stream: int = 0) -> CudaEvent:
        """cudaEventRecord on the stream: ready once all work queued there so far has run."""
        s = self.stream(stream)
        with self._device:
            event = self._cupy.cuda.Event(disable_timing=True)
            event.record(s)
        return CudaEvent(stream, event)

    def synchronize(self, stream: int | None = None) -> None:
        """cudaStreamSynchronize(stream), or cudaDeviceSynchronize() when stream is None."""
        if stream is None:
            self._device.synchronize()
        else:
            self.stream(stream).synchronize()
