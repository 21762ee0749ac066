// fusebox op family sdpa (graph layer): sdpa_fwd, sdpa_bwd, sdpa_fp8_fwd and
// sdpa_fp8_bwd (include/fusebox/ops/sdpa.h has the semantics). The four share
// SdpaOptions (masks, padding, bias, ALiBi, dropout), their validation and
// their JSON; each adds its own inputs and outputs.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox {

using common::dims_string;

const SdpaOptions* sdpa_options(const OpAttrs& attrs) {
  return std::visit(
      [](const auto& a) -> const SdpaOptions* {
        if constexpr (std::is_base_of_v<SdpaOptions, std::decay_t<decltype(a)>>) return &a;
        return nullptr;
      },
      attrs);
}

SdpaOptions* sdpa_options(OpAttrs& attrs) {
  return const_cast<SdpaOptions*>(sdpa_options(static_cast<const OpAttrs&>(attrs)));
}

std::string_view sdpa_alignment_name(SdpaAlignment a) {
  return a == SdpaAlignment::kBottomRight ? "bottom_right" : "top_left";
}
std::vector<double> alibi_slopes(int64_t heads) {
  std::vector<double> exps;  // slope = 2^(-8 * e / n)
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  for (int64_t h = 0; h < n; ++h) exps.push_back(static_cast<double>(h + 1));
  for (int64_t m = 0; m < 2 * (heads - n); m += 2) exps.push_back(static_cast<double>(m + 1) * 0.5);
  std::vector<double> slopes;
  for (double e : exps)
    slopes.push_back(
        static_cast<double>(std::pow(2.0f, -8.0f * static_cast<float>(e) / static_cast<float>(n))));
  return slopes;
}

bool sdpa_keeps(const SdpaOptions& o, int64_t i, int64_t j, int64_t lq, int64_t lkv) {
  if (o.padding && (j >= lkv || i >= lq)) return false;
  const int64_t off = o.alignment == SdpaAlignment::kBottomRight ? lkv - lq : 0;
  const bool has_right = o.right_bound || o.causal;
  if (has_right && j > i + off + o.right_bound.value_or(0)) return false;
  if (o.left_bound && j <= i + off - *o.left_bound) return false;
  return true;
}

namespace {

// The keys row i < lq keeps under sdpa_keeps(): the interval [*lo, *hi] (empty when *lo > *hi).
void kept_key_interval(const SdpaOptions& o, int64_t i, int64_t lq, int64_t lkv, int64_t* lo, int64_t* hi) {
  const int64_t off = o.alignment == SdpaAlignment::kBottomRight ? lkv - lq : 0;
  *hi = lkv - 1;
  if (o.right_bound || o.causal) *hi = std::min(*hi, i + off + o.right_bound.value_or(0));
  *lo = 0;
  if (o.left_bound) *lo = std::max<int64_t>(*lo, i + off - *o.left_bound + 1);
}

}  // namespace

double sdpa_kept_pairs(const SdpaOptions& o, int64_t lq, int64_t lkv) {
  double pairs = 0;
  for (int64_t i = 0; i < lq; ++i) {
    int64_t lo = 0, hi = -1;
    kept_key_interval(o, i, lq, lkv, &lo, &hi);
    if (hi >= lo) pairs += static_cast<double>(hi - lo + 1);
  }
  return pairs;
}

namespace graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
// A decode step (one query per sequence) may split the keys across thread blocks.
std::string sdpa_forward_not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op);
struct SdpaTraits : OpTraitsDefaults {
  static constexpr std::string_view family = "sdpa", bench_family = "sdpa";
  static constexpr auto json_fields =
      std::to_array<std::string_view>({"attn_scale", "causal", "alignment", "left_bound", "right_bound",
                                       "alibi", "dropout", "deterministic", "max_seq_len_kv"});
  static constexpr bool outputs_in_memory = true;
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>(
      {"seq_len_q", "seq_len_kv", "page_table_k", "page_table_v", "block_mask", "seed", "offset"});
};
template <>
struct OpTraits<SdpaFwdAttrs> : SdpaTraits {
  static std::string not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op, const SdpaFwdAttrs&) {
    return sdpa_forward_not_bit_reproducible(g, op);
  }
};
template <>
struct OpTraits<SdpaFp8FwdAttrs> : SdpaTraits {
  static std::string not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op,
                                          const SdpaFp8FwdAttrs&) {
    return sdpa_forward_not_bit_reproducible(g, op);
  }
};
template <>
struct OpTraits<SdpaBwdAttrs> : SdpaTraits {
  static constexpr bool reads_forward_outputs = true;
  static std::string not_bit_reproducible(const ResolvedGraph&, const ResolvedOp& op, const SdpaBwdAttrs& a) {
    return a.deterministic
               ? ""
               : "op '" + op.name +
                     "' (sdpa backward) accumulates dq with atomics; \"deterministic\": true repeats";
  }
};
template <>
struct OpTraits<SdpaFp8BwdAttrs> : SdpaTraits {
  static constexpr bool reads_forward_outputs = true;
};
FUSEBOX_OP_TRAITS(SdpaFwdAttrs)
FUSEBOX_OP_TRAITS(SdpaFp8FwdAttrs)
FUSEBOX_OP_TRAITS(SdpaBwdAttrs)
FUSEBOX_OP_TRAITS(SdpaFp8BwdAttrs)

