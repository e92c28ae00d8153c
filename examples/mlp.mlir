func.func @main(%x : !tessera.tensor<[M, K], f32>, %w : !tessera.tensor<[K, N], f32>, %b : !tessera.tensor<[N], f32>) -> !tessera.tensor<[M, N], f32> {
  %y = tessera.matmul %x, %w : (!tessera.tensor<[M, K], f32>, !tessera.tensor<[K, N], f32>) -> !tessera.tensor<[M, N], f32>
  %z = tessera.add %y, %b : (!tessera.tensor<[M, N], f32>, !tessera.tensor<[N], f32>) -> !tessera.tensor<[M, N], f32>
  %g = tessera.gelu %z {approximate = "tanh"} : (!tessera.tensor<[M, N], f32>) -> !tessera.tensor<[M, N], f32>
  func.return %g : !tessera.tensor<[M, N], f32>
}
