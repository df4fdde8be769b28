"""What the docs show works as shown: README.md and docs/**/*.md, read as a user reads them.

- every `flashq ...` and `bash launch/*.sh` command in a shell code block parses with flashq's own
  argument parser, and its config and overrides load and resolve as `flashq launch --dry-run`
  would (in process: nothing is started); a console block that shows an error must get it;
- every `flashq COMMAND --option` in inline code names an option the command has;
- every relative link and image points to a file that exists (and a heading, for a #fragment);
- every config under configs/ (or bench/configs/) the docs name loads;
- every YAML block that sets config keys names keys and values the config takes.

A failure names the file and line. Python blocks (plug-in examples) are not run here.
"""

from __future__ import annotations

import argparse
import re
import shlex
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from flashq.cli import _parser, parse_args
from flashq.config import ConfigError, FlashqConfig, did_you_mean, load_config, role_kind
from flashq.config.reference import anchor_of

ROOT = Path(__file__).resolve().parents[2]
DOCS = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if p.is_file()]
SHELL = {"", "bash", "sh", "shell", "console", "text", "none"}
CONFIG_DIRS = ("configs/", "bench/configs/")  # a config named under these must exist


@dataclass
class Block:
    line: int  # of the opening fence
    lang: str
    lines: list[str]


@dataclass
class Command:
    line: int
    tokens: list[str]
    shown: list[str] = field(default_factory=list)  # the output a console block shows after it


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _id(path: Path) -> str:
    return _rel(path).replace("/", ":")


def blocks(text: str) -> list[Block]:
    out, open_fence, current = [], None, None
    for i, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)", line)
        if open_fence is None and m:
            open_fence, current = m.group(1), Block(i, m.group(2).lower().lstrip("{.").rstrip("}"), [])
        elif open_fence is not None and re.match(rf"^ {{0,3}}{open_fence[0]}{{{len(open_fence)},}}\s*$", line):
            out.append(current)
            open_fence = None
        elif open_fence is not None:
            current.lines.append(line)
    return out


def prose(text: str, code: bool = False) -> str:
    """The text outside fenced blocks (line numbers kept), inline code blanked unless `code`."""
    fenced = {b.line + k for b in blocks(text) for k in range(len(b.lines) + 2)}
    text = "\n".join("" if i in fenced else line for i, line in enumerate(text.splitlines(), 1))
    return text if code else re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), text)


def commands(block: Block) -> list[Command]:
    """The block's commands, `\\`-continued lines joined; with `$ ` prompts, the other lines are output."""
    prompted = any(line.lstrip().startswith("$ ") for line in block.lines)
    out: list[Command] = []
    pending, start, last = "", 0, None  # last: the command the output lines that follow belong to
    for i, line in enumerate(block.lines, block.line + 1):
        stripped = line.strip()
        if prompted and not pending and not stripped.startswith("$ "):
            if last is not None and stripped:
                last.shown.append(stripped)
            continue
        if not pending:
            start, stripped, last = i, stripped.removeprefix("$ "), None
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text, pending = pending + stripped, ""
        if not re.match(r"^(\w+=\S*\s+)*(exec\s+)?(\S*/)?(flashq|bash|python3?)\s", text + " "):
            continue
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError as e:
            out.append(Command(start, ["#unparsable", str(e)]))
            continue
        part: list[str] = []
        for tok in [*tokens, ";"]:
            if tok in (";", "&&", "||", "|"):
                if part:
                    out.append(last := Command(start, part))
                part = []
            else:
                part.append(tok)
    return out


def flashq_args(tokens: list[str]) -> tuple[list[str] | None, str | None]:
    """The arguments after `flashq` (for a launch script: what it runs), or None; and a problem."""
    while tokens and (re.match(r"^[A-Za-z_]\w*=", tokens[0]) or tokens[0] == "exec"):
        tokens = tokens[1:]
    if not tokens:
        return None, None
    if Path(tokens[0]).name == "flashq":
        return tokens[1:], None
    if Path(tokens[0]).name.startswith("python") and tokens[1:3] == ["-m", "flashq.cli"]:
        return tokens[3:], None
    if tokens[0] == "bash" and len(tokens) > 1 and tokens[1].startswith("launch/"):
        script = ROOT / tokens[1]
        if not script.is_file():
            return None, f"{tokens[1]} does not exist"
        m = re.search(r"flashq launch (\S+)", script.read_text())
        return (["launch", m.group(1), *tokens[2:]] if m else None), None
    return None, None


