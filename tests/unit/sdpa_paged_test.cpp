// Paged K/V caches for sdpa_fwd: JSON, resolve() rules and messages, the
// page tables fusebox makes, the input checks, and the CPU reference reading
// through the tables (equal to the dense reference on the gathered cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::host_from;

struct PagedCase {
  std::string table_dtype = "int32";
  std::string table_dims = "[3, 1, 8, 1]";
  std::string table_v_dims = "[3, 1, 8, 1]";
  std::string v_dims = "[24, 2, 16, 64]";
  std::string table_values;  // JSON array for page_table_k, or empty
  std::string lengths_kv = "[128, 37, 90]";
  std::string extra_attrs;  // e.g. ", \"max_seq_len_kv\": 120"
  std::string op = "sdpa_fwd";
  bool padding = true;
  // An FP8 cache: the dims of descale_k and descale_v ("" none); the pools' dtype.
  std::string descale_dims;
  std::string pool_dtype = "";
};

// A decode graph: q [3,8,1,64], pools [24,2,16,64], tables [3,1,8,1] (128 keys).
std::string paged_json(const PagedCase& c) {
  std::string s = R"({"name": "paged", "io_dtype": "bf16", "tensors": [
    {"name": "q", "dims": [3, 8, 1, 64]},
    {"name": "k_cache", "dims": [24, 2, 16, 64])" +
                  (c.pool_dtype.empty() ? std::string() : R"(, "dtype": ")" + c.pool_dtype + "\"") + R"(},
    {"name": "v_cache", "dims": )" +
                  c.v_dims +
                  (c.pool_dtype.empty() ? std::string() : R"(, "dtype": ")" + c.pool_dtype + "\"") + R"(},)" +
                  (c.descale_dims.empty()
                       ? std::string()
                       : R"({"name": "dk", "dtype": "fp32", "dims": )" + c.descale_dims +
                             R"(}, {"name": "dv", "dtype": "fp32", "dims": )" + c.descale_dims + "},") +
                  R"(
    {"name": "pt_k", "dtype": ")" +
                  c.table_dtype + R"(", "dims": )" + c.table_dims +
                  (c.table_values.empty() ? "" : ", \"values\": " + c.table_values) + R"(},
    {"name": "pt_v", "dtype": "int32", "dims": )" +
                  c.table_v_dims + R"(},)" +
                  (c.padding ? R"({"name": "lq", "dtype": "int32", "dims": [3, 1, 1, 1], "values": [1, 1, 1]},
    {"name": "lkv", "dtype": "int32", "dims": [3, 1, 1, 1], "values": )" +
                                   c.lengths_kv + "},"
                             : std::string()) +
                  R"(
    {"name": "o"}],
  "ops": [{"op": ")" +
                  c.op + R"(", "name": "attn", "causal": true, "alignment": "bottom_right")" + c.extra_attrs +
                  R"(, "inputs": {"q": "q", "k": "k_cache", "v": "v_cache", )" +
                  (c.padding ? R"("seq_len_q": "lq", "seq_len_kv": "lkv", )" : "") +
                  (c.descale_dims.empty() ? "" : R"("descale_k": "dk", "descale_v": "dv", )") +
                  R"("page_table_k": "pt_k", "page_table_v": "pt_v"}, "outputs": {"o": "o"}}]})";
  return s;
}

Result<ResolvedGraph> resolve_json(const std::string& text) {
  FUSEBOX_ASSIGN_OR_RETURN(GraphSpec spec, parse_graph_json(text));
  return resolve(spec);
}

void expect_error(const PagedCase& c, std::initializer_list<const char*> needles) {
  auto r = resolve_json(paged_json(c));
  ASSERT_FALSE(r.ok()) << "expected an error";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  for (const char* n : needles)
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << "message lacks '" << n << "': " << r.status().message();
}

