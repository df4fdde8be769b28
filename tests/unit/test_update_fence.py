"""A push waits for the optimizer step it ships. On a GPU `optimizer.step()` only queues
AdamW's kernels, and vLLM's broadcast casts the parameters on side streams that do not wait for
the default stream; the overlapped push (weight_sync.overlap) runs on another thread. The
ordering is checked here on CPU with a recording fence; the race itself on CUDA (gpu marker)."""

import threading

import pytest
import torch

from flashq.roles.trainer import TrainerRole
from flashq.trainer.update_fence import UpdateFence


def test_a_push_waits_on_the_fence_before_it_reads_a_parameter():
    calls = []

    class Fence:
        def wait(self):
            calls.append("fence waited")

    class Learner:
        updated = Fence()

    class Pusher:
        def push(self, version):
            calls.append(f"pushed {version}")
            return 0.1

    assert TrainerRole._run(object(), Learner(), Pusher(), "push", 7) == 0.1
    assert calls == ["fence waited", "pushed 7"]


def test_on_a_cpu_the_fence_is_free():
    fence = UpdateFence(torch.device("cpu"))
    fence.mark()
    fence.wait()
    assert fence._event is None


@pytest.mark.gpu
def test_a_side_stream_cast_after_the_fence_sees_the_update():
    """Queue a long optimizer step on the default stream, then cast the parameter to bf16 on a
    side stream from another thread, as the push does: after `wait()` every trial matches a
    cast taken after a full synchronize."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda", 0)
    param = torch.nn.Parameter(torch.randn(64 << 20, device=device))
    opt = torch.optim.AdamW([param], lr=1e-2)
    fence = UpdateFence(device)
    side = torch.cuda.Stream(device)
    for _ in range(20):
        param.grad = torch.randn_like(param)
        opt.step()
        fence.mark()
        out = {}

        def push():
            fence.wait()
            with torch.cuda.stream(side):
                out["cast"] = param.detach().to(torch.bfloat16)
            side.synchronize()

        t = threading.Thread(target=push)
        t.start()
        t.join()
        torch.cuda.synchronize()
        assert torch.equal(out["cast"], param.detach().to(torch.bfloat16))
