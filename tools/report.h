// Output writers of the CLI: the result safetensors, JSON and an SVG plot of the trajectories.
#pragma once
#include <string>

#include "alpamayo/engine.h"

namespace alpamayo::cli {

void write_result_safetensors(const std::string& path, const SampleResult& r);
void write_result_json(const std::string& path, const SampleResult& r, const std::string& backend);
void write_result_svg(const std::string& path, const SampleResult& r);

}  // namespace alpamayo::cli
