// alpamayo_expert._core: the C++ engine (Checkpoint, Model, Context, Session) for Python, with nanobind.
//
// Caches are taken through DLPack (torch tensors, numpy arrays, anything with __dlpack__ or the buffer
// protocol) as views: a row-major tensor is never copied, its owner is kept alive by the Context. A
// non-contiguous host tensor is copied into a row-major buffer the Context owns (unless copy=False); device
// memory is viewed as it is, and a backend that cannot read it refuses it at bind. Model loading, binding and
// sampling release the GIL. An alpamayo::Error becomes the class of its code (alpamayo_expert.errors: one
// subclass of alpamayo_expert.Error per code, as the C API has one status per code) with the engine's message.
// The pure-Python layer (python/alpamayo_expert/engine.py) normalises arguments and builds the public classes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "alpamayo/limits.h"
#ifdef ALPAMAYO_WITH_CPU_BACKEND
#include "backends/cpu/profile/profile_table.h"
#endif
#include "alpamayo/bfp.h"
#include "alpamayo/engine.h"
#include "alpamayo/environment.h"
#include "alpamayo/error.h"
#include "model/sampler.h"  // gaussian_noise

namespace nb = nanobind;
using namespace nb::literals;

namespace alpamayo::python {
namespace {

using AnyArray = nb::ndarray<nb::ro>;
using HostF32 = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;

DType dtype_of(const AnyArray& a, const std::string& name) {
  const nb::dlpack::dtype t = a.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
  if (t.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && t.bits == 32) return DType::F32;
    if (code == nb::dlpack::dtype_code::Float && t.bits == 16) return DType::F16;
    if (code == nb::dlpack::dtype_code::Bfloat && t.bits == 16) return DType::BF16;
    if (code == nb::dlpack::dtype_code::Float && t.bits == 64) return DType::F64;
    if (code == nb::dlpack::dtype_code::Int && t.bits == 64) return DType::I64;
    if (code == nb::dlpack::dtype_code::Int && t.bits == 32) return DType::I32;
  }
  throw Error(name + ": unsupported element type (DLPack code " + std::to_string(t.code) + ", " +
              std::to_string(t.bits) + " bits, " + std::to_string(t.lanes) + " lanes); caches must be float32, "
              "float16 or bfloat16");
}

Device device_of(const AnyArray& a, const std::string& name) {
  const int32_t type = a.device_type();
  switch (type) {
    case 1: return {DeviceType::CPU, a.device_id()};
    case 2: return {DeviceType::CUDA, a.device_id()};
    case 3: return {DeviceType::CUDAHost, a.device_id()};
    default:
      throw Error(ErrorCode::Unsupported,
                  name + ": memory of DLPack device type " + std::to_string(type) +
                      ", which the engine does not know (it reads cpu, cuda and cuda_host memory)");
  }
}

// The context's own copy of a non-contiguous host tensor, row-major.
std::vector<uint8_t> copy_row_major(const TensorView& v) {
  const size_t es = dtype_size(v.dtype);
  std::vector<uint8_t> out(v.nbytes());
  const int nd = static_cast<int>(v.shape.size());
  std::vector<int64_t> idx(nd, 0);
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int k = 0; k < nd; ++k) off += idx[k] * v.strides[k];
    std::memcpy(out.data() + i * es, static_cast<const uint8_t*>(v.data) + off * int64_t(es), es);
    for (int k = nd - 1; k >= 0; --k) {
      if (++idx[k] < v.shape[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

// Python's own open() refuses a path with a NUL byte (ValueError: embedded null byte); the system call would
// take the NUL as the end and open another file. The same here, naming the argument and the whole path.
void check_path(const std::string& path, const char* call, const char* arg) {
  const size_t at = path.find('\0');
  if (at == std::string::npos) return;
  std::string shown;
  for (char c : path.substr(0, 200)) shown += c == '\0' ? std::string("\\x00") : std::string(1, c);
  throw nb::value_error((std::string(call) + ": " + arg + ": embedded null byte in the path '" + shown + "' (at byte " +
                         std::to_string(at) + "); a path cannot contain NUL").c_str());
}

struct ModelHandle {
  std::shared_ptr<const Checkpoint> ck;  // null for models built from weights
  std::shared_ptr<const Model> m;
};

// A validated context and everything its views point into: the caller's arrays (kept alive) and the
// row-major copies made of non-contiguous ones.
struct CtxHandle {
  std::optional<Context> ctx;
  std::vector<AnyArray> owners;
  std::vector<std::vector<uint8_t>> copies;
  std::vector<std::string> copied;  // names of the tensors that were copied

  const Context& get() const {
    if (!ctx) throw Error(ErrorCode::InvalidState, "Context: not initialised");
    return *ctx;
  }

  TensorView view(const AnyArray& a, const std::string& name, bool allow_copy) {
    TensorView v;
    v.name = name;
    v.dtype = dtype_of(a, name);
    v.device = device_of(a, name);
    v.data = a.data();
    for (size_t k = 0; k < a.ndim(); ++k) {
      v.shape.push_back(static_cast<int64_t>(a.shape(k)));
      v.strides.push_back(static_cast<int64_t>(a.stride(k)));
    }
    owners.push_back(a);
    if (!v.is_contiguous() && v.numel() > 0) {
      if (!v.device.host_accessible())
        throw Error(name + ": a non-contiguous tensor in " + v.device.str() +
                    " memory (strides " + shape_str(v.strides) + "); the engine reads row-major caches: make it "
                    "contiguous on its device first (.contiguous())");
      if (!allow_copy)
        throw Error(name + ": not row-major contiguous (shape " + shape_str(v.shape) + ", strides " +
                    shape_str(v.strides) + ") and copy=False");
      copies.push_back(copy_row_major(v));
      v.data = copies.back().data();
      v.strides.clear();
      copied.push_back(name);
    }
    return v;
  }
};

std::vector<TensorView> views(CtxHandle& pc, const std::vector<AnyArray>& list, const std::string& prefix,
                              bool allow_copy) {
  std::vector<TensorView> out;
  for (size_t l = 0; l < list.size(); ++l) out.push_back(pc.view(list[l], prefix + std::to_string(l), allow_copy));
  return out;
}

void check_4d(const std::vector<TensorView>& key, const std::string& what) {
  const TensorView& k0 = key[0];
  check(k0.shape.size() == 4, k0.name + ": expected shape [" + what + ", Hkv, rows, d], found " + shape_str(k0.shape));
}

// The ego history of B samples from [B, H, 3] positions and [B, H, 3, 3] rotations (both or neither).
std::optional<EgoHistory> history_of(const std::optional<HostF32>& history_xyz, const std::optional<HostF32>& history_rot,
                                     int64_t B, const std::string& name) {
  std::optional<EgoHistory> hist;
  check(history_xyz.has_value() == history_rot.has_value(),
        name + ": ego_history_xyz and ego_history_rot must be given together");
  if (history_xyz) {
    const HostF32& x = *history_xyz;
    const HostF32& r = *history_rot;
    auto shape_of = [](const HostF32& a) {
      std::vector<int64_t> sh;
      for (size_t k = 0; k < a.ndim(); ++k) sh.push_back(static_cast<int64_t>(a.shape(k)));
      return shape_str(sh);
    };
    check(x.ndim() == 3 && x.shape(2) == 3,
          name + ": ego_history_xyz: expected shape [B, H, 3], found " + shape_of(x));
    EgoHistory h;
    h.H = static_cast<int>(x.shape(1));
    check(static_cast<int64_t>(x.shape(0)) == B,
          name + ": ego_history_xyz has " + std::to_string(x.shape(0)) + " samples, the context B = " +
              std::to_string(B));
    check(r.ndim() == 4 && static_cast<int64_t>(r.shape(0)) == B && static_cast<int64_t>(r.shape(1)) == h.H &&
              r.shape(2) == 3 && r.shape(3) == 3,
          name + ": ego_history_rot: expected shape [" + std::to_string(B) + ", " + std::to_string(h.H) +
              ", 3, 3], found " + shape_of(r));
    h.xyz.assign(x.data(), x.data() + x.size());
    h.rot.assign(r.data(), r.data() + r.size());
    hist = std::move(h);
  }
  return hist;
}

CtxHandle* context_from_arrays(const std::vector<AnyArray>& keys, const std::vector<AnyArray>& values,
                               std::vector<int64_t> valid_len, std::vector<int64_t> rope_delta,
                               std::vector<int64_t> prefix_pad, std::vector<int64_t> prompt_index,
                               const std::vector<AnyArray>& suffix_keys, const std::vector<AnyArray>& suffix_values,
                               std::vector<int64_t> suffix_len, std::optional<HostF32> history_xyz,
                               std::optional<HostF32> history_rot, std::optional<std::vector<float>> v0,
                               bool allow_copy, const std::string& name) {
  auto pc = std::make_unique<CtxHandle>();
  KVCache kv;
  check(!keys.empty(), name + ": the KV cache has no layers (keys is empty)");
  check(keys.size() == values.size(), name + ": " + std::to_string(keys.size()) + " key layers but " +
                                          std::to_string(values.size()) + " value layers");
  kv.key = views(*pc, keys, name + ": key.", allow_copy);
  kv.value = views(*pc, values, name + ": value.", allow_copy);
  check_4d(kv.key, "G");
  kv.G = static_cast<int>(kv.key[0].shape[0]);
  kv.Hkv = static_cast<int>(kv.key[0].shape[1]);
  kv.P = static_cast<int>(kv.key[0].shape[2]);
  kv.d = static_cast<int>(kv.key[0].shape[3]);
  kv.valid_len = std::move(valid_len);
  kv.prefix_pad = std::move(prefix_pad);
  kv.prompt_of = std::move(prompt_index);
  kv.B = kv.prompt_of.empty() ? kv.G : static_cast<int>(kv.prompt_of.size());
  const bool any_suffix = !suffix_keys.empty() || !suffix_values.empty() || !suffix_len.empty();
  if (any_suffix) {
    check(!suffix_keys.empty() && !suffix_values.empty() && !suffix_len.empty(),
          name + ": suffix_keys, suffix_values and suffix_len must be given together");
    check(suffix_keys.size() == values.size() && suffix_values.size() == values.size(),
          name + ": suffix caches have " + std::to_string(suffix_keys.size()) + "/" +
              std::to_string(suffix_values.size()) + " layers, the prompt caches " + std::to_string(keys.size()));
    kv.suffix_key = views(*pc, suffix_keys, name + ": suffix_key.", allow_copy);
    kv.suffix_value = views(*pc, suffix_values, name + ": suffix_value.", allow_copy);
    check_4d(kv.suffix_key, "B");
    kv.Q = static_cast<int>(kv.suffix_key[0].shape[2]);
    kv.suffix_len = std::move(suffix_len);
  }
  std::optional<EgoHistory> hist = history_of(history_xyz, history_rot, kv.B, name);
  {
    nb::gil_scoped_release release;  // validation scans every row in use for NaN/Inf
    pc->ctx = Context::from_views(std::move(kv), std::move(rope_delta), std::move(hist), std::move(v0), name);
  }
  return pc.release();
}

// A serving engine's paged cache (Context::from_paged), read in place whatever its strides: per layer page pools
// (value_pages empty: K and V combined in key_pages), the block table [B, max_pages] int32 or int64 in host memory.
CtxHandle* context_from_paged(const std::vector<AnyArray>& key_pages, const std::vector<AnyArray>& value_pages,
                              const AnyArray& block_table, std::vector<int64_t> valid_len,
                              std::vector<int64_t> rope_delta, const std::string& layout,
                              std::optional<HostF32> history_xyz, std::optional<HostF32> history_rot,
                              std::optional<std::vector<float>> v0, const std::string& name) {
  auto pc = std::make_unique<CtxHandle>();
  auto raw = [&](const AnyArray& a, const std::string& what) {
    TensorView v;
    v.name = what;
    v.dtype = dtype_of(a, what);
    v.device = device_of(a, what);
    v.data = a.data();
    for (size_t k = 0; k < a.ndim(); ++k) {
      v.shape.push_back(static_cast<int64_t>(a.shape(k)));
      v.strides.push_back(static_cast<int64_t>(a.stride(k)));
    }
    pc->owners.push_back(a);
    return v;
  };
  std::vector<TensorView> keys, values;
  for (size_t l = 0; l < key_pages.size(); ++l)
    keys.push_back(raw(key_pages[l], name + ": key_pages[" + std::to_string(l) + "]"));
  for (size_t l = 0; l < value_pages.size(); ++l)
    values.push_back(raw(value_pages[l], name + ": value_pages[" + std::to_string(l) + "]"));
  const TensorView table = raw(block_table, name + ": block_table");
  std::optional<EgoHistory> hist = history_of(history_xyz, history_rot, int64_t(valid_len.size()), name);
  {
    nb::gil_scoped_release release;  // validation scans every row in use for NaN/Inf
    pc->ctx = Context::from_paged(std::move(keys), std::move(values), table, std::move(valid_len),
                                  std::move(rope_delta), layout, std::move(hist), std::move(v0), name);
  }
  return pc.release();
}

// A float32 array over a moved vector: no copy, the capsule frees it.
nb::object array_f32(std::vector<float>&& v, std::vector<size_t> shape) {
  auto* holder = new std::vector<float>(std::move(v));
  nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, float>(holder->data(), shape.size(), shape.data(), owner));
}

nb::dict config_dict(const ExpertConfig& c) {
  nb::dict d;
  d["release"] = release_name(c.release);
  d["model_type"] = release_model_type(c.release);
  d["layers"] = c.L;
  d["hidden_size"] = c.D;
  d["num_attention_heads"] = c.Hq;
  d["num_key_value_heads"] = c.Hkv;
  d["head_dim"] = c.d;
  d["intermediate_size"] = c.I;
  d["rms_norm_eps"] = c.rms_eps;
  d["rope_theta"] = c.rope_theta;
  d["n_waypoints"] = c.T;
  d["action_dims"] = c.A;
  d["dt"] = c.dt;
  d["num_inference_steps"] = c.num_steps;
  d["use_classifier_free_guidance"] = c.use_cfg;
  d["inference_guidance_weight"] = c.guidance_weight;
  // What a port that runs the host stages itself needs (alpamayo_expert.tt): action_in_proj and the action space.
  d["ain_hidden"] = c.ain_hidden;
  d["ain_layers"] = c.ain_layers;
  d["num_fourier_feats"] = c.n_fourier;
  d["max_freq"] = c.max_freq;
  d["ain_norm_eps"] = c.ain_norm_eps;
  return d;
}

// Every weight the engine loaded, as float32 copies under the names of weights.h (layers.{l}.q, action_in.*,
// action_out.*): one loader for every port that runs outside the C++ backends.
nb::dict weights_dict(const Checkpoint& ck, const std::string& prefix) {
  nb::dict d;
  auto put = [&](const std::string& name, const TensorView& t) {
    if (!t.data || name.compare(0, prefix.size(), prefix) != 0) return;  // one layer at a time keeps memory low
    std::vector<size_t> shape(t.shape.begin(), t.shape.end());
    d[name.c_str()] = array_f32(to_f32(t), shape);
  };
  const ModelWeights w = ck.weights();
  for (size_t l = 0; l < w.expert.layers.size(); ++l) {
    const LayerWeights& lw = w.expert.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    put(p + "input_norm", lw.input_norm);
    put(p + "post_norm", lw.post_norm);
    put(p + "q", lw.q);
    put(p + "k", lw.k);
    put(p + "v", lw.v);
    put(p + "o", lw.o);
    put(p + "q_norm", lw.q_norm);
    put(p + "k_norm", lw.k_norm);
    put(p + "gate", lw.gate);
    put(p + "up", lw.up);
    put(p + "down", lw.down);
  }
  put("final_norm", w.expert.final_norm);
  const ActionInProjWeights& a = w.action_in;
  for (size_t i = 0; i < a.linear_w.size(); ++i) put("action_in.linear_w." + std::to_string(i), a.linear_w[i]);
  for (size_t i = 0; i < a.linear_b.size(); ++i) put("action_in.linear_b." + std::to_string(i), a.linear_b[i]);
  for (size_t i = 0; i < a.norm_w.size(); ++i) put("action_in.norm_w." + std::to_string(i), a.norm_w[i]);
  put("action_in.ln_w", a.ln_w);
  put("action_in.ln_b", a.ln_b);
  for (size_t i = 0; i < a.freqs.size(); ++i) put("action_in.freqs." + std::to_string(i), a.freqs[i]);
  put("action_out.w", w.action_out.w);
  put("action_out.b", w.action_out.b);
  return d;
}

// One StepProfile (alpamayo/backend.h) as a dict; "table": the --profile table of the CLI.
nb::dict profile_dict(const StepProfile& p) {
  nb::dict d;
  d["weights"] = p.weights;
  d["threads"] = p.threads;
  d["B"] = p.B;
  d["T"] = p.T;
  d["L"] = p.L;
  d["s_max"] = p.s_max;
  d["wall_seconds"] = p.wall_seconds;
  d["isa"] = p.isa;
  d["kernel_pin"] = p.kernel_pin;
  d["peak_threads"] = p.peak_threads;
  nb::list phases, kernels, ops;
  for (const ProfilePhase& ph : p.phases) {
    nb::dict e;
    e["name"] = ph.name;
    e["seconds"] = ph.seconds;
    e["idle"] = ph.idle;
    phases.append(e);
  }
  for (const ProfileKernel& k : p.kernels) {
    nb::dict e;
    e["op"] = k.op;
    e["kernel"] = k.kernel;
    e["why"] = k.why;
    e["rate"] = k.rate;
    e["unit"] = k.unit;
    e["instruction"] = k.instruction;
    e["check"] = k.check;
    kernels.append(e);
  }
  for (const ProfileOp& o : p.ops) {
    nb::dict e;
    e["op"] = o.op;
    e["kernel"] = o.kernel;
    e["instruction"] = o.instruction;
    e["gflop"] = o.gflop;
    e["peak"] = o.peak;
    e["floor_ms"] = o.floor_ms;
    e["actual_ms"] = o.actual_ms;
    e["achieved"] = o.achieved();
    e["gbytes"] = o.gbytes;
    e["read_gbs"] = o.read_gbs;
    e["compute_ms"] = o.compute_ms;
    e["memory_ms"] = o.memory_ms;
    ops.append(e);
  }
  d["phases"] = phases;
  d["kernels"] = kernels;
  d["ops"] = ops;
#ifdef ALPAMAYO_WITH_CPU_BACKEND
  d["table"] = cpu::format_profile(p);
#endif
  return d;
}

struct SessionHandle {
  std::shared_ptr<const Model> model;
  Session s;
  std::mutex mu;  // one call at a time: a Session is not safe for concurrent use
  nb::object bound = nb::none(), unguided = nb::none();  // the bound contexts (and their arrays) stay alive

  explicit SessionHandle(std::shared_ptr<const Model> m) : model(m), s(std::move(m)) {}

  // Taken with the GIL held and never waited for, so no thread blocks on it while holding the GIL.
  std::unique_lock<std::mutex> acquire() {
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    if (!lock.owns_lock())
      throw Error(ErrorCode::InvalidState,
                  "Session: in use by another thread (a Session runs one call at a time; give each thread its own "
                  "Session: sessions of one Model run in parallel)");
    return lock;
  }
};

// alpamayo_expert.errors.ERRORS, indexed by ErrorCode; set once at import and kept for the process.
PyObject* g_errors[static_cast<int>(ErrorCode::Internal) + 1] = {};

void raise_error(ErrorCode code, const char* msg) { PyErr_SetString(g_errors[static_cast<int>(code)], msg); }

// The classes from the pure-Python module, so that the package and the native module raise the same ones.
void bind_errors(nb::module_& m) {
  nb::module_ errors = nb::module_::import_("alpamayo_expert.errors");
  m.attr("Error") = errors.attr("Error");
  nb::tuple by_code = nb::borrow<nb::tuple>(errors.attr("ERRORS"));
  if (by_code.size() != std::size(g_errors)) throw std::runtime_error("alpamayo_expert.errors.ERRORS: wrong length");
  for (size_t i = 0; i < std::size(g_errors); ++i) {
    nb::object cls = by_code[i];
    g_errors[i] = cls.inc_ref().ptr();
    m.attr(nb::borrow<nb::str>(cls.attr("__name__"))) = cls;
  }
  // The same mapping as the C API's (src/capi/alpamayo_c.cpp): the code of an alpamayo::Error, allocation failures
  // out of memory (naming the stage that ran out, limits.h), file system errors I/O. Other exceptions go on to
  // nanobind's own translation.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      raise_error(e.code(), e.what());
    } catch (const std::bad_alloc&) {
      raise_error(ErrorCode::OutOfMemory, out_of_memory_message().c_str());
    } catch (const std::length_error& e) {
      raise_error(ErrorCode::OutOfMemory, (std::string("allocation too large: ") + e.what()).c_str());
    } catch (const std::filesystem::filesystem_error& e) {
      raise_error(ErrorCode::IO, e.what());
    }
  });
}

}  // namespace
}  // namespace alpamayo::python