namespace {

template <typename T>
constexpr bool kIsBwd = std::is_same_v<T, SdpaBwdAttrs> || std::is_same_v<T, SdpaFp8BwdAttrs>;
template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, SdpaFp8FwdAttrs> || std::is_same_v<T, SdpaFp8BwdAttrs>;

constexpr const char* kFp8FwdScales[] = {"descale_q", "descale_k", "descale_v",
                                         "descale_s", "scale_s",   "scale_o"};
constexpr const char* kFp8BwdScales[] = {"descale_q",  "descale_k", "descale_v",  "descale_o",
                                         "descale_do", "descale_s", "descale_dp", "scale_s",
                                         "scale_dq",   "scale_dk",  "scale_dv",   "scale_dp"};

template <typename T>
std::vector<std::string_view> sdpa_input_roles(const T& a) {
  std::vector<std::string_view> r = {"q", "k", "v"};
  if constexpr (kIsBwd<T>) r.insert(r.end(), {"o", "do", "stats"});
  if constexpr (std::is_same_v<T, SdpaFp8BwdAttrs>)
    r.insert(r.end(), std::begin(kFp8BwdScales), std::end(kFp8BwdScales));
  if constexpr (std::is_same_v<T, SdpaFp8FwdAttrs>)
    r.insert(r.end(), std::begin(kFp8FwdScales), std::end(kFp8FwdScales));
  if (a.padding) r.insert(r.end(), {"seq_len_q", "seq_len_kv"});
  if (a.paged) r.insert(r.end(), {"page_table_k", "page_table_v"});
  if (a.sink) r.push_back("sink_token");
  if constexpr (std::is_same_v<T, SdpaFwdAttrs>) {
    if (a.fp8_kv) r.insert(r.end(), {"descale_k", "descale_v"});
  }
  if (a.block_mask) r.push_back("block_mask");
  if (a.bias) r.push_back("bias");
  if (a.dropout) r.insert(r.end(), {"seed", "offset"});
  return r;
}

template <typename T>
std::vector<std::string_view> sdpa_output_roles(const T& a) {
  std::vector<std::string_view> r;
  if constexpr (std::is_same_v<T, SdpaFwdAttrs>) {
    r = {"o"};
    if (a.generate_stats) r.push_back("stats");
  } else if constexpr (std::is_same_v<T, SdpaBwdAttrs>) {
    r = {"dq", "dk", "dv"};
    if (a.sink_grad) r.push_back("dsink_token");
  } else if constexpr (std::is_same_v<T, SdpaFp8FwdAttrs>) {
    r = {"o", "amax_s", "amax_o"};
    if (a.generate_stats) r.push_back("stats");
  } else {
    r = {"dq", "dk", "dv", "amax_dq", "amax_dk", "amax_dv", "amax_dp"};
  }
  if (a.dump_dropout_mask) r.push_back("dropout_mask");
  return r;
}

template <typename T>
std::string sdpa_output_roles_hint(const T& a) {
  if constexpr (std::is_same_v<T, SdpaFwdAttrs> || std::is_same_v<T, SdpaFp8FwdAttrs>) {
    return a.generate_stats ? " (generate_stats is on: give 'stats' too)"
                            : " (generate_stats is off; a 'stats' output turns it on)";
  }
  return "";
}

template <typename T>
Status sdpa_parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec& op,
                       T& a) {
  FUSEBOX_RETURN_IF_ERROR(r.opt_number(v, path, "attn_scale", a.attn_scale));
  FUSEBOX_RETURN_IF_ERROR(r.opt_bool(v, path, "causal", a.causal));
  FUSEBOX_RETURN_IF_ERROR(r.opt_bool(v, path, "alibi", a.alibi));
  FUSEBOX_RETURN_IF_ERROR(r.opt_int(v, path, "left_bound", a.left_bound));
  FUSEBOX_RETURN_IF_ERROR(r.opt_int(v, path, "right_bound", a.right_bound));
  FUSEBOX_RETURN_IF_ERROR(r.opt_number(v, path, "dropout", a.dropout));
  FUSEBOX_RETURN_IF_ERROR(r.opt_int(v, path, "max_seq_len_kv", a.max_seq_len_kv));
  if (v.contains("alignment")) {
    FUSEBOX_ASSIGN_OR_RETURN(std::string al, r.get_string(path + ".alignment", v["alignment"]));
    if (al == "top_left") {
      a.alignment = SdpaAlignment::kTopLeft;
    } else if (al == "bottom_right") {
      a.alignment = SdpaAlignment::kBottomRight;
    } else {
      return r.err(path + ".alignment",
                   "unknown alignment \"" + al +
                       "\": accepted are \"top_left\" (query row i sees keys j <= i) and "
                       "\"bottom_right\" (the diagonal ends at the last key)");
    }
  }
  // Optional inputs switch their feature on: seq_len_q/seq_len_kv -> padding, bias -> bias.
  a.padding = op.inputs.count("seq_len_q") > 0 || op.inputs.count("seq_len_kv") > 0;
  a.bias = op.inputs.count("bias") > 0;
  // page_table_k/page_table_v -> paged K/V (the role check then asks for both).
  a.paged = op.inputs.count("page_table_k") > 0 || op.inputs.count("page_table_v") > 0;
  if (a.max_seq_len_kv && !a.paged) {
    return r.err(path + ".max_seq_len_kv",
                 "max_seq_len_kv is the key length of a paged K/V cache: give inputs 'page_table_k' and "
                 "'page_table_v' with it, or remove it (a dense k has its length in its dims)");
  }
  a.sink = op.inputs.count("sink_token") > 0;        // sink_token -> attention sinks
  a.block_mask = op.inputs.count("block_mask") > 0;  // block_mask -> block-sparse attention
  if constexpr (!std::is_same_v<T, SdpaFwdAttrs>) {
    if (a.block_mask) {
      return r.err(
          path + ".inputs.block_mask",
          "only sdpa_fwd takes a block mask: cuDNN (frontend 1.32) sets block masks on the forward's "
          "unified SDPA node only (bf16 or fp16)");
    }
  }
  a.dump_dropout_mask = op.outputs.count("dropout_mask") > 0;
  if constexpr (std::is_same_v<T, SdpaBwdAttrs>) {
    FUSEBOX_RETURN_IF_ERROR(r.opt_bool(v, path, "deterministic", a.deterministic));
    a.sink_grad = op.outputs.count("dsink_token") > 0;  // dsink_token -> the sink's gradient
    if (a.sink_grad && !a.sink) {
      return r.err(
          path + ".outputs.dsink_token",
          "a 'dsink_token' output is the gradient of the sink logits: give the forward's 'sink_token' "
          "input too");
    }
  } else if (v.contains("deterministic")) {
    return r.err(path + ".deterministic", "only sdpa_bwd has a deterministic variant");
  }
  // Stats are generated exactly when a "stats" output is named.
  if constexpr (std::is_same_v<T, SdpaFwdAttrs> || std::is_same_v<T, SdpaFp8FwdAttrs>) {
    a.generate_stats = op.outputs.count("stats") > 0;
  }
  // descale_k/descale_v -> an FP8 K/V cache (the role check then asks for both).
  if constexpr (std::is_same_v<T, SdpaFwdAttrs>) {
    a.fp8_kv = op.inputs.count("descale_k") > 0 || op.inputs.count("descale_v") > 0;
  }
  return Status::Ok();
}

template <typename T>
void sdpa_write_json(const T& a, nlohmann::ordered_json& j) {
  if (a.attn_scale) j["attn_scale"] = static_cast<double>(*a.attn_scale);
  if (a.causal) j["causal"] = true;
  if (a.alignment != SdpaAlignment::kTopLeft) j["alignment"] = std::string(sdpa_alignment_name(a.alignment));
  if (a.left_bound) j["left_bound"] = *a.left_bound;
  if (a.right_bound) j["right_bound"] = *a.right_bound;
  if (a.alibi) j["alibi"] = true;
  if (a.dropout) j["dropout"] = static_cast<double>(*a.dropout);
  if (a.max_seq_len_kv) j["max_seq_len_kv"] = *a.max_seq_len_kv;
  if constexpr (std::is_same_v<T, SdpaBwdAttrs>) {
    if (a.deterministic) j["deterministic"] = true;
  }
}

