"""The reference pages generated from the code, in docs/reference/: the configuration's (from the
pydantic models: `flashq.config.reference`) and the command line's (from `flashq`'s argument
parser, here).

`flashq reference` writes them and `flashq reference --check` says which are stale; a unit test
fails when a checked-in page is not what the code generates, so the pages cannot drift from the
parser or the models.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flashq.config.reference import anchor_of, cell, configuration_page

OUT_DIR = Path("docs/reference")
REFRESH = "flashq reference"  # the command that rewrites the pages, for messages that say how


def pages(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each page's file name and Markdown."""
    return {"configuration.md": configuration_page(), "cli.md": cli_page(parser)}


def stale_pages(out_dir: Path, parser: argparse.ArgumentParser) -> list[Path]:
    """The pages under `out_dir` that are missing or not what the code generates."""
    return [out_dir / name for name, text in pages(parser).items() if _read(out_dir / name) != text]


def write_pages(out_dir: Path, parser: argparse.ArgumentParser) -> list[Path]:
    """Write every page that changed; returns those written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages(parser).items():
        if _read(out_dir / name) != text:
            (out_dir / name).write_text(text)
            written.append(out_dir / name)
    return written


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def cli_page(parser: argparse.ArgumentParser) -> str:
    commands = subcommands(parser)
    out = [
        "# Command-line reference",
        "",
        f"<!-- Generated from flashq/cli.py by `{REFRESH}`: edit the parser's help, not this page. -->",
        "",
        f"{parser.description}",
        "",
        "`bash launch/setup.sh` installs `flashq` into `.venv`: activate it (`source .venv/bin/activate`) or call "
        "`.venv/bin/flashq`. `flashq --version` prints the installed version; `flashq COMMAND --help` prints a command's "
        "options. A command that takes a CONFIG (a YAML file, see `configs/`) also takes `KEY=VALUE` overrides of any key "
        "in the [configuration reference](configuration.md), before or after its options; a value is YAML "
        "(`'placement.rollout_gpus=[0,1]'`).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    out += [f"| [`{sub.prog}`](#{anchor_of(sub.prog)}) | {cell(about)} |" for sub, about in commands]
    for sub, about in commands:
        out += ["", f"## {sub.prog}", "", _sentence(about[:1].upper() + about[1:]), "", "```text", synopsis(sub), "```", ""]
        out += ["| argument | description |", "|---|---|"]
        out += [f"| `{cell(_name(a))}` | {cell(_describe(a))} |" for a in _arguments(sub)]
    return "\n".join(out) + "\n"


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[argparse.ArgumentParser, str]]:
    """Each subcommand's parser and its one-line help, in the parser's order."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return [(sub, helps.get(name, "")) for name, sub in action.choices.items()]


def synopsis(parser: argparse.ArgumentParser) -> str:
    """The command as typed: positionals first, then the options (optional ones in brackets)."""
    words = [_name(a) if a.required or not a.option_strings else f"[{_name(a)}]" for a in _arguments(parser)]
    return " ".join([parser.prog, *words])


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Positionals first (as the synopsis has them), then the options; no --help."""
    args = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]
    return sorted(args, key=lambda a: bool(a.option_strings))


def _metavar(a: argparse.Action) -> str:
    if a.metavar is not None:
        return str(a.metavar)
    if a.choices is not None:
        return "{" + ",".join(map(str, a.choices)) + "}"
    return a.dest.upper()


def _positional(a: argparse.Action) -> str:
    m = _metavar(a)
    return {"*": f"[{m} ...]", "+": f"{m} [{m} ...]", "?": f"[{m}]"}.get(a.nargs, m)  # type: ignore[arg-type]


def _name(a: argparse.Action) -> str:
    if not a.option_strings:
        return _positional(a)
    flag = ", ".join(a.option_strings)
    if a.nargs == 0:
        return flag
    m = _metavar(a)
    return f"{flag} " + {"*": f"[{m} ...]", "+": f"{m} [{m} ...]", "?": f"[{m}]"}.get(a.nargs, m)  # type: ignore[arg-type]


def _describe(a: argparse.Action) -> str:
    text = _sentence(a.help or "")
    if a.required and a.option_strings:
        text += " Required."
    if a.option_strings and a.nargs != 0 and a.default not in (None, [], argparse.SUPPRESS):
        text += f" Default: `{a.default}`."
    return text.strip()


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text + ("" if not text or text.endswith(".") else ".")
