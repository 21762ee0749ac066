// Data-parallel bookkeeping (fusebox/distributed.h, issue 31) with no GPU: the torchrun launch
// variables (and every malformed one), the in-process communicators (sums in rank order, a count
// mismatch, an abort that frees the waiting ranks), the gradient buckets and the order in which
// they may start.
#include "fusebox/distributed.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

namespace fusebox {
namespace {

using Env = std::map<std::string, std::string>;

Result<LaunchEnv> parse(const Env& env) {
  return parse_launch_env([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

void expect_refused(const Env& env, const std::string& needle) {
  auto e = parse(env);
  ASSERT_FALSE(e.ok()) << "accepted; expected an error naming " << needle;
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find(needle), std::string::npos) << e.status().message();
}

TEST(LaunchEnv, NoneSetIsOneProcessAndTorchrunsVariablesAreRead) {
  auto none = parse({});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->from_env);
  EXPECT_EQ(none->world_size, 1);
  EXPECT_EQ(none->rank, 0);
  auto e = parse({{"RANK", "3"},
                  {"WORLD_SIZE", "8"},
                  {"LOCAL_RANK", "1"},
                  {"MASTER_ADDR", "node07.cluster"},
                  {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(e->from_env);
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "node07.cluster");
  EXPECT_EQ(e->master_port, 29500);
  // World size 1 needs no rendezvous.
  auto one = parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}});
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->world_size, 1);
}

TEST(LaunchEnv, MalformedVariablesAreRefusedByName) {
  const Env good = {{"RANK", "1"},
                    {"WORLD_SIZE", "2"},
                    {"LOCAL_RANK", "1"},
                    {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Env e = good;
    e[k] = v;
    return e;
  };
  auto without = [&](const std::string& k) {
    Env e = good;
    e.erase(k);
    return e;
  };
  expect_refused(without("RANK"), "missing: RANK");
  expect_refused(without("LOCAL_RANK"), "LOCAL_RANK");
  expect_refused(with("RANK", "2"), "RANK='2'");  // not below WORLD_SIZE
  expect_refused(with("RANK", "-1"), "RANK='-1'");
  expect_refused(with("RANK", "1x"), "RANK='1x'");
  expect_refused(with("RANK", ""), "RANK=''");
  expect_refused(with("WORLD_SIZE", "0"), "WORLD_SIZE='0'");
  expect_refused(with("WORLD_SIZE", "99999999999999999999"), "WORLD_SIZE=");
  expect_refused(with("MASTER_PORT", "70000"), "MASTER_PORT='70000'");
  expect_refused(without("MASTER_PORT"), "MASTER_ADDR and MASTER_PORT");
  expect_refused(with("MASTER_ADDR", "a b"), "MASTER_ADDR");
  expect_refused(with("MASTER_ADDR", std::string(300, 'a')), "MASTER_ADDR");
}

TEST(ThreadCommunicators, SumInRankOrderEveryRankGettingTheSameBits) {
  constexpr int kWorld = 3;
  auto comms = make_thread_communicators(kWorld);
  ASSERT_EQ(comms.size(), 3u);
  EXPECT_EQ(comms[2]->rank(), 2);
  EXPECT_EQ(comms[0]->world_size(), 3);
  std::vector<std::vector<float>> data(kWorld);
  std::vector<Status> st(kWorld);
  std::vector<std::thread> th;
  for (int r = 0; r < kWorld; ++r) {
    th.emplace_back([&, r] {
      for (int call = 0; call < 50 && st[r].ok(); ++call) {  // many calls: the phases must not mix
        data[r] = {1e8f * static_cast<float>(r == 0), static_cast<float>(r + 1), static_cast<float>(call)};
        if (r == 2) data[r][0] = -1e8f;
        st[r] = comms[r]->all_reduce_sum(data[r].data(), data[r].size(), nullptr);
      }
    });
  }
  for (auto& t : th) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    // (1e8 + 0) + -1e8 = 0 in rank order, whatever thread came last.
    EXPECT_EQ(data[r], (std::vector<float>{0.f, 6.f, 3.f * 49}));
  }
}

TEST(ThreadCommunicators, ACountMismatchFailsEveryRankAndAbortFreesTheOthers) {
  auto comms = make_thread_communicators(2);
  std::vector<float> a(4, 1.f), b(5, 1.f);
  Status sa, sb;
  std::thread t0([&] { sa = comms[0]->all_reduce_sum(a.data(), a.size(), nullptr); });
  std::thread t1([&] { sb = comms[1]->all_reduce_sum(b.data(), b.size(), nullptr); });
  t0.join();
  t1.join();
  EXPECT_EQ(sa.code(), StatusCode::kInvalidArgument) << sa.ToString();
  EXPECT_EQ(sb.code(), StatusCode::kInvalidArgument) << sb.ToString();
  EXPECT_NE(sa.message().find("rank 1 gave 5 values"), std::string::npos) << sa.message();
  EXPECT_EQ(a, std::vector<float>(4, 1.f)) << "a failed call leaves the data";

  // Rank 1 never comes: rank 0 waits until rank 1 aborts the group.
  Status waiting;
  std::thread w([&] { waiting = comms[0]->all_reduce_sum(a.data(), a.size(), nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  comms[1]->abort();
  w.join();
  EXPECT_FALSE(waiting.ok());
  EXPECT_NE(waiting.message().find("aborted"), std::string::npos) << waiting.ToString();
  EXPECT_FALSE(comms[1]->all_reduce_sum(b.data(), 1, nullptr).ok()) << "an aborted group stays aborted";
  EXPECT_TRUE(make_single_communicator()->all_reduce_sum(a.data(), a.size(), nullptr).ok());
  EXPECT_TRUE(make_thread_communicators(0).empty());
}

TEST(GradientBuckets, KeepTheOrderFillUpToTheSizeAndALargeTensorGoesAlone) {
  // 4-byte values, 100-byte buckets: 25 values each.
  auto b = plan_gradient_buckets({{"out", 10}, {"w3", 10}, {"big", 60}, {"w2", 20}, {"w1", 5}}, 100);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->size(), 3u);
  EXPECT_EQ((*b)[0].params, (std::vector<std::string>{"out", "w3"}));
  EXPECT_EQ((*b)[0].offsets, (std::vector<int64_t>{0, 10}));
  EXPECT_EQ((*b)[0].elements, 20);
  EXPECT_EQ((*b)[1].params, (std::vector<std::string>{"big"}));
  EXPECT_EQ((*b)[2].params, (std::vector<std::string>{"w2", "w1"}));
  EXPECT_EQ((*b)[2].elements, 25);
  auto full =
      plan_gradient_buckets({{"w2", 20}, {"w1", 5}, {"emb", 1}}, 100);  // 25 fill one; emb starts the next
  ASSERT_TRUE(full.ok());
  ASSERT_EQ(full->size(), 2u);
  EXPECT_EQ(full->back().params, (std::vector<std::string>{"emb"}));
  EXPECT_FALSE(plan_gradient_buckets({{"a", 1}, {"a", 2}}, 100).ok());
  EXPECT_FALSE(plan_gradient_buckets({{"a", 0}}, 100).ok());
  EXPECT_FALSE(plan_gradient_buckets({{"a", 1}}, 3).ok());
}

TEST(BucketTracker, BucketsStartInOrderOnceAllTheirGradientsAreReady) {
  auto b = plan_gradient_buckets({{"p0", 5}, {"p1", 5}, {"p2", 5}, {"p3", 5}}, 40);  // 10 values a bucket
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->size(), 2u);
  BucketTracker t(*b);
  auto r = t.mark_ready("p3");  // bucket 1 is half ready; bucket 0 not at all
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
  r = t.mark_ready("p2");  // bucket 1 complete, but bucket 0 must start first
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
  r = t.mark_ready("p0");
  EXPECT_TRUE(r->empty());
  r = t.mark_ready("p1");
  EXPECT_EQ(*r, (std::vector<int>{0, 1}));
  EXPECT_TRUE(t.all_started());
  EXPECT_FALSE(t.mark_ready("p1").ok()) << "twice in one step";
  EXPECT_FALSE(t.mark_ready("nope").ok());
  t.reset();
  EXPECT_FALSE(t.all_started());
  EXPECT_TRUE(t.mark_ready("p1").ok());
}

}  // namespace
}  // namespace fusebox