// Checks one sdpa input: rank 4, a graph input, the head dim contiguous.
Status check_sdpa_tensor(const InferContext& ctx, const char* role, const char* shape,
                         const std::string& op_type) {
  const ResolvedTensor& t = ctx.in(role);
  const std::string in = ctx.in_where(role);
  if (t.dims.size() != 4) {
    return InvalidArgument(in + " has rank " + std::to_string(t.dims.size()) + " " + dims_string(t.dims) +
                           ": " + op_type + " takes rank-4 " + shape +
                           " (logical order; use layout \"bshd\" or strides for [B, S, H, D] memory)");
  }
  if (!t.is_input) {
    return InvalidArgument(in + " is produced by another op: " + op_type +
                           " reads its inputs from memory, so '" + role + "' must be a graph input");
  }
  if (t.strides.size() != 4 || t.strides[3] != 1) {
    return InvalidArgument(in + " has strides " + dims_string(t.strides) +
                           ": the last dim must be contiguous (stride 1), e.g. layout \"bhsd\" or \"bshd\"");
  }
  return Status::Ok();
}

struct SdpaDims {
  int64_t B = 0, Hq = 0, Sq = 0, D = 0, Hk = 0, Skv = 0, Dv = 0;
};

// Paged K/V: k and v are page pools [num_pages, Hk, page_size, D(v)], the page
// tables int32 [B, 1, max_pages, 1]. Sets d.Skv to max_seq_len_kv (filled in
// as max_pages * page_size when not given) and checks fixed table values.
template <typename T>
Status infer_sdpa_paged(const InferContext& ctx, T& o, SdpaDims& d) {
  const std::string type(type_name(o));
  if constexpr (kIsBwd<T>) {
    return InvalidArgument(
        ctx.in_where("page_table_k") + ": " + type +
        " takes no page tables: paged K/V caches are for inference (sdpa_fwd, sdpa_fp8_fwd); "
        "cuDNN has no paged backward");
  } else {
    const ResolvedTensor& k = ctx.in("k");
    const int64_t page_size = k.dims[2];
    if (!o.padding) {
      return InvalidArgument(
          ctx.where +
          " paged K/V needs each sequence's lengths: give inputs 'seq_len_q' and "
          "'seq_len_kv' (int32 [B,1,1,1]); cuDNN reads a paged cache only with a padding mask");
    }
    const std::vector<int64_t>& table_dims = ctx.in("page_table_k").dims;
    for (const char* role : {"page_table_k", "page_table_v"}) {
      const ResolvedTensor& t = ctx.in(role);
      const std::string w = ctx.in_where(role);
      if (t.scalar_value || !t.is_input) {
        return InvalidArgument(w +
                               " must be a graph input tensor in memory: a page table is int32 "
                               "[B, 1, max_pages, 1], the pool's page index of each page of each sequence");
      }
      if (t.dtype != DType::kInt32) {
        return InvalidArgument(w + " has dtype " + std::string(dtype_name(t.dtype)) +
                               ": a page table is int32 (page indices into the pool)");
      }
      if (t.dims.size() != 4 || t.dims[0] != d.B || t.dims[1] != 1 || t.dims[2] < 1 || t.dims[3] != 1) {
        return InvalidArgument(w + " has dims " + dims_string(t.dims) +
                               ": a page table is [B, 1, max_pages, 1] = [" + std::to_string(d.B) +
                               ", 1, max_pages, 1] (B from q; one row of page indices per "
                               "sequence)");
      }
      if (t.dims != table_dims) {
        return InvalidArgument(w + " has dims " + dims_string(t.dims) + " but 'page_table_k' (" +
                               squote(ctx.in("page_table_k").name) + ") has " + dims_string(table_dims) +
                               ": the k and v page tables must have the same dims");
      }
    }
    const int64_t max_pages = table_dims[2], capacity = max_pages * page_size;
    if (!o.max_seq_len_kv) o.max_seq_len_kv = capacity;
    // cuDNN 9.19's paged cache load: the tables hold exactly ceil(max_seq_len_kv / page_size) pages.
    const int64_t lowest = capacity - page_size + 1;
    if (*o.max_seq_len_kv < lowest || *o.max_seq_len_kv > capacity) {
      return InvalidArgument(
          ctx.where + " max_seq_len_kv is " + std::to_string(*o.max_seq_len_kv) + ": give " +
          std::to_string(lowest) + ".." + std::to_string(capacity) +
          " (cuDNN wants tables of exactly ceil(max_seq_len_kv / page_size) pages: max_pages " +
          std::to_string(max_pages) + " of the page tables, page_size " + std::to_string(page_size) +
          " of the pools), or leave it out for " + std::to_string(capacity));
    }
    d.Skv = *o.max_seq_len_kv;
    for (auto [role, pool_role] :
         {std::pair<const char*, const char*>{"page_table_k", "k"}, {"page_table_v", "v"}}) {
      ResolvedTensor& t = ctx.in(role);
      const ResolvedTensor& pool = ctx.in(pool_role);
      const int64_t num_pages = pool.dims[0];
      if (num_pages > (int64_t{1} << 24)) {  // the references hold indices as floats
        return InvalidArgument(ctx.in_where(pool_role) + " has " + std::to_string(num_pages) +
                               " pages: fusebox handles pools of at most 2^24 pages");
      }
      // fusebox replaces random tables by shuffled valid ones (make_inputs);
      // this range only keeps a table made elsewhere in bounds.
      t.random_lo = 0;
      t.random_hi = static_cast<double>(num_pages - 1);
      for (size_t idx = 0; idx < t.values.size(); ++idx) {
        const double x = t.values[idx];
        if (x < 0 || x >= static_cast<double>(num_pages) || x != std::floor(x)) {
          std::ostringstream vs;
          vs << x;
          return InvalidArgument(ctx.in_where(role) + " holds page " + vs.str() + " for batch entry " +
                                 std::to_string(idx / static_cast<size_t>(max_pages)) + " (slot " +
                                 std::to_string(idx % static_cast<size_t>(max_pages)) + "): the pool '" +
                                 std::string(pool_role) + "' (" + squote(pool.name) + ") has " +
                                 std::to_string(num_pages) +
                                 " pages, so every entry (unused slots too) must be " + "an integer in [0, " +
                                 std::to_string(num_pages) + ")");
        }
      }
    }
    return Status::Ok();
  }
}

