// Per-layer effect of block-format weights, each layer on the fp32 model's own input: for every layer l, the
// input h_{l-1} that the fp32 reference computed (from its `sample --layers-out` file, step 0) runs through layer l
// of the reference backend with bfp8_b / bfp4_b weights and is compared with the fp32 layer output in the same
// file. This is how the seed measured its device's per-layer PCC (each layer fed the golden input), without the
// earlier layers' differences that a whole run carries. Also the PCC of the layer's own contribution (output minus
// input: the attention and MLP branches), which the residual stream does not dilute.
//
//   bfp_layers --checkpoint DIR --context CTX --layers-in ref-f32-layers.safetensors [--weights bfp8_b,bfp4_b]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "alpamayo/checkpoint.h"
#include "alpamayo/context.h"
#include "alpamayo/safetensors.h"
#include "alpamayo/tensor.h"
#include "backends/reference/reference_backend.h"
#include "model/sampler.h"

using namespace alpamayo;

int main(int argc, char** argv) {
  std::string checkpoint, context, layers_in;
  std::vector<std::string> formats = {"bfp8_b", "bfp4_b"};
  int threads = 2;
  CLI::App app{"Per-layer PCC and max abs error of block-format weights, each layer on the fp32 input"};
  app.add_option("--checkpoint", checkpoint)->required();
  app.add_option("--context", context)->required();
  app.add_option("--layers-in", layers_in, "the fp32 reference's --layers-out file (step 0)")->required();
  app.add_option("--weights", formats, "block formats")->delimiter(',');
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  try {
    auto ck = Checkpoint::open(checkpoint);
    const ExpertConfig& cfg = ck->config();
    Context ctx = Context::open(context);
    const KVCache kv = ctx.kv();
    std::vector<int64_t> offset(kv.B);
    for (int b = 0; b < kv.B; ++b) offset[b] = kv.offset(b);
    const RopeTables rope = make_rope_tables(offset, ctx.rope_delta(), cfg.T, cfg.d, cfg.rope_theta);
    SafetensorsFile ref(layers_in);
    std::vector<WeightFormat> wfs;
    for (const std::string& f : formats) {
      BackendOptions o;
      o.weights = f;
      wfs.push_back(parse_weight_format(o));
    }
    std::printf("| layer | max abs (fp32 output) |");
    for (const auto& f : formats) std::printf(" %s PCC | %s max abs | %s branch PCC |", f.c_str(), f.c_str(), f.c_str());
    std::printf("\n|---|---|");
    for (size_t i = 0; i < formats.size(); ++i) std::printf("---|---|---|");
    std::printf("\n");
    std::vector<double> worst_pcc(formats.size(), 1.0), worst_abs(formats.size(), 0.0), worst_br(formats.size(), 1.0);
    auto pcc = [](const std::vector<double>& a, const std::vector<double>& b) {
      double ma = 0, mb = 0, saa = 0, sbb = 0, sab = 0;
      for (size_t j = 0; j < a.size(); ++j) { ma += a[j]; mb += b[j]; }
      ma /= a.size(); mb /= a.size();
      for (size_t j = 0; j < a.size(); ++j) {
        saa += (a[j] - ma) * (a[j] - ma); sbb += (b[j] - mb) * (b[j] - mb); sab += (a[j] - ma) * (b[j] - mb);
      }
      return sab / std::sqrt(saa * sbb);
    };
    for (int l = 0; l < cfg.L; ++l) {
      const std::vector<float> in = to_f32(ref.view(l == 0 ? "emb" : "layer." + std::to_string(l - 1)));
      const std::vector<float> want = to_f32(ref.view("layer." + std::to_string(l)));
      double rmax = 0;
      for (float v : want) rmax = std::max(rmax, double(std::fabs(v)));
      std::printf("| %d | %.2f |", l, rmax);
      for (size_t i = 0; i < wfs.size(); ++i) {
        std::vector<float> h = in;
        reference_layer(cfg, ck->expert().layers[l], wfs[i], kv, l, rope, threads,
                        h.data());
        std::vector<double> got(h.begin(), h.end()), ref_out(want.begin(), want.end()), gb(h.size()), rb(h.size());
        double mx = 0;
        for (size_t j = 0; j < h.size(); ++j) {
          mx = std::max(mx, std::fabs(double(h[j]) - want[j]));
          gb[j] = double(h[j]) - in[j];
          rb[j] = double(want[j]) - in[j];
        }
        const double p = pcc(got, ref_out), pb = pcc(gb, rb);
        worst_pcc[i] = std::min(worst_pcc[i], p);
        worst_br[i] = std::min(worst_br[i], pb);
        worst_abs[i] = std::max(worst_abs[i], mx);
        std::printf(" %.7f | %.2e | %.6f |", p, mx, pb);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    std::printf("| worst | |");
    for (size_t i = 0; i < wfs.size(); ++i) std::printf(" %.7f | %.2e | %.6f |", worst_pcc[i], worst_abs[i], worst_br[i]);
    std::printf("\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bfp_layers: %s\n", e.what());
    return 1;
  }
  return 0;
}