TEST(SdpaPagedResolve, FillsMaxSeqLenAndCountsLogicalKeys) {
  auto r = resolve_json(paged_json({}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& a = std::get<SdpaFwdAttrs>(r->ops[0].attrs);
  EXPECT_TRUE(a.paged);
  ASSERT_TRUE(a.max_seq_len_kv.has_value());
  EXPECT_EQ(*a.max_seq_len_kv, 8 * 16);  // max_pages * page_size
  EXPECT_EQ(r->tensors[r->find_tensor("o")].dims, (std::vector<int64_t>{3, 8, 1, 64}));
  // Decode, bottom-right causal: each query keeps its sequence's lkv keys.
  EXPECT_DOUBLE_EQ(r->flops(), 2.0 * 8 * (128 + 37 + 90) * (64 + 64));
  EXPECT_NE(describe(*r).find("paged K/V, max_seq_len_kv 128"), std::string::npos) << describe(*r);
  const std::string j = op_resolved_attrs_json(*r, r->ops[0]);
  EXPECT_NE(j.find("\"paged\":true"), std::string::npos) << j;
  EXPECT_NE(j.find("\"max_seq_len_kv\":128"), std::string::npos) << j;
}

TEST(SdpaPagedJson, RoundTripsAndFingerprintsDifferFromDense) {
  PagedCase c;
  c.extra_attrs = R"(, "max_seq_len_kv": 120)";
  c.lengths_kv = "[120, 37, 90]";
  auto spec = parse_graph_json(paged_json(c));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::string text = graph_to_json(*spec);
  EXPECT_NE(text.find("\"max_seq_len_kv\": 120"), std::string::npos) << text;
  auto again = parse_graph_json(text);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto r1 = resolve(*spec), r2 = resolve(*again);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(graph_fingerprint(*r1), graph_fingerprint(*r2));
  EXPECT_EQ(*std::get<SdpaFwdAttrs>(r1->ops[0].attrs).max_seq_len_kv, 120);
  auto r3 = resolve_json(paged_json({}));  // max_seq_len_kv 128: another plan
  ASSERT_TRUE(r3.ok());
  EXPECT_NE(graph_fingerprint(*r1), graph_fingerprint(*r3));
}

TEST(SdpaPagedResolve, ErrorsNameOpTensorAndWhatIsAccepted) {
  {
    PagedCase c;
    c.table_dtype = "int64";
    expect_error(c, {"[sdpa_fwd 'attn']", "page_table_k", "'pt_k'", "int64", "int32"});
  }
  {
    PagedCase c;
    c.table_dims = "[3, 1, 8, 2]";
    c.table_v_dims = "[3, 1, 8, 2]";
    expect_error(c, {"'pt_k'", "[3, 1, 8, 2]", "[B, 1, max_pages, 1] = [3, 1, max_pages, 1]"});
  }
  {
    PagedCase c;
    c.table_v_dims = "[3, 1, 4, 1]";
    expect_error(c, {"page_table_v", "'pt_v'", "same dims"});
  }
  {
    PagedCase c;
    c.v_dims = "[24, 2, 32, 64]";
    expect_error(c, {"'v'", "page_size", "must match"});
  }
  {
    PagedCase c;
    c.extra_attrs = R"(, "max_seq_len_kv": 129)";
    expect_error(c, {"max_seq_len_kv is 129", "113..128", "max_pages 8", "page_size 16"});
    c.extra_attrs = R"(, "max_seq_len_kv": 112)";  // 7 pages of 16: cuDNN wants tables of 7
    expect_error(c, {"max_seq_len_kv is 112", "113..128", "ceil(max_seq_len_kv / page_size)"});
  }
  {
    PagedCase c;
    c.padding = false;
    expect_error(c, {"[sdpa_fwd 'attn']", "seq_len_q", "seq_len_kv", "padding"});
  }
  {
    PagedCase c;  // slot 3 of batch entry 1 points past the 24-page pool
    c.table_values = "[0,1,2,3,4,5,6,7, 8,9,10,24,12,13,14,15, 16,17,18,19,20,21,22,23]";
    expect_error(c, {"'pt_k'", "page 24", "batch entry 1", "slot 3", "[0, 24)"});
  }
  {
    PagedCase c;  // a sequence longer than its pages
    c.extra_attrs = R"(, "max_seq_len_kv": 120)";
    expect_error(c, {"seq_len_kv", "'lkv'", "128", "[0, 120]"});
  }
}

TEST(SdpaPagedJson, MaxSeqLenWithoutTablesAndPagedBackwardAreRefused) {
  auto spec = parse_graph_json(R"({"name": "g", "tensors": [
      {"name": "q", "dims": [1, 1, 8, 64]}, {"name": "k", "dims": [1, 1, 8, 64]},
      {"name": "v", "dims": [1, 1, 8, 64]}, {"name": "o"}],
    "ops": [{"op": "sdpa_fwd", "name": "a", "max_seq_len_kv": 8,
             "inputs": {"q": "q", "k": "k", "v": "v"}, "outputs": {"o": "o"}}]})");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("max_seq_len_kv"), std::string::npos) << spec.status().message();
  EXPECT_NE(spec.status().message().find("page_table_k"), std::string::npos) << spec.status().message();

  // Only one table: the role check asks for the other.
  std::string one = paged_json({});
  one.replace(one.find(R"(, "page_table_v": "pt_v")"), std::string(R"(, "page_table_v": "pt_v")").size(), "");
  auto r = resolve_json(one);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("page_table_v"), std::string::npos) << r.status().message();
}

