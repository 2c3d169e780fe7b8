/* The C API of the Alpamayo action expert: a stable ABI over the C++ engine (libalpamayo_expert.so).
 *
 *   alpamayo_checkpoint  a checkpoint directory, opened and validated (memory-mapped weights)
 *   alpamayo_model       its weights loaded into one backend; immutable, shared by any number of sessions
 *   alpamayo_context     what the VLM leaves: per-layer KV caches (a file, or views of the caller's buffers)
 *   alpamayo_session     one bound context on a model; samples trajectories
 *   alpamayo_result      one sample's trajectories, read through getters or copied into caller arrays
 *
 * Errors: every function that can fail returns an alpamayo_status, the kind of failure (one per kind, the
 * same for every function); alpamayo_last_error() gives the message of the calling thread's last such call
 * ("" after a success). No C++ exception crosses this boundary.
 * Threads: checkpoints, models, contexts and results may be used from any number of threads at once;
 * a session must not be used by two threads at once (use one session per thread: they share the model).
 * Ownership: every *_free releases the caller's reference and accepts NULL; objects still in use live on
 * (a session keeps its model, a model its checkpoint's mapping, a session its bound context).
 * Plain C11 and C++; sizes are int64_t, enum values are explicit. See docs/C_API.md. */
#ifndef ALPAMAYO_ALPAMAYO_H
#define ALPAMAYO_ALPAMAYO_H

#include <stdint.h>

#include "alpamayo/version.h" /* ALPAMAYO_VERSION_MAJOR / _MINOR / _PATCH / _STRING */

/* Bumped whenever a declaration or struct layout in this header changes incompatibly; also the shared
 * library's SONAME version (libalpamayo_expert.so.<ABI>). */
#define ALPAMAYO_ABI_VERSION 3

#if defined(_WIN32)
#define ALPAMAYO_API
#elif defined(__GNUC__) || defined(__clang__)
#define ALPAMAYO_API __attribute__((visibility("default")))
#else
#define ALPAMAYO_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes and errors ---------------------------------------------------------------------------- */
typedef enum alpamayo_status {
  ALPAMAYO_OK = 0,
  ALPAMAYO_INVALID_ARGUMENT = 1, /* null pointer, bad size/shape/dtype/value, context that does not fit */
  ALPAMAYO_IO_ERROR = 2,         /* a file or directory that is missing or cannot be read or written */
  ALPAMAYO_FORMAT_ERROR = 3,     /* a file that was read but is malformed (header, tensors, config keys) */
  ALPAMAYO_UNSUPPORTED = 4,      /* unknown backend, weight or KV cache format or kernel, backend that cannot run
                                    here, memory a backend cannot read, a feature the engine or backend lacks */
  ALPAMAYO_OUT_OF_MEMORY = 5,    /* a memory estimate over what is available, or a failed allocation */
  ALPAMAYO_INVALID_STATE = 6, /* e.g. sample before bind, captures or steps that were not requested */
  ALPAMAYO_INTERNAL = 7,      /* anything else (a bug) */
  ALPAMAYO_NON_FINITE = 8     /* NaN or Inf in an input (cache, noise, ego history, v0, weights) or in a
                                 velocity or trajectory computed from finite inputs */
} alpamayo_status;

/* The message of the calling thread's last status-returning call: "" after a success. Names the file,
 * tensor or key, what was expected and what was found. Valid until this thread's next API call. */
ALPAMAYO_API const char* alpamayo_last_error(void);
/* "ok", "invalid argument", ...; "unknown status" for other values. Static storage. */
ALPAMAYO_API const char* alpamayo_status_name(alpamayo_status status);

/* ---- versions ----------------------------------------------------------------------------------------- */
/* The library's version (compare with the ALPAMAYO_VERSION_* macros the caller was compiled with). */
ALPAMAYO_API void alpamayo_version(int64_t* major, int64_t* minor, int64_t* patch);
ALPAMAYO_API const char* alpamayo_version_string(void);
/* The library's ALPAMAYO_ABI_VERSION; a caller compiled against another value must not use it. */
ALPAMAYO_API int64_t alpamayo_abi_version(void);

