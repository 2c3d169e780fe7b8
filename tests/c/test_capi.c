/* The C API from plain C11: a tiny synthetic checkpoint and context written by the CLI, sampled through the
 * C API from the file and from the caller's own buffers (DLPack views), compared bit for bit with the CLI's
 * result (the C++ API), plus every error path: bad paths, malformed files, NULL handles, wrong shapes and
 * dtypes, memory the backend cannot read, sample before bind, and per-thread errors under concurrency.
 *   test_capi PATH_TO_alpamayo-expert */
#define _POSIX_C_SOURCE 200809L
#include "alpamayo/alpamayo.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* alpamayo_tensor is DLPack's DLTensor byte for byte (LP64). */
_Static_assert(offsetof(alpamayo_tensor, data) == 0, "DLTensor.data");
_Static_assert(offsetof(alpamayo_tensor, device_type) == 8, "DLTensor.device.device_type");
_Static_assert(offsetof(alpamayo_tensor, device_id) == 12, "DLTensor.device.device_id");
_Static_assert(offsetof(alpamayo_tensor, ndim) == 16, "DLTensor.ndim");
_Static_assert(offsetof(alpamayo_tensor, dtype_code) == 20, "DLTensor.dtype.code");
_Static_assert(offsetof(alpamayo_tensor, dtype_bits) == 21, "DLTensor.dtype.bits");
_Static_assert(offsetof(alpamayo_tensor, dtype_lanes) == 22, "DLTensor.dtype.lanes");
_Static_assert(offsetof(alpamayo_tensor, shape) == 24, "DLTensor.shape");
_Static_assert(offsetof(alpamayo_tensor, strides) == 32, "DLTensor.strides");
_Static_assert(offsetof(alpamayo_tensor, byte_offset) == 40, "DLTensor.byte_offset");
_Static_assert(sizeof(alpamayo_tensor) == 48, "sizeof(DLTensor)");

static int g_failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);      \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

#define REQUIRE(cond)                                                               \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond);    \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

/* The call must succeed, and leave "" as the thread's last error. */
#define EXPECT_OK(call)                                                                                      \
  do {                                                                                                       \
    alpamayo_status st_ = (call);                                                                            \
    if (st_ != ALPAMAYO_OK) {                                                                                \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, alpamayo_status_name(st_),          \
              alpamayo_last_error());                                                                        \
      exit(1);                                                                                               \
    }                                                                                                        \
    CHECK(alpamayo_last_error()[0] == '\0');                                                                 \
  } while (0)

/* The call must fail with `want`, its message containing `part`. */
#define EXPECT_STATUS(call, want, part) expect_status((call), (want), (part), #call, __LINE__)

static void expect_status(alpamayo_status got, alpamayo_status want, const char* part, const char* call, int line) {
  const char* msg = alpamayo_last_error();
  if (got != want) {
    fprintf(stderr, "line %d: %s -> %s (want %s): %s\n", line, call, alpamayo_status_name(got), alpamayo_status_name(want),
            msg);
    ++g_failures;
  } else if (!strstr(msg, part)) {
    fprintf(stderr, "line %d: %s: message \"%s\" does not contain \"%s\"\n", line, call, msg, part);
    ++g_failures;
  }
}

/* ---- a minimal safetensors reader (enough for the files the CLI writes) ---------------------------------- */
typedef struct {
  char* bytes;
  long size;
  char* header; /* NUL-terminated copy of the JSON header */
  const char* data;
} st_file;

typedef struct {
  const void* data;
  int64_t nbytes;
  char dtype[8];
  int32_t ndim;
  int64_t shape[8];
} st_tensor;

static st_file st_read(const char* path) {
  st_file f = {0};
  FILE* fp = fopen(path, "rb");
  REQUIRE(fp != NULL);
  fseek(fp, 0, SEEK_END);
  f.size = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  f.bytes = malloc((size_t)f.size);
  REQUIRE(f.bytes && fread(f.bytes, 1, (size_t)f.size, fp) == (size_t)f.size);
  fclose(fp);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | (unsigned char)f.bytes[i];
  REQUIRE(n + 8 <= (uint64_t)f.size);
  f.header = malloc(n + 1);
  REQUIRE(f.header);
  memcpy(f.header, f.bytes + 8, n);
  f.header[n] = '\0';
  f.data = f.bytes + 8 + n;
  return f;
}

static void st_close(st_file* f) {
  free(f->bytes);
  free(f->header);
}

static int64_t parse_ints(const char* p, int64_t* out, int max) {
  int n = 0;
  p = strchr(p, '[') + 1;
  while (*p && *p != ']') {
    char* end;
    long long v = strtoll(p, &end, 10);
    if (end == p) {
      ++p;
      continue;
    }
    REQUIRE(n < max);
    out[n++] = v;
    p = end;
  }
  return n;
}

static int st_find(const st_file* f, const char* name, st_tensor* t) {
  char needle[128];
  snprintf(needle, sizeof needle, "\"%s\"", name);
  const char* p = strstr(f->header, needle);
  if (!p) return 0;
  p += strlen(needle);
  while (*p == ' ' || *p == ':') ++p;
  REQUIRE(*p == '{');
  const char* end = strchr(p, '}');
  const char* dt = strstr(p, "\"dtype\"");
  const char* sh = strstr(p, "\"shape\"");
  const char* off = strstr(p, "\"data_offsets\"");
  REQUIRE(dt && sh && off && dt < end && sh < end && off < end);
  dt = strchr(dt + 7, '"') + 1;
  size_t k = 0;
  while (dt[k] != '"' && k + 1 < sizeof t->dtype) t->dtype[k] = dt[k], ++k;
  t->dtype[k] = '\0';
  t->ndim = (int32_t)parse_ints(sh, t->shape, 8);
  int64_t o[2];
  REQUIRE(parse_ints(off, o, 2) == 2);
  t->data = f->data + o[0];
  t->nbytes = o[1] - o[0];
  return 1;
}

/* ---- helpers ------------------------------------------------------------------------------------------ */
static char g_tmp[256];
static const char* g_cli;

static const char* tmp_path(const char* name) {
  static char buf[8][512];
  static int i = 0;
  char* p = buf[i++ % 8];
  snprintf(p, 512, "%s/%s", g_tmp, name);
  return p;
}

/* Runs a shell command, its output to a log that is printed only when it fails. */
static void run(const char* fmt, ...) {
  char cmd[4096], full[4608];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(full, sizeof full, "%s > %s/cmd.log 2>&1", cmd, g_tmp);
  if (system(full) != 0) {
    fprintf(stderr, "command failed: %s\n", cmd);
    snprintf(full, sizeof full, "cat %s/cmd.log >&2", g_tmp);
    if (system(full) != 0) fprintf(stderr, "(no log)\n");
    exit(1);
  }
}

