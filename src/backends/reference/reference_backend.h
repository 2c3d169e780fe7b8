#pragma once
#include <memory>

#include "alpamayo/backend.h"

namespace alpamayo {
std::unique_ptr<Backend> make_reference_backend(const BackendOptions& opts);
}