// ---------------------------------------------------------------- page tables fusebox makes

TEST(SdpaPagedTables, ShuffledDistinctDeterministic) {
  auto r = resolve_json(paged_json({}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ResolvedTensor& tk = r->tensors[r->find_tensor("pt_k")];
  const ResolvedTensor& tv = r->tensors[r->find_tensor("pt_v")];
  const std::vector<float> a = random_page_table(tk, 7, 24).to_float_logical();
  ASSERT_EQ(a.size(), 24u);
  std::set<float> distinct(a.begin(), a.end());
  EXPECT_EQ(distinct.size(), 24u);  // the pool holds exactly B * max_pages pages: a permutation
  EXPECT_GE(*distinct.begin(), 0.0f);
  EXPECT_LE(*distinct.rbegin(), 23.0f);
  // Not in order: some sequence's consecutive pages are not consecutive in the pool.
  int out_of_order = 0;
  for (size_t e = 1; e < a.size(); ++e) out_of_order += a[e] != a[e - 1] + 1;
  EXPECT_GT(out_of_order, 10);
  EXPECT_EQ(random_page_table(tk, 7, 24).to_float_logical(), a);  // deterministic
  EXPECT_NE(random_page_table(tk, 8, 24).to_float_logical(), a);  // in the seed
  EXPECT_NE(random_page_table(tv, 7, 24).to_float_logical(), a);  // and the name
  // A pool smaller than the tables: pages repeat, all in range.
  for (float x : random_page_table(tk, 7, 5).to_float_logical()) EXPECT_TRUE(x >= 0 && x < 5) << x;
}

// ---------------------------------------------------------------- the CPU reference

struct PagedInputs {
  ResolvedGraph g;
  std::map<std::string, HostTensor> in;
};

PagedInputs paged_inputs(const PagedCase& c, uint64_t seed) {
  PagedInputs p;
  auto r = resolve_json(paged_json(c));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  p.g = *r;
  for (int i : p.g.input_tensors()) {
    const ResolvedTensor& t = p.g.tensors[i];
    p.in[t.name] = t.name.rfind("pt_", 0) == 0 ? random_page_table(t, seed, 24)
                   : t.values.empty()          ? random_tensor(t, seed, t.random_lo, t.random_hi)
                                               : host_from(t, t.values);
  }
  return p;
}

// The dense graph of the same problem: k and v [3, 2, Skv, 64], no tables.
ResolvedGraph dense_graph(int64_t skv) {
  const std::string s = std::to_string(skv);
  auto r = resolve_json(R"({"name": "dense", "io_dtype": "bf16", "tensors": [
    {"name": "q", "dims": [3, 8, 1, 64]},
    {"name": "k", "dims": [3, 2, )" +
                        s + R"(, 64]}, {"name": "v", "dims": [3, 2, )" + s + R"(, 64]},
    {"name": "lq", "dtype": "int32", "dims": [3, 1, 1, 1]}, {"name": "lkv", "dtype": "int32", "dims": [3, 1, 1, 1]},
    {"name": "o"}, {"name": "stats", "dtype": "fp32"}],
  "ops": [{"op": "sdpa_fwd", "name": "attn", "causal": true, "alignment": "bottom_right",
           "inputs": {"q": "q", "k": "k", "v": "v", "seq_len_q": "lq", "seq_len_kv": "lkv"},
           "outputs": {"o": "o", "stats": "stats"}}]})");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *r;
}

// pool [24, 2, 16, 64] read through `table` (or in pool order when null) into [3, 2, skv, 64].
HostTensor gather(const ResolvedTensor& dense, const HostTensor& pool, const std::vector<float>* table,
                  int64_t skv) {
  std::vector<double> v;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < skv; ++j) {
        const int64_t slot = b * 8 + j / 16;
        const int64_t page = table ? static_cast<int64_t>((*table)[slot]) : slot;
        for (int64_t d = 0; d < 64; ++d) v.push_back(pool.at({page, h, j % 16, d}));
      }
  return host_from(dense, v);
}

