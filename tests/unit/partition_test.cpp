// The partitioner with a fake support oracle (which op combinations "have an
// engine"): where it cuts, which tensors become temporaries, what a part
// looks like as a graph, and the error when a single op has no engine.
#include "fusebox/partition.h"

#include <gtest/gtest.h>

#include <set>

using namespace fusebox;

namespace {

ResolvedGraph load(const std::string& rel) {
  auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

std::set<std::string> op_types(const ResolvedGraph& g) {
  std::set<std::string> out;
  for (const auto& op : g.ops) out.insert(std::string(op_type_name(op.attrs)));
  return out;
}

// "Engines" exist for any part without op type `loner` beside other ops, and
// for no part holding an op type in `none`.
SupportOracle fake_oracle(std::string loner, std::set<std::string> none = {}, int* calls = nullptr) {
  return [=](const ResolvedGraph& part) -> Status {
    if (calls) ++*calls;
    const auto types = op_types(part);
    for (const auto& t : none) {
      if (types.count(t)) return NotSupported("fake oracle: no engine for " + t);
    }
    if (types.count(loner) && part.ops.size() > 1)
      return NotSupported("fake oracle: " + loner + " runs alone");
    return Status::Ok();
  };
}

// "Engines" for the conv part only where it writes `conv_out` in the io dtype; with `one_op`, for
// one op at a time, else for the conv alone and any part without it.
SupportOracle conv_writes_io_only(const ResolvedGraph& g, const std::string& conv_out, bool one_op) {
  return [&g, conv_out, one_op](const ResolvedGraph& part) -> Status {
    const auto types = op_types(part);
    if (part.ops.size() > 1 && (one_op || types.count("conv_fprop")))
      return NotSupported("fake oracle: the conv alone");
    const int t = part.find_tensor(conv_out);
    if (types.count("conv_fprop") && t >= 0 && part.tensors[t].dtype != g.io_dtype)
      return NotSupported("fake oracle: the conv writes the io dtype only");
    return Status::Ok();
  };
}

// A last resort that takes every op and records which it was asked about.
SupportOracle recording_last_resort(std::vector<std::string>* asked) {
  return [asked](const ResolvedGraph& part) -> Status {
    asked->push_back(part.ops.at(0).name);
    return Status::Ok();
  };
}

}  // namespace

TEST(Partition, AGraphWithAnEngineStaysWhole) {
  const ResolvedGraph g = load("tests/cases/wrong-values/conv_dgrad_drelu_fp16_nhwc_stride2.json");
  int calls = 0;
  auto p = partition_graph(g, fake_oracle("none", {}, &calls));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->parts.size(), 1u);
  EXPECT_EQ(calls, 1);  // one question: the whole graph
  EXPECT_TRUE(p->temporaries.empty());
  EXPECT_EQ(p->parts[0].graph.canonical, g.canonical);
}