// Validates q/k/v (shared by every sdpa op), the options and the optional
// inputs; fills attn_scale, right_bound (causal) and the random ranges of
// sequence-length, dropout and FP8-scale inputs.
template <typename T>
Result<SdpaDims> infer_sdpa_inputs(const InferContext& ctx, T& o) {
  const std::string& where = ctx.where;
  const std::string type(type_name(o));
  constexpr bool fp8 = kIsFp8<T>;
  constexpr bool fp8_bwd = std::is_same_v<T, SdpaFp8BwdAttrs>;
  const ResolvedTensor& qt = ctx.in("q");
  const ResolvedTensor& k = ctx.in("k");
  const ResolvedTensor& v = ctx.in("v");
  bool fp8_kv = false;  // sdpa_fwd's FP8 K/V cache: fp8 k and v with bf16 or fp16 q
  if constexpr (std::is_same_v<T, SdpaFwdAttrs>) fp8_kv = o.fp8_kv;
  struct Named {
    const char* role;
    const ResolvedTensor* t;
    const char* shape;
  };
  for (Named n : {Named{"q", &qt, "[B, Hq, Sq, D]"}, Named{"k", &k, "[B, Hk, Skv, D]"},
                  Named{"v", &v, "[B, Hk, Skv, Dv]"}}) {
    FUSEBOX_RETURN_IF_ERROR(check_sdpa_tensor(ctx, n.role, n.shape, type));
    const std::string in_where = ctx.in_where(n.role);
    const bool fp8_cache = fp8_kv && n.t != &qt;
    if (fp8) {
      FUSEBOX_RETURN_IF_ERROR(check_dtype_in(in_where, n.t->dtype, {DType::kFP8E4M3},
                                             type + " takes fp8_e4m3 q, k and v (cuDNN 9.19 on Hopper)"));
    } else if (fp8_cache) {
      FUSEBOX_RETURN_IF_ERROR(check_dtype_in(in_where, n.t->dtype, {DType::kFP8E4M3},
                                             type + " with 'descale_k' and 'descale_v' (an FP8 K/V cache) "
                                                    "takes fp8_e4m3 k and v"));
    } else {
      FUSEBOX_RETURN_IF_ERROR(
          check_dtype_in(in_where, n.t->dtype, {DType::kBF16, DType::kFP16},
                         type + " takes bf16 or fp16 q, k and v (sdpa_fp8_fwd takes fp8)"));
    }
    if (n.t->dtype != qt.dtype && !fp8_cache) {
      return InvalidArgument(in_where + " has dtype " + std::string(dtype_name(n.t->dtype)) + " but 'q' (" +
                             squote(qt.name) + ") has " + std::string(dtype_name(qt.dtype)) +
                             ": q, k and v must share one dtype");
    }
  }
  SdpaDims d;
  d.B = qt.dims[0], d.Hq = qt.dims[1], d.Sq = qt.dims[2], d.D = qt.dims[3];
  d.Hk = k.dims[1], d.Skv = k.dims[2], d.Dv = v.dims[3];
  auto kv_mismatch = [&](const char* role, const ResolvedTensor& t, size_t dim, const char* what,
                         int64_t want, const char* want_from) {
    return InvalidArgument(ctx.in_where(role) + " " + dims_string(t.dims) + " has " + what + "=" +
                           std::to_string(t.dims[dim]) + " but " + want_from + " has " +
                           std::to_string(want) + ": " + what + " must match");
  };
  if (!o.paged && k.dims[0] != d.B) return kv_mismatch("k", k, 0, "B", d.B, "q");
  if (!o.paged && v.dims[0] != d.B) return kv_mismatch("v", v, 0, "B", d.B, "q");
  if (k.dims[3] != d.D) {
    return InvalidArgument(ctx.in_where("k") + " " + dims_string(k.dims) +
                           " has head dim D=" + std::to_string(k.dims[3]) + " but 'q' (" + squote(qt.name) +
                           ") " + dims_string(qt.dims) + " has D=" + std::to_string(d.D) +
                           ": q and k must have the same head dim");
  }
  if (v.dims[1] != d.Hk) return kv_mismatch("v", v, 1, "Hk", d.Hk, "k");
  if (v.dims[2] != d.Skv) return kv_mismatch("v", v, 2, o.paged ? "page_size" : "Skv", d.Skv, "k");
  if (d.Hq % d.Hk != 0) {
    return InvalidArgument(where + " 'q' (" + squote(qt.name) + ") has Hq=" + std::to_string(d.Hq) +
                           " heads but 'k' (" + squote(k.name) + ") has Hk=" + std::to_string(d.Hk) +
                           ": Hq must be a multiple of Hk (Hk == Hq: multi-head, Hk == 1: multi-query, "
                           "otherwise grouped-query attention)");
  }
  const int64_t multiple = fp8 ? 16 : 8;
  for (auto [name, val] :
       {std::pair<const char*, int64_t>{"D (q/k head dim)", d.D}, {"Dv (v head dim)", d.Dv}}) {
    if (val > 256 || val % multiple != 0) {
      return InvalidArgument(where + " " + name + " is " + std::to_string(val) + ": cuDNN 9.19 " +
                             (fp8 ? "FP8 SDPA needs head dims <= 256 and a multiple of 16"
                                  : "SDPA needs head dims <= 256 and a multiple of 8 (e.g. 64, 128)"));
    }
  }

  // --- options
  if (o.attn_scale) {
    if (!std::isfinite(*o.attn_scale)) {
      return InvalidArgument(where + " attn_scale is not finite: give a finite number (default 1/sqrt(D))");
    }
  } else {
    o.attn_scale = 1.0 / std::sqrt(static_cast<double>(d.D));
  }
  if (o.right_bound && *o.right_bound < 0) {
    return InvalidArgument(where + " right_bound is " + std::to_string(*o.right_bound) +
                           ": give a bound >= 0 (0: causal; key j is kept while j <= i + right_bound)");
  }
  if (o.causal && o.right_bound && *o.right_bound != 0) {
    return InvalidArgument(where + " causal is set with right_bound " + std::to_string(*o.right_bound) +
                           ": causal means right_bound 0; give one or the other");
  }
  if (o.causal) o.right_bound = 0;
  if (o.left_bound && *o.left_bound < 1) {
    return InvalidArgument(where + " left_bound (sliding window) is " + std::to_string(*o.left_bound) +
                           ": give a window of at least 1 key");
  }
  if (o.dropout && !(*o.dropout >= 0.0 && *o.dropout < 1.0)) {
    return InvalidArgument(where + " dropout is " + std::to_string(*o.dropout) +
                           ": give a probability in [0, 1) (0: no dropout)");
  }
  if (o.dump_dropout_mask && !o.dropout) {
    return InvalidArgument(where +
                           " has a 'dropout_mask' output but no dropout: set \"dropout\" (a probability) "
                           "or remove the output");
  }
  if (o.alibi && !(o.right_bound && *o.right_bound == 0)) {
    return InvalidArgument(where +
                           " alibi needs a causal mask in cuDNN 9.19: set \"causal\": true with \"alibi\"");
  }

  // --- optional inputs
  auto check_small = [&](const char* role, DType want, const std::vector<int64_t>& dims,
                         const std::string& what) -> Status {
    ResolvedTensor& t = ctx.in(role);
    const std::string w = ctx.in_where(role);
    if (t.scalar_value || !t.is_input) {
      return InvalidArgument(w + " must be a graph input tensor in memory: " + what);
    }
    if (t.dims != dims) {
      return InvalidArgument(w + " has dims " + dims_string(t.dims) + ": " + what + " has dims " +
                             dims_string(dims));
    }
    if (t.dtype != want) {
      return InvalidArgument(w + " has dtype " + std::string(dtype_name(t.dtype)) + ": " + what + " is " +
                             std::string(dtype_name(want)));
    }
    return Status::Ok();
  };
  if (o.paged) FUSEBOX_RETURN_IF_ERROR(infer_sdpa_paged(ctx, o, d));
  if (o.padding) {
    FUSEBOX_RETURN_IF_ERROR(check_small("seq_len_q", DType::kInt32, {d.B, 1, 1, 1},
                                        "seq_len_q holds each sequence's query length"));
    FUSEBOX_RETURN_IF_ERROR(check_small("seq_len_kv", DType::kInt32, {d.B, 1, 1, 1},
                                        "seq_len_kv holds each sequence's key/value length"));
    for (auto [role, full] : {std::pair<const char*, int64_t>{"seq_len_q", d.Sq}, {"seq_len_kv", d.Skv}}) {
      ResolvedTensor& t = ctx.in(role);
      // [1, S]; for S = 1 (decode) [0, 1]: random integers need a range of two values at least.
      t.random_lo = full == 1 ? 0 : 1;
      t.random_hi = static_cast<double>(full);
      for (double x : t.values) {
        if (x < 0 || x > static_cast<double>(full) || x != std::floor(x)) {
          std::ostringstream vs;
          vs << x;
          return InvalidArgument(ctx.in_where(role) + " holds the value " + vs.str() +
                                 ": each length must be an integer in [0, " + std::to_string(full) + "]");
        }
      }
    }
  }
  if (o.sink) {
    if constexpr (std::is_same_v<T, SdpaFp8BwdAttrs>) {
      return InvalidArgument(ctx.in_where("sink_token") +
                             ": fusebox has attention sinks in sdpa_fwd, "
                             "sdpa_fp8_fwd and sdpa_bwd, not in the FP8 backward; remove 'sink_token' from " +
                             type);
    }
    FUSEBOX_RETURN_IF_ERROR(check_small("sink_token", DType::kFP32, {1, d.Hq, 1, 1},
                                        "the sink token (one fp32 logit per query head)"));
  }
  if (o.block_mask) {
    if constexpr (std::is_same_v<T, SdpaFwdAttrs>) {  // the others refuse it when parsed
      const std::vector<int64_t> dims = sdpa_block_mask_dims(d.B, d.Hq, d.Sq, d.Skv);
      FUSEBOX_RETURN_IF_ERROR(check_small(
          "block_mask", DType::kUInt8, dims,
          "the block mask (one bit per 128 x 128 tile of the scores, uint8 [B, Hq, ceil(Sq / 128), "
          "ceil(ceil(Skv / 128) / 8)] with B, Hq, Sq from q and Skv " +
              std::to_string(d.Skv) + ")"));
      ResolvedTensor& t = ctx.in("block_mask");
      // Random bytes are never 0, so that a row of at most 8 key tiles keeps one.
      t.random_lo = 1;
      t.random_hi = 255;
      for (double x : t.values) {
        if (x < 0 || x > 255 || x != std::floor(x)) {
          std::ostringstream vs;
          vs << x;
          return InvalidArgument(ctx.in_where("block_mask") + " holds the value " + vs.str() +
                                 ": each byte of a block mask is an integer in [0, 255] (8 tiles' bits)");
        }
      }
    }
  }
  if (o.bias) {
    ResolvedTensor& t = ctx.in("bias");
    const std::string w = ctx.in_where("bias");
    if (!t.is_input || t.dims.size() != 4 || (t.dims[0] != 1 && t.dims[0] != d.B) ||
        (t.dims[1] != 1 && t.dims[1] != d.Hq) || t.dims[2] != d.Sq || t.dims[3] != d.Skv) {
      return InvalidArgument(w + " has dims " + dims_string(t.dims) +
                             ": the bias is a graph input [B or 1, Hq or 1, Sq, Skv] = [" +
                             std::to_string(d.B) + " or 1, " + std::to_string(d.Hq) + " or 1, " +
                             std::to_string(d.Sq) + ", " + std::to_string(d.Skv) + "]");
    }
    if (fp8) return InvalidArgument(w + ": cuDNN 9.19 FP8 SDPA takes no bias");
    FUSEBOX_RETURN_IF_ERROR(check_dtype_in(w, t.dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                                           "the bias is bf16, fp16 or fp32"));
    if (t.strides[3] != 1) return InvalidArgument(w + ": its last dim must be contiguous (stride 1)");
  }
  if (o.dropout) {
    for (const char* role : {"seed", "offset"}) {
      FUSEBOX_RETURN_IF_ERROR(check_small(role, DType::kInt64, {1, 1, 1, 1},
                                          std::string("the dropout ") + role + " (Philox RNG)"));
      ctx.in(role).random_lo = 0;
      ctx.in(role).random_hi = 2147483647.0;
    }
  }
  if (fp8_kv) {
    for (auto [role, of] : {std::pair<const char*, const char*>{"descale_k", "k"}, {"descale_v", "v"}}) {
      ResolvedTensor& t = ctx.in(role);
      std::vector<int64_t> per_row = ctx.in(of).dims;
      per_row.back() = 1;
      const std::vector<int64_t> single = {1, 1, 1, 1};
      if (t.scalar_value || !t.is_input || (t.dims != per_row && t.dims != single) ||
          t.dtype != DType::kFP32) {
        return InvalidArgument(ctx.in_where(role) + " is " + (t.is_input ? "" : "produced by an op, ") +
                               std::string(dtype_name(t.dtype)) + " " + dims_string(t.dims) + ": the " + of +
                               " cache's descale is an fp32 graph input in memory, [1, 1, 1, 1] (one for "
                               "the tensor) or " +
                               dims_string(per_row) + " (one per row of '" + of + "')");
      }
      // Random descales near 1 (the fp8 values' own range is e4m3's); fixed values win.
      t.random_lo = 0.5;
      t.random_hi = 2.0;
    }
  }
  if constexpr (fp8) {
    auto scales = fp8_bwd ? std::vector<const char*>(std::begin(kFp8BwdScales), std::end(kFp8BwdScales))
                          : std::vector<const char*>(std::begin(kFp8FwdScales), std::end(kFp8FwdScales));
    for (const char* role : scales) {
      FUSEBOX_RETURN_IF_ERROR(check_small(role, DType::kFP32, {1, 1, 1, 1},
                                          std::string("the FP8 scale factor ") + role + " (one fp32 value)"));
      // Random scales near 1 keep the fp8 values in range; fixed values win. The gradients' output
      // scales are larger: dq and dk of unit-scale attention are about 1e-2, which at a scale near
      // 1 lands in e4m3's subnormal range (below 2^-6), where one quantum is tens of percent of a
      // value; there the cuDNN engine and fusebox's GPU reference each differed from the CPU
      // reference by 10-15% rel-L2 (fusebox's sweep, H100, 2026-12-05, seeds 4126 and 4288) and
      // the plan check refused the graph. In [8, 32] they land in the normal range, as delayed
      // scaling (scale from the amax history) puts them, and dv stays under e4m3's 448
      // (tests/deviceless/fp8_bwd_inputs_test.cpp).
      const std::string r = role;
      const bool gradient_out = r == "scale_dq" || r == "scale_dk" || r == "scale_dv";
      ctx.in(role).random_lo = gradient_out ? 8.0 : 0.5;
      ctx.in(role).random_hi = gradient_out ? 32.0 : 2.0;
    }
  }
  if constexpr (kIsBwd<T>) {
    const std::vector<int64_t> o_dims = {d.B, d.Hq, d.Sq, d.Dv}, stats_dims = {d.B, d.Hq, d.Sq, 1};
    for (const char* role : {"o", "do"}) {
      const ResolvedTensor& t = ctx.in(role);
      FUSEBOX_RETURN_IF_ERROR(check_sdpa_tensor(ctx, role, "[B, Hq, Sq, Dv]", type));
      if (t.dims != o_dims) {
        return InvalidArgument(ctx.in_where(role) + " has dims " + dims_string(t.dims) + ": " + type +
                               " needs [B, Hq, Sq, Dv] = " + dims_string(o_dims) + " from q and v");
      }
      const std::string w = ctx.in_where(role);
      if (fp8_bwd && std::string(role) == "do") {
        FUSEBOX_RETURN_IF_ERROR(check_dtype_in(w, t.dtype, {DType::kFP8E4M3, DType::kFP8E5M2},
                                               "sdpa_fp8_bwd takes do in fp8_e4m3 or fp8_e5m2"));
      } else {
        FUSEBOX_RETURN_IF_ERROR(check_dtype_in(w, t.dtype, {qt.dtype}, "it must have q's dtype"));
      }
    }
    const ResolvedTensor& st = ctx.in("stats");
    if (!st.is_input || st.dims != stats_dims || st.dtype != DType::kFP32) {
      return InvalidArgument(
          ctx.in_where("stats") + " is " + dims_string(st.dims) + " " + std::string(dtype_name(st.dtype)) +
          ": " + type + " needs the forward's softmax stats, an fp32 graph input " + dims_string(stats_dims));
    }
  }
  return d;
}

