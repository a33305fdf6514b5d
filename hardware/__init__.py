"""What a machine is: accelerator, memory tiers, network tiers. Nothing about models."""
from hardware.load import load_system, system_preset_names
from hardware.spec import Accelerator, Dtype, MemoryTier, NetworkTier, SystemSpec

__all__ = ["Accelerator", "MemoryTier", "NetworkTier", "SystemSpec", "Dtype", "load_system",
           "system_preset_names"]
