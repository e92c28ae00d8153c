"""The ``tessera`` command: demo, bench, mma, lanes, docs, doctor, cache, tune, aot."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tessera.errors import TesseraError

ROOT = Path(__file__).resolve().parent.parent.parent


def _docs(args) -> int:
    from tessera.tools import docs
    if getattr(args, "since", False):
        if args.name != "gpu":
            raise TesseraError("--since applies to `tessera docs gpu` only")
        from tessera.tools import gpu_doc
        if args.write:
            print(f"wrote {gpu_doc.write_since()}")
            print(f"wrote {docs.write('gpu', ROOT)}")
        else:
            sys.stdout.write(gpu_doc.since_md())
        return 0
    names = list(docs.GENERATORS) if args.name == "all" else [args.name]
    for n in names:
        if n not in docs.GENERATORS:
            raise TesseraError(f"unknown document {n!r}; known: {', '.join(docs.GENERATORS)}")
        if args.write:
            print(f"wrote {docs.write(n, ROOT)}")
        else:
            sys.stdout.write(docs.generate(n))
    return 0


def _bench(args) -> int:
    if args.what == "tiles":
        from tessera.tools import bench_tiles
        res = bench_tiles.measure(args.dtype)
        print(f"{res['arch']} {res['record']} ({res['threads']} threads; geometric mean over {bench_tiles.SHAPES}):")
        for k, v in sorted(res["gflops"].items(), key=lambda kv: -kv[1]):
            print(f"  {k:>6}  {v:7.1f} GFLOP/s")
        if args.write:
            bench_tiles.write(res)
            print("calibration.json updated")
        return 0
    if args.what == "render":
        from tessera.tools import bench_doc
        sys.stdout.write(bench_doc.render_doc(Path(args.log_dir) if args.log_dir else bench_doc.LOG_DIR))
        return 0
    if args.what == "models":
        from tessera.tools import bench_models
        return bench_models.main(args)
    if args.what == "train":
        from tessera.tools import bench_train
        return bench_train.main(args)
    from tessera.tools import bench_cpu
    return bench_cpu.main(args)


def _lanes(args) -> int:
    from tessera.tools import docs, lanes
    if args.write:
        print(f"wrote {docs.write('lanes', ROOT)}")
        return 0
    sm = lanes.static_map()
    runs = lanes.run_map() if args.run else None
    print(lanes.render_md(sm, runs) if args.markdown else lanes.render_text(sm, runs))
    return 1 if lanes.gate_violations(sm, runs) else 0


def _mma(args) -> int:
    from tessera.mma.selector import (accumulator_regs_per_lane, all_records, get_isa, rank_shapes_by_footprint,
                                      ranked_register_tiles, select_mma)
    if args.list:
        for r in all_records():
            print(f"{r.id:45} {'x'.join(map(str, r.shape)):10} {r.a_dtype:>10}->{r.acc_dtype:<4} "
                  f"{r.mnemonic:50} {r.lowered_by or 'no lowering yet'}")
        return 0
    isa = get_isa(args.target, args.arch)
    print(f"{isa.target}:{isa.arch}  register budget {isa.register_budget}"
          + (f"  waves {isa.wave_sizes}" if isa.wave_sizes else ""))
    print("candidates (cheapest first):")
    for r in rank_shapes_by_footprint(isa, args.dtype, args.out_dtype):
        fp = accumulator_regs_per_lane(r)
        print(f"  {r.id:45} {'x'.join(map(str, r.shape)):10} regs/lane {'-' if fp is None else f'{fp:g}':>4}  "
              f"{r.math_mode or '':5} {r.lowered_by or 'no lowering yet'}")
    sel = select_mma(isa, args.dtype, out_dtype=args.out_dtype, math_mode=args.math_mode, wave=args.wave)
    print(f"selected: {sel.record.id} ({sel.record.mnemonic}); lowered by {sel.lowered_by or 'nothing yet'}")
    if isa.target == "x86" and sel.record.vector_width:
        print("register tiles (best first):")
        for t in ranked_register_tiles(isa, sel)[:6]:
            print(f"  {t.mr}x{t.nr}  {t.registers:2} registers  {t.score:6.1f} GFLOP/s ({t.source})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tessera")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("docs", help="print or --write a generated document")
    d.add_argument("name", help="errors | mma | lanes | numerics | abi | gpu | benchmarks | all")
    d.add_argument("--write", action="store_true")
    d.add_argument("--since", action="store_true",
                   help="gpu: the commits that changed GPU code after each recorded run, from git history as of now "
                        "(--write: record them in benchmarks/gpu/results/since.json, which docs/gpu.md renders)")
    d.set_defaults(func=_docs)
    demo = sub.add_parser("demo", help="compile and run a transformer block on the CPU lane")
    demo.add_argument("--seq", type=int, default=256)
    demo.add_argument("--dim", type=int, default=256)
    demo.set_defaults(func=lambda a: __import__("tessera.tools.demo", fromlist=["main"]).main(a))
    bt = sub.add_parser("bench", help="benchmarks: cpu (the performance table), models (examples/models against "
                                      "the peers), render (docs/benchmarks.md from the raw logs), tiles "
                                      "(register-tile calibration), train (training step and attention "
                                      "gradient against the peers)")
    bt.add_argument("what", choices=["cpu", "models", "render", "tiles", "train"])
    bt.add_argument("--models", nargs="*", default=None, help="models: which examples (default: all)")
    bt.add_argument("--all-threads-only", action="store_true", help="models: skip the one-thread rows")
    bt.add_argument("--write", action="store_true",
                    help="tiles: update calibration.json; cpu: keep the run's raw log as "
                         "benchmarks/results/cpu/<host>/<date>-<commit>.json and re-render docs/benchmarks.md")
    bt.add_argument("--dtype", default="f32")
    bt.add_argument("--quick", action="store_true",
                    help="cpu: small sizes, three rounds (a smoke test; its log is marked quick)")
    bt.add_argument("--tuned", action="store_true",
                    help="cpu: also tune each GEMM and row workload first (tessera.tune, a private database) and "
                         "time the tuned kernel in the same rounds as the cost model's (adds ~30 s per workload)")
    bt.add_argument("--log-dir", default=None,
                    help="cpu/render: the raw logs' folder (default benchmarks/results/cpu; elsewhere, --write "
                         "also writes DIR/benchmarks.md)")
    bt.set_defaults(func=_bench)
    mm = sub.add_parser("mma", help="the MMA selector: ranked candidates and the selection, or the whole table")
    mm.add_argument("--target", default="x86")
    mm.add_argument("--arch", default=None)
    mm.add_argument("--dtype", default="f32")
    mm.add_argument("--out-dtype", default=None)
    mm.add_argument("--math-mode", default=None)
    mm.add_argument("--wave", type=int, default=None, help="rocm: wave size (default: the arch's own)")
    mm.add_argument("--list", action="store_true")
    mm.set_defaults(func=_mma)
    ln = sub.add_parser("lanes", help="the lane map: pipelines, passes, op producers/consumers, gates")
    ln.add_argument("--run", action="store_true", help="also compile the examples/ corpus through every pipeline")
    ln.add_argument("--markdown", action="store_true")
    ln.add_argument("--write", action="store_true", help="write docs/lanes.md (implies --run --markdown)")
    ln.set_defaults(func=_lanes)
    dr = sub.add_parser("doctor", help="every external tool: version, where it was found, what it enables")
    dr.set_defaults(func=lambda a: __import__("tessera.tools.doctor", fromlist=["main"]).main(a))
    from tessera.tools import cache_cli
    cache_cli.add_parser(sub)
    __import__("tessera.tools.tune_cli", fromlist=["add_parser"]).add_parser(sub)   # tessera tune
    __import__("tessera.tools.aot_cli", fromlist=["add_parser"]).add_parser(sub)   # tessera aot
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except TesseraError as e:
        print(e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
