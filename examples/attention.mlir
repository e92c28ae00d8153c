func.func @main(%q : !tessera.tensor<[B, H, S, 64], f32>, %k : !tessera.tensor<[B, H, T, 64], f32>, %v : !tessera.tensor<[B, H, T, 64], f32>) -> !tessera.tensor<[B, H, S, 64], f32> {
  %kt = tessera.transpose %k {perm = [0 : i64, 1 : i64, 3 : i64, 2 : i64]} : (!tessera.tensor<[B, H, T, 64], f32>) -> !tessera.tensor<[B, H, 64, T], f32>
  %s = tessera.matmul %q, %kt : (!tessera.tensor<[B, H, S, 64], f32>, !tessera.tensor<[B, H, 64, T], f32>) -> !tessera.tensor<[B, H, S, T], f32>
  %c = tessera.constant {value = dense<1.250000e-01> : tensor<f32>} : !tessera.tensor<[], f32>
  %a = tessera.mul %s, %c : (!tessera.tensor<[B, H, S, T], f32>, !tessera.tensor<[], f32>) -> !tessera.tensor<[B, H, S, T], f32>
  %p = tessera.softmax %a {axis = -1 : i64} : (!tessera.tensor<[B, H, S, T], f32>) -> !tessera.tensor<[B, H, S, T], f32>
  %o = tessera.matmul %p, %v : (!tessera.tensor<[B, H, S, T], f32>, !tessera.tensor<[B, H, T, 64], f32>) -> !tessera.tensor<[B, H, S, 64], f32>
  func.return %o : !tessera.tensor<[B, H, S, 64], f32>
}