/* ---- backends ----------------------------------------------------------------------------------------- */
/* The backends of this build, in order of preference (index 0 is the default). Strings: static storage. */
ALPAMAYO_API int64_t alpamayo_backend_count(void);
ALPAMAYO_API const char* alpamayo_backend_name(int64_t index);          /* NULL when out of range */
ALPAMAYO_API int64_t alpamayo_backend_format_count(int64_t index);      /* -1 when out of range */
ALPAMAYO_API const char* alpamayo_backend_format(int64_t index, int64_t format); /* 0: the default; NULL out of range */
/* OK when the named backend can run on this machine; UNSUPPORTED (with the reason) when it cannot or is
 * unknown. NULL or "": the default backend. */
ALPAMAYO_API alpamayo_status alpamayo_backend_check(const char* backend);

/* ---- checkpoints ---------------------------------------------------------------------------------------- */
typedef struct alpamayo_checkpoint alpamayo_checkpoint;

/* The expert's sizes (derived from the checkpoint's tensors, checked against its config.json). */
typedef struct alpamayo_config {
  int64_t layers;        /* L: the context needs this many cache layers */
  int64_t hidden;        /* D */
  int64_t heads;         /* query heads */
  int64_t kv_heads;      /* Hkv: the cache's second dimension */
  int64_t head_dim;      /* d: the cache's last dimension */
  int64_t mlp;           /* I */
  int64_t waypoints;     /* T */
  int64_t action_dim;    /* A (2: acceleration, curvature) */
  int64_t default_steps; /* diffusion_cfg.num_inference_steps */
  double rms_eps;
  double rope_theta;
} alpamayo_config;

/* Opens and validates a checkpoint directory (config.json plus single-file or sharded safetensors).
 * vlm_config: NULL, or a VLM config.json (or its text_config) for eps/theta and the layer-count check.
 * IO_ERROR when the directory or its config.json cannot be read; FORMAT_ERROR when its content is wrong. */
ALPAMAYO_API alpamayo_status alpamayo_checkpoint_open(const char* dir, const char* vlm_config, alpamayo_checkpoint** out);
ALPAMAYO_API void alpamayo_checkpoint_free(alpamayo_checkpoint* checkpoint);
ALPAMAYO_API alpamayo_status alpamayo_checkpoint_config(const alpamayo_checkpoint* checkpoint, alpamayo_config* out);

/* ---- models ------------------------------------------------------------------------------------------- */
typedef struct alpamayo_model alpamayo_model;

/* All-zero (or a NULL pointer) means the defaults. */
typedef struct alpamayo_model_options {
  const char* backend;    /* NULL or "": the default backend (alpamayo_backend_name(0)) */
  const char* weights;    /* weight format; NULL or "": the backend's default (its format 0) */
  int64_t threads;        /* threads per session (host backends); 0: all cores */
  const char* vlm_config; /* alpamayo_model_open only: as for alpamayo_checkpoint_open */
  const char* kv;         /* KV cache format ("bf16", "f32", "int8": per-row int8, docs/MATH.md); NULL or "": the
                             backend's default. An unknown one is ALPAMAYO_UNSUPPORTED naming the offered ones */
  const char* kernels;    /* cpu backend: the kernels to load, "op=kernel,..." as alpamayo_model_kernels reports
                             them, instead of timing them (and of the ALPAMAYO_CPU_KERNELS variable); NULL or "":
                             timed. Results match bit for bit across runs only where the kernels do. One that
                             cannot run here, or any value for another backend, is an error naming it (ABI 3) */
} alpamayo_model_options;

/* Loads the checkpoint's weights into a backend (converted or packed once). The model keeps what it needs
 * of the checkpoint: the checkpoint handle may be freed afterwards. */
ALPAMAYO_API alpamayo_status alpamayo_model_load(const alpamayo_checkpoint* checkpoint, const alpamayo_model_options* options,
                                                 alpamayo_model** out);
/* alpamayo_checkpoint_open + alpamayo_model_load. */
ALPAMAYO_API alpamayo_status alpamayo_model_open(const char* dir, const alpamayo_model_options* options, alpamayo_model** out);
ALPAMAYO_API void alpamayo_model_free(alpamayo_model* model);
ALPAMAYO_API alpamayo_status alpamayo_model_config(const alpamayo_model* model, alpamayo_config* out);
/* The backend's name, the weight format and the KV cache format in use; valid while the model lives. NULL for a
 * NULL model. */
