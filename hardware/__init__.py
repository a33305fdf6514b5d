"""What a machine is: accelerator, memory tiers, network tiers. Nothing about models."""
from hardware.spec import Accelerator, MemoryTier, NetworkTier, SystemSpec, Dtype
from hardware.load import load_system, system_preset_names

__all__ = ["Accelerator", "MemoryTier", "NetworkTier", "SystemSpec", "Dtype", "load_system",
           "system_preset_names"]
