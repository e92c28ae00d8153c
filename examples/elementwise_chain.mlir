func.func @main(%x : !tessera.tensor<[R, C], f32>, %y : !tessera.tensor<[C], f32>) -> !tessera.tensor<[C, R], f32> {
  %n = tessera.neg %x : (!tessera.tensor<[R, C], f32>) -> !tessera.tensor<[R, C], f32>
  %nn = tessera.neg %n : (!tessera.tensor<[R, C], f32>) -> !tessera.tensor<[R, C], f32>
  %m = tessera.mul %nn, %y : (!tessera.tensor<[R, C], f32>, !tessera.tensor<[C], f32>) -> !tessera.tensor<[R, C], f32>
  %t = tessera.tanh %m : (!tessera.tensor<[R, C], f32>) -> !tessera.tensor<[R, C], f32>
  %s = tessera.silu %t : (!tessera.tensor<[R, C], f32>) -> !tessera.tensor<[R, C], f32>
  %a = tessera.transpose %s {perm = [1 : i64, 0 : i64]} : (!tessera.tensor<[R, C], f32>) -> !tessera.tensor<[C, R], f32>
  %b = tessera.transpose %a {perm = [1 : i64, 0 : i64]} : (!tessera.tensor<[C, R], f32>) -> !tessera.tensor<[R, C], f32>
  %c = tessera.transpose %b {perm = [1 : i64, 0 : i64]} : (!tessera.tensor<[R, C], f32>) -> !tessera.tensor<[C, R], f32>
  func.return %c : !tessera.tensor<[C, R], f32>
}