ALPAMAYO_API const char* alpamayo_model_backend(const alpamayo_model* model);
ALPAMAYO_API const char* alpamayo_model_weights(const alpamayo_model* model);
ALPAMAYO_API const char* alpamayo_model_kv(const alpamayo_model* model);
/* The kernels the model chose at load, "op=kernel,..." (alpamayo_model_options.kernels takes it back); "" for a
 * backend without a choice. Valid while the model lives; NULL for a NULL model. */
ALPAMAYO_API const char* alpamayo_model_kernels(const alpamayo_model* model);

/* ---- tensors (DLPack) --------------------------------------------------------------------------------- */
/* DLPack's DLDataTypeCode and DLDeviceType values. */
typedef enum alpamayo_dtype_code {
  ALPAMAYO_DTYPE_INT = 0,
  ALPAMAYO_DTYPE_UINT = 1,
  ALPAMAYO_DTYPE_FLOAT = 2,
  ALPAMAYO_DTYPE_BFLOAT = 4
} alpamayo_dtype_code;

typedef enum alpamayo_device_type {
  ALPAMAYO_DEVICE_CPU = 1,
  ALPAMAYO_DEVICE_CUDA = 2,
  ALPAMAYO_DEVICE_CUDA_HOST = 3
} alpamayo_device_type;

/* A view of tensor memory owned by the caller. Field for field (and byte for byte) DLPack's DLTensor, so
 * `*(const alpamayo_tensor*)&dl_managed_tensor->dl_tensor` is a valid view. The cache accepts
 * (FLOAT, 32), (FLOAT, 16) and (BFLOAT, 16), lanes 1 (0 is read as 1). */
typedef struct alpamayo_tensor {
  const void* data;       /* the tensor starts at (const char*)data + byte_offset */
  int32_t device_type;    /* alpamayo_device_type; 0 is read as CPU */
  int32_t device_id;
  int32_t ndim;
  uint8_t dtype_code;     /* alpamayo_dtype_code */
  uint8_t dtype_bits;
  uint16_t dtype_lanes;
  const int64_t* shape;   /* [ndim] */
  const int64_t* strides; /* [ndim] in elements, or NULL: row-major contiguous */
  uint64_t byte_offset;
} alpamayo_tensor;

/* ---- contexts ----------------------------------------------------------------------------------------- */
typedef struct alpamayo_context alpamayo_context;

/* A context over the caller's buffers. keys[l], values[l]: [G, Hkv, P, d] for l < layers, row-major
 * contiguous (G = batch unless prompts > 0). The cache memory is not copied: it must stay valid and unchanged
 * while this context, or a session it was bound to (until that session is rebound or freed), lives.
 * Everything else is copied. Shared prompts (docs/FORMATS.md): prompts = G > 0 prompt caches stored once,
 * prompt_index[b] names sample b's prompt, prefix_pad[g] leading rows of prompt g are left padding, and
 * suffix_keys/values[l] [B, Hkv, Q, d] hold each sample's own rows after its prompt (suffix_len[b] in use);
 * leave them zero / NULL for one cache row set per sample. */
typedef struct alpamayo_context_desc {
  int64_t layers;                 /* L, the length of keys and values */
  const alpamayo_tensor* keys;    /* [layers] */
  const alpamayo_tensor* values;  /* [layers] */
  int64_t batch;                  /* B: samples; equals the caches' first dimension unless prompts > 0 */
  const int64_t* valid_len;       /* [G]: rows [0, S_g) of prompt g are in use */
  const int64_t* rope_delta;      /* [B]: the VLM's multimodal rope offsets */
  const float* v0;                /* [B] initial speeds, or NULL */
  int64_t history;                /* H: ego-history poses (0: none) */
  const float* history_xyz;       /* [B, H, 3] when history > 0 */
  const float* history_rot;       /* [B, H, 3, 3] when history > 0 */
  const char* name;               /* for messages; NULL: "context" */
  int64_t prompts;                /* G; 0: G = batch, sample b reads prompt b */
  const int64_t* prompt_index;    /* [B] each sample's prompt, or NULL (then G must equal B) */
  const int64_t* prefix_pad;      /* [G] left-padding rows, or NULL (none) */
  const alpamayo_tensor* suffix_keys;   /* [layers] of [B, Hkv, Q, d], or NULL (no suffixes) */
  const alpamayo_tensor* suffix_values; /* [layers], with suffix_keys */
  const int64_t* suffix_len;      /* [B], with suffix_keys */
} alpamayo_context_desc;

