"""``docs/configuration.md``, generated from the configuration's schema.

Every setting is defined once, in :mod:`dblog.app.config_schema` (type, bound, default,
docstring); this page is rendered from it, and a unit test fails when the committed page
differs from what the schema gives (``python -m dblog.app.config_docs`` writes it again).
"""

from __future__ import annotations

import sys
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from dblog.app.config_schema import ConfigDocument
from dblog.app.paths import PROJECT_ROOT

PAGE = PROJECT_ROOT / "docs" / "configuration.md"
_INTRO = """# Configuration

One YAML file configures a source: the `dblog` command reads it (`-c dblog.yaml`), and the
Dagster code location builds its assets from it (`$DBLOG_CONFIG`). Unknown keys are refused
with the ones a section knows, and every problem is reported at once with its place
(`capture.chunk_size must be a positive number, got 0`). Secrets are never in the file: it
names the environment variables that hold them. `${VAR}` in a text value is replaced by the
environment's value.

This page is generated from the schema (`dblog/app/config_schema.py`) by
`python -m dblog.app.config_docs`; a unit test keeps it equal to the schema.

```yaml
source: {name: shop, kind: mariadb, host: 127.0.0.1, port: 3306, user: dblog,
         password_env: SHOP_DB_PASSWORD}
tables: [shop.orders, {name: shop.customers, chunk_size: 20000, repair_cron: "0 3 * * *"}]
lake: s3a://analytics/lake
```
"""


def _type_text(annotation: Any, info: FieldInfo) -> str:
    """The setting's type as a reader would say it, with its bound."""
    if typing.get_origin(annotation) is typing.Annotated:  # its bound is in ``info``
        annotation = typing.get_args(annotation)[0]
    args = typing.get_args(annotation)
    base = annotation
    nullable = type(None) in args
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        base = next(a for a in args if a is not type(None))
    metadata = list(info.metadata)
    if typing.get_origin(base) is typing.Annotated:  # a bound inside ``X | None``
        base, *extra = typing.get_args(base)
        metadata += [m for e in extra for m in getattr(e, "metadata", [e])]
    origin = typing.get_origin(base)
    if origin is typing.Literal:
        text = " or ".join(f"`{a}`" for a in typing.get_args(base))
    elif origin is list:
        text = "list of text"
    elif origin is dict:
        text = "mapping"
    elif isinstance(base, type) and issubclass(base, BaseModel):
        text = "mapping"
    else:
        text = {int: "whole number", float: "number", str: "text", bool: "true/false"}.get(
            base, getattr(base, "__name__", str(base)))
    for meta in metadata:
        if getattr(meta, "gt", None) == 0:
            text += " > 0"
        elif getattr(meta, "ge", None) == 0:
            text += " >= 0 (0: off)"
    return text + (" or null" if nullable else "")


def _default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return "empty" if not value else f"`{value}`"
    if info.default is None or info.default is PydanticUndefined:
        return "null"
    if info.default == "":
        return "empty"
    value = info.default
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 10_000:
        return f"`{value:_}`".replace("_", ",")
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _markdown(text: str | None) -> str:
    """A docstring as one line of Markdown (reST literals as code, pipes escaped)."""
    return " ".join((text or "").split()).replace("``", "`").replace("|", "\\|")


def _section(title: str, model: type[BaseModel]) -> list[str]:
    lines = [f"## `{title}`", ""]
    if model.__doc__:
        lines += [_markdown(model.__doc__), ""]
    lines += ["| setting | type | default | what it does |", "|---|---|---|---|"]
    hints = typing.get_type_hints(model, include_extras=True)
    for name, info in model.model_fields.items():
        what = _markdown(info.description)
        lines.append(f"| `{name}` | {_type_text(hints[name], info)} | {_default_text(info)} "
                     f"| {what} |")
    return [*lines, ""]


def render() -> str:
    """The page's text, from the schema."""
    lines = [_INTRO]
    hints = typing.get_type_hints(ConfigDocument)
    for name, info in ConfigDocument.model_fields.items():
        annotation = hints[name]
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        if typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines += _section(name, annotation)
        else:
            what = _markdown(info.description)
            lines += [f"## `{name}`", "", f"{_type_text(annotation, info)}, default "
                      f"{_default_text(info)}. {what}", ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    PAGE.write_text(render())
    print(f"wrote {PAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
