// fusebox_common: graph JSON (docs/graph-format.md) written by code, the language model's stages
// for training (src/train/lm_pipeline.cpp) and serving (src/serve/lm_graphs.cpp). Header-only;
// users link fusebox_json.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace fusebox::common {

// {"name", "dims"[, "layout"][, "dtype"]}.
inline nlohmann::json json_tensor(const std::string& name, std::vector<int64_t> dims,
                                  const char* layout = nullptr, const char* dtype = nullptr) {
  nlohmann::json t = {{"name", name}, {"dims", std::move(dims)}};
  if (layout) t["layout"] = layout;
  if (dtype) t["dtype"] = dtype;
  return t;
}

// {"op", "name", "inputs", "outputs"}: attributes are set on the result.
inline nlohmann::json json_op(const char* kind, const std::string& name, nlohmann::json inputs,
                              nlohmann::json outputs) {
  return {{"op", kind}, {"name", name}, {"inputs", std::move(inputs)}, {"outputs", std::move(outputs)}};
}

// A graph of bf16 tensors with fp32 intermediates and accumulation (the language model's stages).
inline nlohmann::json json_bf16_graph(const std::string& name, nlohmann::json tensors, nlohmann::json ops) {
  return {{"name", name},
          {"io_dtype", "bf16"},
          {"intermediate_dtype", "fp32"},
          {"compute_dtype", "fp32"},
          {"tensors", std::move(tensors)},
          {"ops", std::move(ops)}};
}

}  // namespace fusebox::common
