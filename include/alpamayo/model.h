// A loaded model: every weight a sample needs, converted, packed or uploaded once for one backend.
// Immutable and thread-compatible: any number of Sessions (session.h) share it by reference and run in
// parallel; each session holds only its own bound context, activations and scratch.
#pragma once
#include <memory>
#include <string>

#include "alpamayo/backend.h"
#include "alpamayo/checkpoint.h"
#include "alpamayo/config.h"

namespace alpamayo {

class Model {
 public:
  // Loads the checkpoint's weights into `backend` (empty: the default backend). opts.weights picks the
  // weight format among the backend's (empty: its default), opts.kv the KV cache format among its kv_formats
  // (empty: its default). Throws Error for an unknown backend or format.
  static std::shared_ptr<const Model> load(std::shared_ptr<const Checkpoint> ckpt, const std::string& backend = "",
                                           const BackendOptions& opts = {});
  // The same over caller-owned views (tests, benchmarks, embedding): `owner` is kept alive with the model.
  // The views are validated against cfg (shapes and float dtypes) here, once.
  static std::shared_ptr<const Model> from_weights(const ExpertConfig& cfg, const ModelWeights& w,
                                                   std::shared_ptr<const void> owner, const std::string& backend = "",
                                                   const BackendOptions& opts = {});

  const ExpertConfig& config() const { return cfg_; }
  const BackendModel& backend() const { return *backend_; }
  const std::string& backend_name() const { return name_; }
  std::string weights() const { return backend_->weights(); }
  // The KV cache format in use (BackendInfo::kv_formats; the backend's first when none was asked for).
  const std::string& kv() const { return kv_; }
  // The kernels chosen at load, "op=kernel,..." (BackendOptions::kernels); "" for backends without a choice.
  std::string kernels() const { return backend_->kernels(); }
  // The checkpoint's (or caller's) weight views the model was loaded from (kept alive with it): read when a
  // sample turns non-finite, to name the tensor of the failing layer.
  const ModelWeights& weight_views() const { return views_; }

 private:
  Model() = default;
  ExpertConfig cfg_;
  std::string name_;
  std::string kv_;
  std::shared_ptr<const void> owner_;  // what the weight views point into (checkpoint mapping)
  ModelWeights views_;
  std::unique_ptr<BackendModel> backend_;
};

// Throws Error naming the tensor unless w fits cfg: every size within its bound (limits.h), every shape, float
// dtypes, host-readable memory, every value finite (a scan at memory speed, on the exponent bits).
void validate_weights(const ExpertConfig& cfg, const ModelWeights& w);

}  // namespace alpamayo