static void write_file(const char* path, const char* content) {
  FILE* fp = fopen(path, "wb");
  REQUIRE(fp);
  fputs(content, fp);
  fclose(fp);
}

static const char* k_outputs[] = {"action", "xyz", "yaw", "rot", "v0", "x_steps", "v_steps"};

/* Every output of r equals the CLI's result file bit for bit (shape and bytes). */
static void expect_same_as_file(const alpamayo_result* r, const st_file* f, const char* what) {
  for (int o = ALPAMAYO_ACTION; o <= ALPAMAYO_V_STEPS; ++o) {
    alpamayo_array a;
    EXPECT_OK(alpamayo_result_get(r, (alpamayo_output)o, &a));
    st_tensor t;
    REQUIRE(st_find(f, k_outputs[o], &t));
    int same = strcmp(t.dtype, "F32") == 0 && t.ndim == a.ndim && t.nbytes == a.count * 4 &&
               memcmp(t.data, a.data, (size_t)t.nbytes) == 0;
    for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == a.shape[i];
    if (!same) {
      fprintf(stderr, "%s: output %s differs from the CLI's\n", what, k_outputs[o]);
      ++g_failures;
    }
  }
}

static void expect_same_results(const alpamayo_result* a, const alpamayo_result* b, int outputs, const char* what) {
  for (int o = ALPAMAYO_ACTION; o < outputs; ++o) {
    alpamayo_array x, y;
    EXPECT_OK(alpamayo_result_get(a, (alpamayo_output)o, &x));
    EXPECT_OK(alpamayo_result_get(b, (alpamayo_output)o, &y));
    if (x.count != y.count || memcmp(x.data, y.data, (size_t)x.count * sizeof(float)) != 0) {
      fprintf(stderr, "%s: output %s differs\n", what, k_outputs[o]);
      ++g_failures;
    }
  }
}

/* The context file's tensors copied into the caller's own buffers, described as DLPack views. */
typedef struct {
  int64_t L;
  void* mem[2][16];
  int64_t shape[4];
  alpamayo_tensor keys[16], values[16];
  int64_t valid_len[16], rope_delta[16];
  float *hist_xyz, *hist_rot;
  alpamayo_context_desc desc;
} caller_context;

static void* copy_of(const void* p, int64_t n) {
  void* m = malloc((size_t)n);
  REQUIRE(m);
  memcpy(m, p, (size_t)n);
  return m;
}

static void caller_context_init(caller_context* c, const st_file* f) {
  memset(c, 0, sizeof *c);
  st_tensor t;
  for (c->L = 0;; ++c->L) {
    char name[32];
    snprintf(name, sizeof name, "key.%lld", (long long)c->L);
    if (!st_find(f, name, &t)) break;
    REQUIRE(c->L < 16 && strcmp(t.dtype, "BF16") == 0 && t.ndim == 4);
    memcpy(c->shape, t.shape, sizeof c->shape);
    for (int kv = 0; kv < 2; ++kv) {
      snprintf(name, sizeof name, kv ? "value.%lld" : "key.%lld", (long long)c->L);
      REQUIRE(st_find(f, name, &t));
      c->mem[kv][c->L] = copy_of(t.data, t.nbytes);
      alpamayo_tensor* v = kv ? &c->values[c->L] : &c->keys[c->L];
      v->data = c->mem[kv][c->L];
      v->device_type = ALPAMAYO_DEVICE_CPU;
      v->ndim = 4;
      v->dtype_code = ALPAMAYO_DTYPE_BFLOAT;
      v->dtype_bits = 16;
      v->dtype_lanes = 1;
      v->shape = c->shape;
    }
  }
  const int64_t B = c->shape[0];
  REQUIRE(B <= 16);
  REQUIRE(st_find(f, "valid_len", &t) && strcmp(t.dtype, "I64") == 0);
  memcpy(c->valid_len, t.data, (size_t)t.nbytes);
  REQUIRE(st_find(f, "rope_delta", &t) && strcmp(t.dtype, "I64") == 0);
  memcpy(c->rope_delta, t.data, (size_t)t.nbytes);
  REQUIRE(st_find(f, "ego_history_xyz", &t) && strcmp(t.dtype, "F32") == 0);
  c->hist_xyz = copy_of(t.data, t.nbytes);
  c->desc.history = t.shape[1];
  REQUIRE(st_find(f, "ego_history_rot", &t) && strcmp(t.dtype, "F32") == 0);
  c->hist_rot = copy_of(t.data, t.nbytes);
  c->desc.layers = c->L;
  c->desc.keys = c->keys;
  c->desc.values = c->values;
  c->desc.batch = B;
  c->desc.valid_len = c->valid_len;
  c->desc.rope_delta = c->rope_delta;
  c->desc.history_xyz = c->hist_xyz;
  c->desc.history_rot = c->hist_rot;
  c->desc.name = "caller cache";
}

static void caller_context_free(caller_context* c) {
  for (int64_t l = 0; l < c->L; ++l) free(c->mem[0][l]), free(c->mem[1][l]);
  free(c->hist_xyz);
  free(c->hist_rot);
}

/* ---- threads: sessions of one model in parallel, errors per thread -------------------------------------- */
typedef struct {
  const alpamayo_model* model;
  const alpamayo_context* context;
  alpamayo_result* result;
  int ok;
} thread_job;

static void* thread_main(void* arg) {
  thread_job* j = arg;
  alpamayo_session* s = NULL;
  alpamayo_sample_options so = {0};
  so.seed = 42;
  so.all_steps = 1;
  j->ok = alpamayo_session_create(j->model, &s) == ALPAMAYO_OK &&
          alpamayo_session_bind(s, j->context, NULL) == ALPAMAYO_OK &&
          alpamayo_session_sample(s, &so, &j->result) == ALPAMAYO_OK;
  /* An error here is this thread's alone. */
  j->ok = j->ok && alpamayo_session_sample(NULL, NULL, NULL) == ALPAMAYO_INVALID_ARGUMENT &&
          strstr(alpamayo_last_error(), "alpamayo_session_sample") != NULL;
  alpamayo_session_free(s);
  return NULL;
}