class Refused(Exception):
    """What argparse would print before exiting 2."""


class Exited(Exception):
    """--help or --version: argparse would print and exit 0."""


class RaisingParser(argparse.ArgumentParser):
    def error(self, message):
        raise Refused(f"{self.prog}: error: {message}")

    def exit(self, status=0, message=None):
        raise Exited(status)


def _placeholder(token: str) -> bool:
    """A synopsis' word: [key=value ...], <config>, A|B."""
    return "..." in token or "…" in token or token.startswith(("[", "<", "{")) or token == "|"


def option_problems(args: list[str], strict: bool = True) -> list[str]:
    """Does each `--option` exist for its command? (Synopses and inline code, not run.) Not
    `strict`: an unknown command word is prose ("`flashq needs Python >= 3.11`") unless the span
    also has an option or a config."""
    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    options = {o for a in parser._actions for o in a.option_strings}
    if args and not args[0].startswith("-"):
        if args[0] not in subs:
            looks_run = any(t.startswith("-") or t.endswith((".yaml", ".yml")) for t in args[1:])
            return [f"`flashq {args[0]}`: no such command (commands: {', '.join(subs)})"] if strict or looks_run else []
        options = {o for a in subs[args[0]]._actions for o in a.option_strings}
    flags = [t.lstrip("[").rstrip("]").split("=")[0] for t in args]  # a synopsis brackets them: [--dry-run]
    return [f"`flashq {' '.join(args[:1])} {flag}`: no such option" for flag in flags if flag.startswith("-") and flag not in options]


def run_as_shown(args: list[str], snippets: dict[str, str], tmp: Path) -> str | None:
    """Parse the command and load its config and overrides (launch: resolved and dry-run printed);
    None when it would start, else what flashq would print on refusing it."""
    from flashq.launch import dry_run, resolve_run

    try:
        ns = parse_args(args, _parser(RaisingParser))
    except Refused as e:
        return str(e)
    except Exited:
        return None
    try:
        if ns.command == "role":
            role_kind(ns.name)
        config = {"launch": "config", "sft": "config", "sim": "config", "role": "config", "fetch": "model"}.get(ns.command)
        path = str(getattr(ns, config)) if config else None
        if path is None or not path.endswith((".yaml", ".yml")):
            return None
        if path in snippets:
            (tmp / Path(path).name).write_text(snippets[path])
            path = str(tmp / Path(path).name)
        elif not (ROOT / path).is_file():
            return f"flashq: cannot read config {path}: No such file or directory" if path.startswith(CONFIG_DIRS) else None
        grid = [f"{k}={v}" for item in getattr(ns, "grid", None) or [] for k, vs in [item.split("=", 1)] for v in vs.split(",")]
        cfg = load_config(path, ns.overrides)
        for item in grid:
            load_config(path, [*ns.overrides, item])
        if ns.command == "launch":
            dry_run(resolve_run(cfg))
            bad = set(ns.external) - set(cfg.role_names()) | set(ns.external) & {"coordinator", "trainer"}
            if bad:
                return f"flashq: --external {', '.join(sorted(bad))}: not a rollout or reward role of this run"
    except ConfigError as e:
        return f"flashq: {e}"
    return None


