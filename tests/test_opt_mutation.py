"""A mutation run of ``tessera-opt`` (issue 26, section 3): the example files and the IR samples of
every layer, changed at random (a line deleted or duplicated, tokens swapped, a number made huge,
negative or zero, a type changed, the file truncated, garbage bytes inserted, deep nesting, a
pipeline option mangled), each run through a pipeline.  Every outcome must be exit 0 or exit 1 with
one ``error[CODE]`` whose code is documented in docs/errors.md and is not INTERNAL (a defect) —
no traceback, no signal, no hang.

Most cases run in this process through ``tessera.tools.opt.main`` (an alarm bounds each one); a
few run the real command in a subprocess with a memory limit.  Seeded: a failure names the seed
and the mutations, and writes the mutated file where the message says.
"""
from __future__ import annotations

import contextlib
import io
import os
import random
import re
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ir_samples import SAMPLES
from tessera.tools import opt

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTED = set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", (ROOT / "docs/errors.md").read_text(), re.M))
CASE_SECONDS = 30          # one case, in process or not
SUBPROCESS_MEMORY = 4 << 30

CPU = "tessera-cpu{arch=znver4%s}"
GPU = ("tessera-nvidia{arch=sm_90%s}", "tessera-rocm{arch=gfx1151%s}")


def corpus() -> list[tuple[str, bytes, str]]:
    """(name, text, layer) of every input tessera-opt accepts: the examples and the IR samples."""
    out = [(p.name, p.read_bytes(), "graph") for p in sorted((ROOT / "examples").glob("*.mlir"))]
    for key, text in sorted(SAMPLES.items()):
        if text is None:
            continue
        layer = {"schedule": "schedule", "tile": "tile"}.get(key.split(".")[0], "graph")
        if key.startswith("tessera_") or key.split(".")[0] not in ("tessera", "schedule", "tile"):
            continue
        out.append((key, text.encode(), layer))
    return out


