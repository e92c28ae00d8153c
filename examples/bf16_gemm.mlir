func.func @main(%a : !tessera.tensor<[M, K], bf16>, %b : !tessera.tensor<[K, N], bf16>) -> !tessera.tensor<[M, N], f32> {
  %y = tessera.matmul %a, %b : (!tessera.tensor<[M, K], bf16>, !tessera.tensor<[K, N], bf16>) -> !tessera.tensor<[M, N], f32>
  func.return %y : !tessera.tensor<[M, N], f32>
}
