func.func @main(%s : !tessera.tensor<[B, S, S], f32>, %mask : !tessera.tensor<[S, S], f32>) -> !tessera.tensor<[B, S, S], f32> {
  %c = tessera.constant {value = dense<1.250000e-01> : tensor<f32>} : !tessera.tensor<[], f32>
  %a = tessera.mul %s, %c : (!tessera.tensor<[B, S, S], f32>, !tessera.tensor<[], f32>) -> !tessera.tensor<[B, S, S], f32>
  %b = tessera.add %a, %mask : (!tessera.tensor<[B, S, S], f32>, !tessera.tensor<[S, S], f32>) -> !tessera.tensor<[B, S, S], f32>
  %p = tessera.softmax %b {axis = -1 : i64} : (!tessera.tensor<[B, S, S], f32>) -> !tessera.tensor<[B, S, S], f32>
  func.return %p : !tessera.tensor<[B, S, S], f32>
}