/* ---- the tests ---------------------------------------------------------------------------------------- */
static void test_versions_and_backends(void) {
  CHECK(alpamayo_abi_version() == ALPAMAYO_ABI_VERSION);
  int64_t major = -1, minor = -1, patch = -1;
  alpamayo_version(&major, &minor, &patch);
  CHECK(major == ALPAMAYO_VERSION_MAJOR && minor == ALPAMAYO_VERSION_MINOR && patch == ALPAMAYO_VERSION_PATCH);
  CHECK(strcmp(alpamayo_version_string(), ALPAMAYO_VERSION_STRING) == 0);
  alpamayo_version(NULL, NULL, NULL);

  const int64_t n = alpamayo_backend_count();
  CHECK(n >= 1);
  for (int64_t i = 0; i < n; ++i) {
    CHECK(alpamayo_backend_name(i) != NULL);
    CHECK(alpamayo_backend_format_count(i) >= 1);
    CHECK(alpamayo_backend_format(i, 0) != NULL);
    CHECK(alpamayo_backend_format(i, alpamayo_backend_format_count(i)) == NULL);
  }
  CHECK(alpamayo_backend_name(n) == NULL && alpamayo_backend_name(-1) == NULL);
  CHECK(alpamayo_backend_format_count(n) == -1 && alpamayo_backend_format(-1, 0) == NULL);
  EXPECT_OK(alpamayo_backend_check(NULL));
  EXPECT_STATUS(alpamayo_backend_check("no-such-backend"), ALPAMAYO_UNSUPPORTED, "no-such-backend");
  CHECK(strcmp(alpamayo_status_name(ALPAMAYO_OK), "ok") == 0);
  CHECK(strcmp(alpamayo_status_name((alpamayo_status)99), "unknown status") == 0);
  CHECK(ALPAMAYO_NON_FINITE == 8 && strcmp(alpamayo_status_name(ALPAMAYO_NON_FINITE), "non-finite value") == 0);
}

static void test_bad_inputs(void) {
  alpamayo_checkpoint* ck = (alpamayo_checkpoint*)1;
  alpamayo_context* ctx = (alpamayo_context*)1;
  alpamayo_model* model = (alpamayo_model*)1;

  /* Paths that cannot be read: IO_ERROR naming the file; *out is NULL after any failure. */
  EXPECT_STATUS(alpamayo_checkpoint_open("/nonexistent/alpamayo-ck", NULL, &ck), ALPAMAYO_IO_ERROR, "/nonexistent/alpamayo-ck");
  CHECK(ck == NULL);
  EXPECT_STATUS(alpamayo_model_open("/nonexistent/alpamayo-ck", NULL, &model), ALPAMAYO_IO_ERROR, "/nonexistent/alpamayo-ck");
  CHECK(model == NULL);
  EXPECT_STATUS(alpamayo_context_open("/nonexistent/ctx.safetensors", &ctx), ALPAMAYO_IO_ERROR, "/nonexistent/ctx.safetensors");
  CHECK(ctx == NULL);

  /* Files that were read but are malformed: FORMAT_ERROR naming the file. */
  const char* bad_ctx = tmp_path("bad.safetensors");
  write_file(bad_ctx, "this is not a safetensors file");
  EXPECT_STATUS(alpamayo_context_open(bad_ctx, &ctx), ALPAMAYO_FORMAT_ERROR, bad_ctx);
  run("mkdir -p %s", tmp_path("bad-ck"));
  write_file(tmp_path("bad-ck/config.json"), "{");
  EXPECT_STATUS(alpamayo_checkpoint_open(tmp_path("bad-ck"), NULL, &ck), ALPAMAYO_FORMAT_ERROR, "config.json");
  /* A checkpoint without weights, or a config.json that is a directory: IO_ERROR (files that cannot be read). */
  write_file(tmp_path("bad-ck/config.json"), "{\"model_type\": \"alpamayo_r1\", \"diffusion_cfg\": {}, "
             "\"action_in_proj_cfg\": {}, \"action_space_cfg\": {}}");
  EXPECT_STATUS(alpamayo_checkpoint_open(tmp_path("bad-ck"), NULL, &ck), ALPAMAYO_IO_ERROR, "no model.safetensors");
  run("rm -f %s && mkdir -p %s", tmp_path("bad-ck/config.json"), tmp_path("bad-ck/config.json"));
  EXPECT_STATUS(alpamayo_checkpoint_open(tmp_path("bad-ck"), NULL, &ck), ALPAMAYO_IO_ERROR, "is a directory");
  EXPECT_STATUS(alpamayo_context_open(tmp_path("bad-ck"), &ctx), ALPAMAYO_IO_ERROR, "is a directory");

  /* NULL pointers. */
  EXPECT_STATUS(alpamayo_checkpoint_open(NULL, NULL, &ck), ALPAMAYO_INVALID_ARGUMENT, "dir");
  EXPECT_STATUS(alpamayo_checkpoint_open(tmp_path("ck"), NULL, NULL), ALPAMAYO_INVALID_ARGUMENT, "out is NULL");
  EXPECT_STATUS(alpamayo_checkpoint_config(NULL, NULL), ALPAMAYO_INVALID_ARGUMENT, "checkpoint is NULL");
  EXPECT_STATUS(alpamayo_model_load(NULL, NULL, &model), ALPAMAYO_INVALID_ARGUMENT, "checkpoint is NULL");
  EXPECT_STATUS(alpamayo_model_config(NULL, NULL), ALPAMAYO_INVALID_ARGUMENT, "model is NULL");
  EXPECT_STATUS(alpamayo_context_create(NULL, &ctx), ALPAMAYO_INVALID_ARGUMENT, "desc is NULL");
  EXPECT_STATUS(alpamayo_context_open(NULL, &ctx), ALPAMAYO_INVALID_ARGUMENT, "path");
  EXPECT_STATUS(alpamayo_context_get_info(NULL, NULL), ALPAMAYO_INVALID_ARGUMENT, "context is NULL");
  alpamayo_session* s = NULL;
  EXPECT_STATUS(alpamayo_session_create(NULL, &s), ALPAMAYO_INVALID_ARGUMENT, "model is NULL");
  EXPECT_STATUS(alpamayo_session_bind(NULL, NULL, NULL), ALPAMAYO_INVALID_ARGUMENT, "session is NULL");
  alpamayo_result* r = NULL;
  EXPECT_STATUS(alpamayo_session_sample(NULL, NULL, &r), ALPAMAYO_INVALID_ARGUMENT, "alpamayo_session_sample: session is NULL");
  EXPECT_STATUS(alpamayo_result_get(NULL, ALPAMAYO_XYZ, NULL), ALPAMAYO_INVALID_ARGUMENT, "result is NULL");
  EXPECT_STATUS(alpamayo_result_copy(NULL, ALPAMAYO_XYZ, NULL, 0), ALPAMAYO_INVALID_ARGUMENT, "result is NULL");
  EXPECT_STATUS(alpamayo_result_get_info(NULL, NULL), ALPAMAYO_INVALID_ARGUMENT, "result is NULL");
  EXPECT_STATUS(alpamayo_session_capture(NULL, ALPAMAYO_CAPTURE_EMB, 0, NULL), ALPAMAYO_INVALID_ARGUMENT, "session is NULL");
  CHECK(alpamayo_session_captured_step(NULL) == -1);
  CHECK(alpamayo_model_backend(NULL) == NULL && alpamayo_model_weights(NULL) == NULL && alpamayo_model_kv(NULL) == NULL);
  alpamayo_checkpoint_free(NULL);
  alpamayo_model_free(NULL);
  alpamayo_context_free(NULL);
  alpamayo_session_free(NULL);
  alpamayo_result_free(NULL);
}

