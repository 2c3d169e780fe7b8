// Output writers of the CLI: the result safetensors, JSON and an SVG plot of the trajectories. Each writes
// the file's bytes to a sink (an OutputSet output, output.h).
#pragma once
#include <string>

#include "alpamayo/context.h"
#include "alpamayo/engine.h"
#include "alpamayo/output.h"

namespace alpamayo::cli {

// Both record what produced the result: the model's backend, weight and KV cache formats, and kernels (those
// the cpu backend chose at load, which its bits depend on; "" for other backends).
void write_result_safetensors(const ByteSink& out, const SampleResult& r, const Model& m);
void write_result_json(const ByteSink& out, const SampleResult& r, const Model& m);
// history: the context's ego history (drawn grey), or null.
void write_result_svg(const ByteSink& out, const SampleResult& r, const EgoHistory* history = nullptr);

}  // namespace alpamayo::cli
