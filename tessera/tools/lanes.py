"""``tessera lanes``: the lane map, computed from the pass registry and from real compiles.

Static view (from the registry and the named pipelines): each pipeline's passes in
order with their kind and declared consumed/produced ops; for every op its producers and
consumers per pipeline; counts; ops produced but consumed by no later pass (nor accepted
by the translation); registered passes in no pipeline; options no code reads.

Run view (``--run``): every program of ``examples/`` through every production pipeline,
recording per pass the op census before and after, whether the printed IR changed and the
layers traversed; it flags passes that are no-ops on the whole corpus, declarations the run
contradicts, and layers missing from a production lane.

Nothing here is typed by hand: ``docs/lanes.md`` is this module's output.
"""
from __future__ import annotations

import fnmatch
import inspect
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from tessera.ir.context import LAYERS, layer_of

STRUCTURAL = ("builtin.", "func.", "arith.", "scf.")
ROOT = Path(__file__).resolve().parent.parent.parent


def _match(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclass
class PipelineView:
    name: str
    spec: str
    production: bool
    passes: list            # pass objects, in order
    translation: tuple[str, ...]


def pipelines(named=None) -> list[PipelineView]:
    from tessera.passes import pipelines as P
    from tessera.passes.pipeline import parse_pipeline
    named = P.NAMED if named is None else named
    out = []
    for name, np_ in named.items():
        opts = {o.field: o.default for o in np_.options}
        if any(o.field == "arch" for o in np_.options):
            opts["arch"] = np_.example_arch or "x86-64-v4"
        spec = np_.expand(opts)
        out.append(PipelineView(name, spec, np_.production, parse_pipeline(spec), np_.translation))
    return out


def all_ops() -> list[str]:
    from tessera.ir.context import TESSERA_DIALECTS
    return sorted(op.name for d in TESSERA_DIALECTS for op in d.operations)


def _declared(passes, attr: str, ops: list[str]) -> list[list[str]]:
    return [[o for o in ops if _match(o, getattr(p, attr))] for p in passes]


@dataclass
class StaticMap:
    pipelines: list[PipelineView]
    producers: dict = field(default_factory=dict)     # pipeline -> op -> [pass]
    consumers: dict = field(default_factory=dict)
    dangling: dict = field(default_factory=dict)      # pipeline -> [(op, producer)]
    tile_consumer_counts: dict = field(default_factory=dict)  # pipeline -> op -> number of later consumers
    unused_passes: list = field(default_factory=list)
    unread_options: list = field(default_factory=list)
    missing_arch: list = field(default_factory=list)


def static_map(named=None) -> StaticMap:
    from tessera.passes.base import PASSES
    ops = all_ops() + ["func.func"]
    views = pipelines(named)
    sm = StaticMap(views)
    used = set()
    for v in views:
        prod = _declared(v.passes, "produces", ops)
        cons = _declared(v.passes, "consumes", ops)
        sm.producers[v.name] = OrderedDict()
        sm.consumers[v.name] = OrderedDict()
        sm.dangling[v.name] = []
        sm.tile_consumer_counts[v.name] = {}
        for i, p in enumerate(v.passes):
            used.add(p.name)
            for o in prod[i]:
                sm.producers[v.name].setdefault(o, []).append(p.name)
            for o in cons[i]:
                sm.consumers[v.name].setdefault(o, []).append(p.name)
            if p.kind == "target-lowering" and not getattr(p, "arch", None):
                sm.missing_arch.append((v.name, p.name))
        for i, p in enumerate(v.passes):
            for o in prod[i]:
                later = [q.name for j, q in enumerate(v.passes) if j > i and o in cons[j]]
                if o.startswith("tile."):
                    sm.tile_consumer_counts[v.name][o] = len(later)
                legal_at_end = o.split(".")[0] in v.translation
                if not later and not legal_at_end:
                    sm.dangling[v.name].append((o, p.name))
    sm.unused_passes = sorted(set(PASSES) - used)
    for name, cls in sorted(PASSES.items()):
        src = inspect.getsource(cls)
        for opt in cls.options():
            if f"self.{opt.field}" not in src:
                sm.unread_options.append((name, opt.spelling))
    return sm


@dataclass
class RunRecord:
    program: str
    pipeline: str
    layers: list[str]
    passes: list[dict]
    refused: str = ""       # the coded error when the lane refuses the program (e.g. no GPU generator for a kind)


def run_map(corpus: Path | None = None, named=None) -> list[RunRecord]:
    from tessera.ir.text import parse_module
    from tessera.passes.pipeline import run_pipeline
    from tessera.errors import MmaSelectorError, ScheduleIllegalError
    from tessera.frontend.compile import layers_traversed
    corpus = corpus or ROOT / "examples"
    out = []
    for v in pipelines(named):
        if not v.production:
            continue
        for path in sorted(corpus.glob("*.mlir")):
            module = parse_module(path.read_text(), str(path.name))
            records: list = []
            refused = ""
            try:   # the records of the passes that ran are kept when a later one refuses
                run_pipeline(module, v.passes, after_pass=lambda p, m, rec, t: records.append(rec))
            except (ScheduleIllegalError, MmaSelectorError) as e:   # a lane's documented refusal, not a crash
                refused = f"{e.code}: {e.message.split(':')[0]}"
            initial = records[0].census_before if records else {}
            out.append(RunRecord(path.name, v.name, [] if refused else layers_traversed(initial, records),
                                 [{"pass": p.name, "kind": p.kind, "changed": r.changed, "consumed": r.consumed,
                                   "produced": r.produced, "ops_in": r.ops_in, "ops_out": r.ops_out,
                                   "declared_consumes": list(p.consumes), "declared_produces": list(p.produces),
                                   "survivors": sorted({n for n in r.census_after
                                                        if not n.startswith(STRUCTURAL)})}
                                  for p, r in zip(v.passes, records)], refused))
    return out


def run_flags(runs: list[RunRecord]) -> dict[str, list]:
    """What the run says that the declarations or the design do not allow."""
    flags: dict[str, list] = {"noop_on_corpus": [], "undeclared": [], "missing_layers": [], "untranslatable": []}
    by_pass: dict[tuple[str, str], list[bool]] = {}
    for r in runs:
        if r.layers != list(LAYERS) and not r.refused:
            flags["missing_layers"].append((r.pipeline, r.program, r.layers))
        for p in r.passes:
            by_pass.setdefault((r.pipeline, p["pass"]), []).append(p["changed"])
            for o in p["produced"]:
                if not o.startswith(STRUCTURAL) and not _match(o, p["declared_produces"]):
                    flags["undeclared"].append((r.pipeline, p["pass"], "produces", o))
            for o in p["consumed"]:
                if not o.startswith(STRUCTURAL) and not _match(o, p["declared_consumes"]):
                    flags["undeclared"].append((r.pipeline, p["pass"], "consumes", o))
        last = r.passes[-1]["survivors"] if r.passes and not r.refused else []
        bad = [o for o in last if layer_of(o) in ("graph", "schedule", "tile")]
        if bad:
            flags["untranslatable"].append((r.pipeline, r.program, bad))
    flags["noop_on_corpus"] = sorted({k for k, v in by_pass.items() if not any(v)})
    for k in flags:
        flags[k] = sorted(set(map(lambda x: tuple(map(lambda y: tuple(y) if isinstance(y, list) else y, x)),
                                  flags[k])))
    return flags


def gate_violations(sm: StaticMap, runs: list[RunRecord] | None = None) -> list[str]:
    """The lane-map gates: every failure as one line (empty when all hold)."""
    out = []
    for v in sm.pipelines:
        for o, p in sm.dangling[v.name]:
            out.append(f"{v.name}: {o} produced by {p} is consumed by no later pass and is not a translation input")
        for o, n in sm.tile_consumer_counts[v.name].items():
            if n != 1:
                out.append(f"{v.name}: {o} is produced but consumed by {n} later passes (exactly one must lower it)")
    for pl, p in sm.missing_arch:
        out.append(f"{pl}: target lowering {p} has no arch")
    if runs is not None:
        flags = run_flags(runs)
        for pl, prog, layers in flags["missing_layers"]:
            out.append(f"{pl} on {prog}: traversed {list(layers)}, not all four layers")
        for pl, prog, ops in flags["untranslatable"]:
            out.append(f"{pl} on {prog}: {list(ops)} reach translation")
        for v in sm.pipelines:
            if v.production and not any(r.pipeline == v.name and not r.refused for r in runs):
                out.append(f"{v.name}: no program of the corpus compiles through it")
    return out


# --------------------------------------------------------------------------- rendering
def render_md(sm: StaticMap, runs: list[RunRecord] | None) -> str:
    from tessera.tools.docs import HEADER
    lines = [HEADER.format(cmd="tessera lanes --run --write").rstrip("\n"), "", "# The lane map", "",
             "Computed by `tessera lanes` from the pass registry and the named pipelines, and (`--run`) from "
             "compiling every program in `examples/` through every production pipeline.", ""]
    prod = [v for v in sm.pipelines if v.production]
    n_bound = {v.name: sum(1 for p in v.passes if p.kind == "layer-boundary") for v in sm.pipelines}
    n_target = {v.name: sum(1 for p in v.passes if p.kind == "target-lowering") for v in sm.pipelines}
    lines += ["## Summary", "",
              f"- pipelines: {len(sm.pipelines)} ({len(prod)} production)",
              f"- registered passes: {len({p.name for v in sm.pipelines for p in v.passes} | set(sm.unused_passes))}",
              "- per pipeline: " + "; ".join(f"`{v.name}` {len(v.passes)} passes, {n_bound[v.name]} layer "
                                             f"boundaries, {n_target[v.name]} target lowerings"
                                             for v in sm.pipelines),
              f"- ops produced and never consumed or translated: "
              f"{sum(len(d) for d in sm.dangling.values()) or 'none'}",
              f"- passes registered but in no pipeline: {', '.join(sm.unused_passes) or 'none'}",
              f"- options declared but read by no code: "
              f"{', '.join(f'{a}.{b}' for a, b in sm.unread_options) or 'none'}", ""]
    for v in sm.pipelines:
        lines += [f"## `{v.name}`{' (production)' if v.production else ''}", "", f"`{v.spec}`", "",
                  "| # | pass | kind | consumes (declared) | produces (declared) |", "|---:|---|---|---|---|"]
        for i, p in enumerate(v.passes, 1):
            lines.append(f"| {i} | `{p.name}` | {p.kind} | {', '.join(p.consumes) or '-'} | "
                         f"{', '.join(p.produces) or '-'} |")
        lines.append("")
    lines += ["## Ops: producers and consumers", "",
              "Graph IR ops carry their registry entry (`tessera/ir/opset.py`: kernel family / what the GPU lanes "
              "do; `docs/ops.md`).", "", "| op | layer | registry | " +
              " | ".join(f"`{v.name}` producers / consumers" for v in sm.pipelines) + " |",
              "|---|---|---|" + "---|" * len(sm.pipelines)]
    for o in all_ops():
        cells = []
        for v in sm.pipelines:
            pr = ", ".join(sm.producers[v.name].get(o, [])) or "-"
            co = ", ".join(sm.consumers[v.name].get(o, [])) or "-"
            cells.append(f"{pr} / {co}")
        lines.append(f"| `{o}` | {layer_of(o)} | {_registry_cell(o)} | " + " | ".join(cells) + " |")
    lines.append("")
    if runs is not None:
        flags = run_flags(runs)
        lines += ["## Run view", "", "| program | pipeline | layers traversed | passes changed / total |",
                  "|---|---|---|---|"]
        for r in runs:
            if r.refused:
                lines.append(f"| `{r.program}` | `{r.pipeline}` | refused: {r.refused} | - |")
                continue
            lines.append(f"| `{r.program}` | `{r.pipeline}` | {' -> '.join(r.layers)} | "
                         f"{sum(p['changed'] for p in r.passes)} / {len(r.passes)} |")
        lines += ["", "Per pass (first program of the corpus shown in full in `tessera lanes --run`): ops in -> out, "
                  "changed on how many programs.", "", "| pipeline | pass | changed on | ops produced (observed) |",
                  "|---|---|---:|---|"]
        agg: dict = OrderedDict()
        for r in runs:
            for p in r.passes:
                a = agg.setdefault((r.pipeline, p["pass"]), {"changed": 0, "n": 0, "produced": set()})
                a["changed"] += p["changed"]
                a["n"] += 1
                a["produced"] |= {o for o in p["produced"] if not o.startswith(STRUCTURAL)}
        for (pl, ps), a in agg.items():
            lines.append(f"| `{pl}` | `{ps}` | {a['changed']} / {a['n']} | {', '.join(sorted(a['produced'])) or '-'} |")
        lines += ["", "Flags:", "",
                  f"- passes that are a no-op on every program: "
                  f"{', '.join(f'{a}/{b}' for a, b in flags['noop_on_corpus']) or 'none'}",
                  f"- declarations the run contradicts: "
                  f"{'; '.join(' '.join(x) for x in flags['undeclared']) or 'none'}",
                  f"- production runs missing a layer: {len(flags['missing_layers']) or 'none'}",
                  f"- runs where Graph/Schedule/Tile ops reach translation: {len(flags['untranslatable']) or 'none'}",
                  ""]
    viol = gate_violations(sm, runs)
    lines += ["## Gates", "", "none violated" if not viol else "\n".join(f"- {v}" for v in viol), ""]
    return "\n".join(lines)


def _registry_cell(op_name: str) -> str:
    from tessera.ir import opset
    d = opset.OPS.get(op_name.removeprefix("tessera.")) if op_name.startswith("tessera.") else None
    return f"{d.family} / GPU {d.gpu}" if d is not None else "-"


def render_text(sm: StaticMap, runs: list[RunRecord] | None) -> str:
    out = []
    for v in sm.pipelines:
        out.append(f"{v.name}{' [production]' if v.production else ''}: {v.spec}")
        for i, p in enumerate(v.passes, 1):
            out.append(f"  {i:2}. {p.name:24} {p.kind:16} -{','.join(p.consumes) or '-'}  "
                       f"+{','.join(p.produces[:6]) + (',...' if len(p.produces) > 6 else '') or '-'}")
    out.append(f"unused passes: {', '.join(sm.unused_passes) or 'none'}; unread options: "
               f"{', '.join(f'{a}.{b}' for a, b in sm.unread_options) or 'none'}")
    if runs is not None:
        for r in runs:
            if r.refused:
                out.append(f"run {r.pipeline} on {r.program}: refused ({r.refused})")
                continue
            out.append(f"run {r.pipeline} on {r.program}: layers {' -> '.join(r.layers)}")
            for p in r.passes:
                out.append(f"    {p['pass']:24} {'changed' if p['changed'] else 'unchanged':9} "
                           f"ops {p['ops_in']:5} -> {p['ops_out']:<5}")
        flags = run_flags(runs)
        out.append(f"flags: {dict((k, len(v)) for k, v in flags.items())}")
    viol = gate_violations(sm, runs)
    out.append("gates: " + ("all hold" if not viol else f"{len(viol)} violated:\n  " + "\n  ".join(viol)))
    return "\n".join(out)


def lanes_md() -> str:
    return render_md(static_map(), run_map())
