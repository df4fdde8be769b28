"""`flashq launch --resume` refuses, by name, overrides that change what the checkpoint holds
(the model, the prompt sequence, the group and batch sizes, the LoRA form): before, a smaller
trainer.batch_groups waited for ever and another dataset continued silently from the old one's
position. What may change (more steps, a learning rate) still does."""

import pytest

from flashq.checkpoint import complete
from flashq.config import ConfigError, dump_config, load_config
from flashq.resume import resume_config
from tests.unit.test_checkpoint_durability import state, trainer_half

CONFIG = "configs/quickstart.yaml"


@pytest.fixture
def stopped_run(tmp_path):
    """A run of the quickstart that stopped at step 4 of 10, with its checkpoint."""
    run_dir = tmp_path / "quickstart-1"
    run_dir.mkdir()
    dump_config(load_config(CONFIG, ["trainer.steps=10", f"log.run_dir={run_dir}"]), run_dir / "config.yaml")
    trainer_half(run_dir, 4)
    complete(run_dir, 4, state(4), keep=2)
    return run_dir


@pytest.mark.parametrize("change", ["trainer.batch_groups=2", "sampling.group_size=4", "task.seed=7",
                                    "model.name=/elsewhere/model", "task.arithmetic.max_value=99"])
def test_a_change_the_checkpoint_cannot_carry_is_refused_by_name(stopped_run, change):
    field = change.split("=")[0]
    prefix = field if not field.startswith("task.") else "task"
    with pytest.raises(ConfigError, match=rf"--resume: the overrides given change {prefix} .*cannot change in a resumed run"):
        resume_config(load_config(CONFIG, [change]), str(stopped_run), [change])


def test_what_may_change_does(stopped_run):
    given = ["trainer.steps=20", "trainer.lr=1e-4"]
    resumed = resume_config(load_config(CONFIG, given), str(stopped_run), given)
    assert resumed.trainer.steps == 20 and resumed.trainer.lr == 1e-4
    assert resumed.resume_from == stopped_run / "checkpoints" / "step-000004"
    assert resume_config(load_config(CONFIG), str(stopped_run), []).trainer.steps == 10  # the run's own config
    # started with overrides the file lacks: resuming with the file alone is the run itself, not a change
    started = load_config(stopped_run / "config.yaml")
    assert resume_config(load_config(CONFIG, ["sampling.group_size=4"]), str(stopped_run), []).sampling.group_size == started.sampling.group_size


def test_resume_latest_takes_the_newest_run_with_a_checkpoint_that_reads_back(stopped_run):
    import os

    older = stopped_run.parent / "quickstart-0"
    older.mkdir()
    dump_config(load_config(CONFIG, ["trainer.steps=10", f"log.run_dir={older}"]), older / "config.yaml")
    trainer_half(older, 2)
    complete(older, 2, state(2), keep=2)
    os.utime(older, (1, 1))  # the older run
    given = load_config(CONFIG, [f"log.root={stopped_run.parent}"])
    assert resume_config(given, "latest", []).resume_from == stopped_run / "checkpoints" / "step-000004"
    (stopped_run / "checkpoints" / "step-000004" / "coordinator.msgpack").write_bytes(b"")  # torn: that run has none
    assert resume_config(given, "latest", []).resume_from == older / "checkpoints" / "step-000002"