/* The cpu backend times its kernels in each process, and where two are close (as under a sanitizer, which times
 * its own instrumentation) processes can choose differently, with results that differ in rounding. So that this
 * process and the CLIs it runs compute the same bits, pin the choices `inspect --kernels` makes, as a user would
 * (unless the caller pinned them already). */
static void pin_cpu_kernels(void) {
  const char* set = getenv("ALPAMAYO_CPU_KERNELS");
  if (set && *set) return;
  const char* ck_dir = tmp_path("pin-ck");
  run("%s make-checkpoint --out %s --layers 1 --hidden 32 --heads 2 --kv-heads 1 --head-dim 16 --mlp 64 "
      "--ain-hidden 16 --waypoints 8 ", g_cli, ck_dir);
  run("%s inspect %s --kernels", g_cli, ck_dir);
  FILE* f = fopen(tmp_path("cmd.log"), "r");
  REQUIRE(f != NULL);
  char line[1024];
  const char* key = "cpu pin      ALPAMAYO_CPU_KERNELS=";
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, strlen(key)) != 0) continue;
    line[strcspn(line, "\n")] = '\0';
    REQUIRE(setenv("ALPAMAYO_CPU_KERNELS", line + strlen(key), 1) == 0);
    printf("pinned: ALPAMAYO_CPU_KERNELS=%s\n", line + strlen(key));
  }
  fclose(f);
}

