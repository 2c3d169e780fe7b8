// The whole public C++ API: Checkpoint (checkpoint.h) -> Model (model.h, shared) -> Session (session.h,
// one per bound context) -> SampleResult; Context (context.h) holds what the VLM leaves.
#pragma once
#include "alpamayo/action_space.h"
#include "alpamayo/backend.h"
#include "alpamayo/checkpoint.h"
#include "alpamayo/context.h"
#include "alpamayo/model.h"
#include "alpamayo/session.h"
