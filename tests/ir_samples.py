"""One minimal, valid module per op of Tessera's dialects (used by the round-trip test)."""

T = "!tessera.tensor<[M, K], f32>"
W = "!tessera.tensor<[K, N], f32>"
Y = "!tessera.tensor<[M, N], f32>"
V = "!tessera.tensor<[N], f32>"


def _fn(args: str, body: str, results: str = "") -> str:
    ret_types = f" -> ({results})" if results else ""
    return f"func.func @f({args}){ret_types} {{\n{body}\n}}\n"


def _unary(op: str, attrs: str = "") -> str:
    return _fn(f"%x : {Y}", f"  %r = {op} %x {attrs}: ({Y}) -> {Y}\n  func.return %r : {Y}", Y)


def _binary(op: str) -> str:
    return _fn(f"%x : {Y}, %b : {V}", f"  %r = {op} %x, %b : ({Y}, {V}) -> {Y}\n  func.return %r : {Y}", Y)


FRAG_A = "!tile.fragment<6, 32, 1, f32, f32, a, col_major, fma>"
FRAG_B = "!tile.fragment<6, 32, 1, f32, f32, b, row_major, fma>"
FRAG_C = "!tile.fragment<6, 32, 1, f32, f32, acc, row_major, fma>"
BUF = "!tile.buffer<f32, global>"
PANEL = "!tile.buffer<f32, l2>"

TILE_PREFIX = """  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c6 = arith.constant 6 : index
  %c32 = arith.constant 32 : index
"""


def _tile(body: str, args: str = f"%p : {BUF}") -> str:
    return _fn(args, TILE_PREFIX + body + "\n  func.return")


MMA_BODY = f"""  %va = tile.view %p[%c0] strides [%c1, %c6] bounds [%c6, %c1] : {BUF} -> !tile.view<[6, 1], f32, global>
  %vb = tile.view %p[%c0] strides [%c32, %c1] bounds [%c1, %c32] : {BUF} -> !tile.view<[1, 32], f32, global>
  %a = tile.fragment_pack %va : !tile.view<[6, 1], f32, global> -> {FRAG_A}
  %b = tile.fragment_pack %vb : !tile.view<[1, 32], f32, global> -> {FRAG_B}
  %z = tile.fragment_zero : {FRAG_C}
  %d = tile.mma %a, %b, %z : {FRAG_A}, {FRAG_B}, {FRAG_C} -> {FRAG_C}
  %t = tile.fragment_unpack %d : {FRAG_C} -> !tile.tile<[6, 32], f32>
  %vc = tile.view %p[%c0] strides [%c32, %c1] bounds [%c6, %c32] : {BUF} -> !tile.view<[6, 32], f32, global>
  tile.store %t, %vc : !tile.tile<[6, 32], f32>, !tile.view<[6, 32], f32, global>"""