static void test_sampling(void) {
  const char* ck_dir = tmp_path("ck");
  const char* ctx_path = tmp_path("ctx.safetensors");
  run("%s make-checkpoint --out %s --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --mlp 128 "
      "--ain-hidden 32 --waypoints 8 ",
      g_cli, ck_dir);
  run("%s make-context --checkpoint %s --out %s --batch 2 --rows 9 --valid-len 9,3 --rope-delta=-4,11 ", g_cli,
      ck_dir, ctx_path);

  alpamayo_checkpoint* ck = NULL;
  EXPECT_OK(alpamayo_checkpoint_open(ck_dir, NULL, &ck));
  alpamayo_config cfg;
  EXPECT_OK(alpamayo_checkpoint_config(ck, &cfg));
  CHECK(cfg.layers == 2 && cfg.hidden == 64 && cfg.heads == 4 && cfg.kv_heads == 2 && cfg.head_dim == 16 && cfg.mlp == 128);
  CHECK(cfg.waypoints == 8 && cfg.action_dim == 2 && cfg.default_steps == 10);

  alpamayo_context* ctx = NULL;
  EXPECT_OK(alpamayo_context_open(ctx_path, &ctx));
  alpamayo_context_info ci;
  EXPECT_OK(alpamayo_context_get_info(ctx, &ci));
  CHECK(ci.layers == 2 && ci.batch == 2 && ci.kv_heads == 2 && ci.rows == 9 && ci.head_dim == 16 && ci.has_history && !ci.has_v0);

  st_file ctx_file = st_read(ctx_path);
  caller_context cc;
  caller_context_init(&cc, &ctx_file);

  /* Model options: unknown backend or format, bad threads. */
  alpamayo_model* model = NULL;
  alpamayo_model_options bad = {0};
  bad.backend = "no-such-backend";
  EXPECT_STATUS(alpamayo_model_load(ck, &bad, &model), ALPAMAYO_UNSUPPORTED, "no-such-backend");
  bad.backend = NULL;
  bad.weights = "fp4";
  EXPECT_STATUS(alpamayo_model_load(ck, &bad, &model), ALPAMAYO_UNSUPPORTED, "fp4");
  bad.weights = NULL;
  bad.kv = "fp16";  /* no backend offers it: the message names the backend, the format and the offered ones */
  EXPECT_STATUS(alpamayo_model_load(ck, &bad, &model), ALPAMAYO_UNSUPPORTED, "unknown KV cache format 'fp16'");
  CHECK(strstr(alpamayo_last_error(), alpamayo_backend_name(0)) && strstr(alpamayo_last_error(), "it offers"));
  bad.backend = "reference";
  bad.kv = "bf16";
  EXPECT_STATUS(alpamayo_model_load(ck, &bad, &model), ALPAMAYO_UNSUPPORTED, "(it offers f32, int8)");
  bad.backend = NULL;
  bad.kv = NULL;
  bad.threads = -1;
  EXPECT_STATUS(alpamayo_model_load(ck, &bad, &model), ALPAMAYO_INVALID_ARGUMENT, "threads");
  CHECK(model == NULL);
  bad.threads = 0;
  REQUIRE(setenv("ALPAMAYO_MEMORY_LIMIT", "1K", 1) == 0);  /* an estimate over the limit: OUT_OF_MEMORY */
  EXPECT_STATUS(alpamayo_model_load(ck, &bad, &model), ALPAMAYO_OUT_OF_MEMORY, "only 1.00 KiB is available");
  REQUIRE(unsetenv("ALPAMAYO_MEMORY_LIMIT") == 0);
  CHECK(model == NULL);
  /* A checkpoint whose sampler the engine does not implement (Heun instead of Euler): UNSUPPORTED. */
  const char* heun_dir = tmp_path("heun-ck");
  run("rm -rf %s && cp -r %s %s && sed -i 's/\"euler\"/\"heun\"/' %s/config.json", heun_dir, ck_dir, heun_dir, heun_dir);
  alpamayo_checkpoint* heun = NULL;
  EXPECT_STATUS(alpamayo_checkpoint_open(heun_dir, NULL, &heun), ALPAMAYO_UNSUPPORTED, "integrate with euler only");
  CHECK(heun == NULL);

  for (int64_t b = 0; b < alpamayo_backend_count(); ++b) {
    const char* backend = alpamayo_backend_name(b);
    if (alpamayo_backend_check(backend) != ALPAMAYO_OK) {
      printf("backend %s skipped: %s\n", backend, alpamayo_last_error());
      continue;
    }
    printf("backend %s\n", backend);
    const char* cli_out = tmp_path("cli.safetensors");
    run("%s sample --checkpoint %s --context %s --backend %s --threads 2 --seed 42 --all-steps --out %s ", g_cli,
        ck_dir, ctx_path, backend, cli_out);
    st_file want = st_read(cli_out);

    alpamayo_model_options mo = {0};
    mo.backend = backend;
    mo.threads = 2;
    EXPECT_OK(alpamayo_model_load(ck, &mo, &model));
    CHECK(strcmp(alpamayo_model_backend(model), backend) == 0);
    CHECK(strcmp(alpamayo_model_weights(model), alpamayo_backend_format(b, 0)) == 0);
    CHECK(alpamayo_model_kv(model) != NULL && *alpamayo_model_kv(model) != '\0');  /* the backend's default */
    alpamayo_config mc;
    EXPECT_OK(alpamayo_model_config(model, &mc));
    CHECK(memcmp(&mc, &cfg, sizeof cfg) == 0);
    /* The same through alpamayo_model_open. */
    alpamayo_model* model2 = NULL;
    EXPECT_OK(alpamayo_model_open(ck_dir, &mo, &model2));

    alpamayo_session* s = NULL;
    EXPECT_OK(alpamayo_session_create(model, &s));
    alpamayo_sample_options so = {0};
    so.seed = 42;
    so.all_steps = 1;
    alpamayo_result* r = NULL;
    EXPECT_STATUS(alpamayo_session_sample(s, &so, &r), ALPAMAYO_INVALID_STATE, "bind");
    CHECK(r == NULL);

    /* From the file: bitwise the CLI's result (the C++ API). */
    EXPECT_OK(alpamayo_session_bind(s, ctx, NULL));
    EXPECT_OK(alpamayo_session_sample(s, &so, &r));
    expect_same_as_file(r, &want, "context file");
    alpamayo_result_info ri;
    EXPECT_OK(alpamayo_result_get_info(r, &ri));
    CHECK(ri.batch == 2 && ri.waypoints == 8 && ri.action_dim == 2 && ri.steps == 10 && ri.all_steps == 1);
    CHECK(strcmp(ri.v0_source, "ego history") == 0 && ri.seconds >= 0);
    alpamayo_array xyz;
    EXPECT_OK(alpamayo_result_get(r, ALPAMAYO_XYZ, &xyz));
    CHECK(xyz.ndim == 3 && xyz.shape[0] == 2 && xyz.shape[1] == 8 && xyz.shape[2] == 3 && xyz.count == 48);
    float copy[48];
    EXPECT_OK(alpamayo_result_copy(r, ALPAMAYO_XYZ, copy, 48));
    CHECK(memcmp(copy, xyz.data, sizeof copy) == 0);
    EXPECT_STATUS(alpamayo_result_copy(r, ALPAMAYO_XYZ, copy, 47), ALPAMAYO_INVALID_ARGUMENT, "47");
    EXPECT_STATUS(alpamayo_result_get(r, (alpamayo_output)7, &xyz), ALPAMAYO_INVALID_ARGUMENT, "unknown output");

    /* The same context from the caller's buffers, on a second session of the second model. */
    alpamayo_context* views = NULL;
    EXPECT_OK(alpamayo_context_create(&cc.desc, &views));
    alpamayo_session* s2 = NULL;
    EXPECT_OK(alpamayo_session_create(model2, &s2));
    alpamayo_model_free(model2); /* the session keeps it */
    EXPECT_OK(alpamayo_session_bind(s2, views, NULL));
    alpamayo_context_free(views); /* the session keeps it; the caller's buffers must stay */
    alpamayo_result* r2 = NULL;
    EXPECT_OK(alpamayo_session_sample(s2, &so, &r2));
    expect_same_as_file(r2, &want, "caller views");
    alpamayo_result_free(r2);

    /* Explicit row-major strides are the same views. */
    const int64_t* sh = cc.shape;
    const int64_t strides[4] = {sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3], 1};
    caller_context strided = cc;
    for (int64_t l = 0; l < cc.L; ++l) strided.keys[l].strides = strides, strided.values[l].strides = strides;
    strided.desc.keys = strided.keys;
    strided.desc.values = strided.values;
    EXPECT_OK(alpamayo_context_create(&strided.desc, &views));
    EXPECT_OK(alpamayo_session_bind(s2, views, NULL));
    alpamayo_context_free(views);
    EXPECT_OK(alpamayo_session_sample(s2, &so, &r2));
    expect_same_results(r, r2, ALPAMAYO_V_STEPS + 1, "explicit strides");
    alpamayo_result_free(r2);

    /* The same rows as a paged cache (FlashInfer's [num_pages, 2, page_size, Hkv, d], pages of 4 rows, shuffled,
     * two pages unused and every unread row NaN): bitwise the dense views. */
    {
      enum { PS = 4, NP = 6 };
      const int64_t Hkv = sh[1], P = sh[2], d = sh[3];
      const int64_t pool_shape[5] = {NP, 2, PS, Hkv, d};
      const int32_t table[2][3] = {{4, 0, 2}, {5, -1, 77}}; /* sample 1 (3 rows) reads one page */
      const int64_t table_shape[2] = {2, 3};
      uint16_t* pools[16];
      alpamayo_tensor pages[16];
      for (int64_t l = 0; l < cc.L; ++l) {
        const size_t n = (size_t)(NP * 2 * PS * Hkv * d);
        pools[l] = malloc(n * sizeof(uint16_t));
        REQUIRE(pools[l]);
        for (size_t i = 0; i < n; ++i) pools[l][i] = 0x7fc0; /* bf16 NaN */
        for (int kv = 0; kv < 2; ++kv)
          for (int64_t b = 0; b < 2; ++b)
            for (int64_t h = 0; h < Hkv; ++h)
              for (int64_t i = 0; i < cc.valid_len[b]; ++i)
                memcpy(pools[l] + (((table[b][i / PS] * 2 + kv) * PS + i % PS) * Hkv + h) * d,
                       (const uint16_t*)cc.mem[kv][l] + ((b * Hkv + h) * P + i) * d, (size_t)d * 2);
        pages[l] = cc.keys[l];
        pages[l].data = pools[l];
        pages[l].ndim = 5;
        pages[l].shape = pool_shape;
      }
      alpamayo_paged_context_desc pd = {0};
      pd.layers = cc.L;
      pd.key_pages = pages;
      pd.block_table.data = table;
      pd.block_table.ndim = 2;
      pd.block_table.dtype_code = ALPAMAYO_DTYPE_INT;
      pd.block_table.dtype_bits = 32;
      pd.block_table.shape = table_shape;
      pd.valid_len = cc.valid_len;
      pd.rope_delta = cc.rope_delta;
      pd.history = cc.desc.history;
      pd.history_xyz = cc.hist_xyz;
      pd.history_rot = cc.hist_rot;
      pd.name = "paged cache";
      EXPECT_OK(alpamayo_context_create_paged(&pd, &views));
      EXPECT_OK(alpamayo_session_bind(s2, views, NULL));
      alpamayo_context_free(views);
      EXPECT_OK(alpamayo_session_sample(s2, &so, &r2));
      expect_same_results(r, r2, ALPAMAYO_V_STEPS + 1, "paged views");
      alpamayo_result_free(r2);
      const int32_t outside[2][3] = {{4, 6, 2}, {5, -1, 77}};
      pd.block_table.data = outside;
      EXPECT_STATUS(alpamayo_context_create_paged(&pd, &views), ALPAMAYO_INVALID_ARGUMENT,
                    "block_table[0, 1] = 6 is outside the pool paged cache: key_pages[0] of 6 pages");
      pd.block_table.data = table;
      pd.block_table.dtype_code = ALPAMAYO_DTYPE_FLOAT;
      EXPECT_STATUS(alpamayo_context_create_paged(&pd, &views), ALPAMAYO_INVALID_ARGUMENT,
                    "block_table must be int32 or int64, found F32");
      /* The session keeps the paged context: rebind it to the dense views before the pools go. */
      EXPECT_OK(alpamayo_context_create(&cc.desc, &views));
      EXPECT_OK(alpamayo_session_bind(s2, views, NULL));
      alpamayo_context_free(views);
      for (int64_t l = 0; l < cc.L; ++l) free(pools[l]);
    }

    /* Caller noise x_0 (the seed's noise) gives the same sample; a wrong count is refused. */
    alpamayo_array x_steps;
    EXPECT_OK(alpamayo_result_get(r, ALPAMAYO_X_STEPS, &x_steps));
    CHECK(x_steps.ndim == 4 && x_steps.shape[0] == 11);
    alpamayo_sample_options no = {0};
    no.noise = x_steps.data;
    no.noise_count = 2 * 8 * 2;
    EXPECT_OK(alpamayo_session_sample(s2, &no, &r2));
    expect_same_results(r, r2, ALPAMAYO_V0 + 1, "caller noise");
    alpamayo_array unused;
    EXPECT_STATUS(alpamayo_result_get(r2, ALPAMAYO_X_STEPS, &unused), ALPAMAYO_INVALID_STATE, "all_steps");
    alpamayo_result_free(r2);
    no.noise_count = 31;
    EXPECT_STATUS(alpamayo_session_sample(s2, &no, &r2), ALPAMAYO_INVALID_ARGUMENT, "noise: expected 32 values");
    no.noise = NULL;
    EXPECT_STATUS(alpamayo_session_sample(s2, &no, &r2), ALPAMAYO_INVALID_ARGUMENT, "noise is NULL");
    float nan_noise[32];
    memcpy(nan_noise, x_steps.data, sizeof nan_noise);
    nan_noise[5] = NAN;
    no.noise = nan_noise;
    no.noise_count = 32;
    EXPECT_STATUS(alpamayo_session_sample(s2, &no, &r2), ALPAMAYO_NON_FINITE, "noise: non-finite value nan at flat index 5");
    CHECK(r2 == NULL);

    /* v0 override and step count. */
    alpamayo_sample_options vo = {0};
    vo.use_v0 = 1;
    vo.v0 = 5.0;
    vo.steps = 3;
    EXPECT_OK(alpamayo_session_sample(s2, &vo, &r2));
    EXPECT_OK(alpamayo_result_get_info(r2, &ri));
    alpamayo_array v0;
    EXPECT_OK(alpamayo_result_get(r2, ALPAMAYO_V0, &v0));
    CHECK(ri.steps == 3 && strcmp(ri.v0_source, "given") == 0 && v0.count == 2 && v0.data[0] == 5.0f && v0.data[1] == 5.0f);
    alpamayo_result_free(r2);
    vo.steps = -1;
    EXPECT_STATUS(alpamayo_session_sample(s2, &vo, &r2), ALPAMAYO_INVALID_ARGUMENT, "steps");

    /* Captures: requested at bind, read after the sample. */
    CHECK(alpamayo_session_captured_step(s2) == -1);
    EXPECT_STATUS(alpamayo_session_capture(s2, ALPAMAYO_CAPTURE_EMB, 0, &unused), ALPAMAYO_INVALID_STATE, "no captures");
    alpamayo_bind_options bo = {0};
    bo.capture = 1;
    bo.capture_layers = 1;
    bo.capture_step = 2;
    EXPECT_OK(alpamayo_session_bind(s2, ctx, &bo));
    EXPECT_OK(alpamayo_session_sample(s2, &so, &r2));
    expect_same_results(r, r2, ALPAMAYO_V_STEPS + 1, "with captures");
    alpamayo_result_free(r2);
    CHECK(alpamayo_session_captured_step(s2) == 2);
    for (int w = ALPAMAYO_CAPTURE_EMB; w <= ALPAMAYO_CAPTURE_LAYER; ++w) {
      alpamayo_array a;
      EXPECT_OK(alpamayo_session_capture(s2, (alpamayo_capture)w, 1, &a));
      CHECK(a.ndim == 3 && a.shape[0] == 2 && a.shape[1] == 8 && a.shape[2] == 64 && a.count == 2 * 8 * 64 && a.data);
    }
    EXPECT_STATUS(alpamayo_session_capture(s2, ALPAMAYO_CAPTURE_LAYER, 2, &unused), ALPAMAYO_INVALID_ARGUMENT, "layer 2");
    bo.capture_step = -3;
    EXPECT_STATUS(alpamayo_session_bind(s2, ctx, &bo), ALPAMAYO_INVALID_ARGUMENT, "capture_step");
    EXPECT_STATUS(alpamayo_session_sample(s2, &so, &r2), ALPAMAYO_INVALID_STATE, "bind"); /* left unbound */

    /* Wrong views: each refused with a message naming the tensor or field. */
    caller_context w = cc;
    w.desc.keys = w.keys;
    w.desc.values = w.values;
    w.desc.valid_len = w.valid_len;
    w.desc.rope_delta = w.rope_delta;
    w.keys[1].ndim = 3;
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_INVALID_ARGUMENT, "caller cache: key.1");
    CHECK(views == NULL);
    w.keys[1] = cc.keys[1];
    const int64_t other_shape[4] = {2, 2, 9, 8};
    w.values[0].shape = other_shape;
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_INVALID_ARGUMENT, "caller cache: value.0");
    w.values[0] = cc.values[0];
    w.keys[0].dtype_code = ALPAMAYO_DTYPE_INT;
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_INVALID_ARGUMENT, "key.0");
    w.keys[0] = cc.keys[0];
    const int64_t transposed[4] = {sh[1] * sh[2] * sh[3], sh[2] * sh[3], 1, sh[2]};
    w.keys[0].strides = transposed;
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_INVALID_ARGUMENT, "contiguous");
    w.keys[0] = cc.keys[0];
    w.desc.batch = 3;
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_INVALID_ARGUMENT, "batch");
    w.desc.batch = 2;
    w.valid_len[1] = 10;
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_INVALID_ARGUMENT, "valid_len[1] = 10");
    w.valid_len[1] = cc.valid_len[1];
    uint16_t* key1 = (uint16_t*)cc.mem[0][1];
    const uint16_t kept = key1[3];
    key1[3] = 0x7fc0; /* a bf16 NaN in a row sample 0 attends to: NON_FINITE naming the tensor and index */
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_NON_FINITE, "caller cache: key.1: non-finite value at [0, 0, 0, 3]");
    key1[3] = kept;
    w.desc.keys = NULL;
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_INVALID_ARGUMENT, "NULL");
    w.desc.keys = w.keys;

    /* A context that does not fit the model: one layer for a two-layer expert. */
    w.desc.layers = 1;
    EXPECT_OK(alpamayo_context_create(&w.desc, &views));
    EXPECT_STATUS(alpamayo_session_bind(s2, views, NULL), ALPAMAYO_INVALID_ARGUMENT, "layers");
    alpamayo_context_free(views);
    w.desc.layers = cc.L;

    /* Cache memory the backend cannot read (labelled CUDA): refused at bind, UNSUPPORTED. */
    w.keys[0].device_type = ALPAMAYO_DEVICE_CUDA;
    EXPECT_OK(alpamayo_context_create(&w.desc, &views));
    EXPECT_STATUS(alpamayo_session_bind(s2, views, NULL), ALPAMAYO_UNSUPPORTED, "cuda:0");
    alpamayo_context_free(views);
    w.keys[0].device_type = 77;
    EXPECT_STATUS(alpamayo_context_create(&w.desc, &views), ALPAMAYO_UNSUPPORTED, "device type 77");
    w.keys[0] = cc.keys[0];

    /* Neither v0 nor ego history: sampling asks for v0. */
    w.desc.history = 0;
    EXPECT_OK(alpamayo_context_create(&w.desc, &views));
    EXPECT_OK(alpamayo_session_bind(s2, views, NULL));
    alpamayo_context_free(views);
    EXPECT_STATUS(alpamayo_session_sample(s2, &so, &r2), ALPAMAYO_INVALID_ARGUMENT, "v0");
    const float given_v0[2] = {3.0f, 4.0f};
    w.desc.v0 = given_v0;
    EXPECT_OK(alpamayo_context_create(&w.desc, &views));
    EXPECT_OK(alpamayo_session_bind(s2, views, NULL));
    alpamayo_context_free(views);
    EXPECT_OK(alpamayo_session_sample(s2, &so, &r2));
    EXPECT_OK(alpamayo_result_get(r2, ALPAMAYO_V0, &v0));
    CHECK(v0.data[0] == 3.0f && v0.data[1] == 4.0f);
    alpamayo_result_free(r2);

    /* Two threads, a session each on the shared model and context: bitwise the single-thread result. */
    thread_job jobs[2] = {{model, ctx, NULL, 0}, {model, ctx, NULL, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; ++i) REQUIRE(pthread_create(&th[i], NULL, thread_main, &jobs[i]) == 0);
    for (int i = 0; i < 2; ++i) REQUIRE(pthread_join(th[i], NULL) == 0);
    CHECK(alpamayo_last_error()[0] == '\0'); /* the threads' errors stayed theirs */
    for (int i = 0; i < 2; ++i) {
      CHECK(jobs[i].ok);
      if (jobs[i].result) expect_same_as_file(jobs[i].result, &want, "thread");
      alpamayo_result_free(jobs[i].result);
    }

    alpamayo_result_free(r);
    alpamayo_session_free(s2);
    alpamayo_session_free(s);
    alpamayo_model_free(model);
    st_close(&want);
  }
  caller_context_free(&cc);
  st_close(&ctx_file);
  alpamayo_context_free(ctx);
  alpamayo_checkpoint_free(ck);
}

