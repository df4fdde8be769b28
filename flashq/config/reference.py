"""The configuration reference page (docs/reference/configuration.md), written from the models.

Written by `flashq reference`; a test fails when the checked-in page is not what this writes, so
the page is changed by changing the models (their fields and descriptions), never by hand.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from flashq.config.fields import FieldDoc, SectionDoc, sections

INTRO = """\
Every key of a run's config, by its dotted path. A YAML file sets a key under its section
(`trainer:` then `lr: 3e-4`); an override on the command line sets it by its path
(`flashq launch configs/quickstart.yaml trainer.lr=3e-4`); an override's value is YAML
(`'placement.rollout_gpus=[0,1]'`, `"env={name: 'my_envs:CountUp', redundancy: 2}"`). Defaults
are what an unset key takes; `null` means off or unset. Unknown keys and values out of range fail when the config is
loaded, naming the key; rules across keys (such as `sampling.max_tokens` below
`rollout.max_model_len`) are checked then too. `flashq launch FILE --dry-run` loads a config and
prints what each role would run with, starting nothing."""


def configuration_page(root: type[BaseModel] | None = None) -> str:
    """The page's Markdown for `root` (default: `FlashqConfig`)."""
    if root is None:
        from flashq.config import FlashqConfig

        root = FlashqConfig
    secs = sections(root)
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from flashq/config by `flashq reference`: edit the models' fields and descriptions, not this page. -->",
        "",
        INTRO,
        "",
        "Sections: " + ", ".join(f"[`{s.key}`](#{anchor(s.key)})" for s in secs if s.key) + ".",
    ]
    for sec in secs:
        out += ["", *_section(sec)]
    return "\n".join(out) + "\n"


def anchor(key: str) -> str:
    """The anchor of a section's heading."""
    return anchor_of(heading(key))


def anchor_of(title: str) -> str:
    """A heading's anchor as GitHub and MkDocs make it ("trainer.loss" -> "trainerloss")."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def heading(key: str) -> str:
    return key or "Top level"


def _section(sec: SectionDoc) -> list[str]:
    out = [f"## {heading(sec.key)}", ""]
    if sec.same_as is not None:
        return out + [f"The same keys as [`{sec.same_as}`](#{anchor(sec.same_as)}), under `{sec.key}.`."]
    if sec.about:
        out += [sec.about, ""]
    out += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    out += [_row(f) for f in sec.fields]
    return out


def _row(f: FieldDoc) -> str:
    if f.section:
        off = " Unset (`null`) by default: setting it turns it on." if f.default == "null" else ""
        about = f"{f.description}{off} Keys: [`{f.key}`](#{anchor(f.key)})."
        cells = [f"`{f.key}`", "section", "null" if f.default == "null" else "", "", about.strip()]
    else:
        default = f.default if f.default == "required" else f"`{f.default}`"
        cells = [f"`{f.key}`", f.type, default, ", ".join(f"`{a}`" for a in f.allowed), f.description]
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def cell(text: str) -> str:
    """Pipes escaped (in code spans too: a table row ends at any bare one), and "<" outside code
    spans, which Markdown would take for an HTML tag (<root>/<name>)."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))
