// The free functions of the public engine API (include/deepserve/engine.h), in a library of their
// own (ds_engine_api) so that code written against the API alone (the server and its tests with a
// fake engine) links them without the engine.
#include "deepserve/engine.h"

namespace deepserve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kToolCalls:
      return "tool_calls";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

}  // namespace deepserve