TEST(SdpaPagedReferenceCpu, EqualsDenseReferenceOnTheGatheredCache) {
  for (int64_t skv : {128, 120}) {
    PagedCase c;
    c.extra_attrs = R"(, "max_seq_len_kv": )" + std::to_string(skv);
    c.lengths_kv = "[" + std::to_string(skv) + ", 37, 90]";
    PagedInputs p = paged_inputs(c, 3);
    auto paged = reference_cpu(p.g, p.in);
    ASSERT_TRUE(paged.ok()) << paged.status().ToString();

    const ResolvedGraph d = dense_graph(skv);
    const std::vector<float> tk = p.in.at("pt_k").to_float_logical(), tv = p.in.at("pt_v").to_float_logical();
    ASSERT_NE(tk, tv);  // k and v tables differ: each pool must be read through its own
    std::map<std::string, HostTensor> din = {
        {"q", p.in.at("q")},
        {"lq", p.in.at("lq")},
        {"lkv", p.in.at("lkv")},
        {"k", gather(d.tensors[d.find_tensor("k")], p.in.at("k_cache"), &tk, skv)},
        {"v", gather(d.tensors[d.find_tensor("v")], p.in.at("v_cache"), &tv, skv)}};
    auto dense = reference_cpu(d, din);
    ASSERT_TRUE(dense.ok()) << dense.status().ToString();
    EXPECT_EQ(paged->at("o"), dense->at("o")) << "skv " << skv;

    // A reader that ignored the tables (pages in pool order) gives another answer.
    din["k"] = gather(d.tensors[d.find_tensor("k")], p.in.at("k_cache"), nullptr, skv);
    din["v"] = gather(d.tensors[d.find_tensor("v")], p.in.at("v_cache"), nullptr, skv);
    auto ignored = reference_cpu(d, din);
    ASSERT_TRUE(ignored.ok());
    const Comparison cmp = compare("o", dense->at("o"), ignored->at("o"), default_tolerance(DType::kBF16));
    EXPECT_FALSE(cmp.pass) << cmp.ToString();
  }
}

// An FP8 K/V cache (SdpaFwdAttrs::fp8_kv): e4m3 pools with fp32 descales, one per row or one per
// tensor, and q and o bf16; what is refused says what would be accepted.
TEST(SdpaFp8Cache, ResolveRulesAndMessages) {
  PagedCase c;
  c.pool_dtype = "fp8_e4m3";
  for (const char* dims : {"[24, 2, 16, 1]", "[1, 1, 1, 1]"}) {
    c.descale_dims = dims;
    auto r = resolve_json(paged_json(c));
    ASSERT_TRUE(r.ok()) << dims << ": " << r.status().ToString();
    const auto& a = std::get<SdpaFwdAttrs>(r->ops[0].attrs);
    EXPECT_TRUE(a.fp8_kv);
    EXPECT_EQ(r->tensors[r->find_tensor("o")].dtype, DType::kBF16) << "o takes q's dtype";
  }
  c.descale_dims = "[24, 2, 16, 64]";
  expect_error(c, {"descale_k", "[24, 2, 16, 1]", "[1, 1, 1, 1]"});
  c.descale_dims = "";
  expect_error(c, {"k_cache", "fp8_e4m3", "bf16 or fp16"});  // fp8 pools without descales
  c.pool_dtype = "";
  c.descale_dims = "[1, 1, 1, 1]";
  expect_error(c, {"k_cache", "FP8 K/V cache", "fp8_e4m3"});  // descales with bf16 pools
}

