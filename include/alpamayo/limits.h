// Bounds on every size and number the engine reads from an untrusted source (config.json, the checkpoint's
// tensor shapes, a context, the command line, the C and Python APIs), and the memory a model and a session
// will need, estimated from the sizes before anything is allocated (docs/SECURITY.md).
//
// The bounds are far beyond every released model (Alpamayo 2 Super: L 64, D 1536, I 6144, T 64, 10 steps,
// dt 0.1 s) and far below what would overflow a size computation or make the fp32 arithmetic meaningless;
// crossing one is an error naming the value, where it came from and the bound.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "alpamayo/backend.h"
#include "alpamayo/config.h"

namespace alpamayo {

namespace limits {
// Transformer sizes (from the checkpoint's tensors).
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHidden = 1 << 16;  // D, action_in_proj hidden size
inline constexpr int64_t kMaxMlp = 1 << 18;     // I
inline constexpr int64_t kMaxHeads = 1024;      // Hq, Hkv
inline constexpr int64_t kMaxHeadDim = 1024;    // d
// action_in_proj.
inline constexpr int64_t kMaxEncLayers = 64;
inline constexpr int64_t kMaxFourier = 1024;
inline constexpr double kMaxFreq = 1e6;
// Action space and sampler.
inline constexpr int64_t kMaxWaypoints = 4096;   // n_waypoints T
inline constexpr int64_t kMaxSteps = 100000;     // num_inference_steps / --steps
inline constexpr double kMinDt = 1e-4, kMaxDt = 100.0;  // seconds per waypoint
inline constexpr double kMaxActionStat = 1e3;    // |mean|, std (std > 0) of acceleration and curvature
inline constexpr double kMaxBound = 1e3;         // |accel_bounds|, |curvature_bounds|
inline constexpr double kMaxFitWeight = 1e6;     // v_lambda, v_ridge in [0, this]
inline constexpr double kMaxSpeed = 1e3;         // |v0| in m/s: given, in the context or estimated
inline constexpr double kMaxPosition = 1e7;      // |ego_history_xyz| in m (the ego frame at t0)
inline constexpr double kMaxTemperature = 1e6;
inline constexpr double kMaxGuidanceWeight = 1e3;
inline constexpr double kMaxRopeTheta = 1e30;
}  // namespace limits

// Throws Error(code, "<what> = <value> is outside [lo, hi]<why>") unless lo <= v <= hi (NaN is outside). code:
// InvalidArgument for an option the caller passed, Format for a value read from a file.
void check_range(double v, double lo, double hi, const std::string& what, const std::string& why = "",
                 ErrorCode code = ErrorCode::InvalidArgument);

// Values in an expert layer's weight matrices (q, k, v, o, gate, up, down).
double layer_matrix_params(const ExpertConfig& c);
// Bytes per value of a weight matrix held in host memory in `format` (bf16, int8, fp8, bfp8_b, bfp4_b, f32),
// scales and shared exponents included: what a host backend declares in BackendMemory::host_bytes_per_weight.
double host_bytes_per_weight(const std::string& format);

// The host memory the `backend` needs to hold the model's weights in `format` (beyond the checkpoint's
// mapping, which the page cache holds and may evict).
MemoryEstimate estimate_model_memory(const ExpertConfig& c, const std::string& backend, const std::string& format);
// The host memory one bound session needs: activations and scratch of a step over B samples attending to up
// to `attended` rows each, rope tables, captures, guidance, and what the backend declares
// (BackendMemory::session_bytes: converted caches, fp32 copies of a layer).
MemoryEstimate estimate_session_memory(const ExpertConfig& c, const std::string& backend, const KVCache& kv,
                                       const KVCache* unguided, bool capture_layers);

// Bytes the process may still allocate: MemAvailable from /proc/meminfo, capped by RLIMIT_AS / RLIMIT_DATA
// headroom and by the ALPAMAYO_MEMORY_LIMIT environment variable (bytes, or with a K/M/G suffix) when set.
// Negative when unknown (no check is then made).
double available_memory_bytes(std::string* source = nullptr);

// Throws Error (out of memory) naming `stage`, the estimate and what is available when the estimate does not fit.
void check_memory(const MemoryEstimate& e, const std::string& stage);

// "1.5 GiB", "12 KiB".
std::string format_bytes(double b);

// What the process is doing, for messages about failures that cannot name their place themselves (an
// std::bad_alloc caught at the CLI or C API boundary): "loading the model (reference backend, estimated
// 1.2 GiB: ...)". A thread-local stack; StageScope pushes on construction and pops on destruction.
class StageScope {
 public:
  explicit StageScope(std::string what);
  ~StageScope();
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;
};
// The innermost stage of this thread ("" outside every stage).
std::string current_stage();
// The message for an std::bad_alloc caught at an API boundary: names the stage, its estimate, and what is
// available.
std::string out_of_memory_message();

}  // namespace alpamayo