SAMPLES: dict[str, str] = {
    # ---- Graph IR
    "tessera.matmul": _fn(f"%a : {T}, %b : {W}", f"  %r = tessera.matmul %a, %b : ({T}, {W}) -> {Y}\n"
                                                 f"  func.return %r : {Y}", Y),
    "tessera.add": _binary("tessera.add"),
    "tessera.sub": _binary("tessera.sub"),
    "tessera.mul": _binary("tessera.mul"),
    "tessera.div": _binary("tessera.div"),
    "tessera.maximum": _binary("tessera.maximum"),
    "tessera.neg": _unary("tessera.neg"),
    "tessera.exp": _unary("tessera.exp"),
    "tessera.tanh": _unary("tessera.tanh"),
    "tessera.erf": _unary("tessera.erf"),
    "tessera.relu": _unary("tessera.relu"),
    "tessera.silu": _unary("tessera.silu"),
    "tessera.sqrt": _unary("tessera.sqrt"),
    "tessera.minimum": _binary("tessera.minimum"),
    "tessera.abs": _unary("tessera.abs"),
    "tessera.ceil": _unary("tessera.ceil"),
    "tessera.cos": _unary("tessera.cos"),
    "tessera.exp2": _unary("tessera.exp2"),
    "tessera.expm1": _unary("tessera.expm1"),
    "tessera.floor": _unary("tessera.floor"),
    "tessera.log": _unary("tessera.log"),
    "tessera.log1p": _unary("tessera.log1p"),
    "tessera.reciprocal": _unary("tessera.reciprocal"),
    "tessera.round": _unary("tessera.round"),
    "tessera.rsqrt": _unary("tessera.rsqrt"),
    "tessera.sigmoid": _unary("tessera.sigmoid"),
    "tessera.sign": _unary("tessera.sign"),
    "tessera.sin": _unary("tessera.sin"),
    "tessera.square": _unary("tessera.square"),
    "tessera.gelu": _unary("tessera.gelu", '{approximate = "tanh"} '),
    "tessera.softmax": _unary("tessera.softmax", "{axis = -1 : i64} "),
    "tessera.layer_norm": _fn(f"%x : {Y}, %g : {V}, %b : {V}",
                              f"  %r = tessera.layer_norm %x scale %g : {V} bias %b : {V} {{eps = 1.000000e-05 : f64}} : "
                              f"{Y} -> {Y}\n  func.return %r : {Y}", Y),
    "tessera.rms_norm": _fn(f"%x : {Y}", f"  %r = tessera.rms_norm %x {{eps = 1.000000e-06 : f64}} : {Y} -> {Y}\n"
                                         f"  func.return %r : {Y}", Y),
    "tessera.reduce_sum": _fn(f"%x : {Y}", f"  %r = tessera.reduce_sum %x {{axes = [1 : i64], keepdims = false}} : "
                                           f"({Y}) -> !tessera.tensor<[M], f32>\n"
                                           "  func.return %r : !tessera.tensor<[M], f32>", "!tessera.tensor<[M], f32>"),
    "tessera.reduce_max": _fn(f"%x : {Y}", f"  %r = tessera.reduce_max %x {{axes = [1 : i64], keepdims = true}} : "
                                           f"({Y}) -> !tessera.tensor<[M, 1], f32>\n"
                                           "  func.return %r : !tessera.tensor<[M, 1], f32>",
                              "!tessera.tensor<[M, 1], f32>"),
    "tessera.reduce_mean": _fn(f"%x : {Y}", f"  %r = tessera.reduce_mean %x {{axes = [0 : i64], keepdims = false}} : "
                                            f"({Y}) -> {V}\n  func.return %r : {V}", V),
    "tessera.transpose": _fn(f"%x : {Y}", f"  %r = tessera.transpose %x {{perm = [1 : i64, 0 : i64]}} : "
                                          f"({Y}) -> !tessera.tensor<[N, M], f32>\n"
                                          "  func.return %r : !tessera.tensor<[N, M], f32>",
                             "!tessera.tensor<[N, M], f32>"),
    "tessera.concat": _fn("%x : !tessera.tensor<[4, N], f32>, %y : !tessera.tensor<[4, N], f32>", "  %r = tessera.concat %x, %y {axis = 0 : i64} : "
                                                 "(!tessera.tensor<[4, N], f32>, !tessera.tensor<[4, N], f32>) -> "
                                                 "!tessera.tensor<[8, N], f32>\n"
                                                 "  func.return %r : !tessera.tensor<[8, N], f32>",
                          "!tessera.tensor<[8, N], f32>"),
    "tessera.pad": _fn("%x : !tessera.tensor<[M, 5], f32>", "  %r = tessera.pad %x {pads = [0 : i64, 0 : i64, 2 : i64, "
                       "1 : i64], mode = \"reflect\", value = 0.000000e+00 : f64} : (!tessera.tensor<[M, 5], f32>) -> "
                       "!tessera.tensor<[M, 8], f32>\n  func.return %r : !tessera.tensor<[M, 8], f32>",
                       "!tessera.tensor<[M, 8], f32>"),
    "tessera.conv_patches": _fn("%x : !tessera.tensor<[N, 9, 11, 3], f32>", "  %r = tessera.conv_patches %x {kernel = "
                                "[3 : i64, 3 : i64], stride = [2 : i64, 1 : i64], dilation = [1 : i64, 2 : i64], "
                                "channels = [0 : i64, 3 : i64]} : (!tessera.tensor<[N, 9, 11, 3], f32>) -> "
                                "!tessera.tensor<[N, 4, 7, 27], f32>\n  func.return %r : !tessera.tensor<[N, 4, 7, 27], f32>",
                                "!tessera.tensor<[N, 4, 7, 27], f32>"),
    "tessera.slice": _fn(f"%x : !tessera.tensor<[M, 16], f32>", "  %r = tessera.slice %x {starts = [0 : i64, 3 : i64], "
                                                                   "steps = [1 : i64, 2 : i64]} : "
                                                                   "(!tessera.tensor<[M, 16], f32>) -> "
                                                                   "!tessera.tensor<[M, 6], f32>\n"
                                                                   "  func.return %r : !tessera.tensor<[M, 6], f32>",
                         "!tessera.tensor<[M, 6], f32>"),
    "tessera.reshape": _fn(f"%x : {Y}", f"  %r = tessera.reshape %x : ({Y}) -> !tessera.tensor<[M*N], f32>\n"
                                        "  func.return %r : !tessera.tensor<[M*N], f32>", "!tessera.tensor<[M*N], f32>"),
    "tessera.cast": _fn(f"%x : {Y}", f"  %r = tessera.cast %x : ({Y}) -> !tessera.tensor<[M, N], bf16>\n"
                                     "  func.return %r : !tessera.tensor<[M, N], bf16>",
                        "!tessera.tensor<[M, N], bf16>"),
    "tessera.constant": _fn("", "  %r = tessera.constant {value = dense<5.000000e-01> : tensor<f32>} : "
                                "!tessera.tensor<[], f32>\n  func.return %r : !tessera.tensor<[], f32>",
                            "!tessera.tensor<[], f32>"),
    "tessera.attention": _fn("%q : !tessera.tensor<[B, H, S, D], f32>, %k : !tessera.tensor<[B, H, T, D], f32>, "
                             "%v : !tessera.tensor<[B, H, T, E], f32>, %m : !tessera.tensor<[S, T], i1>",
                             "  %r = tessera.attention %q, %k, %v mask %m : !tessera.tensor<[S, T], i1> {causal = true, "
                             "masked_rows = \"zero\"} : !tessera.tensor<[B, H, S, D], f32>, !tessera.tensor<[B, H, T, D], "
                             "f32>, !tessera.tensor<[B, H, T, E], f32> -> !tessera.tensor<[B, H, S, E], f32>\n"
                             "  func.return %r : !tessera.tensor<[B, H, S, E], f32>", "!tessera.tensor<[B, H, S, E], f32>"),
    "tessera.fusion": _fn(f"%x : {Y}", f"""  %r = tessera.fusion "elementwise" (%x) : ({Y}) -> {Y} {{
  ^bb0(%a : {Y}):
    %e = tessera.exp %a : ({Y}) -> {Y}
    tessera.yield %e : {Y}
  }}
  func.return %r : {Y}""", Y),
    "tessera.yield": None,  # covered by tessera.fusion
    # ---- Schedule IR
    "schedule.kernel": _fn(f"%x : {Y}", f"""  %r = schedule.kernel "k0" (%x) attributes {{kind = "elementwise", loops = ["r", "c"], tiles = [1 : i64, 64 : i64], order = ["r", "c"], parallel = "r", threads = 2 : i64, staging = 1 : i64, mma = "", register_tile = [], unroll = 1 : i64, vector = 16 : i64}} : ({Y}) -> {Y} {{
  ^bb0(%a : {Y}):
    %e = tessera.exp %a : ({Y}) -> {Y}
    tessera.yield %e : {Y}
  }}
  func.return %r : {Y}""", Y),
    # ---- Tile IR
    "tile.view": _tile(MMA_BODY),
    "tile.fragment_pack": _tile(MMA_BODY),
    "tile.fragment_zero": _tile(MMA_BODY),
    "tile.mma": _tile(MMA_BODY),
    "tile.fragment_unpack": _tile(MMA_BODY),
    "tile.store": _tile(MMA_BODY),
    "tile.alloc": _tile(f"""  %s = tile.alloc {{size = 4096 : i64}} : {PANEL}
  %v = tile.view %p[%c0] strides [%c32, %c1] bounds [%c6, %c32] : {BUF} -> !tile.view<[6, 32], f32, global>
  %t = tile.async_copy %v, %s[%c0] {{layout = "b_panel", panel = 16 : i64, kpack = 1 : i64}} : !tile.view<[6, 32], f32, global>, {PANEL}
  tile.wait %t
  %t2 = tile.async_copy %v, %s[%c0] {{layout = "b_panel", panel = 16 : i64, kpack = 2 : i64, kblock = 32 : i64}} : !tile.view<[6, 32], f32, global>, {PANEL}
  tile.wait %t2
  tile.barrier
  %w = tile.claim
  tile.prefetch %v : !tile.view<[6, 32], f32, global>"""),
    "tile.async_copy": None,  # covered by tile.alloc
    "tile.wait": None,
    "tile.barrier": None,
    "tile.claim": None, "tile.prefetch": None,
    "tile.load": _tile(f"""  %v = tile.view %p[%c0] strides [%c32, %c1] bounds [%c1, %c32] : {BUF} -> !tile.view<[1, 32], f32, global>
  %t = tile.load %v : !tile.view<[1, 32], f32, global> -> !tile.tile<[1, 32], f32>
  %h0 = tile.constant (5.000000e-01 : f32) : !tile.tile<[1, 1], f32>
  %n6 = tile.splat_index %c6 : !tile.tile<[1, 1], f32>
  %h = tile.elementwise "div" %h0, %n6 : (!tile.tile<[1, 1], f32>, !tile.tile<[1, 1], f32>) -> !tile.tile<[1, 1], f32>
  %e = tile.elementwise "mul" %t, %h : (!tile.tile<[1, 32], f32>, !tile.tile<[1, 1], f32>) -> !tile.tile<[1, 32], f32>
  %mk = tile.mask %e cols %c6 pad (-1.000000e+00 : f32) : !tile.tile<[1, 32], f32> -> !tile.tile<[1, 32], f32>
  %mg = tile.mask %e cols %c32 diag %c6 pad (-1.000000e+00 : f32) {{side = "ge"}} : !tile.tile<[1, 32], f32> -> !tile.tile<[1, 32], f32>
  %m = tile.reduce "max" %mk {{axis = 1 : i64}} : !tile.tile<[1, 32], f32> -> !tile.tile<[1, 1], f32>
  %sc, %st = tile.scan "add" %mk, %h0 : !tile.tile<[1, 32], f32>, !tile.tile<[1, 1], f32> -> !tile.tile<[1, 32], f32>, !tile.tile<[1, 1], f32>
  %s = tile.elementwise "sub" %e, %m : (!tile.tile<[1, 32], f32>, !tile.tile<[1, 1], f32>) -> !tile.tile<[1, 32], f32>
  %big = arith.cmpi sge, %c32, %c6 : index
  tile.store %s, %v stream %big : !tile.tile<[1, 32], f32>, !tile.view<[1, 32], f32, global>"""),
    "tile.constant": None,
    "tile.elementwise": None,
    "tile.reduce": None,
    "tile.scan": None,
    "tile.mask": None,
    "tile.splat_index": None,
    "tile.launch": _fn(f"%x : {Y}", f"""  %r = tile.launch @k0(%x) {{dims = ["M", "N"], workspace = 0 : i64}} : ({Y}) -> {Y}
  func.return %r : {Y}""", Y),
    # ---- Target IR: x86
    "tessera_x86.vzero": _fn("%p : !llvm.ptr, %o : index, %n : index, %s : f32", """  %z = tessera_x86.vzero : vector<16xf32>
  %c = tessera_x86.vconstant (1.000000e+00 : f32) : vector<16xf32>
  %s1 = tessera_x86.vsplat %s : f32 -> vector<16xf32>
  %b = tessera_x86.vbroadcast %p[%o] {group = 1 : i64} : vector<16xf32>
  %l = tessera_x86.vload %p[%o] : vector<16xf32>
  %m = tessera_x86.vload %p[%o] count %n : vector<16xf32>
  %gm = tessera_x86.vgather %p[%o, %n] count %n : vector<16xf32>
  %gb = tessera_x86.vgather %p[%o, %o] : vector<16xi8>
  %f = tessera_x86.vfma %b, %l, %z : vector<16xf32>
  %g = tessera_x86.vbinary "add" %f, %m : vector<16xf32>
  %u = tessera_x86.vunary "exp" %g : vector<16xf32>
  %r = tessera_x86.vreduce "max" %u : vector<16xf32>
  %h = tessera_x86.vcvt %r : vector<16xf32> -> vector<16xbf16>
  %x = tessera_x86.load %p[%o] : f32
  tessera_x86.store %x, %p[%o] : f32
  tessera_x86.vstore %r, %p[%o] : vector<16xf32>
  tessera_x86.vstore %r, %p[%o] count %n : vector<16xf32>
  tessera_x86.vstore %r, %p[%o] {nontemporal} : vector<16xf32>
  %al = tessera_x86.aligned %p[%o] {bytes = 64 : i64, elem_bytes = 4 : i64}
  tessera_x86.sfence
  tessera_x86.barrier %p, %n
  %bp = tessera_x86.vbroadcast %p[%o] {group = 2 : i64} : vector<32xbf16>
  %bv = tessera_x86.vload %p[%o] : vector<32xbf16>
  %d = tessera_x86.vdpbf16ps %bp, %bv, %z : vector<32xbf16>, vector<16xf32>
  %h16 = tessera_x86.vload %p[%o] : vector<16xbf16>
  %il = tessera_x86.vinterleave %h16, %h16 : vector<16xbf16> -> vector<32xbf16>
  %ls = tessera_x86.vlaneselect %l, %z count %n : vector<16xf32>
  %tr:2 = tessera_x86.vtranspose %l, %z : vector<16xf32>, vector<16xf32> -> vector<16xf32>, vector<16xf32>
  %w = tessera_x86.workspace %p[64] 
  %wc = tessera_x86.claim %p
  tessera_x86.prefetch %p[%o] {elem_bytes = 4 : i64}
  %t0 = tessera_x86.tzero : !tessera_x86.amx
  %ta = tessera_x86.tload %p[%o] stride %n {elem_bytes = 2 : i64} : !tessera_x86.amx
  %tc = tessera_x86.tdp "tdpbf16ps" %ta, %ta, %t0 : !tessera_x86.amx
  tessera_x86.tstore %tc, %p[%o] stride %n {elem_bytes = 4 : i64} : !tessera_x86.amx
  func.return"""),
    "tessera_x86.claim": None, "tessera_x86.prefetch": None, "tessera_x86.tzero": None, "tessera_x86.tload": None, "tessera_x86.tdp": None, "tessera_x86.tstore": None,
    "tessera_x86.vconstant": None, "tessera_x86.vsplat": None, "tessera_x86.vbroadcast": None,
    "tessera_x86.vload": None, "tessera_x86.vgather": None, "tessera_x86.vstore": None, "tessera_x86.load": None, "tessera_x86.store": None,
    "tessera_x86.vfma": None, "tessera_x86.vdpbf16ps": None, "tessera_x86.vbinary": None,
    "tessera_x86.vunary": None, "tessera_x86.vreduce": None, "tessera_x86.vcvt": None,
    "tessera_x86.workspace": None, "tessera_x86.vinterleave": None, "tessera_x86.vlaneselect": None,
    "tessera_x86.aligned": None, "tessera_x86.sfence": None, "tessera_x86.vtranspose": None, "tessera_x86.barrier": None,
    "tessera_x86.velem": _fn("%a : vector<8xi32>, %f : vector<8xf32>", """  %c = tessera_x86.velem "cmp_lt" %a, %a : (vector<8xi32>, vector<8xi32>) -> vector<8xi1>
  %s = tessera_x86.velem "select" %c, %a, %a : (vector<8xi1>, vector<8xi32>, vector<8xi32>) -> vector<8xi32>
  %v = tessera_x86.velem "cvt" %s : (vector<8xi32>) -> vector<8xf32>
  %k = tessera_x86.vconstant (-3 : i32) : vector<8xi32>
  func.return"""),
    "tessera_x86.launch": _fn(f"%x : {Y}", f"""  %r = tessera_x86.launch @k0(%x) {{dims = ["M", "N"], workspace = 0 : i64, team = 0 : i64, threads = 2 : i64, parallel = "r"}} : ({Y}) -> {Y}
  func.return %r : {Y}""", Y),
    # ---- Target IR: NVIDIA, ROCm
    "tessera_nvidia.mma_sync": _fn("%a0 : vector<2xf16>, %a1 : vector<2xf16>, %a2 : vector<2xf16>, %a3 : vector<2xf16>, "
                                   "%b0 : vector<2xf16>, %b1 : vector<2xf16>, %c0 : f32, "
                                   "%c1 : f32, %c2 : f32, %c3 : f32", """  %d:4 = tessera_nvidia.mma_sync "m16n8k16" a(%a0, %a1, %a2, %a3 : vector<2xf16>, vector<2xf16>, vector<2xf16>, vector<2xf16>) b(%b0, %b1 : vector<2xf16>, vector<2xf16>) c(%c0, %c1, %c2, %c3 : f32, f32, f32, f32) {atype = "f16", ctype = "f32"} -> f32, f32, f32, f32
  func.return"""),
    "tessera_rocm.wmma": _fn("%a : vector<16xf16>, %c : vector<8xf32>", """  %d = tessera_rocm.wmma "16x16x16" %a, %a, %c {arch = "gfx1151"} : vector<16xf16>, vector<16xf16>, vector<8xf32> -> vector<8xf32>
  func.return"""),
    "tessera_rocm.mfma": _fn("%a : vector<4xf16>, %c : vector<16xf32>", """  %d = tessera_rocm.mfma "32x32x8" %a, %a, %c {arch = "gfx942"} : vector<4xf16>, vector<4xf16>, vector<16xf32> -> vector<16xf32>
  func.return"""),
    # ---- Target IR: Hopper (sm_90a) warpgroup MMA from shared-memory descriptors
    "tessera_nvidia.wgmma": _fn("%s : !tile.buffer<f16, smem>, %t : index, %db : i64, %c0 : f32, %c1 : f32, "
                                "%c2 : f32, %c3 : f32", """  %sa = tessera_nvidia.shared_address %s[%t] : !tile.buffer<f16, smem> -> i64
  tessera_nvidia.fence_proxy_async
  tessera_nvidia.wgmma_fence
  %d:4 = tessera_nvidia.wgmma "m64n8k16" %sa, %db c(%c0, %c1, %c2, %c3 : f32, f32, f32, f32) {atype = "bf16"} : i64, i64 -> f32, f32, f32, f32
  %e:4 = tessera_nvidia.wgmma "m64n8k16" %sa, %db c(%d#0, %d#1, %d#2, %d#3 : f32, f32, f32, f32) {atype = "bf16", trans_b} : i64, i64 -> f32, f32, f32, f32
  tessera_nvidia.wgmma_commit
  tessera_nvidia.wgmma_wait {pending = 0 : i64}
  %f:4 = tessera_nvidia.wgmma_fence_operand(%e#0, %e#1, %e#2, %e#3 : f32, f32, f32, f32) -> f32, f32, f32, f32
  func.return"""),
    "tessera_nvidia.shared_address": None, "tessera_nvidia.fence_proxy_async": None,
    "tessera_nvidia.wgmma_fence": None, "tessera_nvidia.wgmma_commit": None, "tessera_nvidia.wgmma_wait": None,
    "tessera_nvidia.wgmma_fence_operand": None,
    # ---- Target IR: the GPU SIMT dialect and NVIDIA copies / matrix loads
    "tessera_gpu.thread_id": _fn("%g : !tile.buffer<f16, global>, %i : index", """  %t = tessera_gpu.thread_id : index
  %bx = tessera_gpu.block_id {axis = 1 : i64} : index
  %s = tessera_gpu.shared {offset = 16 : i64, size = 64 : i64} : !tile.buffer<f16, smem>
  %v = tessera_gpu.load %g[%i] {align = 16 : i64} : !tile.buffer<f16, global> -> vector<8xf16>
  %e = tessera_gpu.extract %v[3] : vector<8xf16> -> f16
  %p = tessera_gpu.pack %e, %e : f16, f16 -> vector<2xf16>
  tessera_gpu.store %v, %s[%t] {align = 16 : i64} : vector<8xf16>, !tile.buffer<f16, smem>
  tessera_gpu.barrier
  %w = tessera_gpu.convert %v : vector<8xf16> -> vector<8xf32>
  %x = tessera_gpu.math "gelu_tanh" %w : (vector<8xf32>) -> vector<8xf32>
  %y = tessera_gpu.math "add" %x, %w : (vector<8xf32>, vector<8xf32>) -> vector<8xf32>
  %q = tessera_gpu.extract %y[0] : vector<8xf32> -> f32
  %z = tessera_gpu.shuffle_xor %q {mask = 16 : i64, width = 32 : i64} : f32 -> f32
  tessera_nvidia.cp_async %s[%t], %g[%i], %i {bytes = 16 : i64} : !tile.buffer<f16, smem>, !tile.buffer<f16, global>
  tessera_nvidia.cp_async_commit
  tessera_nvidia.cp_async_wait {pending = 1 : i64}
  %r:4 = tessera_nvidia.ldmatrix %s[%t] {trans} : !tile.buffer<f16, smem> -> vector<2xf16>, vector<2xf16>, vector<2xf16>, vector<2xf16>
  func.return"""),
    "tessera_gpu.block_id": None, "tessera_gpu.shared": None, "tessera_gpu.load": None, "tessera_gpu.store": None,
    "tessera_gpu.barrier": None, "tessera_gpu.pack": None, "tessera_gpu.extract": None, "tessera_gpu.convert": None,
    "tessera_gpu.math": None, "tessera_nvidia.cp_async": None, "tessera_nvidia.cp_async_commit": None,
    "tessera_nvidia.cp_async_wait": None, "tessera_nvidia.ldmatrix": None,
    "tessera_gpu.shuffle_xor": None,
    "tessera_gpu.launch": _fn(f"%x : {Y}", f"""  %r = tessera_gpu.launch @k0(%x) {{dims = ["M", "N"], grid = ["N/64", "M/64", "1"], block = 128 : i64, shared = 1024 : i64}} : ({Y}) -> {Y}
  func.return %r : {Y}""", Y),
    "tile.program_id": _fn("", """  %p = tile.program_id {axis = 2 : i64} : index
  %w = tile.wave_id : index
  func.return"""),
    "tile.wave_id": None,
}

