// fusebox's engine rules: one table, each entry naming the pattern, the
// engine (and knob values) it bars, and the evidence.
#include "engine_rules.h"

#include <algorithm>
#include <functional>
#include <map>

#include "ops/pointwise_fold.h"

namespace fusebox::cudnn {
namespace {

struct Rule {
  const char* name;
  const char* pattern;   // the engine barred ("eng8"), with any knob values
  const char* evidence;  // the case and what came back, with the cuDNN version
  std::function<bool(const ResolvedGraph&)> applies;
  bool dynamic_only = false;  // only in a dynamic-shape build
};

// The dims in `among`, in `t`'s memory order, slowest first.
std::vector<int> memory_order(const ResolvedTensor& t, const std::vector<int>& among) {
  std::vector<int> d = among;
  std::stable_sort(d.begin(), d.end(), [&](int a, int b) { return t.strides[a] > t.strides[b]; });
  return d;
}

// Whether `param` (a per-element parameter of x: scale, bias) is laid out
// in another order than x over the dims it spans (size > 1 in both).
bool other_layout_than(const ResolvedTensor& param, const ResolvedTensor& x) {
  if (param.dims.size() != x.dims.size()) return false;
  std::vector<int> spanned;
  for (size_t i = 0; i < x.dims.size(); ++i) {
    if (param.dims[i] > 1 && x.dims[i] > 1) spanned.push_back(static_cast<int>(i));
  }
  return memory_order(param, spanned) != memory_order(x, spanned);
}

bool any_op(const ResolvedGraph& g, const std::function<bool(const ResolvedOp&)>& pred) {
  for (const ResolvedOp& op : g.ops) {
    if (pred(op)) return true;
  }
  return false;
}

const ResolvedTensor* tensor_of(const ResolvedGraph& g, const std::map<std::string, int>& roles,
                                const char* role) {
  auto it = roles.find(role);
  return it == roles.end() ? nullptr : &g.tensors[it->second];
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = {
      {"layernorm-params-in-x-layout", "eng1",
       "cuDNN 9.19's layernorm engine eng1 reads scale and bias as if laid out like x: with x nhwc and "
       "scale/bias "
       "nchw it returned y 98% off (tests/cases/wrong-values/layernorm_fp16_over_chw_nhwc.json, H200, "
       "2026-12-04); with scale and bias in x's layout it is right. Give scale and bias x's layout",
       [](const ResolvedGraph& g) {
         return any_op(g, [&](const ResolvedOp& op) {
           if (!std::holds_alternative<LayerNormAttrs>(op.attrs)) return false;
           const ResolvedTensor* x = tensor_of(g, op.inputs, "x");
           for (const char* role : {"scale", "bias"}) {
             const ResolvedTensor* p = tensor_of(g, op.inputs, role);
             if (x && p && other_layout_than(*p, *x)) return true;
           }
           return false;
         });
       }},
      {"batchnorm-bwd-dx-in-x-dtype", "eng0",
       "cuDNN 9.19's batchnorm backward engine eng0 writes dx in x's dtype: with x fp16 and dx fp32 every "
       "one of "
       "its 35 knob settings left half of dx unwritten (tests/cases/wrong-values/"
       "batchnorm_bwd_fp16_fp32params_nhwc.json, H200, 2026-12-04). Give dx x's dtype",
       [](const ResolvedGraph& g) {
         return any_op(g, [&](const ResolvedOp& op) {
           if (!std::holds_alternative<BatchNormBwdAttrs>(op.attrs)) return false;
           const ResolvedTensor* x = tensor_of(g, op.inputs, "x");
           const ResolvedTensor* dx = tensor_of(g, op.outputs, "dx");
           return x && dx && x->dtype != dx->dtype;
         });
       }},
      {"dgrad-drelu-channels-last-output", "eng8",
       "cuDNN 9.19's fallback engine eng8 for conv_dgrad + relu_bwd with an output not in channels-last "
       "layout "
       "returned 206,965 non-finite values of 209,952 (tests/cases/wrong-values/"
       "conv_dgrad_drelu_fp16_nhwc_stride2.json, H200, 2026-12-04); with the output nhwc eng1 is right. Give "
       "the "
       "output nhwc, or let the graph run in parts",
       [](const ResolvedGraph& g) {
         const bool dgrad =
             any_op(g, [](const ResolvedOp& op) { return std::holds_alternative<ConvDgradAttrs>(op.attrs); });
         return dgrad && any_op(g, [&](const ResolvedOp& op) {
                  const auto* pw = std::get_if<PointwiseAttrs>(&op.attrs);
                  if (!pw || pw->mode != PointwiseMode::kReluBwd) return false;
                  const ResolvedTensor* y = tensor_of(g, op.outputs, "y");
                  return y && !y->is_virtual && y->dims.size() >= 3 && y->dims[1] > 1 && y->strides[1] != 1;
                });
       }},
      {"sdpa-fp8-bwd-ragged-sq", "eng6",
       "cuDNN 9.19's FP8 attention backward engine eng6 (the only candidate) is unreliable when the query "
       "length is not a multiple of 64: of five random graphs with Sq = 100 on the H200 (fusebox's sweep, "
       "2026-12-04 and 2026-12-05), dq was 14-15% off (rel-L2) in two (tests/cases/wrong-values/"
       "sdpa_fp8_bwd_s100.json, sdpa_fp8_bwd_gqa_s100.json), 8.6% off in a third (Sq 100, Skv 256, causal: "
       "past the 8% FP8 tolerance, served when the plan check's sample passed), within tolerance in two; "
       "all seven with Sq a multiple of 64 were right. Pad the queries to a multiple of 64 (padding masks "
       "the extra rows)",
       [](const ResolvedGraph& g) {
         return any_op(g, [&](const ResolvedOp& op) {
           if (!std::holds_alternative<SdpaFp8BwdAttrs>(op.attrs)) return false;
           const ResolvedTensor* q = tensor_of(g, op.inputs, "q");
           return q && q->dims.size() == 4 && q->dims[2] % 64 != 0;
         });
       }},
      {"pointwise-broadcast-over-two-dims", "eng1",
       "cuDNN 9.19's pointwise engine eng1 (every knob setting) broadcasts an in-memory input wrongly "
       "over two or more dims at rank 3, or over any dim at rank 2, in a graph of pointwise ops alone. "
       "On the H100 (2026-12-05) x [2,8,27] + b [1,1,27] gave rel-L2 0.49 (whatever b's strides, in "
       "bf16, fp16 and fp32), b [1,8,1] 0.47, [16,27] + [1,27] non-finite values, while b [1,8,27] or "
       "[2,1,27] (one dim) and [1,16,27] + [1,1,27] were right (fusebox's sweep, seeds 3004 and 4327: "
       "tests/cases/wrong-values/pointwise_bias_over_two_dims.json). By-value scalars broadcast right. "
       "Where merging adjacent dims leaves one broadcast dim, the lowering folds them; otherwise give the "
       "input the dims it is added to",
       [](const ResolvedGraph& g) {
         // The lowering folds the broadcast dims where that fixes it (ops/pointwise_fold.h).
         return pointwise_broadcast_eng1_gets_wrong(g) && !fold_pointwise_broadcast_dims(g, nullptr);
       }},
      {"max-pool-dynamic-shape", "eng3",
       "cuDNN 9.19's resample engine eng3, built with dynamic shapes, stopped max_pool 3x3/2 pad 1 on NHWC "
       "[N,8,7,7] fp16, [N,16,14,14] fp32, [N,8,14,14] and [N,16,9,9] fp16 with cudaErrorMisalignedAddress "
       "(which leaves the CUDA context unusable) on the H100 (fusebox's sweep, 2026-12-05, seeds 3104, 3185, "
       "4265, 4346; tests/rules/max_pool_dynamic_fp16_nhwc.json); the same graphs at a static "
       "shape ran right on eng3. Pools of a symbolic graph are built static",
       [](const ResolvedGraph& g) {
         return any_op(g, [](const ResolvedOp& op) { return std::holds_alternative<PoolAttrs>(op.attrs); });
       },
       true},
  };
  return table;
}

}  // namespace

std::vector<EngineBar> engine_bars_for(const ResolvedGraph& g, bool dynamic_shape) {
  std::vector<EngineBar> out;
  for (const Rule& r : rules()) {
    if ((!r.dynamic_only || dynamic_shape) && r.applies(g)) out.push_back({r.name, r.pattern, r.evidence});
  }
  return out;
}

bool engine_barred(const std::string& engine, const std::vector<EngineBar>& bars,
                   const std::vector<std::string>& excluded, std::string* why) {
  for (const auto& name : excluded) {
    if (name == engine) {
      if (why) *why = "failed the plan check earlier";
      return true;
    }
  }
  for (const auto& b : bars) {
    // The engine itself ("eng8") with any knobs ("eng8_k2=1"), never another engine ("eng80").
    if (engine == b.pattern || engine.rfind(b.pattern + "_", 0) == 0) {
      if (why) *why = "fusebox rule '" + b.rule + "': " + b.evidence;
      return true;
    }
  }
  return false;
}

}  // namespace fusebox::cudnn