/* Shared prompts with suffixes and left padding, classifier-free guidance, per-sample seeds and temperature:
 * bitwise the CLI's result on every backend. */
static void test_shared_prompts_and_guidance(void) {
  const char* ck_dir = tmp_path("ck");  /* written by test_sampling */
  const char* ctx_path = tmp_path("shared.safetensors");
  const char* unguided_path = tmp_path("unguided.safetensors");
  run("%s make-context --checkpoint %s --out %s --batch 3 --prompts 2 --prompt-index 1,0,1 --rows 10 "
      "--valid-len 10,7 --prefix-pad 2,0 --suffix-rows 4 --suffix-len 4,0,2 --rope-delta=-3,5,-3 --history 0 ",
      g_cli, ck_dir, ctx_path);
  run("%s make-context --checkpoint %s --out %s --batch 3 --rows 6 --history 0 --seed 7 ", g_cli, ck_dir, unguided_path);
  alpamayo_context *ctx = NULL, *unguided = NULL;
  EXPECT_OK(alpamayo_context_open(ctx_path, &ctx));
  EXPECT_OK(alpamayo_context_open(unguided_path, &unguided));
  alpamayo_context_info ci;
  EXPECT_OK(alpamayo_context_get_info(ctx, &ci));
  CHECK(ci.batch == 3);
  const uint64_t seeds[3] = {11, 12, 13};
  for (int64_t b = 0; b < alpamayo_backend_count(); ++b) {
    const char* backend = alpamayo_backend_name(b);
    if (alpamayo_backend_check(backend) != ALPAMAYO_OK) continue;
    const char* cli_out = tmp_path("cli-shared.safetensors");
    run("%s sample --checkpoint %s --context %s --guidance-context %s --guidance-weight 1.5 --seeds 11,12,13 "
        "--temperature 0.8 --backend %s --threads 2 --all-steps --out %s ",
        g_cli, ck_dir, ctx_path, unguided_path, backend, cli_out);
    st_file want = st_read(cli_out);
    alpamayo_model* model = NULL;
    alpamayo_model_options mo = {0};
    mo.backend = backend;
    mo.threads = 2;
    EXPECT_OK(alpamayo_model_open(ck_dir, &mo, &model));
    alpamayo_session* s = NULL;
    EXPECT_OK(alpamayo_session_create(model, &s));
    alpamayo_bind_options bo = {0};
    bo.guidance = unguided;
    bo.guidance_weight = 1.5;
    EXPECT_OK(alpamayo_session_bind(s, ctx, &bo));
    alpamayo_sample_options so = {0};
    so.all_steps = 1;
    so.seeds = seeds;
    so.seeds_count = 3;
    so.use_temperature = 1;
    so.temperature = 0.8;
    alpamayo_result* r = NULL;
    EXPECT_OK(alpamayo_session_sample(s, &so, &r));
    expect_same_as_file(r, &want, "shared prompts, guidance, seeds, temperature");
    alpamayo_result_free(r);
    r = NULL;
    so.seeds_count = 2;
    EXPECT_STATUS(alpamayo_session_sample(s, &so, &r), ALPAMAYO_INVALID_ARGUMENT, "seeds");
    so.seeds_count = 3;
    so.temperature = -1.0;
    EXPECT_STATUS(alpamayo_session_sample(s, &so, &r), ALPAMAYO_INVALID_ARGUMENT, "temperature");
    bo.guidance_weight = NAN;
    EXPECT_STATUS(alpamayo_session_bind(s, ctx, &bo), ALPAMAYO_INVALID_ARGUMENT, "guidance weight");
    alpamayo_session_free(s);
    alpamayo_model_free(model);
    st_close(&want);
  }
  alpamayo_context_free(ctx);
  alpamayo_context_free(unguided);
}

