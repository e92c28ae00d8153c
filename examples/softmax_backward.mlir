func.func @main(%y : !tessera.tensor<[T, V], f32>, %g : !tessera.tensor<[T, V], f32>) -> !tessera.tensor<[T, V], f32> {
  %gy = tessera.mul %g, %y : (!tessera.tensor<[T, V], f32>, !tessera.tensor<[T, V], f32>) -> !tessera.tensor<[T, V], f32>
  %s = tessera.reduce_sum %gy {axes = [1 : i64], keepdims = true} : (!tessera.tensor<[T, V], f32>) -> !tessera.tensor<[T, 1], f32>
  %d = tessera.sub %g, %s : (!tessera.tensor<[T, V], f32>, !tessera.tensor<[T, 1], f32>) -> !tessera.tensor<[T, V], f32>
  %dx = tessera.mul %y, %d : (!tessera.tensor<[T, V], f32>, !tessera.tensor<[T, V], f32>) -> !tessera.tensor<[T, V], f32>
  func.return %dx : !tessera.tensor<[T, V], f32>
}
