func.func @main(%x : !tessera.tensor<[T, D], f32>, %r : !tessera.tensor<[T, D], f32>, %g : !tessera.tensor<[D], f32>, %b : !tessera.tensor<[D], f32>) -> !tessera.tensor<[T, D], f32> {
  %s = tessera.add %x, %r : (!tessera.tensor<[T, D], f32>, !tessera.tensor<[T, D], f32>) -> !tessera.tensor<[T, D], f32>
  %y = tessera.layer_norm %s scale %g : !tessera.tensor<[D], f32> bias %b : !tessera.tensor<[D], f32> {eps = 1.000000e-05 : f64} : !tessera.tensor<[T, D], f32> -> !tessera.tensor<[T, D], f32>
  func.return %y : !tessera.tensor<[T, D], f32>
}