/* The int8 KV cache on the reference backend: loads, samples bit for bit as the CLI's `--kv int8`, and differs
 * from the default (f32) cache. */
static void test_kv_int8(void) {
  const char* ck_dir = tmp_path("ck");
  const char* ctx_path = tmp_path("ctx.safetensors");
  const char* cli_out = tmp_path("cli-kv-int8.safetensors");
  run("%s sample --checkpoint %s --context %s --backend reference --kv int8 --threads 2 --seed 42 --all-steps --out %s ",
      g_cli, ck_dir, ctx_path, cli_out);
  st_file want = st_read(cli_out);
  alpamayo_model_options mo = {0};
  mo.backend = "reference";
  mo.threads = 2;
  mo.kv = "int8";
  alpamayo_model *model = NULL, *f32 = NULL;
  EXPECT_OK(alpamayo_model_open(ck_dir, &mo, &model));
  CHECK(model && strcmp(alpamayo_model_kv(model), "int8") == 0 && strcmp(alpamayo_model_weights(model), "f32") == 0);
  mo.kv = "";
  EXPECT_OK(alpamayo_model_open(ck_dir, &mo, &f32));
  CHECK(f32 && strcmp(alpamayo_model_kv(f32), "f32") == 0);
  alpamayo_context* ctx = NULL;
  EXPECT_OK(alpamayo_context_open(ctx_path, &ctx));
  alpamayo_session *s = NULL, *s32 = NULL;
  EXPECT_OK(alpamayo_session_create(model, &s));
  EXPECT_OK(alpamayo_session_create(f32, &s32));
  EXPECT_OK(alpamayo_session_bind(s, ctx, NULL));
  EXPECT_OK(alpamayo_session_bind(s32, ctx, NULL));
  alpamayo_sample_options so = {0};
  so.seed = 42;
  so.all_steps = 1;
  alpamayo_result *r = NULL, *r32 = NULL;
  EXPECT_OK(alpamayo_session_sample(s, &so, &r));
  EXPECT_OK(alpamayo_session_sample(s32, &so, &r32));
  if (r && r32) {
    expect_same_as_file(r, &want, "reference --kv int8");
    alpamayo_array a, b;
    EXPECT_OK(alpamayo_result_get(r, ALPAMAYO_ACTION, &a));
    EXPECT_OK(alpamayo_result_get(r32, ALPAMAYO_ACTION, &b));
    CHECK(a.count == b.count && memcmp(a.data, b.data, (size_t)a.count * sizeof(float)) != 0);
  }
  alpamayo_result_free(r);
  alpamayo_result_free(r32);
  alpamayo_session_free(s);
  alpamayo_session_free(s32);
  alpamayo_context_free(ctx);
  alpamayo_model_free(model);
  alpamayo_model_free(f32);
  st_close(&want);
}