# reductions, scans and log-row ops (ir/graph_rows.py)
SAMPLES.update({
    "tessera.logsumexp": _fn(f"%x : {Y}", f"  %r = tessera.logsumexp %x {{keepdims = false}} : "
                                          f"({Y}) -> !tessera.tensor<[M], f32>\n"
                                          "  func.return %r : !tessera.tensor<[M], f32>", "!tessera.tensor<[M], f32>"),
    "tessera.log_softmax": _unary("tessera.log_softmax"),
    "tessera.argmax": _fn(f"%x : {Y}", f"  %r = tessera.argmax %x {{keepdims = true}} : "
                                       f"({Y}) -> !tessera.tensor<[M, 1], i64>\n"
                                       "  func.return %r : !tessera.tensor<[M, 1], i64>", "!tessera.tensor<[M, 1], i64>"),
    "tessera.argmin": _fn(f"%x : {Y}", f"  %r = tessera.argmin %x {{keepdims = false}} : "
                                       f"({Y}) -> !tessera.tensor<[M], i64>\n"
                                       "  func.return %r : !tessera.tensor<[M], i64>", "!tessera.tensor<[M], i64>"),
    "tessera.top_k": _fn(f"%x : {Y}", f"  %v, %i = tessera.top_k %x {{k = 3 : i64}} : ({Y}) -> "
                                      "(!tessera.tensor<[M, 3], f32>, !tessera.tensor<[M, 3], i64>)\n"
                                      "  func.return %v : !tessera.tensor<[M, 3], f32>", "!tessera.tensor<[M, 3], f32>"),
    "tessera.reduce_any": _fn(f"%x : {Y}", f"  %r = tessera.reduce_any %x {{axes = [1 : i64], keepdims = false}} : "
                                           f"({Y}) -> !tessera.tensor<[M], i1>\n"
                                           "  func.return %r : !tessera.tensor<[M], i1>", "!tessera.tensor<[M], i1>"),
    "tessera.reduce_all": _fn(f"%x : {Y}", f"  %r = tessera.reduce_all %x {{axes = [0 : i64], keepdims = true}} : "
                                           f"({Y}) -> !tessera.tensor<[1, N], i1>\n"
                                           "  func.return %r : !tessera.tensor<[1, N], i1>", "!tessera.tensor<[1, N], i1>"),
    "tessera.cross_entropy": _fn(f"%x : {Y}, %y : !tessera.tensor<[M], i64>",
                                 "  %l, %v = tessera.cross_entropy %x, %y {ignore_index = -100 : i64} : "
                                 f"({Y}, !tessera.tensor<[M], i64>) -> (!tessera.tensor<[M], f32>, "
                                 "!tessera.tensor<[M], f32>)\n  func.return %l : !tessera.tensor<[M], f32>",
                                 "!tessera.tensor<[M], f32>"),
    "tessera.cumsum": _unary("tessera.cumsum", "{axis = 0 : i64} "),
    "tessera.cumprod": _unary("tessera.cumprod", "{axis = -1 : i64} "),
    "tessera.reduce_prod": _fn(f"%x : {Y}", f"  %r = tessera.reduce_prod %x {{axes = [1 : i64], keepdims = true}} : "
                                            f"({Y}) -> !tessera.tensor<[M, 1], f32>\n"
                                            "  func.return %r : !tessera.tensor<[M, 1], f32>",
                               "!tessera.tensor<[M, 1], f32>"),
})
# gathers (tessera/ir/graph_index.py) and the index load their kernels use
_E, _I = "!tessera.tensor<[37, D], f32>", "!tessera.tensor<[B, S], i32>"
SAMPLES.update({
    "tessera.take": _fn(f"%t : {_E}, %i : {_I}, %l : !tessera.tensor<[3, D], i64>", f"""  %r = tessera.take %t, %i {{axis = 0 : i64}} : ({_E}, {_I}) -> !tessera.tensor<[B, S, D], f32>
  %a = tessera.take_along_axis %t, %l {{axis = 0 : i64}} : ({_E}, !tessera.tensor<[3, D], i64>) -> !tessera.tensor<[3, D], f32>
  %h = tessera.one_hot %i : ({_I}) -> !tessera.tensor<[B, S, 10], bf16>
  func.return %r : !tessera.tensor<[B, S, D], f32>""", "!tessera.tensor<[B, S, D], f32>"),
    "tessera.take_along_axis": None, "tessera.one_hot": None,
    "tile.load_index": _tile("  %k = tile.load_index %q[%c6] : !tile.buffer<i64, global>",
                             f"%p : {BUF}, %q : !tile.buffer<i64, global>"),
})
# ---- typed ops (tessera/ir/graph_typed.py): comparisons, where, logic, integer ops, pow, iota
YB = "!tessera.tensor<[M, N], i1>"
YI = "!tessera.tensor<[M, N], i32>"
VI = "!tessera.tensor<[N], i32>"


