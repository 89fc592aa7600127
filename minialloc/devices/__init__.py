"""Devices: what the caching allocator runs on.

- base.py: the Device protocol (the driver calls the allocator and expandable segments make), its errors
  (DeviceError, DeviceOutOfMemory) and PageBudget, the page accounting, fault injection and counters both
  devices share;
- simulated.py: SimulatedGPU (accounting only) and DataGPU (SimulatedGPU(..., store_data=True), with bytes);
- cuda.py: CudaGPU, a real NVIDIA GPU through CuPy and the driver API (imports CuPy only when one is made);
- data.py: HostData and KernelData, what `device.data()` returns to reach the bytes behind addresses.

The older paths minialloc.device and minialloc.cuda_device re-export the same objects.
"""

from .base import Device, DeviceError, DeviceOutOfMemory, PageBudget, StreamEvent
from .cuda import CudaGPU, NoCudaGPU, cuda_unavailable_reason
from .data import DeviceData, HostData, KernelData
from .simulated import MAX_DATA_CAPACITY, DataGPU, SimEvent, SimulatedGPU

__all__ = [
    "MAX_DATA_CAPACITY", "CudaGPU", "DataGPU", "Device", "DeviceData", "DeviceError", "DeviceOutOfMemory",
    "HostData", "KernelData", "NoCudaGPU", "PageBudget", "SimEvent", "SimulatedGPU", "StreamEvent",
    "cuda_unavailable_reason",
]
