// The C API (include/alpamayo/alpamayo.h) over the C++ engine. Every entry point catches everything: no C++
// exception crosses the boundary. An alpamayo::Error becomes the status of its code, one to one (the code is
// set where the error is raised, error.h), std::bad_alloc OUT_OF_MEMORY, anything else INTERNAL; the message
// goes to a thread-local last error.
#include "alpamayo/limits.h"
#include "alpamayo/alpamayo.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "alpamayo/engine.h"
#include "alpamayo/environment.h"
#include "alpamayo/error.h"

struct alpamayo_checkpoint {
  std::shared_ptr<const alpamayo::Checkpoint> ck;
};

struct alpamayo_model {
  std::shared_ptr<const alpamayo::Model> m;
  std::string backend, weights, kv, kernels;
};

struct alpamayo_context {
  alpamayo::Context ctx;
};

struct alpamayo_session {
  explicit alpamayo_session(std::shared_ptr<const alpamayo::Model> m) : model(m), s(std::move(m)) {}
  std::shared_ptr<const alpamayo::Model> model;
  alpamayo::Session s;
};

struct alpamayo_result {
  alpamayo::SampleResult r;
  bool all_steps = false;
};

namespace {

using alpamayo::check;
using alpamayo::DType;
using alpamayo::Error;
using alpamayo::ErrorCode;

template <class T>
void require_ptr(const T* p, const char* what) {
  check(p != nullptr, std::string(what) + " is NULL");
}

alpamayo_status status_of(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument: return ALPAMAYO_INVALID_ARGUMENT;
    case ErrorCode::Format: return ALPAMAYO_FORMAT_ERROR;
    case ErrorCode::IO: return ALPAMAYO_IO_ERROR;
    case ErrorCode::Unsupported: return ALPAMAYO_UNSUPPORTED;
    case ErrorCode::OutOfMemory: return ALPAMAYO_OUT_OF_MEMORY;
    case ErrorCode::NonFinite: return ALPAMAYO_NON_FINITE;
    case ErrorCode::InvalidState: return ALPAMAYO_INVALID_STATE;
    case ErrorCode::Internal: return ALPAMAYO_INTERNAL;
  }
  return ALPAMAYO_INTERNAL;
}

thread_local std::string t_error;
thread_local bool t_error_lost = false;  // the message could not be stored (out of memory)

alpamayo_status record(alpamayo_status st, const char* fn, const char* msg) noexcept {
  try {
    t_error.assign(fn);
    t_error.append(": ");
    t_error.append(msg);
    t_error_lost = false;
  } catch (...) {
    t_error_lost = true;
  }
  return st;
}

// Runs f; maps every exception to a status.
template <class F>
alpamayo_status guarded(const char* fn, F&& f) noexcept {
  try {
    f();
    t_error.clear();
    t_error_lost = false;
    return ALPAMAYO_OK;
  } catch (const Error& e) {
    return record(status_of(e.code()), fn, e.what());
  } catch (const std::bad_alloc&) {
    return record(ALPAMAYO_OUT_OF_MEMORY, fn, alpamayo::out_of_memory_message().c_str());
  } catch (const std::length_error& e) {
    return record(ALPAMAYO_OUT_OF_MEMORY, fn, (std::string("allocation too large: ") + e.what()).c_str());
  } catch (const std::filesystem::filesystem_error& e) {
    return record(ALPAMAYO_IO_ERROR, fn, e.what());
  } catch (const std::exception& e) {
    return record(ALPAMAYO_INTERNAL, fn, e.what());
  } catch (...) {
    return record(ALPAMAYO_INTERNAL, fn, "unknown exception");
  }
}

// Sets *out to NULL first, so a failed call never leaves a stale handle behind.
template <class T>
void clear_out(T** out) {
  require_ptr(out, "out");
  *out = nullptr;
}

std::shared_ptr<const alpamayo::Checkpoint> open_checkpoint(const char* dir, const char* vlm_config) {
  check(dir != nullptr && *dir, "dir is NULL or empty");
  return alpamayo::Checkpoint::open(dir, vlm_config ? vlm_config : "");
}

alpamayo_config make_config(const alpamayo::ExpertConfig& c) {
  alpamayo_config o{};
  o.layers = c.L;
  o.hidden = c.D;
  o.heads = c.Hq;
  o.kv_heads = c.Hkv;
  o.head_dim = c.d;
  o.mlp = c.I;
  o.waypoints = c.T;
  o.action_dim = c.A;
  o.default_steps = c.num_steps;
  o.rms_eps = c.rms_eps;
  o.rope_theta = c.rope_theta;
  return o;
}

