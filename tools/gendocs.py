"""The generated reference pages of the documentation site, from the code they describe: every
setting from the pydantic model (dispatcher/config/settings.py), every command from the argparse
parser
(dispatcher/cli/parser.py), the HTTP API from the document /openapi.json serves, every metric from
dispatcher/observability/metrics.py and every alert from config/prometheus/dispatcher-rules.yml.

The site's build runs this (tools/mkdocs_hooks.py replaces each `<!-- gendocs: NAME -->` marker
of a page with `render(NAME)`), so a reference page cannot drift from the code. To read the
output without building the site: `python -m tools.gendocs [NAME ...]`.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "config" / "prometheus" / "dispatcher-rules.yml"


def cell(text: object) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# --- settings -------------------------------------------------------------------------------


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """The `#` comment lines right above each field in the model's source: why it exists."""
    source = inspect.getsource(model)
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#"):
                comment.insert(0, lines[row].strip().lstrip("#").strip())
                row -= 1
            found[node.target.id] = " ".join(comment)
    return found


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = " or ".join(type_name(a) for a in args)
        return f"{names} (optional)" if type(None) in typing.get_args(annotation) else names
    if origin is typing.Literal:
        return " or ".join(f'"{a}"' for a in typing.get_args(annotation))
    if origin in (list, tuple):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {type_name(args[1])}"
    name = getattr(annotation, "__name__", str(annotation))
    return {"SecretStr": "secret string", "str": "string", "int": "integer", "float": "number",
            "bool": "boolean", "Path": "path"}.get(name, name)  # fmt: skip


def default_text(info: FieldInfo) -> str:
    if info.default is PydanticUndefined:
        return "required" if info.default_factory is None else "(computed)"
    value = info.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, dict) and value and isinstance(next(iter(value.values())), BaseModel):
        return ", ".join(f"[{k}]" for k in value)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path | str):
        return f'"{value}"'
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def limits(info: FieldInfo) -> str:
    words = []
    for item in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                words.append(f"{sign} {getattr(item, attr)}")
        for attr in ("min_length", "max_length", "pattern"):
            if getattr(item, attr, None) is not None:
                words.append(f"{attr.replace('_', ' ')} `{getattr(item, attr)}`")
    return ", ".join(words)


def inner_model(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field holds and how TOML spells its table: (Model, '' | '.NAME' | '[]')."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):  # an optional section: `X | None`
        present = [a for a in args if a is not type(None)]
        return inner_model(present[0]) if len(present) == 1 else None
    if origin is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], ".NAME"
    if origin is list and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], "[]"
    return None


def settings_tables(
    model: type[BaseModel], table: str, env: str | None
) -> Iterator[tuple[str, str, list[str]]]:
    """(TOML table, its environment prefix, table rows) for the model and each nested one."""
    comments = field_comments(model)
    rows: list[str] = []
    nested: list[tuple[type[BaseModel], str, str | None]] = []
    for name, info in model.model_fields.items():
        found = inner_model(info.annotation)
        if found:
            sub, how = found
            sub_table = f"{table}.{name}".lstrip(".") + (".NAME" if how == ".NAME" else "")
            sub_env = None if how == "[]" or env is None else f"{env}{name.upper()}__"
            if how == ".NAME" and sub_env:
                sub_env += "NAME__"
            nested.append((sub, f"[[{sub_table}]]" if how == "[]" else sub_table, sub_env))
            continue
        variable = f"`{env}{name.upper()}`" if env is not None else "(file only)"
        rows.append(
            f"| `{name}` | {cell(type_name(info.annotation))} | `{cell(default_text(info))}` "
            f"| {cell(limits(info))} | {variable} | {cell(comments.get(name, ''))} |"
        )
    yield table, env or "", rows
    for sub, sub_table, sub_env in nested:
        yield from settings_tables(sub, sub_table, sub_env)


