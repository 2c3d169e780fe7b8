// Views of every weight a sample needs, as stored in the checkpoint (F32, F16 or BF16, PyTorch layout
// [out, in]). A Checkpoint hands these to Model::load; tests and benchmarks may build them over their
// own buffers. The data must outlive the Model built from them (Model keeps a caller-given owner alive).
#pragma once
#include <vector>

#include "alpamayo/tensor.h"

namespace alpamayo {

// One expert layer (docs/MATH.md section 4).
struct LayerWeights {
  TensorView input_norm;      // [D]
  TensorView post_norm;       // [D]
  TensorView q, k, v;         // [Hq*d, D], [Hkv*d, D], [Hkv*d, D]
  TensorView o;               // [D, Hq*d]
  TensorView q_norm, k_norm;  // [d]
  TensorView gate, up;        // [I, D]
  TensorView down;            // [D, I]
};

struct ExpertWeights {
  std::vector<LayerWeights> layers;
  TensorView final_norm;  // [D]
};

// action_in_proj (docs/MATH.md section 3).
struct ActionInProjWeights {
  std::vector<TensorView> linear_w, linear_b;  // trunk Linears, in order (num_enc_layers + 1)
  std::vector<TensorView> norm_w;              // trunk RMSNorms (num_enc_layers)
  TensorView ln_w, ln_b;                       // the final LayerNorm
  std::vector<TensorView> freqs;               // A sinus buffers then the timestep one; empty if absent
};

struct ActionOutProjWeights {
  TensorView w, b;  // [A, D], [A]
};

struct ModelWeights {
  ExpertWeights expert;
  ActionInProjWeights action_in;
  ActionOutProjWeights action_out;
};

}  // namespace alpamayo
