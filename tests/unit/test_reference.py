"""The reference pages (docs/reference/) are written from the code by `flashq reference`: every
config key from the pydantic models, every command and option from the argument parser. The
checked-in pages must be what the code writes now."""

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from flashq.cli import _parser, main
from flashq.config import REFERENCE, Section
from flashq.config.reference import configuration_page
from flashq.reference import OUT_DIR, REFRESH, pages, subcommands

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["configuration.md", "cli.md"])
def test_the_checked_in_page_is_what_the_code_generates(name):
    path = ROOT / OUT_DIR / name
    if not path.is_file() or path.read_text() != pages(_parser())[name]:
        pytest.fail(f"{OUT_DIR / name} is not what the code generates: run `{REFRESH}` in the repository root and commit the page")


def test_the_page_an_unknown_key_points_to_is_the_generated_one():
    assert ROOT / REFERENCE == ROOT / OUT_DIR / "configuration.md"


class Inner(Section):
    count: int = Field(3, ge=1, description="How many <things>.")


class Outer(Section):
    """A section of its own."""

    mode: Literal["fast", "safe"] = Field("fast", description="Which | one.")
    share: float = Field(0.5, gt=0, le=1)
    names: list[str] = Field(default_factory=lambda: ["a"], min_length=1)
    path: str | None = None
    inner: Inner | None = Field(None, description="Extra.")
    again: Inner = Inner()


def test_each_field_is_a_row_with_its_type_default_and_allowed_values():
    page = configuration_page(Outer)
    assert "A section of its own." in page
    assert "| `mode` | str | `fast` | `fast`, `safe` | Which \\| one. |" in page
    assert "| `share` | float | `0.5` | `> 0`, `<= 1` |  |" in page
    assert '| `names` | list of str | `["a"]` | `at least 1 item` |  |' in page
    assert "| `path` | str or null | `null` |  |  |" in page
    assert "| `inner` | section | null |  | Extra. Unset (`null`) by default: setting it turns it on. Keys: [`inner`](#inner). |" in page
    assert "## inner" in page and "| `inner.count` | int | `3` | `>= 1` | How many &lt;things>. |" in page
    assert "## again\n\nThe same keys as [`inner`](#inner), under `again.`." in page


def test_every_command_and_option_is_on_the_cli_page():
    page = pages(_parser())["cli.md"]
    for sub, about in subcommands(_parser()):
        assert f"## {sub.prog}\n" in page and about in page
        for action in sub._actions:
            for option in action.option_strings:
                assert option in ("-h", "--help") or f"| `{option}" in page, (sub.prog, option)


def test_the_command_writes_the_pages_and_check_names_a_stale_one(tmp_path, capsys):
    assert main(["reference", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.md", "configuration.md"]
    assert main(["reference", "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "cli.md").write_text("edited by hand\n")
    capsys.readouterr()
    assert main(["reference", "--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'cli.md'} is not what the code generates; run `flashq reference`" in err and "configuration.md" not in err
    assert (tmp_path / "cli.md").read_text() == "edited by hand\n"  # --check writes nothing