def _typed_binary(op: str, x: str, v: str, r: str) -> str:
    return _fn(f"%x : {x}, %b : {v}", f"  %r = {op} %x, %b : ({x}, {v}) -> {r}\n  func.return %r : {r}", r)


def _typed_unary(op: str, x: str, r: str) -> str:
    return _fn(f"%x : {x}", f"  %r = {op} %x : ({x}) -> {r}\n  func.return %r : {r}", r)


TYPED_SAMPLES = {
    **{f"tessera.{n}": _typed_binary(f"tessera.{n}", Y, V, YB)
       for n in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")},
    **{f"tessera.{n}": _typed_binary(f"tessera.{n}", YI, VI, YI)
       for n in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "floor_divide", "mod")},
    "tessera.pow": _typed_binary("tessera.pow", Y, V, Y),
    "tessera.bitwise_not": _typed_unary("tessera.bitwise_not", YB, YB),
    **{f"tessera.{n}": _typed_unary(f"tessera.{n}", Y, YB) for n in ("isnan", "isinf", "isfinite")},
    "tessera.where": _fn(f"%c : {YB}, %x : {Y}, %b : {V}", f"  %r = tessera.where %c, %x, %b : ({YB}, {Y}, {V}) -> {Y}\n"
                                                             f"  func.return %r : {Y}", Y),
    "tessera.iota": _fn("", "  %r = tessera.iota {axis = 1 : i64} : !tessera.tensor<[4, 7], i64>\n"
                            "  func.return %r : !tessera.tensor<[4, 7], i64>", "!tessera.tensor<[4, 7], i64>"),
    "tile.index": _fn("%i : index", "  %r = tile.index %i {row_step = 0 : i64, col_step = 1 : i64} : !tile.tile<[1, 16], i32>\n"
                                    "  %s = tile.index %i {row_step = 1 : i64, col_step = 0 : i64} : !tile.tile<[4, 1], f32>\n"
                                    "  %c = tile.constant (7 : i32) : !tile.tile<[1, 1], i32>\n"
                                    "  %e = tile.elementwise \"cmp_lt\" %r, %c : (!tile.tile<[1, 16], i32>, !tile.tile<[1, 1], i32>) -> !tile.tile<[1, 16], i1>\n"
                                    "  func.return"),
}
SAMPLES.update(TYPED_SAMPLES)

