"""Device backends: the only layer that touches device bytes. `sim` is the default."""

from .address_index import AddressIndex, Allocation
from .backend import DeviceBackend, DeviceRange
from .sim import SimBackend, SimConfig

__all__ = ["AddressIndex", "Allocation", "DeviceBackend", "DeviceRange", "SimBackend", "SimConfig"]