# ------------------------------------------------------------------------------ mutations
TOKEN = re.compile(rb"[A-Za-z_][\w.]*|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?|\S")
NUMBER = re.compile(rb"(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
TYPES = (b"f32", b"bf16", b"f16", b"f64", b"i64", b"i32", b"i1", b"i8", b"index", b"f8E4M3FN", b"u8")
TYPE = re.compile(rb"\b(?:" + b"|".join(TYPES) + rb")\b")
DIM = re.compile(rb"(?<=[\[, ])([A-Z][A-Z0-9]*)(?=[\],])")
NUMBERS = (b"0", b"-1", b"-7", b"1", b"3", b"4294967296", b"99999999999999999999", b"1e309", b"-0.0", b"nan",
           b"1.5", b"65536", b"2147483647")
GARBAGE = (b"\x00", b"\xff\xfe", b"\xef\xbb\xbf", b"}", b"{", b"%", b'"', b"@", b"<<", b">", b"\xe2\x80\x8b",
           b"^bb9:", b"// comment\n", b"\n\n", b"tessera.", b"!tile.fragment<", b"#", b"\\", b"\t\r\n")


def _lines(t: bytes) -> list[bytes]:
    return t.split(b"\n")


def m_delete_line(r, t):
    ls = _lines(t)
    del ls[r.randrange(len(ls))]
    return b"\n".join(ls)


def m_duplicate_line(r, t):
    ls = _lines(t)
    i = r.randrange(len(ls))
    ls.insert(r.randrange(len(ls) + 1), ls[i])
    return b"\n".join(ls)


def m_swap_lines(r, t):
    ls = _lines(t)
    i, j = r.randrange(len(ls)), r.randrange(len(ls))
    ls[i], ls[j] = ls[j], ls[i]
    return b"\n".join(ls)


def m_swap_tokens(r, t):
    toks = list(TOKEN.finditer(t))
    if len(toks) < 2:
        return t
    a, b = sorted(r.sample(toks, 2), key=lambda m: m.start())
    return t[:a.start()] + b.group() + t[a.end():b.start()] + a.group() + t[b.end():]


def m_number(r, t):
    ms = list(NUMBER.finditer(t))
    if not ms:
        return t
    m = r.choice(ms)
    return t[:m.start()] + r.choice(NUMBERS) + t[m.end():]


def m_dim(r, t):
    ms = list(DIM.finditer(t))
    if not ms:
        return m_number(r, t)
    m = r.choice(ms)
    return t[:m.start()] + r.choice(NUMBERS[:8] + (b"M*N", b"?", b"Q")) + t[m.end():]


def m_type(r, t):
    ms = list(TYPE.finditer(t))
    if not ms:
        return t
    m = r.choice(ms)
    return t[:m.start()] + r.choice(TYPES) + t[m.end():]


def m_dim_everywhere(r, t):
    """A symbolic size made one number (huge, zero, negative) in every type that names it."""
    syms = sorted(set(DIM.findall(t)))
    if not syms:
        return m_number(r, t)
    return re.sub(rb"(?<=[\[, ])" + re.escape(r.choice(syms)) + rb"(?=[\],])", r.choice(NUMBERS[:8]), t)


def m_type_everywhere(r, t):
    """One element type replaced by another everywhere (the file stays consistent)."""
    found = sorted(set(TYPE.findall(t)))
    if not found:
        return t
    return re.sub(rb"\b" + re.escape(r.choice(found)) + rb"\b", r.choice(TYPES), t)


def m_attr_number(r, t):
    """A number inside an attribute dictionary or a type's parameters, in every copy of that text."""
    groups = sorted(set(re.findall(rb"\{[^{}\n]*\d[^{}\n]*\}|<[^<>\n]*\d[^<>\n]*>", t)))
    if not groups:
        return m_number(r, t)
    g = r.choice(groups)
    return t.replace(g, m_number(r, g))


def m_truncate(r, t):
    return t[:r.randrange(len(t) + 1)]


def m_garbage(r, t):
    i = r.randrange(len(t) + 1)
    g = r.choice(GARBAGE) if r.random() < 0.7 else bytes(r.randrange(256) for _ in range(r.randint(1, 8)))
    return t[:i] + g + t[i:]


def m_nesting(r, t):
    i = r.randrange(len(t) + 1)
    n = r.choice((300, 3000, 30000))
    opener, closer = r.choice(((b"(", b")"), (b"[", b"]"), (b"<", b">"), (b"{", b"}"),
                               (b"!tessera.tensor<[M], ", b">"), (b"scf.execute_region {\n", b"}\n")))
    return t[:i] + opener * n + (closer * n if r.random() < 0.7 else b"") + t[i:]


def m_big_file(r, t):
    ls = _lines(t)
    i = r.randrange(len(ls))
    return b"\n".join(ls[:i] + [ls[i]] * r.choice((200, 2000)) + ls[i + 1:])


# (mutation, weight): most keep the text parseable, so the passes see the damage too
MUTATIONS = [(m_dim_everywhere, 4), (m_type_everywhere, 3), (m_attr_number, 4), (m_number, 1), (m_dim, 1), (m_type, 1),
             (m_delete_line, 2), (m_duplicate_line, 2), (m_swap_lines, 1),
             (m_swap_tokens, 2), (m_truncate, 0.5), (m_garbage, 1), (m_nesting, 0.5), (m_big_file, 0.5)]
MAX_BYTES = 1 << 20


def pipeline_for(r: random.Random, layer: str) -> str:
    inp = "" if layer == "graph" else f" input={layer}"
    u = r.random()
    if u < 0.3:
        return ""                                  # parse, verify, print
    if u < 0.4:
        return "canonicalize"
    if u < 0.85:
        return CPU % inp
    return r.choice(GPU) % inp


def mutate_pipeline(r: random.Random, p: str) -> str:
    opts = ("unroll=%s", "threads=%s", "chunk=%s", "tile-m=%s", "tile-k=%s", "register-tile=%s,%s", "arch=%s",
            "parallel=%s", "input=%s", "staging=%s")
    vals = ("0", "-1", "100000", "4294967296", "zen", "", "m", "1.5", "{", "}", "schedule", "9" * 30)
    if not p:
        p = CPU % ""
    o = r.choice(opts)
    o = o % tuple(r.choice(vals) for _ in range(o.count("%s")))
    return p[:-1] + " " + o + "}" if p.endswith("}") else p + "{" + o + "}"


@dataclass
class Case:
    seed: int
    source: str
    text: bytes
    pipeline: str
    what: list

    def describe(self) -> str:
        return f"seed {self.seed}: {self.source} with {', '.join(self.what)} through {self.pipeline!r}"


def make_case(seed: int, items=None) -> Case:
    r = random.Random(seed)
    items = items or corpus()
    name, text, layer = r.choice(items)
    what = []
    fns, weights = zip(*MUTATIONS)
    for _ in range(r.choice((1, 1, 1, 2, 3))):
        m = r.choices(fns, weights)[0]
        changed = m(r, text)
        if len(changed) <= MAX_BYTES:
            text = changed
            what.append(m.__name__[2:])
    pipeline = pipeline_for(r, layer)
    if r.random() < 0.12:
        pipeline = mutate_pipeline(r, pipeline)
        what.append("pipeline")
    return Case(seed, name, text, pipeline, what)


# ------------------------------------------------------------------------------ checking
ERROR = re.compile(r"error\[([A-Z][A-Z0-9_]*)\]")
# run_pipeline wraps an exception a pass did not mean to raise as "pass 'x' failed: KeyError: ..."
CRASH = re.compile(r"error\[PASS_FAILED\]: pass '[^']+' failed: ([A-Za-z_]*(?:Error|Exception|Interrupt)\b)")


def judge(rc, stderr: str) -> str:
    """'' when the outcome is exit 0 or a documented, non-internal coded error."""
    if rc == 0:
        return ""
    if rc != 1:
        return f"exit status {rc}"
    if "Traceback" in stderr:
        return "a Python traceback"
    codes = ERROR.findall(stderr)
    if not codes:
        return "exit 1 without error[CODE]"
    if codes[0] == "INTERNAL":
        return "INTERNAL (a defect by definition)"
    if codes[0] not in DOCUMENTED:
        return f"code {codes[0]} is not in docs/errors.md"
    crash = CRASH.search(stderr)
    if crash:
        return f"a pass crashed ({crash.group(1)} wrapped as PASS_FAILED)"
    return ""


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_in_process(case: Case, tmp: Path) -> tuple[int, str]:
    f = tmp / f"m{case.seed}.mlir"
    f.write_bytes(case.text)
    err, out = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = opt.main([str(f), "--pass-pipeline", case.pipeline])
    except _Timeout:
        rc = "timeout"
    except BaseException as e:  # noqa: BLE001 - anything out of main is a failure to report
        rc = f"{type(e).__name__} escaped main: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    text = err.getvalue()
    if "_Timeout" in text:
        rc = "timeout"
    return rc, text


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (SUBPROCESS_MEMORY, SUBPROCESS_MEMORY))


