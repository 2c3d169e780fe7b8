// Subcommands of the alpamayo-expert CLI. Each registers its options and returns the function to run.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "alpamayo/checkpoint.h"

namespace alpamayo::cli {

using Run = std::function<void()>;
Run add_sample(CLI::App& app);
Run add_inspect(CLI::App& app);
Run add_make_checkpoint(CLI::App& app);
Run add_make_context(CLI::App& app);
Run add_demo(CLI::App& app);
Run add_backends(CLI::App& app);

// The help text of --weights (kv false) or --kv (kv true) of `sample` and `demo`: each backend this build has,
// with its formats (BackendInfo::weight_formats / kv_formats of src/backends/registry.cpp), the default its first.
std::string formats_help(bool kv);

// --release: the release whose layout a checkpoint's config.json follows, when its model_type is not a
// known one. checkpoint_options() turns it and --vlm-config into Checkpoint::open's options.
void add_release_option(CLI::App& app, std::string& release);
alpamayo::CheckpointOptions checkpoint_options(const std::string& vlm_config, const std::string& release);

// Validators for options: an integer in [0, 2^64 - 1] written as digits only (no sign, no wrap, no saturation);
// a finite floating-point number (no nan, inf, or a value beyond the range of a double).
CLI::Validator unsigned64();
CLI::Validator finite_number();

// Splits "a,b,c" at commas ("" gives no items).
std::vector<std::string> split_list(const std::string& s);
// Parses "1,2,-3" into integers; throws alpamayo::Error naming the option on bad input.
std::vector<int64_t> parse_int_list(const std::string& s, const std::string& option);

}  // namespace alpamayo::cli