// The outputs every sdpa op shares the rules of.
struct SdpaOutputs {
  const InferContext& ctx;
  SdpaDims d;

  Status check(const char* role, std::initializer_list<DType> allowed, const std::string& why) const {
    const ResolvedTensor& t = ctx.out(role);
    const std::string w = ctx.out_where(role);
    FUSEBOX_RETURN_IF_ERROR(check_dtype_in(w, t.dtype, allowed, why));
    if (t.dims.size() == 4 && t.strides[3] != 1) {
      return InvalidArgument(w + " has strides " + dims_string(t.strides) +
                             ": the last dim must be contiguous (stride 1)");
    }
    return Status::Ok();
  }
  // o like q's stride order (bshd q gives bshd o).
  Status o(std::initializer_list<DType> allowed, const std::string& why) const {
    const std::vector<int64_t> dims = {d.B, d.Hq, d.Sq, d.Dv};
    FUSEBOX_RETURN_IF_ERROR(
        ctx.finish_output("o", dims, dense_strides_like(dims, ctx.in("q").strides), ctx.in("q").dtype));
    return check("o", allowed, why);
  }
  Status amax(std::initializer_list<const char*> roles) const {
    for (const char* role : roles) {
      FUSEBOX_RETURN_IF_ERROR(ctx.finish_output(role, {1, 1, 1, 1}, {1, 1, 1, 1}, DType::kFP32));
      FUSEBOX_RETURN_IF_ERROR(check(role, {DType::kFP32}, "amax outputs are fp32 [1,1,1,1]"));
    }
    return Status::Ok();
  }
  // dq, dk, dv shaped like q, k, v, in their stride order, q's dtype by default.
  Status gradients(std::initializer_list<DType> allowed, const std::string& why) const {
    for (auto [grad, like_role] :
         {std::pair<const char*, const char*>{"dq", "q"}, {"dk", "k"}, {"dv", "v"}}) {
      const ResolvedTensor& like = ctx.in(like_role);
      FUSEBOX_RETURN_IF_ERROR(
          ctx.finish_output(grad, like.dims, dense_strides_like(like.dims, like.strides), ctx.in("q").dtype));
      FUSEBOX_RETURN_IF_ERROR(check(grad, allowed, why));
    }
    return Status::Ok();
  }
  // stats dense [B, H, S, 1].
  Status stats() const {
    const std::vector<int64_t> dims = {d.B, d.Hq, d.Sq, 1};
    FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("stats", dims, dense_strides_like(dims, {}), DType::kFP32));
    return check("stats", {DType::kFP32}, "cuDNN writes stats in fp32 only");
  }
  Status dsink() const {
    const std::vector<int64_t> dims = {1, d.Hq, 1, 1};
    FUSEBOX_RETURN_IF_ERROR(
        ctx.finish_output("dsink_token", dims, dense_strides_like(dims, {}), DType::kFP32));
    const ResolvedTensor& t = ctx.out("dsink_token");
    if (t.dims != dims) {
      return InvalidArgument(ctx.out_where("dsink_token") + " has dims " + dims_string(t.dims) +
                             ": the sink gradient is like the sink token, fp32 " + dims_string(dims));
    }
    return check("dsink_token", {DType::kFP32}, "the sink gradient is fp32, like the sink token");
  }
  Status dropout_mask() const {
    const std::vector<int64_t> dims = {d.B, d.Hq, d.Sq, d.Skv};
    FUSEBOX_RETURN_IF_ERROR(
        ctx.finish_output("dropout_mask", dims, dense_strides_like(dims, {}), DType::kFP32));
    return check("dropout_mask", {DType::kFP32}, "the dropout mask dump is fp32");
  }
};