TEST(Partition, DgradThenReluBwdSplitsThroughATemporary) {
  const ResolvedGraph g = load("tests/cases/no-engine/conv_dgrad_drelu_3d_grouped_dilated_ncdhw.json");
  auto p = partition_graph(g, fake_oracle("relu_bwd"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->parts.size(), 2u);
  EXPECT_EQ(p->summary(), "2 parts: [conv_dgrad 'dgrad'] | [relu_bwd 'drelu']");
  ASSERT_EQ(p->temporaries.size(), 1u);
  const ResolvedTensor& tmp = g.tensors[p->temporaries[0]];
  EXPECT_EQ(tmp.name, "dgrad_out");
  EXPECT_EQ(p->temporary_bytes, (tmp.storage_bytes() + 255) / 256 * 256);
  EXPECT_EQ(p->temporary_dtypes.at(p->temporaries[0]), g.intermediate_dtype);  // the oracle took fp32
  // The temporary is the first part's output and the second part's input, in the intermediate dtype.
  const ResolvedGraph& a = p->parts[0].graph;
  const ResolvedGraph& b = p->parts[1].graph;
  const int ia = a.find_tensor("dgrad_out"), ib = b.find_tensor("dgrad_out");
  ASSERT_GE(ia, 0);
  ASSERT_GE(ib, 0);
  EXPECT_TRUE(a.tensors[ia].is_output);
  EXPECT_FALSE(a.tensors[ia].is_virtual);
  EXPECT_TRUE(b.tensors[ib].is_input);
  EXPECT_EQ(a.tensors[ia].dtype, g.intermediate_dtype);
  EXPECT_EQ(a.tensors[ia].strides, b.tensors[ib].strides);  // one layout on both sides of the cut
  EXPECT_GT(a.tensors[ia].uid, 0);
  // Graph inputs and outputs keep their names and layouts.
  EXPECT_EQ(b.tensors[b.find_tensor("dz")].strides, g.tensors[g.find_tensor("dz")].strides);
  EXPECT_NE(p->parts[0].why_cut.find("fake oracle: relu_bwd runs alone"), std::string::npos)
      << p->parts[0].why_cut;
  EXPECT_NE(p->parts[0].why_cut.find("[conv_dgrad 'dgrad'] and [relu_bwd 'drelu']"), std::string::npos);
  EXPECT_TRUE(p->parts[1].why_cut.empty());
}

TEST(Partition, TakesTheLargestFirstPart) {
  // conv + bias + scale fuse; the reduction runs alone after them.
  const ResolvedGraph g = load("tests/cases/no-engine/conv_bias_scale_reduce_amax_nhwc.json");
  auto p = partition_graph(g, fake_oracle("reduce_amax"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->parts.size(), 2u);
  EXPECT_EQ(p->parts[0].op_count, 3);
  EXPECT_EQ(p->parts[1].op_count, 1);
  ASSERT_EQ(p->temporaries.size(), 1u);
  EXPECT_EQ(g.tensors[p->temporaries[0]].name, "pre");
  // Inside the first part the conv's and the bias's outputs stay virtual: fused as before.
  const ResolvedGraph& a = p->parts[0].graph;
  EXPECT_TRUE(a.tensors[a.find_tensor("gemm_out")].is_virtual);
  EXPECT_TRUE(a.tensors[a.find_tensor("t0")].is_virtual);
  EXPECT_FALSE(a.tensors[a.find_tensor("pre")].is_virtual);
}

TEST(Partition, ATemporaryFallsBackToTheIoDtypeWhenThePartsWantIt) {
  // The "engines" here write and read only the io dtype in memory.
  const ResolvedGraph g = load("tests/cases/no-engine/conv_bias_scale_reduce_amax_nhwc.json");
  auto p = partition_graph(g, [&](const ResolvedGraph& part) -> Status {
    const auto types = op_types(part);
    if (types.count("reduce_amax") && part.ops.size() > 1) return NotSupported("fake oracle: reduce alone");
    for (const auto& t : part.tensors) {
      if (!t.is_virtual && !t.scalar_value && t.name == "pre" && t.dtype != g.io_dtype)
        return NotSupported("io dtype only");
    }
    return Status::Ok();
  });
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->parts.size(), 2u);
  const int pre = g.find_tensor("pre");
  EXPECT_EQ(p->temporary_dtypes.at(pre), g.io_dtype);
  // Both sides of the cut see the same dtype.
  EXPECT_EQ(p->parts[0].graph.tensors[p->parts[0].graph.find_tensor("pre")].dtype, g.io_dtype);
  EXPECT_EQ(p->parts[1].graph.tensors[p->parts[1].graph.find_tensor("pre")].dtype, g.io_dtype);
  ResolvedTensor as_bf16 = g.tensors[pre];
  as_bf16.dtype = g.io_dtype;
  EXPECT_EQ(p->temporary_bytes, (as_bf16.storage_bytes() + 255) / 256 * 256);
}

TEST(Partition, AnOpWithNoEngineAloneIsNotSupportedNamingItAndItsTensors) {
  const ResolvedGraph g = load("tests/cases/no-engine/conv_dgrad_drelu_3d_grouped_dilated_ncdhw.json");
  auto p = partition_graph(g, fake_oracle("x", {"relu_bwd"}));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotSupported);
  const std::string& m = p.status().message();
  EXPECT_NE(m.find("[relu_bwd 'drelu'] has no engine even on its own"), std::string::npos) << m;
  EXPECT_NE(m.find("relu_in"), std::string::npos) << m;
  EXPECT_NE(m.find("fake oracle: no engine for relu_bwd"), std::string::npos) << m;
}

TEST(Partition, APartIsRejectedOutsideTheGraph) {
  const ResolvedGraph g = load("tests/cases/no-engine/conv_dgrad_drelu_3d_grouped_dilated_ncdhw.json");
  EXPECT_FALSE(graph_part(g, 1, 2).ok());
  EXPECT_FALSE(graph_part(g, -1, 1).ok());
  EXPECT_FALSE(graph_part(g, 0, 0).ok());
}

