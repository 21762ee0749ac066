// fusebox tests: building ResolvedGraphs by hand (no resolve()), for the reference tests.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/tensor.h"

namespace fusebox::testing_util {

inline std::vector<int64_t> dense(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

// Channels-last strides for [N, C, spatial...].
inline std::vector<int64_t> channels_last(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size());
  int64_t acc = dims[1];
  s[1] = 1;
  for (int i = static_cast<int>(dims.size()) - 1; i >= 2; --i) {
    s[i] = acc;
    acc *= dims[i];
  }
  s[0] = acc;
  return s;
}

// Builds a ResolvedGraph tensor by tensor and op by op, in topological order.
struct GraphBuilder {
  ResolvedGraph g;

  int tensor(const std::string& name, std::vector<int64_t> dims, DType dtype = DType::kFP32,
             std::vector<int64_t> strides = {}, bool is_virtual = false) {
    ResolvedTensor t;
    t.name = name;
    t.strides = strides.empty() ? dense(dims) : strides;
    t.dims = std::move(dims);
    t.dtype = dtype;
    t.is_virtual = is_virtual;
    t.is_input = !is_virtual;
    g.tensors.push_back(t);
    return static_cast<int>(g.tensors.size()) - 1;
  }
  int scalar(const std::string& name, double value, int rank = 4) {
    const int i = tensor(name, std::vector<int64_t>(rank, 1));
    g.tensors[i].scalar_value = value;
    return i;
  }
  void op(const std::string& name, OpAttrs attrs, std::map<std::string, int> inputs, int y) {
    ResolvedOp o;
    o.name = name;
    o.attrs = std::move(attrs);
    o.inputs = std::move(inputs);
    o.outputs = {{"y", y}};
    g.tensors[y].is_input = false;
    g.tensors[y].is_output = !g.tensors[y].is_virtual;
    g.ops.push_back(std::move(o));
  }
  // An op with several outputs by role (sdpa ops).
  void op_outputs(const std::string& name, OpAttrs attrs, std::map<std::string, int> inputs,
                  std::map<std::string, int> outputs) {
    op(name, std::move(attrs), std::move(inputs), outputs.begin()->second);
    g.ops.back().outputs = outputs;
    for (const auto& [role, idx] : outputs) {
      g.tensors[idx].is_input = false;
      g.tensors[idx].is_output = !g.tensors[idx].is_virtual;
    }
  }
  const ResolvedTensor& t(int i) const { return g.tensors[i]; }
};

// Fills a host tensor with `values` given in logical row-major order.
inline HostTensor host_from(const ResolvedTensor& t, const std::vector<double>& values) {
  HostTensor h = HostTensor::like(t);
  const size_t es = dtype_size_bytes(h.dtype);
  const size_t rank = h.dims.size();
  std::vector<int64_t> idx(rank, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t rem = static_cast<int64_t>(i), off = 0;
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      off += (rem % h.dims[d]) * h.strides[d];
      rem /= h.dims[d];
    }
    store_element(h.data.data() + off * es, h.dtype, values[i]);
  }
  return h;
}

// resolve(g) fails with InvalidArgument and a message holding every needle.
inline void expect_resolve_error(const GraphSpec& g, std::initializer_list<const char*> needles) {
  auto r = resolve(g);
  ASSERT_FALSE(r.ok()) << "expected resolve() to fail";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  for (const char* n : needles)
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << "message lacks '" << n << "': " << r.status().message();
}

// A graph from JSON text through resolve().
inline Result<ResolvedGraph> resolve_json(const std::string& text) {
  FUSEBOX_ASSIGN_OR_RETURN(GraphSpec spec, parse_graph_json(text));
  return resolve(spec);
}

// resolve() refuses `json` with InvalidArgument whose message holds every needle.
inline void expect_error(const std::string& json, std::initializer_list<const char*> needles) {
  auto r = resolve_json(json);
  ASSERT_FALSE(r.ok()) << "expected an error";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  for (const char* n : needles)
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << "message lacks '" << n << "': " << r.status().message();
}

}  // namespace fusebox::testing_util