// The CPU reference of an FP8 cache equals the bf16 cache that holds its values times their
// descales: powers of two, so that each e4m3 value times its descale is a bf16 value exactly.
TEST(SdpaFp8Cache, ReferenceEqualsTheBf16CacheOfTheDescaledValues) {
  PagedCase c8;
  c8.pool_dtype = "fp8_e4m3";
  c8.descale_dims = "[24, 2, 16, 1]";
  c8.extra_attrs = R"(, "max_seq_len_kv": 128)";
  PagedInputs p8 = paged_inputs(c8, 5);
  const double pow2[] = {0.25, 0.5, 1.0, 2.0, 4.0};
  std::vector<double> dk, dv;
  for (int64_t i = 0; i < 24 * 2 * 16; ++i) {
    dk.push_back(pow2[i % 5]);
    dv.push_back(pow2[(i * 3 + 1) % 5]);
  }
  p8.in["dk"] = host_from(p8.g.tensors[p8.g.find_tensor("dk")], dk);
  p8.in["dv"] = host_from(p8.g.tensors[p8.g.find_tensor("dv")], dv);
  auto out8 = reference_cpu(p8.g, p8.in);
  ASSERT_TRUE(out8.ok()) << out8.status().ToString();

  PagedCase c16 = c8;
  c16.pool_dtype = "";
  c16.descale_dims = "";
  auto g16 = resolve_json(paged_json(c16));
  ASSERT_TRUE(g16.ok()) << g16.status().ToString();
  std::map<std::string, HostTensor> in16 = p8.in;
  in16.erase("dk");
  in16.erase("dv");
  for (auto [pool, scale] : {std::pair{"k_cache", &dk}, std::pair{"v_cache", &dv}}) {
    const std::vector<float> x = p8.in.at(pool).to_float_logical();
    std::vector<double> real(x.size());
    for (size_t i = 0; i < x.size(); ++i) real[i] = static_cast<double>(x[i]) * (*scale)[i / 64];
    in16[pool] = host_from(g16->tensors[g16->find_tensor(pool)], real);
    EXPECT_EQ(in16[pool].to_float_logical(), std::vector<float>(real.begin(), real.end())) << "exact in bf16";
  }
  auto out16 = reference_cpu(*g16, in16);
  ASSERT_TRUE(out16.ok()) << out16.status().ToString();
  EXPECT_EQ(out8->at("o"), out16->at("o"));
  // Descales ignored (the raw e4m3 values) give another answer.
  p8.in["dk"] = host_from(p8.g.tensors[p8.g.find_tensor("dk")], std::vector<double>(dk.size(), 1.0));
  auto plain = reference_cpu(p8.g, p8.in);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(compare("o", out16->at("o"), plain->at("o"), default_tolerance(DType::kBF16)).pass);
}

