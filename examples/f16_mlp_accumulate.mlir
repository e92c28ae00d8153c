func.func @main(%x : !tessera.tensor<[B, M, K], f16>, %w : !tessera.tensor<[K, N], f16>, %c : !tessera.tensor<[B, M, N], f32>, %b : !tessera.tensor<[N], f32>) -> !tessera.tensor<[B, M, N], f32> {
  %y = tessera.matmul %x, %w : (!tessera.tensor<[B, M, K], f16>, !tessera.tensor<[K, N], f16>) -> !tessera.tensor<[B, M, N], f32>
  %acc = tessera.add %y, %c : (!tessera.tensor<[B, M, N], f32>, !tessera.tensor<[B, M, N], f32>) -> !tessera.tensor<[B, M, N], f32>
  %z = tessera.add %acc, %b : (!tessera.tensor<[B, M, N], f32>, !tessera.tensor<[N], f32>) -> !tessera.tensor<[B, M, N], f32>
  %g = tessera.silu %z : (!tessera.tensor<[B, M, N], f32>) -> !tessera.tensor<[B, M, N], f32>
  func.return %g : !tessera.tensor<[B, M, N], f32>
}