// The last resort (fusebox's reference kernels, issue 29) serves only an op the oracle refused
// alone in every form; a part that only needed the io dtype keeps its engine.
TEST(Partition, TheLastResortTakesOnlyAnOpWithNoEngineInAnyForm) {
  const ResolvedGraph g = load("tests/cases/no-engine/conv_dgrad_drelu_3d_grouped_dilated_ncdhw.json");
  std::vector<std::string> asked;
  const SupportOracle last_resort = recording_last_resort(&asked);
  // relu_bwd never has an engine: the last resort serves it, and only it.
  auto p = partition_graph(g, fake_oracle("relu_bwd", {"relu_bwd"}), last_resort);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->summary(), "2 parts: [conv_dgrad 'dgrad'] | [relu_bwd 'drelu']");
  ASSERT_FALSE(asked.empty());
  for (const auto& a : asked) EXPECT_EQ(a, "drelu");

  // relu_bwd has an engine alone when its input arrives in the io dtype: no last resort.
  asked.clear();
  const SupportOracle io_only = [&](const ResolvedGraph& part) -> Status {
    if (op_types(part).count("relu_bwd") && part.ops.size() > 1) return NotSupported("alone only");
    const int t = part.find_tensor("dgrad_out");
    if (op_types(part).count("relu_bwd") && t >= 0 && part.tensors[t].dtype != g.io_dtype)
      return NotSupported("fake oracle: relu_bwd reads the io dtype only");
    return Status::Ok();
  };
  auto q = partition_graph(g, io_only, last_resort);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_TRUE(asked.empty()) << "the last resort was asked about " << asked.front();
  ASSERT_EQ(q->temporaries.size(), 1u);
  EXPECT_EQ(q->temporary_dtypes.at(q->temporaries[0]), g.io_dtype);

  // A last resort that refuses too: the error names both.
  const SupportOracle refuses = [](const ResolvedGraph&) -> Status { return NotSupported("rank 9"); };
  auto r = partition_graph(g, fake_oracle("relu_bwd", {"relu_bwd"}), refuses);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("the last resort: rank 9"), std::string::npos) << r.status().message();
}

// A temporary that a later reduce_sum sums stays in the intermediate dtype: stored as bf16, a bf16
// conv's 144 outputs a channel summed with cancellation came back 0.56% off (H100, sweep seed 7131).
// It is narrowed only when nothing else runs the graph, and the partition says so.
TEST(Partition, ASummedTemporaryIsNarrowedOnlyAsALastResort) {
  const ResolvedGraph g = load("tests/cases/wrong-values/conv_reduce_sum_fp32_summed_temporary.json");
  ASSERT_EQ(g.intermediate_dtype, DType::kFP32);
  ASSERT_EQ(g.io_dtype, DType::kBF16);
  // "Engines" for one op at a time; the conv writes only the io dtype.
  const SupportOracle io_conv = conv_writes_io_only(g, "conv_out", /*one_op=*/true);
  std::vector<std::string> asked;
  const SupportOracle last_resort = recording_last_resort(&asked);
  const int conv_out = g.find_tensor("conv_out");
  ASSERT_GE(conv_out, 0);
  // With a last resort, it computes the conv in fp32.
  auto p = partition_graph(g, io_conv, last_resort);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->temporary_dtypes.at(conv_out), DType::kFP32);
  EXPECT_EQ(asked, std::vector<std::string>{"conv"});
  EXPECT_TRUE(p->narrowed.empty());
  // Without one, the temporary is narrowed, and the partition says why.
  auto q = partition_graph(g, io_conv);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->temporary_dtypes.at(conv_out), DType::kBF16);
  ASSERT_EQ(q->narrowed.size(), 1u);
  EXPECT_NE(
      q->narrowed[0].find("temporary 'conv_out' stored as bf16, not the graph's intermediate fp32, though "
                          "[reduce_sum 'reduce'] sums it"),
      std::string::npos)
      << q->narrowed[0];
  // A max loses nothing to the rounding beyond its own: narrowed at once, no last resort asked.
  ResolvedGraph max_graph = g;
  for (auto& op : max_graph.ops)
    if (auto* r = std::get_if<ReductionAttrs>(&op.attrs)) r->mode = ReductionMode::kMax;
  asked.clear();
  auto m = partition_graph(max_graph, io_conv, last_resort);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->temporary_dtypes.at(conv_out), DType::kBF16);
  EXPECT_TRUE(asked.empty());
  EXPECT_TRUE(m->narrowed.empty());
}