TEST(SdpaPagedInputs, BadTableOrLengthNamesTensorAndBatchEntry) {
  PagedInputs p = paged_inputs({}, 5);
  EXPECT_TRUE(check_sdpa_paged_inputs(p.g, p.in).ok());

  auto bad_table = p.in;
  std::vector<double> t(24);
  for (int i = 0; i < 24; ++i) t[i] = i;
  t[2 * 8 + 5] = 24;  // batch entry 2, slot 5: past the pool
  bad_table["pt_v"] = host_from(p.g.tensors[p.g.find_tensor("pt_v")], t);
  Status s = check_sdpa_paged_inputs(p.g, bad_table);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const char* n :
       {"[sdpa_fwd 'attn']", "page_table_v", "'pt_v'", "page 24", "batch entry 2", "slot 5", "[0, 24)"})
    EXPECT_NE(s.message().find(n), std::string::npos) << n << ": " << s.message();
  // The reference refuses it too, rather than read past the pool.
  auto ref = reference_cpu(p.g, bad_table);
  ASSERT_FALSE(ref.ok());
  EXPECT_NE(ref.status().message().find("batch entry 2"), std::string::npos) << ref.status().message();

  t[2 * 8 + 5] = -1;
  bad_table["pt_v"] = host_from(p.g.tensors[p.g.find_tensor("pt_v")], t);
  EXPECT_FALSE(check_sdpa_paged_inputs(p.g, bad_table).ok());

  auto long_seq = p.in;
  long_seq["lkv"] = host_from(p.g.tensors[p.g.find_tensor("lkv")], {128, 129, 5});
  s = check_sdpa_paged_inputs(p.g, long_seq);
  ASSERT_FALSE(s.ok());
  for (const char* n : {"seq_len_kv", "'lkv'", "batch 1", "[0, 128]", "past its pages"})
    EXPECT_NE(s.message().find(n), std::string::npos) << n << ": " << s.message();
}

TEST(SdpaPagedJson, ExamplesResolveWithShuffledFixedTables) {
  for (const char* f : {"small/sdpa_paged_decode_small.json", "small/sdpa_paged_prefill_small.json",
                        "sdpa_paged_decode.json", "sdpa_paged_prefill.json"}) {
    auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/" + f);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto r = resolve(*spec);
    ASSERT_TRUE(r.ok()) << f << ": " << r.status().ToString();
    EXPECT_TRUE(std::get<SdpaFwdAttrs>(r->ops[0].attrs).paged) << f;
    EXPECT_GT(r->flops(), 0);
  }
}

}  // namespace
}  // namespace fusebox

// ---------------------------------------------------------------- attention sinks

namespace fusebox {
namespace {

std::string sink_json(const std::string& op, const std::string& sink_dims, const std::string& sink_dtype) {
  const bool bwd = op == "sdpa_bwd";
  return R"({"name": "sink", "io_dtype": "bf16", "tensors": [
    {"name": "q", "dims": [1, 2, 3, 64]}, {"name": "k", "dims": [1, 1, 3, 64]}, {"name": "v", "dims": [1, 1, 3, 64]},
    {"name": "sink", "dtype": ")" +
         sink_dtype + R"(", "dims": )" + sink_dims + R"(, "values": [0.5, -1.0]},)" +
         (bwd ? R"({"name": "o_in", "dims": [1, 2, 3, 64]}, {"name": "do", "dims": [1, 2, 3, 64]},
                   {"name": "st", "dtype": "fp32", "dims": [1, 2, 3, 1]}, {"name": "dq"}, {"name": "dk"}, {"name": "dv"}],)"
              : R"({"name": "o"}, {"name": "stats", "dtype": "fp32"}],)") +
         R"("ops": [{"op": ")" + op +
         R"(", "name": "attn", "causal": true, "inputs": {"q": "q", "k": "k", "v": "v", )" +
         (bwd ? R"("o": "o_in", "do": "do", "stats": "st", )" : "") +
         R"("sink_token": "sink"}, "outputs": )" +
         (bwd ? R"({"dq": "dq", "dk": "dk", "dv": "dv"})" : R"({"o": "o", "stats": "stats"})") + "}]}";
}