# scatter_add (tessera/ir/graph_scatter.py): into zeros and into a target
_ST, _SI, _SU = "!tessera.tensor<[11, D], f32>", "!tessera.tensor<[B, S], i64>", "!tessera.tensor<[B, S, D], f32>"
SAMPLES["tessera.scatter_add"] = _fn(
    f"%t : {_ST}, %i : {_SI}, %u : {_SU}",
    f"  %z = tessera.scatter_add %i, %u {{axis = 0 : i64}} : {_SI}, {_SU} -> {_ST}\n"
    f"  %r = tessera.scatter_add %i, %u into %z : {_ST} {{axis = 0 : i64}} : {_SI}, {_SU} -> {_ST}\n"
    f"  func.return %r : {_ST}", _ST)

# attention_grad (tessera/ir/graph_attention_grad.py): dQ, dK, dV packed [B, HKV, G + 2, S, D], reading
# the forward's saved log-sum-exp (the optional lse operand)
_AQ, _AK, _AG = ("!tessera.tensor<[B, 4, S, D], f32>", "!tessera.tensor<[B, 2, S, D], f32>",
                 "!tessera.tensor<[B, 2, 4, S, D], f32>")
SAMPLES["tessera.attention_grad"] = _fn(
    f"%q : {_AQ}, %k : {_AK}, %v : {_AK}, %o : {_AQ}, %g : {_AQ}, %m : !tessera.tensor<[S, S], i1>, "
    f"%l : !tessera.tensor<[B, 4, S], f32>",
    f"  %r = tessera.attention_grad %q, %k, %v, %o, %g mask %m : !tessera.tensor<[S, S], i1> "
    f"lse %l : !tessera.tensor<[B, 4, S], f32> {{causal = true}} : "
    f"{_AQ}, {_AK}, {_AK}, {_AQ}, {_AQ} -> {_AG}\n  func.return %r : {_AG}", _AG)