def yaml_snippets(text: str) -> dict[str, str]:
    """YAML blocks that say which file they are (a first line `# my_run.yaml`), for the commands that run it."""
    out = {}
    for b in blocks(text):
        if b.lang in ("yaml", "yml") and b.lines and (m := re.match(r"^#\s*(\S+\.ya?ml)\b", b.lines[0].strip())):
            out[m.group(1)] = "\n".join(b.lines)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_shell_commands_run_as_shown(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # where the docs' commands run: their relative paths and the errors that name them
    text, problems, seen = doc.read_text(), [], 0
    snippets = yaml_snippets(text)
    for block in blocks(text):
        if block.lang not in SHELL:
            continue
        for cmd in commands(block):
            where = f"{_rel(doc)}:{cmd.line}"
            if cmd.tokens[0] == "#unparsable":
                problems.append(f"{where}: cannot be parsed as a shell line ({cmd.tokens[1]})")
                continue
            args, problem = flashq_args(cmd.tokens)
            if problem:
                problems.append(f"{where}: {problem}")
            if args is None:
                continue
            seen += 1
            if any(_placeholder(t) for t in args):  # a synopsis: FILE [key=value ...]
                problems += [f"{where}: {p}" for p in option_problems(args)]
                continue
            refused = run_as_shown(args, snippets, tmp_path)
            error_shown = bool(cmd.shown) and re.match(r"^(flashq:|usage:|error)", cmd.shown[0]) is not None
            if error_shown and refused is None:
                problems.append(f"{where}: shows an error, but `flashq {' '.join(args)}` is accepted")
            elif error_shown:
                missing = [line for line in cmd.shown if "..." not in line and "…" not in line and line not in refused]
                problems += [f"{where}: shows `{line}`; flashq prints:\n{refused}" for line in missing[:1]]
            elif refused is not None:
                problems.append(f"{where}: `flashq {' '.join(args)}` is refused:\n{refused}")
    assert not problems, "\n".join(problems)


INLINE_FLASHQ = re.compile(r"`((?:\S*/)?flashq (?:[a-z][\w-]*|--?[a-z][\w-]*)[^`]*)`")


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_inline_commands_name_options_that_exist(doc):
    fenced = {b.line + k for b in blocks(doc.read_text()) for k in range(len(b.lines) + 2)}
    problems = []
    for i, line in enumerate(doc.read_text().splitlines(), 1):
        if i in fenced:
            continue
        for m in INLINE_FLASHQ.finditer(line):
            try:
                args = shlex.split(m.group(1))[1:]
            except ValueError:
                continue
            problems += [f"{_rel(doc)}:{i}: {p}" for p in option_problems(args, strict=False)]
    assert not problems, "\n".join(problems)


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML = re.compile(r"""<(?:img|a|source)\b[^>]*?\b(?:src|href)=["']([^"']+)["']""", re.I)


def headings(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (GitHub's: repeated ones get -1, -2), and HTML ids."""
    text, seen = prose(path.read_text(), code=True), {}
    out = set(re.findall(r"""(?:id|name)=["']([^"']+)["']""", text))
    for title in re.findall(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = anchor_of(re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", title).strip())
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_relative_links_and_images_point_to_files_that_exist(doc):
    text = prose(doc.read_text())
    problems = []
    for pattern in (LINK, REF_DEF, HTML):
        for m in pattern.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][\w+.-]*:", target) or target.startswith("//"):
                continue  # a URL
            line = text.count("\n", 0, m.start()) + 1
            path_part, _, fragment = urllib.parse.unquote(target).partition("#")
            path_part = path_part.split("?")[0]
            dest = doc if not path_part else (ROOT / path_part.lstrip("/") if path_part.startswith("/") else doc.parent / path_part)
            if not dest.exists():
                problems.append(f"{_rel(doc)}:{line}: {target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in headings(dest):
                problems.append(f"{_rel(doc)}:{line}: {target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not problems, "\n".join(problems)


NAMED_CONFIG = re.compile(r"(?<![\w/.-])((?:bench/)?configs/[\w./-]+?\.ya?ml)\b")


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_every_config_named_loads(doc):
    problems = []
    for name in sorted(set(NAMED_CONFIG.findall(doc.read_text()))):
        try:
            load_config(ROOT / name)
        except ConfigError as e:
            problems.append(f"{_rel(doc)}: {name}: {e}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_yaml_blocks_set_keys_the_config_has(doc):
    """A block of config keys (any top-level key a config section) must validate; rules across
    sections are left to complete configs (a block named `# NAME.yaml`), since an excerpt sets one part."""
    problems = []
    for b in blocks(doc.read_text()):
        if b.lang not in ("yaml", "yml"):
            continue
        try:
            data = yaml.safe_load("\n".join(b.lines))
        except yaml.YAMLError:
            continue  # an excerpt with an ellipsis, say
        if not isinstance(data, dict) or not set(data) & set(FlashqConfig.model_fields):
            continue
        complete = bool(b.lines) and re.match(r"^#\s*\S+\.ya?ml\b", b.lines[0].strip()) is not None
        try:
            FlashqConfig.model_validate(data)
        except ValidationError as e:
            for x in e.errors():
                key = ".".join(map(str, x["loc"]))
                near = did_you_mean(key.split(".")) if x["type"] == "extra_forbidden" else []
                hint = f" (did you mean {' or '.join(near)}?)" if near else ""
                if complete or key:
                    problems.append(f"{_rel(doc)}:{b.line}: {key or 'config'}: {x['msg']}{hint}")
    assert not problems, "\n".join(problems)
