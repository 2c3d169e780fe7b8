// The cpu backend's registry entry (src/backends/registry.cpp lists it).
#include "alpamayo/limits.h"
#include "backends/cpu/cpu_backend.h"

namespace alpamayo {

BackendInfo cpu_backend_info() {
  BackendInfo b;
  b.name = "cpu";
  b.weight_formats = {"bf16", "int8", "bfp8_b", "bfp4_b"};
  b.kv_formats = {"bf16", "int8"};
  b.load = load_cpu_backend;
  b.kernel_choices = true;
  b.kernels_variable = "ALPAMAYO_CPU_KERNELS";
  b.features.shared_prompts = b.features.suffix_rows = b.features.left_padding = b.features.guidance = true;
  b.features.traces_non_finite = b.features.host_threads = true;
  b.features.strided_cache = b.features.paged_cache = true;
  b.memory.host_bytes_per_weight = host_bytes_per_weight;  // packed or block-encoded once at load
  b.memory.session = [](MemoryEstimate& e, const ExpertConfig&, const KVCache& kv, const KVCache* unguided) {
    double conv = 0;  // caches not in bf16 are converted to bf16 once at bind
    for (const KVCache* k : {&kv, unguided})
      if (k)
        for (const auto* list : {&k->key, &k->value, &k->suffix_key, &k->suffix_value})
          for (const TensorView& t : *list)
            if (t.dtype != DType::BF16)  // a strided view or a pool: its rows gathered as dense [N, Hkv, rows, d]
              conv += 2.0 * (!k->paged() && t.is_contiguous()
                                 ? double(t.numel())
                                 : double(list == &k->key || list == &k->value ? k->G : k->B) * k->Hkv *
                                       (list == &k->key || list == &k->value ? k->P : k->Q) * k->d);
    e.add("caches converted to bf16", conv);
  };
  return b;
}

}  // namespace alpamayo