def render_settings() -> str:
    from dispatcher.config.settings import Settings

    out = []
    for table, _env, rows in settings_tables(Settings, "", "DISPATCHER_"):
        out.append(f"### `{table}`" if table else "### top level")
        out.append("")
        out.append("| setting | type | default | limits | environment | notes |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        out.extend(rows)
        out.append("")
    return "\n".join(out)


# --- CLI ------------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for deeper, subsub in subcommands(sub):
                    yield f"{name} {deeper}", subsub


def render_cli() -> str:
    from dispatcher.cli import build_parser

    parser = build_parser()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    out = ["## dispatcher", "", "```text", usage(parser), "```", ""]
    for name, sub in subcommands(parser):
        out += [f"## dispatcher {name}", "", "```text", usage(sub), "```", ""]
    return "\n".join(out)


def usage(parser: argparse.ArgumentParser) -> str:
    import os

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # the same wrapping on every terminal and in CI
    try:
        return parser.format_help().rstrip()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


# --- HTTP API -------------------------------------------------------------------------------


def render_api() -> str:
    from dispatcher.api.openapi import openapi_document

    document = openapi_document()
    out = [f"OpenAPI {document['openapi']}: *{cell(document['info'].get('title', ''))}* "
           f"version {document['info'].get('version', '')}.", ""]  # fmt: skip
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            if not isinstance(op, dict) or method.startswith("x-") or method == "parameters":
                continue
            out += [f"### `{method.upper()} {path}`", ""]
            if op.get("summary"):
                out += [cell(op["summary"]), ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            params = [*operations.get("parameters", []), *op.get("parameters", [])]
            if params:
                out += ["| parameter | in | required | description |", "| --- | --- | --- | --- |"]
                for p in params:
                    p = resolve(document, p)
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} "
                        f"| {cell(p.get('description', ''))} |"
                    )
                out.append("")
            responses = op.get("responses", {})
            if responses:
                out += ["| status | meaning |", "| --- | --- |"]
                for status, answer in responses.items():
                    answer = resolve(document, answer)
                    out.append(f"| {status} | {cell(answer.get('description', ''))} |")
                out.append("")
    out += ["### Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        out += [f"#### {name}", "", "```json", json.dumps(schema, indent=2), "```", ""]
    return "\n".join(out)


def resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follow a local `$ref` (`#/components/...`)."""
    while "$ref" in node:
        target: Any = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


# --- metrics and alerts ---------------------------------------------------------------------


def render_metrics() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from dispatcher.observability import metrics

    out = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            kind = value._type
            name = value._name + ("_total" if kind == "counter" else "")
            name += "_info" if kind == "info" else ""
            labels = ", ".join(f"`{x}`" for x in value._labelnames)
            out.append(f"| `{name}` | {kind} | {labels} | {cell(value._documentation)} |")
    return "\n".join(out) + "\n"


def alerts() -> list[dict[str, Any]]:
    rules = yaml.safe_load(RULES.read_text())
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def render_alerts() -> str:
    out = []
    for rule in alerts():
        name = rule["alert"]
        notes = rule.get("annotations", {})
        out += [
            f"### {name}",
            "",
            f"Severity **{rule.get('labels', {}).get('severity', '')}**, "
            f"after {rule.get('for', '0s')}. {cell(notes.get('summary', ''))}. "
            f"Runbook: [{name}](../operations/runbooks.md#{name.lower()}).",
            "",
            cell(notes.get("description", "")),
            "",
            "```promql",
            rule["expr"].strip(),
            "```",
            "",
        ]
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": render_settings,
    "cli": render_cli,
    "api": render_api,
    "metrics": render_metrics,
    "alerts": render_alerts,
}


def render(name: str) -> str:
    return GENERATORS[name]()


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(GENERATORS)
    for name in names:
        if name not in GENERATORS:
            print(f"gendocs: no generator {name!r}; choose from {', '.join(GENERATORS)}")
            return 2
        print(render(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