using namespace alpamayo;
using namespace alpamayo::python;

// The binding table (about 200 lines): one statement per exported class, method and function, as nanobind's idiom
// has it; the work is in the functions above.
NB_MODULE(_core, m) {
  m.doc() = "The Alpamayo action-expert engine (C++), bound with nanobind. Use the classes of alpamayo_expert.";
  bind_errors(m);

  m.def("backends", [] {
    std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>, std::string>> out;
    for (const BackendInfo& b : registered_backends())
      out.emplace_back(b.name, b.weight_formats, b.kv_formats, b.unavailable());
    return out;
  }, "Every backend of this build: (name, weight formats, KV cache formats (the first of each is the default), why it "
     "cannot run here or '').");

  m.def("backend_formats", [](const std::string& name) {
    for (const BackendInfo& b : registered_backends()) {
      if (b.name != name) continue;
      const std::string why = b.unavailable();
      std::vector<std::pair<std::string, std::string>> out;
      for (const std::string& w : b.weight_formats) out.emplace_back(w, why.empty() ? b.format_unavailable(w) : why);
      return out;
    }
    std::string known;
    for (const BackendInfo& b : registered_backends()) known += (known.empty() ? "" : ", ") + b.name;
    throw Error(ErrorCode::InvalidArgument, "backend_formats: no backend '" + name + "' in this build (" + known + ")");
  }, "name"_a, "A backend's weight formats, each with why this machine cannot run it or '' (e.g. fp8 on a GPU "
     "older than sm_89).");

  m.def("bfp_quantize", [](HostF32 x, const std::string& fmt) {
    bfp::Format f;
    if (!bfp::parse_format(fmt, &f)) throw Error(ErrorCode::InvalidArgument, "bfp_quantize: unknown format " + fmt);
    if (x.size() % bfp::kBlockSize != 0)
      throw Error(ErrorCode::InvalidArgument, "bfp_quantize: size must be a multiple of 16");
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); i += bfp::kBlockSize) bfp::quantize_block(f, x.data() + i, out.data() + i);
    std::vector<size_t> shape;
    for (size_t i = 0; i < x.ndim(); ++i) shape.push_back(x.shape(i));
    return array_f32(std::move(out), shape);
  }, "x"_a, "fmt"_a, "Each run of 16 consecutive values quantised to bfp8_b / bfp4_b and back (the engine's own code).");

  m.def("gaussian_noise", [](uint64_t seed, int64_t n) {
    if (n < 0) throw Error(ErrorCode::InvalidArgument, "gaussian_noise: n must be >= 0");
    return array_f32(gaussian_noise(seed, n), {size_t(n)});
  }, "seed"_a, "n"_a, "The sampler's standard normal draw for a seed (what sample(seed=...) starts from).");

  nb::class_<ModelHandle>(m, "Model")
      .def("__init__", [](ModelHandle* self, const std::string& checkpoint, const std::string& backend,
                          const std::string& weights, int threads, const std::string& vlm_config,
                          const std::string& release, bool exact_freqs, bool profile, const std::string& kv,
                          const std::string& kernels) {
             check_path(checkpoint, "Model", "checkpoint");
             check_path(vlm_config, "Model", "vlm_config");
             std::shared_ptr<const Checkpoint> ck;
             std::shared_ptr<const Model> model;
             {
               nb::gil_scoped_release release_gil;
               CheckpointOptions co;
               co.vlm_config = vlm_config;
               if (!release.empty()) co.release = parse_release(release, "release");
               ck = Checkpoint::open(checkpoint, co);
               BackendOptions bo;
               bo.threads = threads;
               bo.weights = weights;
               bo.kv = kv;
               bo.kernels = kernels;
               bo.exact_freqs = exact_freqs;
               bo.profile = profile;
               options_from_environment(bo, backend);  // ALPAMAYO_CPU_KERNELS where no kernels are given, ALPAMAYO_CPU_ISA
               model = Model::load(ck, backend, bo);
             }
             new (self) ModelHandle{std::move(ck), std::move(model)};
           },
           "checkpoint"_a, "backend"_a = "", "weights"_a = "", "threads"_a = 0, "vlm_config"_a = "", "release"_a = "",
           "exact_freqs"_a = false, "profile"_a = false, "kv"_a = "", "kernels"_a = "")
      .def_prop_ro("backend", [](const ModelHandle& p) { return p.m->backend_name(); })
      .def_prop_ro("weights", [](const ModelHandle& p) { return p.m->weights(); })
      .def_prop_ro("kv", [](const ModelHandle& p) { return p.m->kv(); })
      .def_prop_ro("kernels", [](const ModelHandle& p) { return p.m->kernels(); })
      .def_prop_ro("checkpoint", [](const ModelHandle& p) { return p.ck ? p.ck->dir() : std::string(); })
      .def_prop_ro("layout", [](const ModelHandle& p) { return p.ck ? std::string(layout_name(p.ck->layout())) : std::string(); })
      .def_prop_ro("config", [](const ModelHandle& p) { return config_dict(p.m->config()); })
      .def_prop_ro("values", [](const ModelHandle& p) {
        std::vector<std::tuple<std::string, std::string, std::string>> out;
        if (p.ck)
          for (const ConfigValue& v : p.ck->values()) out.emplace_back(v.name, v.value, v.source);
        return out;
      })
      .def_prop_ro("weight_bytes", [](const ModelHandle& p) { return p.m->backend().weight_bytes(); })
      .def("tensors", [](const ModelHandle& p, const std::string& prefix) {
             return p.ck ? weights_dict(*p.ck, prefix) : nb::dict();
           }, "prefix"_a = "",
           "The checkpoint's weights whose names start with prefix, as float32 arrays named as in weights.h.")
      .def("decode_action", [](const ModelHandle& p, HostF32 action, double v0, double z) {
             const ExpertConfig& c = p.m->config();
             if (action.ndim() != 2 || int64_t(action.shape(0)) != c.T || int64_t(action.shape(1)) != c.A)
               throw Error(ErrorCode::InvalidArgument, "decode_action: expected action [T, A] float32");
             Trajectory tr = decode_action(action.data(), c.T, v0, z, c);
             return std::make_tuple(array_f32(std::move(tr.xyz), {size_t(c.T), 3}),
                                    array_f32(std::move(tr.yaw), {size_t(c.T)}),
                                    array_f32(std::move(tr.rot), {size_t(c.T), 3, 3}));
           }, "action"_a, "v0"_a, "z"_a = 0.0,
           "The engine's unicycle decode of one action [T, A]: (xyz [T, 3], yaw [T], rot [T, 3, 3]).")
      .def("estimate_v0", [](const ModelHandle& p, HostF32 xyz, HostF32 rot) {
             if (xyz.ndim() != 2 || xyz.shape(1) != 3 || rot.ndim() != 3 || rot.shape(0) != xyz.shape(0) ||
                 rot.shape(1) != 3 || rot.shape(2) != 3)
               throw Error(ErrorCode::InvalidArgument, "estimate_v0: expected xyz [H, 3] and rot [H, 3, 3] float32");
             return estimate_v0(xyz.data(), rot.data(), int(xyz.shape(0)), p.m->config());
           }, "xyz"_a, "rot"_a, "The engine's initial speed from one ego history (what the sampler decodes with).");

  nb::class_<CtxHandle>(m, "Context")
      .def_static("open", [](const std::string& path) {
        check_path(path, "Context.open", "path");
        auto pc = std::make_unique<CtxHandle>();
        nb::gil_scoped_release release;
        pc->ctx = Context::open(path);
        return pc.release();
      }, "path"_a, nb::rv_policy::take_ownership)
      .def_static("from_arrays", &context_from_arrays, "keys"_a, "values"_a, "valid_len"_a, "rope_delta"_a,
                  "prefix_pad"_a, "prompt_index"_a, "suffix_keys"_a, "suffix_values"_a, "suffix_len"_a,
                  "history_xyz"_a.none(), "history_rot"_a.none(), "v0"_a.none(), "copy"_a, "name"_a,
                  nb::rv_policy::take_ownership)
      .def_static("from_paged", &context_from_paged, "key_pages"_a, "value_pages"_a, "block_table"_a, "valid_len"_a,
                  "rope_delta"_a, "layout"_a, "history_xyz"_a.none(), "history_rot"_a.none(), "v0"_a.none(),
                  "name"_a, nb::rv_policy::take_ownership)
      .def_prop_ro("paged", [](const CtxHandle& c) { return c.get().kv().paged(); })
      .def_prop_ro("name", [](const CtxHandle& c) { return c.get().name(); })
      .def_prop_ro("batch", [](const CtxHandle& c) { return c.get().batch(); })
      .def_prop_ro("prompts", [](const CtxHandle& c) { return c.get().kv().G; })
      .def_prop_ro("layers", [](const CtxHandle& c) { return c.get().layers(); })
      .def_prop_ro("kv_heads", [](const CtxHandle& c) { return c.get().kv().Hkv; })
      .def_prop_ro("head_dim", [](const CtxHandle& c) { return c.get().kv().d; })
      .def_prop_ro("rows", [](const CtxHandle& c) { return c.get().kv().P; })
      .def_prop_ro("suffix_rows", [](const CtxHandle& c) { return c.get().kv().Q; })
      .def_prop_ro("valid_len", [](const CtxHandle& c) { return c.get().kv().valid_len; })
      .def_prop_ro("prefix_pad", [](const CtxHandle& c) {
        const KVCache& kv = c.get().kv();
        std::vector<int64_t> out(kv.G);
        for (int g = 0; g < kv.G; ++g) out[g] = kv.pad(g);
        return out;
      })
      .def_prop_ro("prompt_index", [](const CtxHandle& c) {
        const KVCache& kv = c.get().kv();
        std::vector<int64_t> out(kv.B);
        for (int b = 0; b < kv.B; ++b) out[b] = kv.prompt(b);
        return out;
      })
      .def_prop_ro("suffix_len", [](const CtxHandle& c) {
        const KVCache& kv = c.get().kv();
        std::vector<int64_t> out(kv.B);
        for (int b = 0; b < kv.B; ++b) out[b] = kv.suffix(b);
        return out;
      })
      .def_prop_ro("offsets", [](const CtxHandle& c) {
        const KVCache& kv = c.get().kv();
        std::vector<int64_t> out(kv.B);
        for (int b = 0; b < kv.B; ++b) out[b] = kv.offset(b);
        return out;
      })
      .def_prop_ro("rope_delta", [](const CtxHandle& c) { return c.get().rope_delta(); })
      .def_prop_ro("has_history", [](const CtxHandle& c) { return c.get().history().has_value(); })
      .def_prop_ro("v0", [](const CtxHandle& c) { return c.get().v0(); })
      .def_prop_ro("copied", [](const CtxHandle& c) { return c.copied; })
      .def("views", [](const CtxHandle& c) {
        std::vector<std::tuple<std::string, uintptr_t, std::string, std::string, std::vector<int64_t>>> out;
        const KVCache& kv = c.get().kv();
        for (const auto* list : {&kv.key, &kv.value, &kv.suffix_key, &kv.suffix_value})
          for (const TensorView& t : *list)
            out.emplace_back(t.name, reinterpret_cast<uintptr_t>(t.data), t.device.str(), dtype_name(t.dtype), t.shape);
        return out;
      }, "(name, data pointer, device, dtype, shape) of every cache tensor the engine reads.");

  nb::class_<SessionHandle>(m, "Session")
      .def("__init__", [](SessionHandle* self, const ModelHandle& model) { new (self) SessionHandle(model.m); }, "model"_a)
      .def("bind", [](SessionHandle& s, nb::object ctx, nb::object guidance, std::optional<double> weight, int capture_step,
                      bool capture_layers) {
             const CtxHandle& pc = nb::cast<const CtxHandle&>(ctx);
             BindOptions o;
             o.capture = {.step = capture_step, .layers = capture_layers};
             if (!guidance.is_none()) {
               const CtxHandle& gc = nb::cast<const CtxHandle&>(guidance);
               o.guidance = Guidance{gc.get(), weight ? *weight : s.model->config().guidance_weight};
             }
             Context c = pc.get();
             std::unique_lock<std::mutex> lock = s.acquire();
             try {
               nb::gil_scoped_release release;
               s.s.bind(std::move(c), o);
             } catch (...) {
               s.bound = nb::none();  // a failed bind leaves the session unbound
               s.unguided = nb::none();
               throw;
             }
             s.bound = ctx;
             s.unguided = guidance;
           },
           "context"_a, "guidance"_a.none() = nb::none(), "guidance_weight"_a.none() = nb::none(),
           "capture_step"_a = -1, "capture_layers"_a = true)
      .def_prop_ro("bound", [](const SessionHandle& s) { return s.s.bound(); })
      .def_prop_ro("buffer_bytes", [](const SessionHandle& s) { return s.s.buffer_bytes(); })
      .def("sample", [](SessionHandle& s, int steps, std::optional<uint64_t> seed, std::vector<uint64_t> seeds,
                        std::optional<HostF32> noise, double temperature, std::optional<double> v0, bool all_steps) {
             SampleOptions o;
             o.steps = steps;
             o.seed = seed;
             o.seeds = std::move(seeds);
             if (noise) o.noise.assign(noise->data(), noise->data() + noise->size());
             o.temperature = temperature;
             o.v0 = v0;
             o.all_steps = all_steps;
             SampleResult r;
             std::unique_lock<std::mutex> lock = s.acquire();
             {
               nb::gil_scoped_release release;
               r = s.s.sample(o);
             }
             lock.unlock();
             const size_t B = r.B, T = r.T, A = r.A, N = r.steps;
             nb::dict d;
             d["action"] = array_f32(std::move(r.action), {B, T, A});
             d["xyz"] = array_f32(std::move(r.xyz), {B, T, 3});
             d["yaw"] = array_f32(std::move(r.yaw), {B, T});
             d["rot"] = array_f32(std::move(r.rot), {B, T, 3, 3});
             d["v0"] = array_f32(std::move(r.v0), {B});
             if (all_steps) {
               d["x_steps"] = array_f32(std::move(r.x_steps), {N + 1, B, T, A});
               d["v_steps"] = array_f32(std::move(r.v_steps), {N, B, T, A});
             }
             d["steps"] = r.steps;
             d["seconds"] = r.seconds;
             d["step_seconds"] = r.step_seconds;
             d["v0_source"] = r.v0_source;
             return d;
           },
           "steps"_a = 0, "seed"_a.none() = nb::none(), "seeds"_a = std::vector<uint64_t>{}, "noise"_a.none() = nb::none(),
           "temperature"_a = 1.0, "v0"_a.none() = nb::none(), "all_steps"_a = false)
      .def("profiles", [](SessionHandle& s) {
        std::unique_lock<std::mutex> lock = s.acquire();
        nb::list out;
        for (const StepProfile& p : s.s.profiles()) out.append(profile_dict(p));
        return out;
      })
      .def("captures", [](SessionHandle& s) {
        std::unique_lock<std::mutex> lock = s.acquire();
        const Captures& c = s.s.captures();
        nb::dict d;
        d["step"] = c.step;
        if (c.step < 0) return d;
        const size_t B = s.s.context().batch(), T = s.model->config().T, D = s.model->config().D;
        d["emb"] = array_f32(std::vector<float>(c.emb), {B, T, D});
        d["hidden"] = array_f32(std::vector<float>(c.hidden), {B, T, D});
        nb::list layers;
        for (const auto& l : c.layers) layers.append(array_f32(std::vector<float>(l), {B, T, D}));
        d["layers"] = layers;
        return d;
      });
}
