"""CPU slots: the backend when a host has no GPU (or ``--cpu-slots`` asks for it). No torch."""

from .base import Backend


class CPUBackend(Backend):
    """N equal CPU slots; every GPU visibility variable is blanked in the children,
    so a stray GPU is never used behind the suite's back."""

    name = "cpu"
    vendor = None
    torch_device = "cpu"
    visibility_var = "CUDA_VISIBLE_DEVICES"

    def available(self):
        return True, None

    def discover(self):
        return []  # slots are made by milarun.host.devices.discover, from --cpu-slots

    def child_env(self, visible):
        return {"CUDA_VISIBLE_DEVICES": ""}

    def versions(self):
        return {"driver": None, "runtime": None, "runtime_name": None}

    def read(self, device):
        raise RuntimeError("CPU slots have no device telemetry")
