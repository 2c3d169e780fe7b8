/* A C consumer of the installed library: samples a checkpoint and context, prints the trajectories as
 * hexadecimal floats (bit-exact text), so run.cmake can compare it with the C++ consumer's output.
 *   consumer_c CHECKPOINT_DIR CONTEXT_FILE */
#include <stdio.h>

#include "alpamayo/alpamayo.h"

static int fail(const char* what, alpamayo_status st) {
  fprintf(stderr, "%s: %s: %s\n", what, alpamayo_status_name(st), alpamayo_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s CHECKPOINT_DIR CONTEXT_FILE\n", argv[0]);
    return 2;
  }
  if (alpamayo_abi_version() != ALPAMAYO_ABI_VERSION) {
    fprintf(stderr, "ABI %lld, compiled for %d\n", (long long)alpamayo_abi_version(), ALPAMAYO_ABI_VERSION);
    return 1;
  }
  fprintf(stderr, "alpamayo_expert %s (headers %s)\n", alpamayo_version_string(), ALPAMAYO_VERSION_STRING);

  alpamayo_model* model = NULL;
  alpamayo_context* ctx = NULL;
  alpamayo_session* session = NULL;
  alpamayo_result* result = NULL;
  alpamayo_status st;
  if ((st = alpamayo_model_open(argv[1], NULL, &model))) return fail("model", st);
  if ((st = alpamayo_context_open(argv[2], &ctx))) return fail("context", st);
  if ((st = alpamayo_session_create(model, &session))) return fail("session", st);
  if ((st = alpamayo_session_bind(session, ctx, NULL))) return fail("bind", st);
  alpamayo_sample_options opts = {0};
  opts.seed = 7;
  if ((st = alpamayo_session_sample(session, &opts, &result))) return fail("sample", st);

  alpamayo_array xyz;
  if ((st = alpamayo_result_get(result, ALPAMAYO_XYZ, &xyz))) return fail("xyz", st);
  printf("%s xyz", alpamayo_model_backend(model));
  for (int64_t i = 0; i < xyz.count; ++i) printf(" %a", xyz.data[i]);
  printf("\n");

  alpamayo_result_free(result);
  alpamayo_session_free(session);
  alpamayo_context_free(ctx);
  alpamayo_model_free(model);
  return 0;
}