template <typename T>
Status sdpa_infer(const InferContext& ctx, T& a) {
  FUSEBOX_ASSIGN_OR_RETURN(SdpaDims d, infer_sdpa_inputs(ctx, a));
  SdpaOutputs out{ctx, d};
  if (a.dump_dropout_mask) FUSEBOX_RETURN_IF_ERROR(out.dropout_mask());
  if constexpr (std::is_same_v<T, SdpaFwdAttrs>) {
    FUSEBOX_RETURN_IF_ERROR(out.o({DType::kBF16, DType::kFP16}, "sdpa_fwd writes o in bf16 or fp16"));
    if (a.generate_stats) FUSEBOX_RETURN_IF_ERROR(out.stats());
  } else if constexpr (std::is_same_v<T, SdpaFp8FwdAttrs>) {
    FUSEBOX_RETURN_IF_ERROR(
        out.o({DType::kFP8E4M3}, "sdpa_fp8_fwd writes o in fp8_e4m3 on Hopper (cuDNN 9.19)"));
    FUSEBOX_RETURN_IF_ERROR(out.amax({"amax_s", "amax_o"}));
    if (a.generate_stats) FUSEBOX_RETURN_IF_ERROR(out.stats());
  } else if constexpr (std::is_same_v<T, SdpaFp8BwdAttrs>) {
    FUSEBOX_RETURN_IF_ERROR(out.gradients({DType::kFP8E4M3, DType::kFP8E5M2},
                                          "sdpa_fp8_bwd writes fp8 gradients on Hopper (cuDNN 9.19)"));
    FUSEBOX_RETURN_IF_ERROR(out.amax({"amax_dq", "amax_dk", "amax_dv", "amax_dp"}));
  } else {
    FUSEBOX_RETURN_IF_ERROR(
        out.gradients({DType::kBF16, DType::kFP16}, "sdpa_bwd writes gradients in bf16 or fp16"));
    if (a.sink_grad) FUSEBOX_RETURN_IF_ERROR(out.dsink());
  }
  return Status::Ok();
}

