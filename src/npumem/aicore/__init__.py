"""The simulated NPU's AI cores: device profiles, the cost model, per-core timelines."""

from .cost import charged_bytes, cube_cycles, transfer_cycles, vector_cycles
from .profile import DEFAULT_PROFILE, PROFILES, Engine, Profile, current_profile
from .timeline import LANES, Slice, Timeline

__all__ = ["DEFAULT_PROFILE", "LANES", "PROFILES", "Engine", "Profile", "Slice", "Timeline",
           "charged_bytes", "cube_cycles", "current_profile", "transfer_cycles", "vector_cycles"]