def run_subprocess(case: Case, tmp: Path) -> tuple[int, str]:
    f = tmp / f"s{case.seed}.mlir"
    f.write_bytes(case.text)
    try:
        p = subprocess.run([sys.executable, "-m", "tessera.tools.opt", str(f), "--pass-pipeline", case.pipeline],
                           capture_output=True, timeout=CASE_SECONDS * 2, preexec_fn=_limit_memory, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    return p.returncode, p.stderr.decode("utf-8", "replace")


def failures(cases, runner, tmp: Path) -> list[str]:
    bad = []
    for c in cases:
        rc, err = runner(c, tmp)
        why = judge(rc, err) if isinstance(rc, int) else str(rc)
        if why:
            keep = tmp / f"failing-{c.seed}.mlir"
            keep.write_bytes(c.text)
            bad.append(f"{c.describe()}: {why} (input kept at {keep})\n    {err.strip()[-600:]}")
    return bad


# ------------------------------------------------------------------------------ tests
def test_the_corpus_itself_is_accepted(tmp_path):
    """Unmutated, every input goes through a lane's pipeline with exit 0 (so a mutation is what fails);
    tile.launch without its kernel only parses and prints."""
    bad = []
    for name, text, layer in corpus():
        inp = "" if layer == "graph" else f" input={layer}"
        outcomes = []
        for p in (CPU % inp, *(g % inp for g in GPU), ""):   # "": parse, verify, print (tile.launch alone)
            outcomes.append(run_in_process(Case(0, name, text, p, []), tmp_path))
            if outcomes[-1][0] == 0:
                break
        if outcomes[-1][0] != 0:
            bad.append(f"{name}: " + " / ".join(f"{rc} {err.strip()[:200]}" for rc, err in outcomes))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("batch", range(4))
def test_mutations_in_process(tmp_path, batch):
    cases = [make_case(1000 * batch + i) for i in range(100)]
    bad = failures(cases, run_in_process, tmp_path)
    assert not bad, f"{len(bad)} of {len(cases)} mutated inputs were not exit 0 or a coded error:\n" + "\n".join(bad)


def test_mutations_in_a_subprocess(tmp_path):
    """The real command: exit status, signals and memory are the process's own."""
    items = corpus()
    cases = [make_case(90_000 + i, items) for i in range(2)]
    # and one of each hostile kind that must be refused, not followed
    cases.append(Case(-1, "mlp.mlir", b"func.func @main() {" + b"scf.execute_region {" * 3000 + b"}" * 3001,
                      "", ["deep nesting"]))
    cases.append(Case(-2, "mlp.mlir", (ROOT / "examples/mlp.mlir").read_bytes()[:-7] + b"\xff\xfe\x00",
                      CPU % "", ["garbage bytes"]))
    bad = failures(cases, run_subprocess, tmp_path)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("batch", range(4, 40))
def test_mutations_in_process_slow(tmp_path, batch):
    seed = int(os.environ.get("TESSERA_FUZZ_SEED", "0"))   # fixed mutants unless asked for others
    cases = [make_case(1_000_000 * (seed + 1) + 1000 * batch + i) for i in range(100)]
    bad = failures(cases, run_in_process, tmp_path)
    assert not bad, f"{len(bad)} of {len(cases)} mutated inputs were not exit 0 or a coded error:\n" + "\n".join(bad)


def test_the_judge_has_teeth(tmp_path, monkeypatch):
    """A planted crash in a pass, a traceback, an undocumented code and INTERNAL are all reported."""
    assert judge(0, "") == "" and judge(1, "x:1:1: error[IR_PARSE]: bad") == ""
    assert judge(1, "error[NOT_A_CODE]: x") and judge(1, "error[INTERNAL]: x") and judge(-11, "")
    assert judge(1, "Traceback (most recent call last):") and judge(1, "no code at all")
    assert judge(1, "error[PASS_FAILED]: pass 'lower-tile-to-x86' failed: KeyError: 'k0'")
    assert not judge(1, "error[PASS_FAILED]: lower-tile-to-x86: kernel @k0 is laid out for 16-lane vectors")
    from tessera.passes.graph.canonicalize import Canonicalize
    c = Case(7, "mlp.mlir", (ROOT / "examples/mlp.mlir").read_bytes(), "canonicalize", [])
    with monkeypatch.context() as m:
        m.setattr(Canonicalize, "apply", lambda self, *a, **k: 1 / 0)
        bad = failures([c], run_in_process, tmp_path)
    assert len(bad) == 1 and "ZeroDivisionError wrapped as PASS_FAILED" in bad[0] and "seed 7" in bad[0]
    with monkeypatch.context() as m:
        m.setattr(opt, "_run", lambda args: {}["planted"])
        bad = failures([c], run_in_process, tmp_path)
    assert len(bad) == 1 and "INTERNAL" in bad[0]
    assert failures([c], run_in_process, tmp_path) == []
