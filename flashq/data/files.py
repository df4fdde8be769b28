"""Prompts from local files: JSONL/JSON/Parquet, or a Hugging Face dataset on a local path.

Records are read once; item k comes from epoch k // N in an order shuffled by (seed, epoch),
so the position in the stream is one integer and resuming from it is exact.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from flashq.config import FileTaskConfig


def read_records(cfg: FileTaskConfig) -> list[dict]:
    path = Path(cfg.path)
    if not path.exists():
        raise FileNotFoundError(f"task.file.path {path} does not exist")
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            records = []
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            return records
        if suffix == ".json":
            data = json.loads(path.read_text())
            return data if isinstance(data, list) else data[cfg.split]
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        raise ValueError(f"task.file.path {path}: unsupported file type {suffix!r} (use .jsonl, .json, .parquet or a dataset directory)")
    import datasets

    if (path / "dataset_info.json").exists() or (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[cfg.split]
    else:
        ds = datasets.load_dataset(str(path), split=cfg.split)
    return list(ds)


class FileTasks:
    def __init__(self, cfg: FileTaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed
        self.records = read_records(cfg)
        if not self.records:
            raise ValueError(f"task.file.path {cfg.path} holds no records")
        missing = [i for i, r in enumerate(self.records) if cfg.prompt_field not in r]
        if missing:
            raise ValueError(f"task.file: record {missing[0]} of {cfg.path} has no field {cfg.prompt_field!r} (task.file.prompt_field)")
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.records)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.records)))
            if self.cfg.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # keep only the current epoch's order
        return self._orders[epoch]

    def task(self, index: int) -> dict:
        epoch, pos = divmod(index, len(self.records))
        i = self._order(epoch)[pos]
        rec = self.records[i]
        task = {k: v for k, v in rec.items() if _jsonable(v)}
        task["prompt"] = str(rec[self.cfg.prompt_field])
        if self.cfg.answer_field is not None:
            task["answer"] = str(rec.get(self.cfg.answer_field, ""))
        task["id"] = str(rec[self.cfg.id_field]) if self.cfg.id_field else f"{Path(self.cfg.path).stem}-{i}"
        return task


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False