TEST(SdpaSinkResolve, RulesAndMessages) {
  auto r = resolve_json(sink_json("sdpa_fwd", "[1, 2, 1, 1]", "fp32"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<SdpaFwdAttrs>(r->ops[0].attrs).sink);
  EXPECT_NE(describe(*r).find("sink tokens"), std::string::npos);
  for (const auto& [dims, dtype, needles] :
       std::vector<std::tuple<std::string, std::string, std::vector<std::string>>>{
           {"[1, 1, 1, 2]",
            "fp32",
            {"'sink_token' ('sink')", "[1, 2, 1, 1]", "one fp32 logit per query head"}},
           {"[1, 2, 1, 1]", "bf16", {"'sink_token'", "bf16", "fp32"}}}) {
    auto bad = resolve_json(sink_json("sdpa_fwd", dims, dtype));
    ASSERT_FALSE(bad.ok()) << dims << " " << dtype;
    for (const std::string& n : needles)
      EXPECT_NE(bad.status().message().find(n), std::string::npos) << n << ": " << bad.status().message();
  }
  // sdpa_bwd takes the sink (its stats include it); without a dsink_token output it writes no gradient.
  auto bwd = resolve_json(sink_json("sdpa_bwd", "[1, 2, 1, 1]", "fp32"));
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString();
  EXPECT_TRUE(std::get<SdpaBwdAttrs>(bwd->ops[0].attrs).sink);
  EXPECT_FALSE(std::get<SdpaBwdAttrs>(bwd->ops[0].attrs).sink_grad);
}

// sink_json("sdpa_bwd") with a "dsink_token" output (tensor "ds", dims given or inferred).
std::string sink_bwd_json(const std::string& ds_tensor = R"({"name": "ds", "dtype": "fp32"})",
                          bool with_sink = true) {
  std::string j = sink_json("sdpa_bwd", "[1, 2, 1, 1]", "fp32");
  const std::string outs = R"({"dq": "dq", "dk": "dk", "dv": "dv"})";
  j.replace(j.find(outs), outs.size(), R"({"dq": "dq", "dk": "dk", "dv": "dv", "dsink_token": "ds"})");
  const std::string last = R"({"name": "dv"}],)";
  j.replace(j.find(last), last.size(), R"({"name": "dv"}, )" + ds_tensor + "],");
  if (!with_sink) {
    const std::string in = R"(, "sink_token": "sink"})";
    j.replace(j.find(in), in.size(), "}");
  }
  return j;
}

TEST(SdpaSinkResolve, BackwardSinkGradientRulesAndMessages) {
  auto r = resolve_json(sink_bwd_json());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<SdpaBwdAttrs>(r->ops[0].attrs).sink_grad);
  EXPECT_NE(describe(*r).find("sink gradient"), std::string::npos) << describe(*r);
  const ResolvedTensor& ds = r->tensors[r->find_tensor("ds")];
  EXPECT_EQ(ds.dims, (std::vector<int64_t>{1, 2, 1, 1}));
  EXPECT_EQ(ds.dtype, DType::kFP32);
  // fingerprints: the gradient output changes the graph
  auto plain = resolve_json(sink_json("sdpa_bwd", "[1, 2, 1, 1]", "fp32"));
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(graph_fingerprint(*r), graph_fingerprint(*plain));

  auto no_sink = resolve_json(sink_bwd_json(R"({"name": "ds", "dtype": "fp32"})", false));
  ASSERT_FALSE(no_sink.ok());
  EXPECT_NE(no_sink.status().message().find("dsink_token"), std::string::npos) << no_sink.status().message();
  EXPECT_NE(no_sink.status().message().find("'sink_token'"), std::string::npos) << no_sink.status().message();

  auto bf16 = resolve_json(sink_bwd_json(R"({"name": "ds", "dtype": "bf16"})"));
  ASSERT_FALSE(bf16.ok());
  EXPECT_NE(bf16.status().message().find("fp32"), std::string::npos) << bf16.status().message();
  auto dims = resolve_json(sink_bwd_json(R"({"name": "ds", "dtype": "fp32", "dims": [1, 1, 1, 2]})"));
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("[1, 2, 1, 1]"), std::string::npos) << dims.status().message();
}