template <typename T>
void sdpa_canonical(const T& a, CanonicalWriter& w) {
  if (a.attn_scale) w.field("attn_scale", *a.attn_scale);
  w.field("causal", a.causal);
  w.field("alignment", sdpa_alignment_name(a.alignment));
  if (a.left_bound) w.field("left_bound", *a.left_bound);
  if (a.right_bound) w.field("right_bound", *a.right_bound);
  w.field("padding", a.padding);
  w.field("bias", a.bias);
  w.field("alibi", a.alibi);
  if (a.dropout) w.field("dropout", *a.dropout);
  w.field("dropout_mask", a.dump_dropout_mask);
  if (a.sink) w.field("sink", true);              // absent without: fingerprints stay as they were
  if (a.block_mask) w.field("block_mask", true);  // likewise
  if (a.paged) {  // absent for dense ops: their fingerprints stay as they were
    w.field("paged", true);
    w.field("max_seq_len_kv", *a.max_seq_len_kv);
  }
  if constexpr (std::is_same_v<T, SdpaFwdAttrs> || std::is_same_v<T, SdpaFp8FwdAttrs>) {
    w.field("stats", a.generate_stats);
  }
  if constexpr (std::is_same_v<T, SdpaBwdAttrs>) {
    w.field("deterministic", a.deterministic);
    if (a.sink_grad) w.field("sink_grad", true);  // absent without: fingerprints stay as they were
  }
}

template <typename T>
void sdpa_describe(const T& a, std::ostream& os) {
  os << ", attn_scale " << (a.attn_scale ? *a.attn_scale : 0.0) << (a.causal ? ", causal" : "");
  if (a.right_bound) os << ", right_bound " << *a.right_bound;
  if (a.left_bound) os << ", left_bound " << *a.left_bound;
  if (a.alignment == SdpaAlignment::kBottomRight) os << ", bottom_right";
  if (a.padding) os << ", padding";
  if (a.bias) os << ", bias";
  if (a.alibi) os << ", alibi";
  if (a.dropout) os << ", dropout " << *a.dropout;
  if (a.paged) os << ", paged K/V, max_seq_len_kv " << a.max_seq_len_kv.value_or(0);
  if (a.sink) os << ", sink tokens";
  if (a.block_mask) os << ", block mask";
  if constexpr (std::is_same_v<T, SdpaBwdAttrs>) {
    if (a.deterministic) os << ", deterministic";
    if (a.sink_grad) os << ", sink gradient";
  }
  if constexpr (std::is_same_v<T, SdpaFwdAttrs> || std::is_same_v<T, SdpaFp8FwdAttrs>) {
    if (a.generate_stats) os << ", stats";
  }
}

template <class V>
nlohmann::ordered_json optional_json(const std::optional<V>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

template <typename T>
void sdpa_resolved_json(const FlopsContext& ctx, const T& a, nlohmann::ordered_json& j) {
  j["attn_scale"] = optional_json(a.attn_scale);
  j["causal"] = a.causal;
  j["alignment"] = std::string(sdpa_alignment_name(a.alignment));
  j["left_bound"] = optional_json(a.left_bound);
  j["right_bound"] = optional_json(a.right_bound);
  j["padding"] = a.padding;
  j["bias"] = a.bias;
  j["alibi"] = a.alibi;
  // Per query head, so that no tool recomputes cuDNN's slopes.
  j["alibi_slopes"] = a.alibi ? nlohmann::ordered_json(alibi_slopes(ctx.in("q").dims.at(1)))
                              : nlohmann::ordered_json(nullptr);
  j["dropout"] = optional_json(a.dropout);
  j["dump_dropout_mask"] = a.dump_dropout_mask;
  j["paged"] = a.paged;
  j["max_seq_len_kv"] = optional_json(a.max_seq_len_kv);
  j["sink"] = a.sink;
  j["block_mask"] = a.block_mask;
  if constexpr (std::is_same_v<T, SdpaFwdAttrs> || std::is_same_v<T, SdpaFp8FwdAttrs>) {
    j["generate_stats"] = a.generate_stats;
  }
  if constexpr (std::is_same_v<T, SdpaBwdAttrs>) {
    j["deterministic"] = a.deterministic;
    j["sink_grad"] = a.sink_grad;
  }
}

// 2*(D+Dv) per kept (query, key) pair of every query head; backward 2.5 times
// that (five matmuls against two). With padding, lengths are data: from
// ctx.inputs, else the tensor's fixed values, else full length; a block mask's
// bytes likewise (its dropped tiles are not counted; random bytes, unknown
// here, count every tile).
template <typename T>
double sdpa_flops(const FlopsContext& ctx, const T& s) {
  const auto& q = ctx.in("q");
  const auto& k = ctx.in("k");
  const auto& v = ctx.in("v");
  auto lengths = [&](const char* role, int64_t full) {
    std::vector<int64_t> r(static_cast<size_t>(q.dims[0]), full);
    if (!s.padding) return r;
    auto it = ctx.inputs.find(ctx.in(role).name);
    const std::vector<double>& vals = it != ctx.inputs.end() ? it->second : ctx.in(role).values;
    for (size_t b = 0; b < r.size() && b < vals.size(); ++b) {
      r[b] = std::clamp<int64_t>(static_cast<int64_t>(vals[b]), 0, full);
    }
    return r;
  };
  const auto lq = lengths("seq_len_q", q.dims[2]);
  const auto lkv = lengths("seq_len_kv", sdpa_kv_length(s, k.dims));
  double pairs = 0;  // over every query head
  const std::vector<double>* blocks = nullptr;
  if (s.block_mask) {  // known bytes (the caller's inputs or fixed values) count only the kept tiles
    auto it = ctx.inputs.find(ctx.in("block_mask").name);
    blocks = it != ctx.inputs.end() ? &it->second : &ctx.in("block_mask").values;
    if (blocks->empty()) blocks = nullptr;
  }
  if (!blocks) {
    for (size_t b = 0; b < lq.size(); ++b) pairs += sdpa_kept_pairs(s, lq[b], lkv[b]);
    pairs *= static_cast<double>(q.dims[1]);
  } else {
    const int64_t Hq = q.dims[1], Skv = sdpa_kv_length(s, k.dims);
    const std::vector<int64_t> bd = sdpa_block_mask_dims(q.dims[0], Hq, q.dims[2], Skv);
    for (int64_t b = 0; b < static_cast<int64_t>(lq.size()); ++b) {
      for (int64_t i = 0; i < lq[b]; ++i) {
        int64_t lo = 0, hi = -1;
        kept_key_interval(s, i, lq[b], lkv[b], &lo, &hi);
        for (int64_t h = 0; h < Hq && lo <= hi; ++h) {
          const size_t row = static_cast<size_t>(((b * Hq + h) * bd[2] + i / kSdpaBlockTile) * bd[3]);
          for (int64_t t = lo / kSdpaBlockTile; t <= hi / kSdpaBlockTile; ++t) {
            if (row + t / 8 >= blocks->size()) break;
            if (!sdpa_block_keeps(static_cast<unsigned>((*blocks)[row + t / 8]), t * kSdpaBlockTile))
              continue;
            pairs += static_cast<double>(std::min(hi, (t + 1) * kSdpaBlockTile - 1) -
                                         std::max(lo, t * kSdpaBlockTile) + 1);
          }
        }
      }
    }
  }
  double f = 2.0 * pairs * static_cast<double>(q.dims[3] + v.dims[3]);
  if constexpr (kIsBwd<T>) f *= 2.5;
  return f;
}

}  // namespace

