"""CUDA IPC handles (vLLM's `ipc` weight transfer, placement.colocate) as plain data for
flashq's messages. vLLM's IPC engine sends, per parameter, the arguments of torch's
`rebuild_cuda_tensor`: classes, a dtype, sizes, and byte strings naming the CUDA allocation.
vLLM's HTTP client pickles them; flashq's wire carries msgpack only (a push comes from the
trainer's authenticated role, but a rollout worker still unpickles nothing it is sent), so the
classes and dtype travel by name, decoded against a closed list, and the rest as they are."""

from __future__ import annotations

from typing import Any

import torch

ARGS = ("tensor_cls", "tensor_size", "tensor_stride", "tensor_offset", "storage_cls", "dtype", "storage_device",
        "storage_handle", "storage_size_bytes", "storage_offset_bytes", "requires_grad", "ref_counter_handle",
        "ref_counter_offset", "event_handle", "event_sync_required")  # torch.multiprocessing.reductions.rebuild_cuda_tensor's
CLASSES = {cls.__module__ + "." + cls.__qualname__: cls for cls in
           (torch.Tensor, torch.nn.Parameter, torch.UntypedStorage, torch.TypedStorage)}
KINDS = {"tensor_cls": "class", "storage_cls": "class", "dtype": "dtype", "tensor_size": "ints", "tensor_stride": "ints",
         "tensor_offset": "int", "storage_device": "int", "storage_size_bytes": "int", "storage_offset_bytes": "int",
         "ref_counter_offset": "int", "storage_handle": "bytes", "ref_counter_handle": "bytes", "event_handle": "bytes",
         "requires_grad": "bool", "event_sync_required": "bool"}


def _encode_args(args: tuple) -> list:
    out = []
    for name, value in zip(ARGS, args, strict=True):
        kind = KINDS[name]
        if kind == "class":
            out.append(value.__module__ + "." + value.__qualname__)
        elif kind == "dtype":
            out.append(str(value).removeprefix("torch."))
        elif kind == "ints":
            out.append([int(v) for v in value])
        else:
            out.append(value)
    return out


def _decode_args(values: list) -> tuple:
    if not isinstance(values, list) or len(values) != len(ARGS):
        raise ValueError(f"an IPC handle has {len(ARGS)} arguments; got {values!r:.200}")
    out = []
    for name, value in zip(ARGS, values):
        kind = KINDS[name]
        if kind == "class":
            if value not in CLASSES:
                raise ValueError(f"IPC handle {name}: {value!r} is not one of {sorted(CLASSES)}")
            out.append(CLASSES[value])
        elif kind == "dtype":
            dtype = getattr(torch, value, None) if isinstance(value, str) else None
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"IPC handle dtype: {value!r} is not a torch dtype")
            out.append(dtype)
        elif kind == "ints":
            if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
                raise ValueError(f"IPC handle {name}: want a list of ints, got {value!r:.200}")
            out.append(tuple(value))
        elif not isinstance(value, {"int": int, "bytes": bytes, "bool": bool}[kind]):
            raise ValueError(f"IPC handle {name}: want {kind}, got {type(value).__name__}")
        else:
            out.append(value)
    return tuple(out)


def _map_handles(handles: Any, convert) -> Any:
    """ipc_handles: one {gpu uuid: args} per parameter (unpacked), or one for a packed buffer."""
    if isinstance(handles, dict):
        return {str(uuid): convert(args) for uuid, args in handles.items()}
    if isinstance(handles, list):
        return [_map_handles(h, convert) for h in handles]
    raise ValueError(f"ipc_handles: want a dict or a list of dicts, got {type(handles).__name__}")


def encode(update_info: dict) -> dict:
    """An IPC update's info as plain data (other backends' pass through)."""
    if update_info.get("ipc_handles") is None:
        return update_info
    return {**update_info, "ipc_handles": _map_handles(update_info["ipc_handles"], _encode_args)}


def decode(update_info: dict) -> dict:
    """What `encode` made, back to the arguments vLLM's IPC engine rebuilds tensors from."""
    if update_info.get("ipc_handles") is None:
        return update_info
    return {**update_info, "ipc_handles": _map_handles(update_info["ipc_handles"], _decode_args)}
