// The cuDNN feature table (fusebox/cudnn_features.h). The minimum versions are
// those cudnn-frontend 1.32 checks before it uses each backend feature
// (get_backend_version() gates in its nodes), so a feature marked active here
// is one the frontend will also accept.
#include "fusebox/cudnn_features.h"

#include <array>

#include "internal.h"

namespace fusebox {
namespace {

constexpr std::array kFeatures = {
    CudnnFeature{"override_shapes", 92100,
                 "execute-time shape override (OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED): one plan serves "
                 "many shapes",
                 "symbolic graphs on a GPU (with override_shape_workspace): the first shape's plan is built "
                 "override-enabled and serves later shapes with no build (PlanRequest::override_shapes)",
                 "a plan per concrete shape, with the kernel cache"},
    CudnnFeature{"diagonal_band_mask", 92100, "SDPA's sliding-window (diagonal band) mask as one operation",
                 "sdpa_fwd/sdpa_bwd window masks, through the frontend",
                 "the frontend builds the mask from pointwise operations"},
    CudnnFeature{"transpose_slice_constants", 92200,
                 "transpose, strided slice and compile-time constants as graph operations", "not used yet",
                 "views are resolved by fusebox before lowering"},
    CudnnFeature{"override_shape_workspace", 92300,
                 "the workspace queried per variant pack of override shapes",
                 "the workspace of each shape served by override (plan_at_shape)",
                 "override shapes stay off (the built shape's workspace may be too small)"},
    CudnnFeature{
        "rope", 92400, "RoPE forward and backward as cuDNN operations (ROPE_FWD/BWD descriptors)",
        "not used: cuDNN 9.27 runs no RoPE graph alone (no engine), only rope before sdpa in one graph; "
        "fusebox's own kernel runs rope and rope_bwd (issue 35, part 4)",
        "fusebox's own kernel (rope, rope_bwd)"},
    CudnnFeature{"reduction_group_offset", 92400, "reductions over ragged groups (a group-offset tensor)",
                 "not used", "none"},
    CudnnFeature{"sdpa_block_mask", 92600, "SDPA block masks (Blackwell only)",
                 "refused on Hopper at validate (no engine for sm_90)", "refused with the reason"},
    CudnnFeature{"sdpa_ragged_sink", 92600, "SDPA attention sinks together with ragged (packed) sequences",
                 "sdpa with sinks and ragged offsets, through the frontend",
                 "the frontend refuses the combination; padded batches work"},
    CudnnFeature{"kernel_cache_queries", 92700, "kernel-cache size and entry queries", "not used",
                 "the kernel cache without queries"},
};

}  // namespace

std::span<const CudnnFeature> cudnn_feature_table() { return kFeatures; }

std::vector<CudnnFeatureState> cudnn_feature_states(int64_t runtime_version) {
  std::vector<CudnnFeatureState> out;
  out.reserve(kFeatures.size());
  for (const CudnnFeature& f : kFeatures) {
    out.push_back({&f, CUDNN_VERSION >= f.min_version, runtime_version >= f.min_version});
  }
  return out;
}

bool cudnn_feature_active(std::string_view name, int64_t runtime_version) {
  for (const CudnnFeatureState& s : cudnn_feature_states(runtime_version)) {
    if (s.feature->name == name) return s.active();
  }
  return false;
}

}  // namespace fusebox