/* A serving engine's paged cache over the caller's buffers (docs/FORMATS.md shows vLLM's, SGLang's, FlashInfer's
 * and TensorRT-LLM's), read in place like the views above. key_pages[l], value_pages[l]: page pools
 * [num_pages, page_size, Hkv, d] (layout "NHD") or [num_pages, Hkv, page_size, d] ("HND"), any strides with the
 * head dim's stride 1; value_pages NULL when each key_pages[l] holds K and V as [num_pages, 2, ...]. page_size: a
 * power of two from 1 to 256. block_table [B, max_pages] INT32 or INT64 in host memory (copied): sample b's rows
 * [p * page_size, (p + 1) * page_size) lie in page block_table[b, p]. Samples whose tables start with the same
 * pages share them as one prompt, read once per step for all of them; the rest of each sample's pages are its own. */
typedef struct alpamayo_paged_context_desc {
  int64_t layers;                    /* L, the length of key_pages (and value_pages) */
  const alpamayo_tensor* key_pages;  /* [layers] */
  const alpamayo_tensor* value_pages; /* [layers], or NULL: K and V combined in key_pages */
  const char* layout;                /* "NHD" or "HND"; NULL: "NHD" */
  alpamayo_tensor block_table;       /* [B, max_pages] */
  const int64_t* valid_len;          /* [B]: rows of each sample */
  const int64_t* rope_delta;         /* [B] */
  const float* v0;                   /* [B] initial speeds, or NULL */
  int64_t history;                   /* H: ego-history poses (0: none) */
  const float* history_xyz;          /* [B, H, 3] when history > 0 */
  const float* history_rot;          /* [B, H, 3, 3] when history > 0 */
  const char* name;                  /* for messages; NULL: "context" */
} alpamayo_paged_context_desc;

typedef struct alpamayo_context_info {
  int64_t layers, batch, kv_heads, rows, head_dim; /* L, B, Hkv, P, d */
  int32_t has_v0, has_history;
} alpamayo_context_info;

/* Validates and wraps the caller's buffers (shapes, dtypes, strides, 0 <= S_b <= P, finite valid rows). */
ALPAMAYO_API alpamayo_status alpamayo_context_create(const alpamayo_context_desc* desc, alpamayo_context** out);
/* Validates and wraps a paged cache: every page a sample reads inside its pool, lengths within the block table,
 * head counts and page sizes alike, finite rows in use; the messages name the tensor and the page. */
ALPAMAYO_API alpamayo_status alpamayo_context_create_paged(const alpamayo_paged_context_desc* desc,
                                                           alpamayo_context** out);
/* Maps and validates a context file (docs/FORMATS.md). IO_ERROR when it cannot be read, FORMAT_ERROR when
 * its content is wrong. */
ALPAMAYO_API alpamayo_status alpamayo_context_open(const char* path, alpamayo_context** out);
ALPAMAYO_API void alpamayo_context_free(alpamayo_context* context);
ALPAMAYO_API alpamayo_status alpamayo_context_get_info(const alpamayo_context* context, alpamayo_context_info* out);

/* ---- sessions ----------------------------------------------------------------------------------------- */
typedef struct alpamayo_session alpamayo_session;
typedef struct alpamayo_result alpamayo_result;

/* All-zero (or NULL) means the defaults: no captures. */
typedef struct alpamayo_bind_options {
  int32_t capture;        /* nonzero: capture Euler step capture_step of every later sample */
  int32_t capture_layers; /* nonzero: also every layer's output (else only emb and hidden) */
  int64_t capture_step;
  /* Classifier-free guidance: the unguided context (same samples and layers) or NULL, and the weight w of
   * v = (1 - w) v_unguided + w v_guided (the session keeps the context; the handle may be freed). */
  const alpamayo_context* guidance;
  double guidance_weight;
} alpamayo_bind_options;

/* All-zero (or NULL) means the defaults: checkpoint's step count, noise from seed 0, context's v0. */
typedef struct alpamayo_sample_options {
  int64_t steps;       /* Euler steps; 0: the checkpoint's default */
  uint64_t seed;       /* noise from the engine's generator (docs/FORMATS.md) when noise is NULL */
  const float* noise;  /* x_0 [B, T, A], or NULL */
  int64_t noise_count; /* elements in noise: must be B * T * A */
  int32_t all_steps;   /* nonzero: keep every x_k and v_k (ALPAMAYO_X_STEPS, ALPAMAYO_V_STEPS) */
  int32_t use_v0;      /* nonzero: v0 below for every sample, overriding the context's v0 / history */
  double v0;
  const uint64_t* seeds;  /* [B] one seed per sample (sample b reproducible alone), or NULL */
  int64_t seeds_count;    /* elements in seeds: must be B */
  int32_t use_temperature; /* nonzero: multiply x_0 by temperature (>= 0) */
  double temperature;
} alpamayo_sample_options;

