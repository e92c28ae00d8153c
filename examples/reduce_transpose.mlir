func.func @main(%x : !tessera.tensor<[A, B, C], f32>) -> (!tessera.tensor<[A, C], f32>, !tessera.tensor<[C, A, B], f32>) {
  %m = tessera.reduce_mean %x {axes = [1 : i64], keepdims = false} : (!tessera.tensor<[A, B, C], f32>) -> !tessera.tensor<[A, C], f32>
  %t = tessera.transpose %x {perm = [2 : i64, 0 : i64, 1 : i64]} : (!tessera.tensor<[A, B, C], f32>) -> !tessera.tensor<[C, A, B], f32>
  func.return %m, %t : !tessera.tensor<[A, C], f32>, !tessera.tensor<[C, A, B], f32>
}
