// Output writers of the CLI: the result safetensors, JSON and an SVG plot of the trajectories. Each writes
// the file's bytes to a sink (an OutputSet output, output.h).
#pragma once
#include <string>

#include "alpamayo/context.h"
#include "alpamayo/engine.h"
#include "alpamayo/output.h"

namespace alpamayo::cli {

void write_result_safetensors(const ByteSink& out, const SampleResult& r);
void write_result_json(const ByteSink& out, const SampleResult& r, const std::string& backend);
// history: the context's ego history (drawn grey), or null.
void write_result_svg(const ByteSink& out, const SampleResult& r, const EgoHistory* history = nullptr);

}  // namespace alpamayo::cli
