func.func @main(%x : !tessera.tensor<[M, K], f16>, %w1 : !tessera.tensor<[K, N], f16>, %w3 : !tessera.tensor<[K, N], f16>) -> !tessera.tensor<[M, N], f32> {
  %a = tessera.matmul %x, %w1 : (!tessera.tensor<[M, K], f16>, !tessera.tensor<[K, N], f16>) -> !tessera.tensor<[M, N], f32>
  %g = tessera.silu %a : (!tessera.tensor<[M, N], f32>) -> !tessera.tensor<[M, N], f32>
  %b = tessera.matmul %x, %w3 : (!tessera.tensor<[M, K], f16>, !tessera.tensor<[K, N], f16>) -> !tessera.tensor<[M, N], f32>
  %y = tessera.mul %g, %b : (!tessera.tensor<[M, N], f32>, !tessera.tensor<[M, N], f32>) -> !tessera.tensor<[M, N], f32>
  func.return %y : !tessera.tensor<[M, N], f32>
}
