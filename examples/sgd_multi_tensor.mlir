func.func @main(%w : !tessera.tensor<[N, K], f32>, %gw : !tessera.tensor<[N, K], f32>, %b : !tessera.tensor<[K], f32>, %gb : !tessera.tensor<[K], f32>) -> (!tessera.tensor<[N, K], f32>, !tessera.tensor<[K], f32>) {
  %lr = tessera.constant {value = dense<1.000000e-02> : tensor<f32>} : !tessera.tensor<[], f32>
  %sw = tessera.mul %gw, %lr : (!tessera.tensor<[N, K], f32>, !tessera.tensor<[], f32>) -> !tessera.tensor<[N, K], f32>
  %w2 = tessera.sub %w, %sw : (!tessera.tensor<[N, K], f32>, !tessera.tensor<[N, K], f32>) -> !tessera.tensor<[N, K], f32>
  %lr2 = tessera.constant {value = dense<2.000000e-02> : tensor<f32>} : !tessera.tensor<[], f32>
  %sb = tessera.mul %gb, %lr2 : (!tessera.tensor<[K], f32>, !tessera.tensor<[], f32>) -> !tessera.tensor<[K], f32>
  %b2 = tessera.sub %b, %sb : (!tessera.tensor<[K], f32>, !tessera.tensor<[K], f32>) -> !tessera.tensor<[K], f32>
  func.return %w2, %b2 : !tessera.tensor<[N, K], f32>, !tessera.tensor<[K], f32>
}
