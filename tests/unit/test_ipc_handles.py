"""CUDA IPC handles (placement.colocate's weight pushes on a GPU) cross flashq's msgpack wire as
plain data and come back as the arguments torch rebuilds a tensor from; anything else a
message carries there is refused by name (a rollout worker unpickles nothing)."""

import msgspec
import pytest
import torch

from flashq.engine import ipc_handles

# what torch.multiprocessing.reductions.reduce_tensor gives for a CUDA tensor (no CUDA here: values stand in)
ARGS = (torch.Tensor, torch.Size([2, 3]), (3, 1), 0, torch.UntypedStorage, torch.bfloat16, 0, b"\x01cuda-mem", 12, 0,
        False, b"ref-counter", 4, b"event", True)
INFO = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2, 3]], "ipc_handles": [{"GPU-1": ARGS}]}


def test_handles_cross_the_wire_and_come_back_as_rebuild_arguments():
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(ipc_handles.encode(INFO)))
    back = ipc_handles.decode(wire)["ipc_handles"][0]["GPU-1"]
    assert back == (torch.Tensor, (2, 3), (3, 1), 0, torch.UntypedStorage, torch.bfloat16, *ARGS[6:])
    assert ipc_handles.decode(ipc_handles.encode({"names": ["w"]})) == {"names": ["w"]}  # gloo and NCCL pass through


@pytest.mark.parametrize("position, value, error", [
    (0, "os.system", "not one of"),
    (5, "__class__", "is not a torch dtype"),
    (7, "not bytes", "storage_handle: want bytes"),
    (1, [2, "3"], "tensor_size: want a list of ints"),
])
def test_a_handle_that_is_not_one_is_refused_by_name(position, value, error):
    wire = ipc_handles.encode(INFO)
    wire["ipc_handles"][0]["GPU-1"][position] = value
    with pytest.raises(ValueError, match=error):
        ipc_handles.decode(wire)
    with pytest.raises(ValueError, match="has 15 arguments"):
        ipc_handles.decode({**INFO, "ipc_handles": [{"GPU-1": [1, 2]}]})