const alpamayo::BackendInfo& backend_info(const char* name) {
  const auto& all = alpamayo::registered_backends();
  check(!all.empty(), ErrorCode::Unsupported, "no backend in this build");
  if (name == nullptr || *name == '\0') return all.front();
  return alpamayo::find_backend(name);
}

alpamayo_model* load_model(std::shared_ptr<const alpamayo::Checkpoint> ck, const alpamayo_model_options* o) {
  const alpamayo_model_options opts = o ? *o : alpamayo_model_options{};
  const alpamayo::BackendInfo& info = backend_info(opts.backend);
  alpamayo::BackendOptions bo;
  // Formats, kernels and whether the backend runs here are checked once, by Model::load (its errors carry codes).
  bo.weights = opts.weights ? opts.weights : "";
  bo.kv = opts.kv ? opts.kv : "";
  check(opts.threads >= 0 && opts.threads <= 65536,
        "threads must be in [0, 65536] (0: all cores), found " + std::to_string(opts.threads));
  bo.threads = static_cast<int>(opts.threads);
  bo.kernels = opts.kernels ? opts.kernels : "";
  alpamayo::options_from_environment(bo, info.name);
  auto h = std::make_unique<alpamayo_model>();
  h->m = alpamayo::Model::load(std::move(ck), info.name, bo);
  h->backend = h->m->backend_name();
  h->weights = h->m->weights();
  h->kv = h->m->kv();
  h->kernels = h->m->kernels();
  return h.release();
}

// DLPack (code, bits, lanes) -> DType.
DType to_dtype(const alpamayo_tensor& t, const std::string& name) {
  const int lanes = t.dtype_lanes == 0 ? 1 : t.dtype_lanes;
  const int code = t.dtype_code, bits = t.dtype_bits;
  if (lanes == 1) {
    if (code == ALPAMAYO_DTYPE_FLOAT && bits == 32) return DType::F32;
    if (code == ALPAMAYO_DTYPE_FLOAT && bits == 16) return DType::F16;
    if (code == ALPAMAYO_DTYPE_BFLOAT && bits == 16) return DType::BF16;
    if (code == ALPAMAYO_DTYPE_FLOAT && bits == 64) return DType::F64;
    if (code == ALPAMAYO_DTYPE_INT && bits == 64) return DType::I64;
    if (code == ALPAMAYO_DTYPE_INT && bits == 32) return DType::I32;
    if (code == ALPAMAYO_DTYPE_INT && bits == 16) return DType::I16;
    if (code == ALPAMAYO_DTYPE_INT && bits == 8) return DType::I8;
    if (code == ALPAMAYO_DTYPE_UINT && bits == 8) return DType::U8;
  }
  throw Error(name + ": unsupported DLPack dtype (code " + std::to_string(code) + ", bits " +
                                               std::to_string(bits) + ", lanes " + std::to_string(lanes) + ")");
}

alpamayo::TensorView to_view(const alpamayo_tensor& t, const std::string& name) {
  alpamayo::TensorView v;
  v.name = name;
  v.dtype = to_dtype(t, name);
  check(t.ndim >= 0 && t.ndim <= 16, name + ": ndim " + std::to_string(t.ndim) + " is out of range");
  check(t.ndim == 0 || t.shape != nullptr, name + ": shape is NULL");
  v.shape.assign(t.shape, t.shape + t.ndim);
  for (int64_t s : v.shape)
    check(s >= 0 && s <= (int64_t(1) << 40), name + ": invalid shape " + alpamayo::shape_str(v.shape));
  if (t.strides) v.strides.assign(t.strides, t.strides + t.ndim);
  switch (t.device_type) {
    case 0:
    case ALPAMAYO_DEVICE_CPU: v.device.type = alpamayo::DeviceType::CPU; break;
    case ALPAMAYO_DEVICE_CUDA: v.device.type = alpamayo::DeviceType::CUDA; break;
    case ALPAMAYO_DEVICE_CUDA_HOST: v.device.type = alpamayo::DeviceType::CUDAHost; break;
    default:
      throw Error(ErrorCode::Unsupported, name + ": unsupported DLPack device type " + std::to_string(t.device_type));
  }
  check(t.device_id >= 0, name + ": negative device id " + std::to_string(t.device_id));
  v.device.id = t.device_id;
  check(t.data != nullptr || t.byte_offset == 0, name + ": byte_offset with a NULL data pointer");
  v.data = t.data ? static_cast<const char*>(t.data) + t.byte_offset : nullptr;
  return v;
}

