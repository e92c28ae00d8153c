func.func @main(%q : !tessera.tensor<[B, 8, S, 64], bf16>, %k : !tessera.tensor<[B, 2, T, 64], bf16>, %v : !tessera.tensor<[B, 2, T, 64], bf16>) -> !tessera.tensor<[B, 8, S, 64], bf16> {
  %o = tessera.attention %q, %k, %v {causal = true, masked_rows = "zero"} : !tessera.tensor<[B, 8, S, 64], bf16>, !tessera.tensor<[B, 2, T, 64], bf16>, !tessera.tensor<[B, 2, T, 64], bf16> -> !tessera.tensor<[B, 8, S, 64], bf16>
  func.return %o : !tessera.tensor<[B, 8, S, 64], bf16>
}
