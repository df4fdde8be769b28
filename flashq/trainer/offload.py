"""The optimizer's state off the device while an engine shares it (placement.colocate with
trainer.offload_optimizer): AdamW keeps two float32 tensors per parameter, twice the masters'
size (12 GiB at 1.5B), which the engine's KV cache can use while it generates. Moved to pinned
CPU memory after each step and back before the next; each tensor returns to the device it came
from (AdamW keeps its step counters on the CPU unless fused)."""

from __future__ import annotations

import torch


class OptimizerOffload:
    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.homes: dict[tuple[int, str], torch.device] = {}  # (parameter id, state key) -> its device

    def offload(self) -> int:
        """Move the state to CPU memory; returns the bytes moved off a device."""
        moved = 0
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                if torch.is_tensor(value) and value.device.type != "cpu":
                    self.homes[(id(param), key)] = value.device
                    host = torch.empty(value.shape, dtype=value.dtype, pin_memory=torch.cuda.is_available())
                    state[key] = host.copy_(value, non_blocking=True)
                    moved += value.numel() * value.element_size()
        return moved

    def restore(self) -> None:
        """Put the state back where it was, before the next step reads it."""
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                home = self.homes.pop((id(param), key), None)
                if home is not None:
                    state[key] = value.to(home, non_blocking=True)


def give_back_device_memory(offload: OptimizerOffload | None) -> int:
    """After a colocated step: the optimizer's state off the device (with `offload`), and every
    block torch's caching allocator holds returned to the device, for the engine's KV cache to
    take when it wakes. Returns the bytes of optimizer state moved."""
    moved = offload.offload() if offload is not None else 0
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the copies are done before their sources are freed
        torch.cuda.empty_cache()
    return moved