// Through a pointwise op the sum still adds the temporary's rounding: conv -> relu -> reduce_sum
// cut after the conv keeps the conv's output in fp32 too; a matmul between them ends the chain.
TEST(Partition, ASumBehindPointwiseOpsKeepsTheTemporaryWide) {
  auto graph = [](const std::string& middle) {
    const std::string text = R"({"name": "conv_then_sum", "io_dtype": "bf16", "intermediate_dtype": "fp32",
      "tensors": [{"name": "x", "dims": [2, 8, 6, 6], "layout": "nhwc"},
                  {"name": "w", "dims": [8, 8, 3, 3], "layout": "nhwc"},
                  {"name": "r", "dtype": "fp32"}],
      "ops": [{"op": "conv_fprop", "name": "conv", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "c"},
               "padding": [1, 1]},
              {"op": ")" + middle +
                             R"(", "name": "mid", "inputs": {"x": "c"}, "outputs": {"y": "m"}},
              {"op": "reduce_sum", "name": "sum", "inputs": {"x": "m"}, "outputs": {"y": "r"},
               "reduce_dims": [0, 2, 3]}]})";
    auto spec = parse_graph_json(text);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  };
  const ResolvedGraph g = graph("relu");
  // The conv alone, writing the io dtype only; relu and the sum together.
  const SupportOracle oracle = conv_writes_io_only(g, "c", /*one_op=*/false);
  std::vector<std::string> asked;
  const SupportOracle last_resort = recording_last_resort(&asked);
  auto p = partition_graph(g, oracle, last_resort);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->summary(), "2 parts: [conv_fprop 'conv'] | [relu 'mid', reduce_sum 'sum']");
  EXPECT_EQ(p->temporary_dtypes.at(g.find_tensor("c")), DType::kFP32);
  EXPECT_EQ(asked, std::vector<std::string>{"conv"});
  auto q = partition_graph(g, oracle);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->narrowed.size(), 1u);
  EXPECT_NE(q->narrowed[0].find("though [reduce_sum 'sum'] sums it"), std::string::npos) << q->narrowed[0];
}

// A training step's da, dw and residual copy read dy and nothing of each other: three groups.
TEST(IndependentOpGroups, OpsJoinedOnlyBySharedInputsAreSeparateGroups) {
  const ResolvedGraph g = load("tests/cases/wrong-values/matmul_da_dw_residual_independent.json");
  ASSERT_EQ(g.ops.size(), 3u);
  const std::vector<int> groups = independent_op_groups(g);
  EXPECT_EQ(std::set<int>(groups.begin(), groups.end()), (std::set<int>{0, 1, 2}));
  EXPECT_EQ(groups[0], 0);
}

// conv -> bias -> relu chains, and an op reading a non-virtual output of another, are one group.
TEST(IndependentOpGroups, AProducerAndItsReadersAreOneGroup) {
  const ResolvedGraph chain = load("tests/cases/wrong-values/matmul_bias_reduce_amax_size1_dim.json");
  EXPECT_EQ(independent_op_groups(chain), (std::vector<int>{0, 0, 0}));
  const ResolvedGraph two = load("tests/cases/partitioned/two_convs_one_graph.json");
  const std::vector<int> groups = independent_op_groups(two);
  EXPECT_EQ(std::set<int>(groups.begin(), groups.end()).size(), 1u);
}

// The partitioner, asked with an oracle that refuses independent groups (as the cuDNN lowering
// does), runs each group as a part.
TEST(IndependentOpGroups, ThePartitionRunsEachGroupAlone) {
  const ResolvedGraph g = load("tests/cases/wrong-values/matmul_da_dw_residual_independent.json");
  const SupportOracle oracle = [](const ResolvedGraph& part) -> Status {
    const std::vector<int> groups = independent_op_groups(part);
    for (int k : groups)
      if (k > 0) return NotSupported("independent groups");
    return Status::Ok();
  };
  auto p = partition_graph(g, oracle);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->parts.size(), 3u) << p->summary();
  EXPECT_TRUE(p->temporaries.empty());
}
