"""The key tables of docs/configuration.md, generated from the schema (:mod:`foxdqn.config.schema`).

``python -m foxdqn.config.doc`` rewrites the part of docs/configuration.md between the
``<!-- keys:begin -->`` and ``<!-- keys:end -->`` markers: one table per group with every key, its
type (choices listed), its default and the comment written beside it in the schema. The text
around the markers is ours to write; tests/config/test_config_doc.py fails when the tables are stale.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from pathlib import Path

from foxdqn.config.compose import conf_folder
from foxdqn.config.schema import Choice, TrainConfig

BEGIN, END = "<!-- keys:begin -->", "<!-- keys:end -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _comments(cls) -> dict[str, str]:
    """``name: type = default  # comment`` lines of a dataclass's source: name → comment. A comment
    indented past the field continues the one above it; a comment line level with the fields is
    the comment of the next field that has none of its own."""
    out, last, pending = {}, None, []
    for line in inspect.getsource(cls).splitlines():
        indent = len(line) - len(line.lstrip())
        m = re.match(r"\s+(\w+): [^=]+=[^#]*(?:#\s?(.*))?$", line)
        if m:
            last = m.group(1)
            out[last] = (m.group(2) or " ".join(pending)).strip()
            pending, field_indent = [], indent
            continue
        c = re.match(r"\s+#\s?(.*)$", line)
        if c and last and indent > field_indent:
            out[last] += " " + c.group(1).strip()
        elif c:
            pending.append(c.group(1).strip())
    return out


def _type_name(kind) -> str:
    if isinstance(kind, type) and issubclass(kind, Choice):
        return " \\| ".join(kind._member_names_)
    if typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return f"{_type_name(args[0])} or null"
    if typing.get_origin(kind) in (list, typing.List):
        return f"list of {_type_name(typing.get_args(kind)[0])}"
    return getattr(kind, "__name__", str(kind))


def _default(value) -> str:
    if isinstance(value, str):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_default(v) for v in value) + "]"
    return repr(value)


def rows(node, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, comment) of every leaf of the dataclass instance ``node``."""
    hints, notes, out = typing.get_type_hints(type(node)), _comments(type(node)), []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            out += rows(value, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", _type_name(hints[f.name]), _default(value), notes.get(f.name, "")))
    return out


def options() -> list[str]:
    """Markdown: the option files of each config group of conf/ (the package ``foxdqn.conf``)."""
    out = ["### groups of conf/", "", "Choose one with `GROUP=OPTION` (an experiment with `+experiment=NAME`).", "",
           "| group | options |", "|---|---|"]
    for folder in sorted((p for p in conf_folder().iterdir() if p.is_dir() and not p.name.startswith("_")),
                         key=lambda p: p.name):
        names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
        out.append(f"| `{folder.name}` | {', '.join(f'`{n}`' for n in names)} |")
    return out + [""]


def tables() -> str:
    """Markdown: the groups of conf/, the top-level keys, then one section per group, in schema order."""
    cfg, sections = TrainConfig(), {"": []}
    for key, kind, default, note in rows(cfg):
        group = key.split(".")[0] if "." in key else ""
        sections.setdefault(group, []).append((key, kind, default, note))
    out = options()
    for group, entries in sections.items():
        doc = inspect.getdoc(type(getattr(cfg, group))) if group else "Top-level keys of a run."
        out += [f"### {group or 'top level'}", "", " ".join(doc.split()), "",
                "| key | type | default | meaning |", "|---|---|---|---|"]
        out += [f"| `{k}` | {t} | `{d}` | {n.replace('|', chr(92) + '|')} |" for k, t, d, n in entries]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def render(text: str) -> str:
    """``text`` (docs/configuration.md) with the part between the markers replaced by :func:`tables`.

    Raises:
        ValueError: the markers are missing.
    """
    if BEGIN not in text or END not in text:
        raise ValueError(f"docs/configuration.md: the markers {BEGIN} and {END} are missing")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{tables()}{END}{rest.split(END, 1)[1]}"


def main() -> int:
    DOC.write_text(render(DOC.read_text()))
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
