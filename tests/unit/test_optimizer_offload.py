"""The optimizer's state leaves the device between steps (placement.colocate with
trainer.offload_optimizer) and comes back exactly: the steps after are those of an optimizer
that never moved. Needs CUDA (on a CPU there is nothing to move)."""

import pytest
import torch

from flashq.trainer.offload import OptimizerOffload

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fused", [False, True])
def test_offloaded_state_comes_back_and_training_goes_on_as_if_it_never_left(fused):
    torch.manual_seed(0)
    a = torch.nn.Linear(256, 256, device="cuda")
    b = torch.nn.Linear(256, 256, device="cuda")
    b.load_state_dict(a.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, fused=fused) for m in (a, b)]
    offload = OptimizerOffload(opts[1])
    x = torch.randn(32, 256, device="cuda")
    for _ in range(3):
        for model, opt in zip((a, b), opts):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        before = torch.cuda.memory_allocated()
        moved = offload.offload()
        assert moved >= 2 * 4 * sum(p.numel() for p in b.parameters())  # both moments, float32
        assert torch.cuda.memory_allocated() < before
        assert all(v.device.type == "cpu" for s in opts[1].state.values() for v in s.values() if torch.is_tensor(v))
        offload.restore()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