// The CPU reference's dsink against a central difference of the forward
// reference: L(sink) = sum(do * o(sink)), dL/dsink[h] by (L(+e) - L(-e)) / 2e,
// with the backward fed the forward's o and stats (as fusebox derives them).
TEST(SdpaSinkReferenceCpu, SinkGradientIsTheDerivativeOfTheForward) {
  auto fwd = resolve_json(sink_json("sdpa_fwd", "[1, 2, 1, 1]", "fp32"));
  auto bwd = resolve_json(sink_bwd_json());
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString();
  std::map<std::string, HostTensor> in;
  for (const char* name : {"q", "k", "v", "do"}) {
    const ResolvedTensor& t = bwd->tensors[bwd->find_tensor(name)];
    in[name] = random_tensor(t, 31 + static_cast<int>(std::string(name).size()) * 7 + name[0]);
  }
  const ResolvedTensor& sink_t = fwd->tensors[fwd->find_tensor("sink")];
  auto forward = [&](double s0, double s1) {
    std::map<std::string, HostTensor> f = {
        {"q", in["q"]}, {"k", in["k"]}, {"v", in["v"]}, {"sink", host_from(sink_t, {s0, s1})}};
    return reference_cpu(*fwd, f);
  };
  auto base = forward(0.5, -1.0);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  const std::vector<float> dout = in["do"].to_float_logical();
  auto loss = [&](const ReferenceOutputs& r) {
    double l = 0;
    const std::vector<float>& o = r.at("o");
    for (size_t i = 0; i < o.size(); ++i) l += static_cast<double>(o[i]) * dout[i];
    return l;
  };
  std::map<std::string, HostTensor> b = in;
  b["sink"] = host_from(sink_t, {0.5, -1.0});
  const ResolvedTensor& o_t = bwd->tensors[bwd->find_tensor("o_in")];
  const ResolvedTensor& st_t = bwd->tensors[bwd->find_tensor("st")];
  b["o_in"] = host_from(o_t, std::vector<double>(base->at("o").begin(), base->at("o").end()));
  b["st"] = host_from(st_t, std::vector<double>(base->at("stats").begin(), base->at("stats").end()));
  auto grads = reference_cpu(*bwd, b);
  ASSERT_TRUE(grads.ok()) << grads.status().ToString();
  const double e = 1e-3;
  for (int h = 0; h < 2; ++h) {
    auto plus = forward(0.5 + (h == 0 ? e : 0), -1.0 + (h == 1 ? e : 0));
    auto minus = forward(0.5 - (h == 0 ? e : 0), -1.0 - (h == 1 ? e : 0));
    ASSERT_TRUE(plus.ok() && minus.ok());
    const double fd = (loss(*plus) - loss(*minus)) / (2 * e);
    const double got = grads->at("ds")[h];
    std::printf("[ sink ] head %d: dsink %.6f, central difference %.6f\n", h, got, fd);
    EXPECT_NEAR(got, fd, 2e-3 + 2e-2 * std::abs(fd)) << "head " << h;
    EXPECT_GT(std::abs(fd), 1e-2) << "head " << h << ": a sink gradient of ~0 tests nothing";
  }
}

// q = 0: every kept score is 0, so with n kept keys P = 1 / (n + exp(sink)),
// stats = log(n + exp(sink)), and o = P * (sum of the kept v rows).
TEST(SdpaSinkReferenceCpu, SinkJoinsTheSoftmaxWithoutAValue) {
  auto r = resolve_json(sink_json("sdpa_fwd", "[1, 2, 1, 1]", "fp32"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<std::string, HostTensor> in;
  for (int i : r->input_tensors()) {
    const ResolvedTensor& t = r->tensors[i];
    in[t.name] = t.name == "q"      ? host_from(t, std::vector<double>(2 * 3 * 64, 0.0))
                 : t.values.empty() ? random_tensor(t, 9)
                                    : host_from(t, t.values);
  }
  auto out = reference_cpu(*r, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const std::vector<float> v = in.at("v").to_float_logical();
  const double sink[2] = {0.5, -1.0};
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 3; ++i) {
      const double z = (i + 1) + std::exp(sink[h]);  // causal: keys 0..i
      EXPECT_NEAR(out->at("stats")[h * 3 + i], std::log(z), 1e-6) << h << "," << i;
      for (int d = 0; d < 64; d += 21) {
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += v[j * 64 + d];
        EXPECT_NEAR(out->at("o")[(h * 3 + i) * 64 + d], sum / z, 1e-6) << h << "," << i << "," << d;
      }
    }
}

}  // namespace
}  // namespace fusebox
