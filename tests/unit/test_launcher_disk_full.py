"""A role that exits for a full disk (status 3) stops the run: the launcher neither restarts it
nor resumes from the newest checkpoint, which would meet the same full disk again and again.
Real launcher and real processes; the roles are stand-in scripts that exit as the real ones do
(the trainer with 3 once the run has started)."""

import asyncio
import sys

from flashq.checkpoint import EXIT_DISK_FULL, complete
from flashq.config import load_config
from flashq.launch import Launcher, RoleProcess, resolve_run
from tests.unit.test_checkpoint_durability import state, trainer_half


def stand_in(run_dir, name: str) -> RoleProcess:
    started = run_dir / "started.json"
    scripts = {
        "coordinator": f"import pathlib, time; pathlib.Path({str(started)!r}).write_text('{{}}'); time.sleep(60)",
        "trainer": f"import pathlib, sys, time\nwhile not pathlib.Path({str(started)!r}).exists(): time.sleep(0.05)\n"
                   f"print('no space left to write checkpoint', flush=True); sys.exit({EXIT_DISK_FULL})",
    }
    code = scripts.get(name, "import time; time.sleep(60)")
    return RoleProcess(name, [sys.executable, "-c", code], {}, run_dir / "logs" / f"{name}.log", "white")


def test_a_role_out_of_disk_stops_the_run_without_a_resume(tmp_path, monkeypatch, tiny_model, capsys):
    cfg = resolve_run(load_config(None, [f"model.name={tiny_model}", f"log.run_dir={tmp_path}", "trainer.steps=10",
                                         "sft.warm_start=false", "eval=null"]))
    trainer_half(tmp_path, 4)
    complete(tmp_path, 4, state(4), keep=2)  # a checkpoint to resume from, were the launcher to try
    monkeypatch.setattr("flashq.launch.role_specs", lambda cfg, config_file, *credentials: [stand_in(tmp_path, n) for n in cfg.role_names()])
    launcher = Launcher(cfg, show_progress=False)
    launcher._fetch_model = lambda: None
    code = asyncio.run(asyncio.wait_for(launcher._main(), 120))
    out = capsys.readouterr().out
    assert code == 1 and launcher.restarts == 0, out
    assert "trainer ran out of disk space writing a checkpoint" in out and "resuming" not in out