# the tensor copy engine (copy_engine="tma", sm_90a): Tile IR's bulk ops and their Target IR forms
_BARS = "!tile.buffer<i64, smem>"
_STAGE = "!tile.buffer<bf16, smem>"
SAMPLES["tile.bulk_copy"] = _fn(
    f"%d : {_STAGE}, %m : {_BARS}, %s : index, %r : index, %c : index, %ph : index",
    f"""  tile.bulk_init %m {{count = 1 : i64}} : {_BARS}
  tile.bulk_expect %m[%s] {{bytes = 32768 : i64}} : {_BARS}
  tile.bulk_copy %d[%r], %m[%s] at[%r, %c] {{map = 0 : i64, box = [128 : i64, 64 : i64]}} : {_STAGE}, {_BARS}
  tile.bulk_wait %m[%s], %ph : {_BARS}
  func.return""")
SAMPLES["tile.bulk_init"] = SAMPLES["tile.bulk_expect"] = SAMPLES["tile.bulk_wait"] = None
SAMPLES["tessera_nvidia.tma_load"] = _fn(
    f"%d : {_STAGE}, %m : {_BARS}, %s : index, %r : index, %c : index, %ph : index",
    f"""  tessera_nvidia.mbarrier_init %m[%s] {{count = 1 : i64}} : {_BARS}
  tessera_nvidia.fence_mbarrier_init
  tessera_nvidia.mbarrier_expect_tx %m[%s] {{bytes = 32768 : i64}} : {_BARS}
  tessera_nvidia.tma_load %d[%r], %m[%s], [%r, %c] {{map = 0 : i64, box = [64 : i64, 128 : i64]}} : {_STAGE}, {_BARS}
  tessera_nvidia.mbarrier_wait %m[%s], %ph : {_BARS}
  func.return""")
for _name in ("mbarrier_init", "fence_mbarrier_init", "mbarrier_expect_tx", "mbarrier_wait"):
    SAMPLES[f"tessera_nvidia.{_name}"] = None
