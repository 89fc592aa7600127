"""CudaGPU, at the path the course, the labs, the tools and older code import it from.

The code lives in minialloc.devices.cuda; this module re-exports its names (the ctypes structures and the
driver wrapper too, for the tests and tools that use them). Patch minialloc.devices.cuda, not this module, to
change what CudaGPU calls.
"""

from .devices.base import DeviceError, DeviceOutOfMemory
from .devices.cuda import (
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM,
    CU_MEM_ALLOCATION_TYPE_PINNED,
    CU_MEM_HANDLE_TYPE_NONE,
    CU_MEM_LOCATION_TYPE_DEVICE,
    CUDA_ERROR_MEMORY_ALLOCATION,
    CUDA_ERROR_OUT_OF_MEMORY,
    NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_VALUE_NOT_AVAILABLE,
    CudaEvent,
    CudaGPU,
    CUmemAccessDesc,
    CUmemAllocationFlags,
    CUmemAllocationProp,
    CUmemLocation,
    Driver,
    NoCudaGPU,
    NvmlProcessInfo,
    cuda_unavailable_reason,
    driver,
    nvml,
    nvml_processes,
)

__all__ = [
    "DeviceError", "DeviceOutOfMemory", "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_MEMORY_ALLOCATION",
    "CU_MEM_ALLOCATION_TYPE_PINNED", "CU_MEM_LOCATION_TYPE_DEVICE", "CU_MEM_HANDLE_TYPE_NONE",
    "CU_MEM_ACCESS_FLAGS_PROT_READWRITE", "CU_MEM_ALLOC_GRANULARITY_MINIMUM",
    "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", "CUmemLocation", "CUmemAllocationFlags",
    "CUmemAllocationProp", "CUmemAccessDesc", "NoCudaGPU", "Driver", "NvmlProcessInfo", "NVML_VALUE_NOT_AVAILABLE",
    "NVML_ERROR_INSUFFICIENT_SIZE", "nvml", "nvml_processes", "driver", "cuda_unavailable_reason", "CudaEvent",
    "CudaGPU",
]