ALPAMAYO_API alpamayo_status alpamayo_session_create(const alpamayo_model* model, alpamayo_session** out);
ALPAMAYO_API void alpamayo_session_free(alpamayo_session* session);
/* Checks the context against the model and binds it; the session keeps it (the context handle may be freed).
 * A failed bind leaves the session unbound. A context of other sizes may be bound at any time. */
ALPAMAYO_API alpamayo_status alpamayo_session_bind(alpamayo_session* session, const alpamayo_context* context,
                                                   const alpamayo_bind_options* options);
/* Samples B trajectories. INVALID_STATE before a successful bind. *out is a new result owned by the caller. */
ALPAMAYO_API alpamayo_status alpamayo_session_sample(alpamayo_session* session, const alpamayo_sample_options* options,
                                                     alpamayo_result** out);

/* ---- results ------------------------------------------------------------------------------------------ */
typedef enum alpamayo_output {
  ALPAMAYO_ACTION = 0,  /* [B, T, A] the sampler's x_N (normalized acceleration, curvature) */
  ALPAMAYO_XYZ = 1,     /* [B, T, 3] waypoints in the ego frame */
  ALPAMAYO_YAW = 2,     /* [B, T] */
  ALPAMAYO_ROT = 3,     /* [B, T, 3, 3] */
  ALPAMAYO_V0 = 4,      /* [B] the initial speed used */
  ALPAMAYO_X_STEPS = 5, /* [N+1, B, T, A] with all_steps */
  ALPAMAYO_V_STEPS = 6  /* [N, B, T, A] with all_steps */
} alpamayo_output;

/* A read-only fp32 array owned by the library (row-major; shape[i] for i < ndim). */
typedef struct alpamayo_array {
  const float* data;
  int64_t count; /* elements */
  int64_t ndim;
  int64_t shape[4];
} alpamayo_array;

typedef struct alpamayo_result_info {
  int64_t batch, waypoints, action_dim, steps; /* B, T, A, N */
  int32_t all_steps;
  double seconds;        /* wall time of the denoising loop */
  const char* v0_source; /* "given", "context v0" or "ego history"; valid while the result lives */
} alpamayo_result_info;

ALPAMAYO_API void alpamayo_result_free(alpamayo_result* result);
ALPAMAYO_API alpamayo_status alpamayo_result_get_info(const alpamayo_result* result, alpamayo_result_info* out);
/* A view of one output, valid while the result lives. INVALID_STATE for steps sampled without all_steps. */
ALPAMAYO_API alpamayo_status alpamayo_result_get(const alpamayo_result* result, alpamayo_output which, alpamayo_array* out);
/* Copies one output into dst (capacity in elements; INVALID_ARGUMENT when it is smaller than the output). */
ALPAMAYO_API alpamayo_status alpamayo_result_copy(const alpamayo_result* result, alpamayo_output which, float* dst,
                                                  int64_t capacity);

/* ---- debug captures ----------------------------------------------------------------------------------- */
typedef enum alpamayo_capture {
  ALPAMAYO_CAPTURE_EMB = 0,    /* [B, T, D] action_in_proj output (the layers' input) */
  ALPAMAYO_CAPTURE_HIDDEN = 1, /* [B, T, D] after the final norm */
  ALPAMAYO_CAPTURE_LAYER = 2   /* [B, T, D] output of layer `layer` (bind with capture_layers) */
} alpamayo_capture;

/* The step captured by the session's last sample, or -1 (none requested, or no sample yet). */
ALPAMAYO_API int64_t alpamayo_session_captured_step(const alpamayo_session* session);
/* A view of one capture of the last sample, valid until the session's next bind or sample. */
ALPAMAYO_API alpamayo_status alpamayo_session_capture(const alpamayo_session* session, alpamayo_capture which, int64_t layer,
                                                      alpamayo_array* out);

#ifdef __cplusplus
}
#endif

#endif /* ALPAMAYO_ALPAMAYO_H */
