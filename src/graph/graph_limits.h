// fusebox: limits on what a graph file may hold (docs/graph-format.md, "Limits").
// They bound the work and memory of reading an untrusted file; each is far above
// any real graph. Exceeding one is an InvalidArgument naming the place and the limit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fusebox::graph_limits {

// Nesting of JSON arrays and objects. A graph file needs 4 (root, "ops",
// op, "inputs"); nlohmann::json prints and compares recursively, so deep
// input would overflow the stack.
inline constexpr int kMaxJsonDepth = 64;
// JSON values in a file (counted as '[', '{' and ','): bounds the parsed
// document (~64 bytes a value at worst) to about 0.5 GiB whatever the file.
// A graph at the tensor and op limits needs about 3 million.
inline constexpr std::size_t kMaxJsonValues = std::size_t{1} << 23;
inline constexpr std::size_t kMaxTensors = 100000;
inline constexpr std::size_t kMaxOps = 100000;
// Graph, tensor and op names, role names and layouts.
inline constexpr std::size_t kMaxNameBytes = 256;
// Entries of one tensor's "values" (sequence lengths, FP8 scales).
inline constexpr std::size_t kMaxValues = std::size_t{1} << 20;
// Elements summed over the tensors a file gives dims for: 2 TiB of bf16,
// more than any one GPU holds, and far from 64-bit overflow in byte counts.
inline constexpr int64_t kMaxTotalElements = int64_t{1} << 40;

}  // namespace fusebox::graph_limits
