"""What a user types first: `flashq --version`, and overrides wherever they put them."""

import importlib.metadata

import pytest

import flashq
from flashq.cli import main, parse_args, version


def test_version_prints_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"flashq {importlib.metadata.version('flashq')}\n"


def test_version_from_a_source_tree_that_is_not_installed(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert version() == "unknown (not installed)"
    monkeypatch.setattr(flashq, "__version__", "9.9", raising=False)
    assert version() == "9.9"


def test_overrides_may_follow_the_options():
    args = parse_args(["launch", "configs/quickstart.yaml", "async_ratio=0", "--dry-run", "trainer.steps=3"])
    assert args.dry_run and args.overrides == ["async_ratio=0", "trainer.steps=3"]
    with pytest.raises(SystemExit):
        parse_args(["launch", "configs/quickstart.yaml", "--dry-run", "stray"])