/* The cpu backend's kernels pinned per model (alpamayo_model_options.kernels): the model reports what it loaded,
 * the option wins over ALPAMAYO_CPU_KERNELS, and the result is the CLI's bit for bit under the variable set to
 * the same kernels; a kernel that cannot be loaded, or the option on a backend without a choice, is an error. */
static void test_kernels(void) {
  const char* ck_dir = tmp_path("ck");
  const char* ctx_path = tmp_path("ctx.safetensors");
  alpamayo_model_options mo = {0};
  mo.backend = "reference";
  alpamayo_model* model = NULL;
  EXPECT_OK(alpamayo_model_open(ck_dir, &mo, &model));
  CHECK(model && strcmp(alpamayo_model_kernels(model), "") == 0);
  alpamayo_model_free(model);
  model = NULL;
  CHECK(alpamayo_model_kernels(NULL) == NULL);
  mo.kernels = "attention=avx2_fma";
  EXPECT_STATUS(alpamayo_model_open(ck_dir, &mo, &model), ALPAMAYO_UNSUPPORTED, "no kernels to choose");
  if (alpamayo_backend_check("cpu") != ALPAMAYO_OK) {
    printf("cpu backend not here: kernels option not tested\n");
    return;
  }
  mo.backend = "cpu";
  mo.threads = 2;
  mo.kernels = "attention=avx9000";
  EXPECT_STATUS(alpamayo_model_open(ck_dir, &mo, &model), ALPAMAYO_UNSUPPORTED, "unknown attention kernel \"avx9000\"");
  mo.kernels = "attention=avx2_fma,matmul_bf16=avx2_fma";
  EXPECT_OK(alpamayo_model_open(ck_dir, &mo, &model));
  if (!model) return;
  CHECK(strcmp(alpamayo_model_kernels(model), mo.kernels) == 0);
  const char* cli_out = tmp_path("cli-kernels.safetensors");
  run("ALPAMAYO_CPU_KERNELS=%s %s sample --checkpoint %s --context %s --backend cpu --threads 2 --seed 5 --all-steps "
      "--out %s ", mo.kernels, g_cli, ck_dir, ctx_path, cli_out);
  st_file want = st_read(cli_out);
  alpamayo_context* ctx = NULL;
  alpamayo_session* s = NULL;
  EXPECT_OK(alpamayo_context_open(ctx_path, &ctx));
  EXPECT_OK(alpamayo_session_create(model, &s));
  EXPECT_OK(alpamayo_session_bind(s, ctx, NULL));
  alpamayo_sample_options so = {0};
  so.seed = 5;
  so.all_steps = 1;
  alpamayo_result* r = NULL;
  EXPECT_OK(alpamayo_session_sample(s, &so, &r));
  if (r) expect_same_as_file(r, &want, "cpu kernels pinned by the option");
  alpamayo_result_free(r);
  alpamayo_session_free(s);
  alpamayo_context_free(ctx);
  alpamayo_model_free(model);
  st_close(&want);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH_TO_alpamayo-expert\n", argv[0]);
    return 2;
  }
  g_cli = argv[1];
  snprintf(g_tmp, sizeof g_tmp, "/tmp/alpamayo-capi-XXXXXX");
  REQUIRE(mkdtemp(g_tmp) != NULL);

  pin_cpu_kernels();
  test_versions_and_backends();
  test_bad_inputs();
  test_sampling();
  test_shared_prompts_and_guidance();
  test_kv_int8();
  test_kernels();

  run("rm -rf %s", g_tmp);
  if (g_failures) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("all C API checks passed\n");
  return 0;
}
