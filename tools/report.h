// Output writers of the CLI: the result safetensors, JSON and an SVG plot of the trajectories.
#pragma once
#include <string>

#include "alpamayo/context.h"
#include "alpamayo/engine.h"

namespace alpamayo::cli {

void write_result_safetensors(const std::string& path, const SampleResult& r);
void write_result_json(const std::string& path, const SampleResult& r, const std::string& backend);
// history: the context's ego history (drawn grey), or null.
void write_result_svg(const std::string& path, const SampleResult& r, const EgoHistory* history = nullptr);

}  // namespace alpamayo::cli
