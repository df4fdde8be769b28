"""Per-role credentials (flashq/credentials.py): one secret per run, one token per role name, each
role given its own alone. The hub's side (a name heard only from the connection that proved it)
is tested in test_coordinator_loop.py over real sockets."""

import stat

import pytest

from flashq.cli import main
from flashq.config import load_config
from flashq.credentials import FILE, TOKEN_ENV, RunCredentials
from flashq.launch import role_specs


def test_a_run_secret_is_made_once_readable_by_its_owner_alone(tmp_path):
    first = RunCredentials.ensure(tmp_path)
    assert stat.S_IMODE((tmp_path / FILE).stat().st_mode) == 0o600
    again = RunCredentials.ensure(tmp_path)  # a resume, a restarted coordinator: the same tokens
    assert first.token("trainer") == again.token("trainer") != first.token("reward-0")
    assert again.verify("reward-0", first.token("reward-0")) and not again.verify("trainer", first.token("reward-0"))
    for hostile in ("é" * 32, "\x00" * 32, first.token("reward-0")[:-1], None, 7, b"x" * 32):  # refused, never raised
        assert not again.verify("reward-0", hostile)
    assert RunCredentials.ensure(tmp_path / "other").token("trainer") != first.token("trainer")  # another run's differ
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / FILE).write_text("")  # a crash while it was made: made again
    assert len(RunCredentials.ensure(tmp_path / "torn").token("trainer")) == 32
    with pytest.raises(FileNotFoundError, match="no credentials for this run"):
        RunCredentials.load(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / FILE).write_text("not hex\n")
    with pytest.raises(ValueError, match="not a run secret"):
        RunCredentials.load(tmp_path / "bad")


def test_the_launcher_gives_each_role_its_own_token_and_no_other(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(TOKEN_ENV, "a token from the launcher's own environment")
    cfg = load_config(None, [f"log.run_dir={tmp_path}", "rollout.num_workers=2"])
    credentials = RunCredentials.ensure(tmp_path)
    specs = {s.name: s for s in role_specs(cfg, tmp_path / "config.yaml", credentials)}
    assert TOKEN_ENV not in specs["coordinator"].env  # it holds the secret itself
    for name in ("trainer", "rollout-0", "rollout-1", "reward-0"):
        assert specs[name].env[TOKEN_ENV] == credentials.token(name)
    assert TOKEN_ENV not in {k for s in role_specs(cfg, tmp_path / "config.yaml") for k in s.env}  # --dry-run prints none
    assert main(["token", "reward-0", "--run-dir", str(tmp_path)]) == 0  # for a role started by hand
    assert capsys.readouterr().out.strip() == credentials.token("reward-0")
    assert main(["token", "reward-0", "--run-dir", str(tmp_path / "nowhere")]) == 2
    assert "no credentials for this run" in capsys.readouterr().err


def test_a_role_takes_its_token_out_of_the_environment(monkeypatch):
    """What a role starts (engines, environments, reward code) must not inherit its credential."""
    import os

    from flashq import credentials

    monkeypatch.setattr(credentials, "_given", None)
    monkeypatch.setenv(TOKEN_ENV, "t" * 32)
    assert credentials.own_token() == "t" * 32 and TOKEN_ENV not in os.environ
    assert credentials.own_token() == "t" * 32  # a second hello (a coordinator restart) still has it