std::string sdpa_forward_not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op) {
  const auto& q = g.tensors[static_cast<size_t>(op.inputs.at("q"))].dims;
  if (q.size() == 4 && q[2] == 1) {
    return "op '" + op.name +
           "' (sdpa with one query per sequence, a decode step) may split the keys "
           "across thread blocks and combine the parts in no fixed order";
  }
  return "";
}

// The four sdpa ops: every function forwards to the shared template above.
#define FUSEBOX_SDPA_OP(T, NAME)                                                                       \
  std::vector<std::string_view> type_names(std::type_identity<T>) { return {NAME}; }                   \
  std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<T>) {                    \
    if (name == NAME) return OpAttrs{T{}};                                                             \
    return std::nullopt;                                                                               \
  }                                                                                                    \
  std::string_view type_name(const T&) { return NAME; }                                                \
  std::vector<std::string_view> input_roles(const T& a) { return sdpa_input_roles(a); }                \
  std::vector<std::string_view> output_roles(const T& a) { return sdpa_output_roles(a); }              \
  Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec& op, \
                    T& a) {                                                                            \
    return sdpa_parse_json(r, v, path, op, a);                                                         \
  }                                                                                                    \
  void write_json(const T& a, nlohmann::ordered_json& j) { sdpa_write_json(a, j); }                    \
  std::string output_roles_hint(const T& a) { return sdpa_output_roles_hint(a); }                      \
  Status infer(const InferContext& ctx, T& a) { return sdpa_infer(ctx, a); }                           \
  void canonical(const T& a, CanonicalWriter& w) { sdpa_canonical(a, w); }                             \
  void describe(const T& a, std::ostream& os) { sdpa_describe(a, os); }                                \
  void resolved_json(const FlopsContext& ctx, const T& a, nlohmann::ordered_json& j) {                 \
    sdpa_resolved_json(ctx, a, j);                                                                     \
  }                                                                                                    \
  double flops(const FlopsContext& ctx, const T& a) { return sdpa_flops(ctx, a); }

FUSEBOX_SDPA_OP(SdpaFwdAttrs, "sdpa_fwd")
FUSEBOX_SDPA_OP(SdpaBwdAttrs, "sdpa_bwd")
FUSEBOX_SDPA_OP(SdpaFp8FwdAttrs, "sdpa_fp8_fwd")
FUSEBOX_SDPA_OP(SdpaFp8BwdAttrs, "sdpa_fp8_bwd")
#undef FUSEBOX_SDPA_OP

// ---- gradient rules: sdpa_fwd -> sdpa_bwd with the same options (mask,
// padding, bias, dropout seed and offset passed through from the saved
// inputs), reading the forward's o and stats. The others have none.
Status grad(GradContext& ctx, const SdpaFwdAttrs& a) {
  if (!a.generate_stats)
    return ctx.no_rule(
        "the backward reads the forward's softmax statistics: declare the output 'stats' (training)");
  if (a.paged) return ctx.no_rule("a paged KV cache is for inference; train on dense k and v");
  if (a.sink) return ctx.no_rule("the sink token's gradient is not derived yet");
  if (ctx.has_in("bias") && ctx.wants("bias"))
    return ctx.no_rule("the attention bias gets no gradient: leave it out of wrt");
  if (ctx.dy("o").empty()) return Status::Ok();
  SdpaBwdAttrs b;
  static_cast<SdpaOptions&>(b) = a;
  b.dump_dropout_mask = false;
  std::map<std::string, std::string> in{{"do", ctx.dy("o")}};
  for (const auto& [role, t] : ctx.op().inputs) {
    FUSEBOX_ASSIGN_OR_RETURN(in[role], ctx.in(role));
  }
  for (const char* role : {"o", "stats"}) {
    FUSEBOX_ASSIGN_OR_RETURN(in[role], ctx.out(role));
  }
  FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("bwd", b, in));
  return ctx.hand(r, {{"q", "dq"}, {"k", "dk"}, {"v", "dv"}});
}
Status grad(GradContext& ctx, const SdpaBwdAttrs&) {
  return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
}
Status grad(GradContext& ctx, const SdpaFp8FwdAttrs&) {
  return ctx.no_rule(
      "FP8 attention's backward needs its scales chosen (issue 33, FP8 training); train in bf16");
}
Status grad(GradContext& ctx, const SdpaFp8BwdAttrs&) {
  return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
}

}  // namespace graph_ops
}  // namespace fusebox