int to_int(int64_t v, const std::string& what) {
  check(v >= 0 && v <= std::numeric_limits<int>::max(), what + " = " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

// The ego history and initial speed fields, which the dense and the paged descriptors share by name.
template <class Desc>
std::optional<alpamayo::EgoHistory> ego_history(const Desc& d, int64_t B, const std::string& name) {
  if (d.history == 0) return std::nullopt;
  check(d.history > 0 && d.history <= (int64_t(1) << 24),
        name + ": history = " + std::to_string(d.history) + " is out of range");
  check(d.history_xyz != nullptr && d.history_rot != nullptr, name + ": history > 0 needs history_xyz and history_rot");
  alpamayo::EgoHistory h;
  h.H = static_cast<int>(d.history);
  h.xyz.assign(d.history_xyz, d.history_xyz + B * d.history * 3);
  h.rot.assign(d.history_rot, d.history_rot + B * d.history * 9);
  return h;
}

template <class Desc>
std::optional<std::vector<float>> initial_speed(const Desc& d, int64_t B) {
  if (d.v0 == nullptr) return std::nullopt;
  return std::vector<float>(d.v0, d.v0 + B);
}

alpamayo::Context make_context(const alpamayo_context_desc& d) {
  const std::string name = d.name && *d.name ? d.name : "context";
  check(d.layers > 0 && d.layers <= 4096, name + ": layers must be in [1, 4096], found " + std::to_string(d.layers));
  check(d.keys != nullptr && d.values != nullptr, name + ": keys or values is NULL");
  check(d.batch > 0, name + ": batch must be positive, found " + std::to_string(d.batch));
  check(d.valid_len != nullptr && d.rope_delta != nullptr, name + ": valid_len or rope_delta is NULL");
  alpamayo::KVCache kv;
  for (int64_t l = 0; l < d.layers; ++l) {
    kv.key.push_back(to_view(d.keys[l], name + ": key." + std::to_string(l)));
    kv.value.push_back(to_view(d.values[l], name + ": value." + std::to_string(l)));
  }
  const alpamayo::TensorView& k0 = kv.key[0];
  check(k0.shape.size() == 4, k0.name + ": expected shape [B, Hkv, P, d], found " + alpamayo::shape_str(k0.shape));
  check(d.prompts >= 0, name + ": prompts must be >= 0, found " + std::to_string(d.prompts));
  const int64_t G = d.prompts > 0 ? d.prompts : d.batch;
  check(k0.shape[0] == G, k0.name + ": first dimension " + std::to_string(k0.shape[0]) + " differs from " +
                              (d.prompts > 0 ? "desc.prompts = " : "desc.batch = ") + std::to_string(G));
  kv.G = to_int(G, name + ": prompts");
  kv.B = to_int(d.batch, name + ": batch");
  kv.Hkv = to_int(k0.shape[1], k0.name + ": Hkv");
  kv.P = to_int(k0.shape[2], k0.name + ": P");
  kv.d = to_int(k0.shape[3], k0.name + ": d");
  kv.valid_len.assign(d.valid_len, d.valid_len + G);
  if (d.prompt_index) kv.prompt_of.assign(d.prompt_index, d.prompt_index + d.batch);
  if (d.prefix_pad) kv.prefix_pad.assign(d.prefix_pad, d.prefix_pad + G);
  check((d.suffix_keys == nullptr) == (d.suffix_values == nullptr) &&
            (d.suffix_keys == nullptr) == (d.suffix_len == nullptr),
        name + ": suffix_keys, suffix_values and suffix_len go together");
  if (d.suffix_keys) {
    for (int64_t l = 0; l < d.layers; ++l) {
      kv.suffix_key.push_back(to_view(d.suffix_keys[l], name + ": suffix_key." + std::to_string(l)));
      kv.suffix_value.push_back(to_view(d.suffix_values[l], name + ": suffix_value." + std::to_string(l)));
    }
    const alpamayo::TensorView& s0 = kv.suffix_key[0];
    check(s0.shape.size() == 4, s0.name + ": expected shape [B, Hkv, Q, d], found " + alpamayo::shape_str(s0.shape));
    kv.Q = to_int(s0.shape[2], s0.name + ": Q");
    kv.suffix_len.assign(d.suffix_len, d.suffix_len + d.batch);
  }
  std::vector<int64_t> rope(d.rope_delta, d.rope_delta + d.batch);
  std::optional<alpamayo::EgoHistory> hist = ego_history(d, d.batch, name);
  std::optional<std::vector<float>> v0 = initial_speed(d, d.batch);
  return alpamayo::Context::from_views(std::move(kv), std::move(rope), std::move(hist), std::move(v0), name);
}

alpamayo::Context make_paged_context(const alpamayo_paged_context_desc& d) {
  const std::string name = d.name && *d.name ? d.name : "context";
  check(d.layers > 0 && d.layers <= 4096, name + ": layers must be in [1, 4096], found " + std::to_string(d.layers));
  check(d.key_pages != nullptr, name + ": key_pages is NULL");
  check(d.valid_len != nullptr && d.rope_delta != nullptr, name + ": valid_len or rope_delta is NULL");
  std::vector<alpamayo::TensorView> keys, values;
  for (int64_t l = 0; l < d.layers; ++l) {
    keys.push_back(to_view(d.key_pages[l], name + ": key_pages[" + std::to_string(l) + "]"));
    if (d.value_pages) values.push_back(to_view(d.value_pages[l], name + ": value_pages[" + std::to_string(l) + "]"));
  }
  const alpamayo::TensorView table = to_view(d.block_table, name + ": block_table");
  check(table.shape.size() == 2, name + ": block_table must be [B, max_pages], found " +
                                     alpamayo::shape_str(table.shape));
  const int64_t B = table.shape[0];
  check(B > 0 && B <= (int64_t(1) << 24), name + ": block_table has " + std::to_string(B) + " rows");
  std::vector<int64_t> valid(d.valid_len, d.valid_len + B), rope(d.rope_delta, d.rope_delta + B);
  std::optional<alpamayo::EgoHistory> hist = ego_history(d, B, name);
  std::optional<std::vector<float>> v0 = initial_speed(d, B);
  return alpamayo::Context::from_paged(std::move(keys), std::move(values), table, std::move(valid), std::move(rope),
                                       d.layout ? d.layout : "NHD", std::move(hist), std::move(v0), name);
}

void fill_array(alpamayo_array* out, const std::vector<float>& v, std::initializer_list<int64_t> shape) {
  *out = alpamayo_array{};
  out->data = v.data();
  out->count = static_cast<int64_t>(v.size());
  out->ndim = static_cast<int64_t>(shape.size());
  int64_t i = 0, n = 1;
  for (int64_t s : shape) {
    out->shape[i++] = s;
    n *= s;
  }
  check(n == out->count, ErrorCode::Internal,
        "output size " + std::to_string(out->count) + " does not match its shape");
}

void result_array(const alpamayo_result& h, alpamayo_output which, alpamayo_array* out) {
  const alpamayo::SampleResult& r = h.r;
  const int64_t B = r.B, T = r.T, A = r.A, N = r.steps;
  switch (which) {
    case ALPAMAYO_ACTION: return fill_array(out, r.action, {B, T, A});
    case ALPAMAYO_XYZ: return fill_array(out, r.xyz, {B, T, 3});
    case ALPAMAYO_YAW: return fill_array(out, r.yaw, {B, T});
    case ALPAMAYO_ROT: return fill_array(out, r.rot, {B, T, 3, 3});
    case ALPAMAYO_V0: return fill_array(out, r.v0, {B});
    case ALPAMAYO_X_STEPS:
    case ALPAMAYO_V_STEPS:
      check(h.all_steps, ErrorCode::InvalidState,
            std::string(which == ALPAMAYO_X_STEPS ? "x_steps" : "v_steps") + " were not kept: sample with all_steps");
      if (which == ALPAMAYO_X_STEPS) return fill_array(out, r.x_steps, {N + 1, B, T, A});
      return fill_array(out, r.v_steps, {N, B, T, A});
  }
  throw Error("unknown output " + std::to_string(static_cast<int64_t>(which)));
}

}  // namespace

extern "C" {

const char* alpamayo_last_error(void) {
  return t_error_lost ? "out of memory (the error message could not be stored)" : t_error.c_str();
}

const char* alpamayo_status_name(alpamayo_status status) {
  switch (status) {
    case ALPAMAYO_OK: return "ok";
    case ALPAMAYO_INVALID_ARGUMENT: return "invalid argument";
    case ALPAMAYO_IO_ERROR: return "I/O error";
    case ALPAMAYO_FORMAT_ERROR: return "format error";
    case ALPAMAYO_UNSUPPORTED: return "unsupported";
    case ALPAMAYO_OUT_OF_MEMORY: return "out of memory";
    case ALPAMAYO_INVALID_STATE: return "invalid state";
    case ALPAMAYO_INTERNAL: return "internal error";
    case ALPAMAYO_NON_FINITE: return "non-finite value";
  }
  return "unknown status";
}

void alpamayo_version(int64_t* major, int64_t* minor, int64_t* patch) {
  if (major) *major = ALPAMAYO_VERSION_MAJOR;
  if (minor) *minor = ALPAMAYO_VERSION_MINOR;
  if (patch) *patch = ALPAMAYO_VERSION_PATCH;
}

const char* alpamayo_version_string(void) { return ALPAMAYO_VERSION_STRING; }

int64_t alpamayo_abi_version(void) { return ALPAMAYO_ABI_VERSION; }

int64_t alpamayo_backend_count(void) {
  try {
    return static_cast<int64_t>(alpamayo::registered_backends().size());
  } catch (...) {
    return 0;
  }
}

const char* alpamayo_backend_name(int64_t index) {
  try {
    const auto& all = alpamayo::registered_backends();
    return index >= 0 && index < static_cast<int64_t>(all.size()) ? all[index].name.c_str() : nullptr;
  } catch (...) {
    return nullptr;
  }
}

int64_t alpamayo_backend_format_count(int64_t index) {
  try {
    const auto& all = alpamayo::registered_backends();
    return index >= 0 && index < static_cast<int64_t>(all.size()) ? static_cast<int64_t>(all[index].weight_formats.size()) : -1;
  } catch (...) {
    return -1;
  }
}

const char* alpamayo_backend_format(int64_t index, int64_t format) {
  try {
    const auto& all = alpamayo::registered_backends();
    if (index < 0 || index >= static_cast<int64_t>(all.size())) return nullptr;
    const auto& f = all[index].weight_formats;
    return format >= 0 && format < static_cast<int64_t>(f.size()) ? f[format].c_str() : nullptr;
  } catch (...) {
    return nullptr;
  }
}

alpamayo_status alpamayo_backend_check(const char* backend) {
  return guarded(__func__, [&] {
    const alpamayo::BackendInfo& info = backend_info(backend);
    const std::string why = info.unavailable();
    check(why.empty(), ErrorCode::Unsupported, "backend " + info.name + " cannot run here: " + why);
  });
}

alpamayo_status alpamayo_checkpoint_open(const char* dir, const char* vlm_config, alpamayo_checkpoint** out) {
  return guarded(__func__, [&] {
    clear_out(out);
    auto h = std::make_unique<alpamayo_checkpoint>();
    h->ck = open_checkpoint(dir, vlm_config);
    *out = h.release();
  });
}

void alpamayo_checkpoint_free(alpamayo_checkpoint* checkpoint) { delete checkpoint; }

alpamayo_status alpamayo_checkpoint_config(const alpamayo_checkpoint* checkpoint, alpamayo_config* out) {
  return guarded(__func__, [&] {
    require_ptr(checkpoint, "checkpoint");
    require_ptr(out, "out");
    *out = make_config(checkpoint->ck->config());
  });
}

alpamayo_status alpamayo_model_load(const alpamayo_checkpoint* checkpoint, const alpamayo_model_options* options,
                                    alpamayo_model** out) {
  return guarded(__func__, [&] {
    clear_out(out);
    require_ptr(checkpoint, "checkpoint");
    *out = load_model(checkpoint->ck, options);
  });
}

alpamayo_status alpamayo_model_open(const char* dir, const alpamayo_model_options* options, alpamayo_model** out) {
  return guarded(__func__, [&] {
    clear_out(out);
    backend_info(options ? options->backend : nullptr);  // an unknown backend fails before the checkpoint is read
    *out = load_model(open_checkpoint(dir, options ? options->vlm_config : nullptr), options);
  });
}

void alpamayo_model_free(alpamayo_model* model) { delete model; }

alpamayo_status alpamayo_model_config(const alpamayo_model* model, alpamayo_config* out) {
  return guarded(__func__, [&] {
    require_ptr(model, "model");
    require_ptr(out, "out");
    *out = make_config(model->m->config());
  });
}

const char* alpamayo_model_backend(const alpamayo_model* model) { return model ? model->backend.c_str() : nullptr; }

const char* alpamayo_model_weights(const alpamayo_model* model) { return model ? model->weights.c_str() : nullptr; }
const char* alpamayo_model_kv(const alpamayo_model* model) { return model ? model->kv.c_str() : nullptr; }
const char* alpamayo_model_kernels(const alpamayo_model* model) { return model ? model->kernels.c_str() : nullptr; }

alpamayo_status alpamayo_context_create(const alpamayo_context_desc* desc, alpamayo_context** out) {
  return guarded(__func__, [&] {
    clear_out(out);
    require_ptr(desc, "desc");
    *out = new alpamayo_context{make_context(*desc)};
  });
}

alpamayo_status alpamayo_context_create_paged(const alpamayo_paged_context_desc* desc, alpamayo_context** out) {
  return guarded(__func__, [&] {
    clear_out(out);
    require_ptr(desc, "desc");
    *out = new alpamayo_context{make_paged_context(*desc)};
  });
}

alpamayo_status alpamayo_context_open(const char* path, alpamayo_context** out) {
  return guarded(__func__, [&] {
    clear_out(out);
    check(path != nullptr && *path, "path is NULL or empty");
    *out = new alpamayo_context{alpamayo::Context::open(path)};
  });
}

void alpamayo_context_free(alpamayo_context* context) { delete context; }

alpamayo_status alpamayo_context_get_info(const alpamayo_context* context, alpamayo_context_info* out) {
  return guarded(__func__, [&] {
    require_ptr(context, "context");
    require_ptr(out, "out");
    const alpamayo::Context& c = context->ctx;
    *out = alpamayo_context_info{};
    out->layers = c.layers();
    out->batch = c.batch();
    out->kv_heads = c.kv().Hkv;
    out->rows = c.kv().P;
    out->head_dim = c.kv().d;
    out->has_v0 = c.v0().has_value();
    out->has_history = c.history().has_value();
  });
}

alpamayo_status alpamayo_session_create(const alpamayo_model* model, alpamayo_session** out) {
  return guarded(__func__, [&] {
    clear_out(out);
    require_ptr(model, "model");
    auto h = std::make_unique<alpamayo_session>(model->m);
    *out = h.release();
  });
}

void alpamayo_session_free(alpamayo_session* session) { delete session; }

alpamayo_status alpamayo_session_bind(alpamayo_session* session, const alpamayo_context* context,
                                      const alpamayo_bind_options* options) {
  return guarded(__func__, [&] {
    require_ptr(session, "session");
    require_ptr(context, "context");
    const alpamayo_bind_options o = options ? *options : alpamayo_bind_options{};
    alpamayo::BindOptions bo;
    if (o.capture) {
      if (o.capture_step < 0 || o.capture_step > 100000) {
        session->s = alpamayo::Session(session->model);  // a failed bind leaves the session unbound
        throw Error("capture_step must be in [0, 100000], found " + std::to_string(o.capture_step));
      }
      bo.capture.step = static_cast<int>(o.capture_step);
      bo.capture.layers = o.capture_layers != 0;
    }
    if (o.guidance) bo.guidance = alpamayo::Guidance{o.guidance->ctx, o.guidance_weight};
    session->s.bind(context->ctx, bo);  // a failed bind leaves the session unbound
  });
}

alpamayo_status alpamayo_session_sample(alpamayo_session* session, const alpamayo_sample_options* options,
                                        alpamayo_result** out) {
  return guarded(__func__, [&] {
    clear_out(out);
    require_ptr(session, "session");
    check(session->s.bound(), ErrorCode::InvalidState, "no context bound (call alpamayo_session_bind first)");
    const alpamayo_sample_options o = options ? *options : alpamayo_sample_options{};
    alpamayo::SampleOptions so;
    check(o.steps >= 0 && o.steps <= 100000,
          "steps must be in [1, 100000] (0: the checkpoint's default), found " + std::to_string(o.steps));
    so.steps = static_cast<int>(o.steps);
    so.seed = o.seed;
    check(o.noise != nullptr || o.noise_count == 0, "noise is NULL but noise_count = " + std::to_string(o.noise_count));
    if (o.noise) {
      const alpamayo::ExpertConfig& c = session->model->config();
      const int64_t want = int64_t(session->s.context().batch()) * c.T * c.A;
      check(o.noise_count == want, "noise: expected " + std::to_string(want) +
                                       " values [B=" + std::to_string(session->s.context().batch()) +
                                       ", T=" + std::to_string(c.T) + ", A=" + std::to_string(c.A) +
                                       "], noise_count is " + std::to_string(o.noise_count));
      so.noise.assign(o.noise, o.noise + o.noise_count);
    }
    so.all_steps = o.all_steps != 0;
    if (o.use_v0) so.v0 = o.v0;
    check(o.seeds != nullptr || o.seeds_count == 0, "seeds is NULL but seeds_count = " + std::to_string(o.seeds_count));
    if (o.seeds) {
      check(o.seeds_count == session->s.context().batch(),
            "seeds: expected one per sample (B = " + std::to_string(session->s.context().batch()) +
                "), seeds_count is " + std::to_string(o.seeds_count));
      so.seeds.assign(o.seeds, o.seeds + o.seeds_count);
    }
    if (o.use_temperature) so.temperature = o.temperature;
    auto h = std::make_unique<alpamayo_result>();
    h->r = session->s.sample(so);
    h->all_steps = so.all_steps;
    *out = h.release();
  });
}

void alpamayo_result_free(alpamayo_result* result) { delete result; }

alpamayo_status alpamayo_result_get_info(const alpamayo_result* result, alpamayo_result_info* out) {
  return guarded(__func__, [&] {
    require_ptr(result, "result");
    require_ptr(out, "out");
    *out = alpamayo_result_info{};
    out->batch = result->r.B;
    out->waypoints = result->r.T;
    out->action_dim = result->r.A;
    out->steps = result->r.steps;
    out->all_steps = result->all_steps;
    out->seconds = result->r.seconds;
    out->v0_source = result->r.v0_source.c_str();
  });
}

alpamayo_status alpamayo_result_get(const alpamayo_result* result, alpamayo_output which, alpamayo_array* out) {
  return guarded(__func__, [&] {
    require_ptr(result, "result");
    require_ptr(out, "out");
    result_array(*result, which, out);
  });
}

alpamayo_status alpamayo_result_copy(const alpamayo_result* result, alpamayo_output which, float* dst, int64_t capacity) {
  return guarded(__func__, [&] {
    require_ptr(result, "result");
    require_ptr(dst, "dst");
    alpamayo_array a;
    result_array(*result, which, &a);
    check(capacity >= a.count,
          "dst holds " + std::to_string(capacity) + " floats, the output has " + std::to_string(a.count));
    std::copy(a.data, a.data + a.count, dst);
  });
}

int64_t alpamayo_session_captured_step(const alpamayo_session* session) {
  try {
    return session ? session->s.captures().step : -1;
  } catch (...) {
    return -1;
  }
}

alpamayo_status alpamayo_session_capture(const alpamayo_session* session, alpamayo_capture which, int64_t layer,
                                         alpamayo_array* out) {
  return guarded(__func__, [&] {
    require_ptr(session, "session");
    require_ptr(out, "out");
    const alpamayo::Captures& c = session->s.captures();
    check(c.step >= 0, ErrorCode::InvalidState, "no captures: bind with capture set, then sample");
    const int64_t B = session->s.context().batch(), T = session->model->config().T,
                  D = session->model->config().D;
    switch (which) {
      case ALPAMAYO_CAPTURE_EMB: return fill_array(out, c.emb, {B, T, D});
      case ALPAMAYO_CAPTURE_HIDDEN: return fill_array(out, c.hidden, {B, T, D});
      case ALPAMAYO_CAPTURE_LAYER:
        check(!c.layers.empty(), ErrorCode::InvalidState, "layer outputs were not captured: bind with capture_layers");
        check(layer >= 0 && layer < static_cast<int64_t>(c.layers.size()),
              "layer " + std::to_string(layer) + " is outside [0, " + std::to_string(c.layers.size()) + ")");
        return fill_array(out, c.layers[layer], {B, T, D});
    }
    throw Error("unknown capture " + std::to_string(static_cast<int64_t>(which)));
  });
}

}  // extern "C"
