"""The simulated GPU, at the path the course, the labs and older code import it from.

The code lives in minialloc.devices (simulated.py; the Device protocol and the shared budget in base.py); this
module re-exports it, so `minialloc.device.SimulatedGPU`, `DeviceError`, `DeviceOutOfMemory`, `DataGPU` keep
working. `Event` is the simulator's StreamEvent, now named SimEvent (workloads.Event is a different thing).
"""

from .devices.base import Device, DeviceError, DeviceOutOfMemory, StreamEvent
from .devices.simulated import MAX_DATA_CAPACITY, DataGPU, SimEvent, SimulatedGPU

Event = SimEvent  # the old name

__all__ = ["MAX_DATA_CAPACITY", "DataGPU", "Device", "DeviceError", "DeviceOutOfMemory", "Event", "SimEvent",
           "SimulatedGPU", "StreamEvent"]
