"""The point in the device's work where an optimizer step's updates are done.

On a GPU `optimizer.step()` returns once AdamW's kernels are queued on the default stream, not
run. A push that overlaps the next step (`weight_sync.overlap`) reads the parameters from
another thread, and vLLM's broadcast casts them on its own side streams, which do not wait for
the default stream: without a fence it can send a tensor before its update and label it with the
new version. `mark()` records where the step's work ends; `wait()` blocks the pushing thread until
the device has got there (the training thread goes on). On a CPU the work is done when
`step()` returns, and both are no-ops.
"""

from __future__ import annotations

import torch


class UpdateFence:
    def __init__(self, device: torch.device):
        self.device = device
        self._event = None

    def mark(self) -> None:
        """After the optimizer steps of a version: the end of their queued work."""
        if self.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(self.device))

    def wait(self) -> None:
        """Before reading the parameters elsewhere: until the marked work has run."""
        if self._event is not None:
            self._event.synchronize()
