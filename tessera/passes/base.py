"""The pass base class and registry.

A pass is a frozen dataclass whose fields are its options (``ModulePass`` from
xDSL).  Each Tessera pass also declares what the lane map needs to know about
it: its ``kind``, the ops it ``consumes`` (rewrites away) and ``produces``, and
the layer it starts from and ends in.  Target lowerings declare ``arch: str``
with no default, so a pipeline without it fails to parse.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar, get_type_hints

from xdsl.passes import ModulePass

KINDS = ("graph-transform", "layer-boundary", "target-lowering", "schedule-transform", "tile-transform")


@dataclass(frozen=True)
class TesseraPass(ModulePass):
    name: ClassVar[str] = ""
    kind: ClassVar[str] = "graph-transform"
    consumes: ClassVar[tuple[str, ...]] = ()   # op names or fnmatch patterns ("tessera.*")
    produces: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""

    @classmethod
    def options(cls) -> list["OptionInfo"]:
        hints = get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            out.append(OptionInfo(f.name.replace("_", "-"), f.name, hints[f.name], not has_default, default,
                                  str(f.metadata.get("doc", ""))))
        return out

    def option_values(self) -> dict[str, object]:
        return {o.spelling: getattr(self, o.field) for o in self.options()}

    def spec_text(self) -> str:
        """The pass as a pipeline string, with the options that differ from their defaults."""
        opts = " ".join(f"{o.spelling}={_fmt(getattr(self, o.field))}" for o in self.options()
                        if o.required or getattr(self, o.field) != o.default)
        return f"{self.name}{{{opts}}}" if opts else self.name


def _fmt(v: object) -> str:
    """An option value as pipeline text; strings that are not bare words are quoted (``"b*m"``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return ",".join(_fmt(x) for x in v)
    text = str(v)
    if isinstance(v, str) and not re.fullmatch(r"[A-Za-z0-9_.\-]*", text):
        return '"' + text.replace('"', '\\"') + '"'
    return text


fmt_option = _fmt


@dataclass(frozen=True)
class OptionInfo:
    spelling: str
    field: str
    type: object
    required: bool
    default: object
    doc: str

    @property
    def type_name(self) -> str:
        t = self.type
        return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def option(default=dataclasses.MISSING, doc: str = ""):
    """A pass option field with documentation (shown by ``tessera-opt --list-passes``)."""
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={"doc": doc})
    return dataclasses.field(default=default, metadata={"doc": doc})


PASSES: dict[str, type[TesseraPass]] = {}


def register(cls: type[TesseraPass]) -> type[TesseraPass]:
    assert cls.name and cls.name not in PASSES, cls.name
    assert cls.kind in KINDS, (cls.name, cls.kind)
    cls.summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
    PASSES[cls.name] = cls
    return cls
