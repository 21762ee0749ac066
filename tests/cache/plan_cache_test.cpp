// PlanCache: round trips, corruption, LRU, read-only and foreign files,
// concurrent processes, export/import. CPU only; runs everywhere.
#include "fusebox/plan_cache.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "entry_codec.h"
#include "fusebox/graph.h"

namespace fusebox {

struct PlanCacheTestPeer {
  // Caps this connection's database size: later growth fails with SQLITE_FULL.
  static void limit_pages(PlanCache& c, int pages) {
    ASSERT_EQ(sqlite3_exec(c.db_.get(), ("PRAGMA max_page_count = " + std::to_string(pages)).c_str(), nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
  }
};

namespace {

namespace fs = std::filesystem;

class PlanCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("fusebox-cache-test-" + std::to_string(getpid()) + "-" +
                                        info->test_suite_name() + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "plans.sqlite").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
  std::string path_;
};

CacheKey base_key() {
  CacheKey k;
  k.graph_canonical = "conv_fprop x[8,64,56,56] w[64,64,3,3] nhwc half -> relu";
  k.device_name = "NVIDIA H200";
  k.sm_version = 90;
  k.sm_count = 132;
  k.cudnn_version = 91900;
  k.frontend_version = "1.17.0";
  k.policy = "heuristic:a";
  return k;
}

// A payload that passes common::check_plan_payload() (the keys the frontend
// reads), padded with letters that depend on `fill` to exactly `bytes` when
// that is at least the ~170 bytes of the smallest one.
std::vector<uint8_t> valid_payload(size_t bytes, uint8_t fill) {
  if (bytes == 0) return {};
  auto make = [&](size_t pad) {
    std::string p(pad, 'a');
    for (size_t i = 0; i < pad; ++i) p[i] = static_cast<char>('a' + (fill + i * 7) % 26);
    nlohmann::json backend = {
        {"cudnnVersion", 91900},
        {"schemaVersion", 4},
        {"engine", {{"engineId", 7}}},
        {"operationGraph",
         {{"tensors", nlohmann::json::array()}, {"nodes", nlohmann::json::array()}, {"pad", p}}}};
    nlohmann::json j = {{"json_version", "2.0"},
                        {"cudnn_backend_data", backend.dump()},
                        {"behavior_notes", nlohmann::json::array({nlohmann::json::array()})},
                        {"variant_pack_uids", nlohmann::json::array()},
                        {"variant_pack_replacements", nlohmann::json::array()},
                        {"fe_workspace_size", 0}};
    return nlohmann::json::to_ubjson(j);
  };
  std::vector<uint8_t> v = make(0);
  if (v.size() < bytes) {
    size_t pad = bytes - v.size();
    while (pad > 0 && (v = make(pad)).size() > bytes) --pad;
  }
  return v;
}

CacheEntry make_entry(const std::string& key, size_t payload_bytes = 256, uint8_t fill = 0x5a) {
  CacheEntry e;
  e.key = key;
  e.info.graph_fingerprint = "0123456789abcdef";
  e.info.engine = "eng7_k2=3_k3=0";
  e.info.workspace_bytes = 4096;
  e.info.device_name = "NVIDIA H200";
  e.info.sm_version = 90;
  e.info.sm_count = 132;
  e.info.built_deviceless = true;
  e.info.cudnn_version = 91900;
  e.info.frontend_version = "1.17.0";
  e.info.fusebox_version = "0.1.0";
  e.tuned_median_ms = 0.125;
  e.payload = valid_payload(payload_bytes, fill);
  return e;
}

// Runs one statement on the cache file directly, as a corrupting disk or user would.
void raw_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

int64_t raw_count(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) return -1;
  sqlite3_stmt* s = nullptr;
  int64_t n = -1;
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM entries", -1, &s, nullptr) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW) {
    n = sqlite3_column_int64(s, 0);
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return n;
}

std::optional<CacheEntry> must_lookup(PlanCache& c, const std::string& key) {
  auto r = c.lookup(key);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::nullopt;
}

TEST(CacheKeyHash, StableAndSensitiveToEveryField) {
  const CacheKey k = base_key();
  const std::string h = cache_key_hash(k);
  EXPECT_EQ(h.size(), 16u);
  EXPECT_EQ(h, cache_key_hash(base_key()));
  std::set<std::string> hashes{h};
  auto differs = [&](CacheKey v, const char* what) {
    const std::string hv = cache_key_hash(v);
    EXPECT_TRUE(hashes.insert(hv).second) << what << " did not change the hash";
  };
  CacheKey v = k;
  v.graph_canonical += " ";
  differs(v, "graph");
  v = k;
  v.device_name = "NVIDIA H100";
  differs(v, "device name");
  v = k;
  v.sm_version = 100;
  differs(v, "sm_version");
  v = k;
  v.sm_count = 114;
  differs(v, "sm_count");
  v = k;
  v.cudnn_version = 91800;
  differs(v, "cudnn version");
  v = k;
  v.frontend_version = "1.16.0";
  differs(v, "frontend version");
  v = k;
  v.policy = "tune:median";
  differs(v, "policy");
  // Length prefixes: moving a character between fields changes the hash.
  v = k;
  v.device_name = "NVIDIA H20";
  v.frontend_version = "01.17.0";
  differs(v, "field boundary");
}

TEST_F(PlanCacheTest, StoreThenLookupRoundTrips) {
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.enabled()) << c.warning();
  EXPECT_TRUE(c.warning().empty()) << c.warning();
  const std::string key = cache_key_hash(base_key());
  CacheEntry in = make_entry(key);
  ASSERT_TRUE(c.store(in).ok());
  auto out = must_lookup(c, key);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->key, key);
  EXPECT_EQ(out->payload, in.payload);
  EXPECT_EQ(out->payload_bytes, static_cast<int64_t>(in.payload.size()));
  EXPECT_EQ(out->info.engine, in.info.engine);
  EXPECT_EQ(out->info.workspace_bytes, 4096);
  EXPECT_EQ(out->info.sm_count, 132);
  EXPECT_EQ(out->info.cudnn_version, 91900);
  EXPECT_EQ(out->info.frontend_version, "1.17.0");
  EXPECT_EQ(out->info.fusebox_version, "0.1.0");
  EXPECT_TRUE(out->info.built_deviceless);
  EXPECT_DOUBLE_EQ(out->tuned_median_ms, 0.125);
  EXPECT_EQ(out->created_utc.size(), 27u) << out->created_utc;
  EXPECT_FALSE(out->last_used_utc.empty());
  EXPECT_TRUE(c.warning().empty()) << c.warning();

  // Survives closing and reopening; a heuristic (untuned) entry keeps -1.
  CacheEntry h = make_entry("feedfacefeedface");
  h.tuned_median_ms = -1;
  ASSERT_TRUE(c.store(h).ok());
  PlanCache again = PlanCache::open(path_);
  auto h2 = must_lookup(again, "feedfacefeedface");
  ASSERT_TRUE(h2.has_value());
  EXPECT_EQ(h2->tuned_median_ms, -1);
  EXPECT_TRUE(must_lookup(again, key).has_value());
}

TEST_F(PlanCacheTest, MissIsNulloptWithoutWarning) {
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.enabled());
  EXPECT_FALSE(must_lookup(c, "0000000000000000").has_value());
  EXPECT_TRUE(c.warning().empty());
}

// Keys hash the canonical form, which starts with its version: entries keyed
// on another version (or on the pre-version describe() text) miss cleanly,
// and the new form fills the cache beside them.
TEST_F(PlanCacheTest, CanonicalFormVersionChangeMissesOldEntries) {
  GraphSpec spec;
  spec.tensor("a", {1, 8, 8});
  spec.tensor("b", {1, 8, 8});
  spec.output(spec.matmul("mm", "a", "b"));
  auto g = resolve(spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::string form = canonical_form(*g);
  const std::string version_line = "fusebox-canonical-form=" + std::to_string(kCanonicalFormVersion) + "\n";
  ASSERT_EQ(form.rfind(version_line, 0), 0u) << form;

  CacheKey old_key = base_key(), new_key = base_key();
  old_key.graph_canonical = "fusebox-canonical-form=" + std::to_string(kCanonicalFormVersion - 1) + "\n" +
                            form.substr(version_line.size());
  new_key.graph_canonical = form;
  CacheKey describe_key = base_key();
  describe_key.graph_canonical = describe(*g);  // what keyed the cache before the canonical form

  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.enabled());
  ASSERT_TRUE(c.store(make_entry(cache_key_hash(old_key))).ok());
  ASSERT_TRUE(c.store(make_entry(cache_key_hash(describe_key), 256, 0x11)).ok());
  EXPECT_FALSE(must_lookup(c, cache_key_hash(new_key)).has_value());
  EXPECT_TRUE(c.warning().empty());
  ASSERT_TRUE(c.store(make_entry(cache_key_hash(new_key), 256, 0x33)).ok());
  auto hit = must_lookup(c, cache_key_hash(new_key));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->payload, make_entry("", 256, 0x33).payload);
  EXPECT_EQ(raw_count(path_), 3);  // the old entries stay until LRU eviction
}

TEST_F(PlanCacheTest, StoreReplacesSameKey) {
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.store(make_entry("k1", 100, 1)).ok());
  ASSERT_TRUE(c.store(make_entry("k1", 50, 2)).ok());
  auto e = must_lookup(c, "k1");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->payload, make_entry("k1", 50, 2).payload);
  EXPECT_EQ(raw_count(path_), 1);
}

TEST_F(PlanCacheTest, RejectsUnstorableEntries) {
  PlanCache c = PlanCache::open(path_);
  EXPECT_EQ(c.store(make_entry("", 10)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.store(make_entry("k", 0)).code(), StatusCode::kInvalidArgument);
  CacheEntry nan = make_entry("k");
  nan.tuned_median_ms = std::nan("");
  EXPECT_EQ(c.store(nan).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(raw_count(path_), 0);
}

void expect_corrupt_entry_is_dropped(const std::string& path, const std::string& corrupting_sql) {
  const std::string key = "c0ffee00c0ffee00";
  {
    PlanCache c = PlanCache::open(path);
    ASSERT_TRUE(c.store(make_entry(key, 512)).ok());
    ASSERT_TRUE(c.store(make_entry("other", 64)).ok());
  }
  raw_sql(path, corrupting_sql);
  PlanCache c = PlanCache::open(path);
  ASSERT_TRUE(c.enabled()) << c.warning();
  EXPECT_FALSE(must_lookup(c, key).has_value());
  ASSERT_EQ(c.warnings().size(), 1u) << c.warning();
  EXPECT_NE(c.warning().find(key), std::string::npos) << c.warning();
  EXPECT_NE(c.warning().find("deleted"), std::string::npos) << c.warning();
  EXPECT_EQ(raw_count(path), 1);  // the corrupt one is gone, the other stays
  EXPECT_FALSE(must_lookup(c, key).has_value());
  EXPECT_EQ(c.warnings().size(), 1u) << "the second lookup is a plain miss";
  EXPECT_TRUE(must_lookup(c, "other").has_value());
}

TEST_F(PlanCacheTest, BitFlippedPayloadIsAMissAndDeleted) {
  // Flip the lowest bit of payload byte 99 (0-based): still a well-formed payload, so the checksum must catch
  // it.
  const uint8_t b = make_entry("x", 512).payload[99] ^ 1;
  char hex[8];
  std::snprintf(hex, sizeof hex, "%02X", b);
  expect_corrupt_entry_is_dropped(
      path_, std::string("UPDATE entries SET payload = substr(payload, 1, 99) || X'") + hex +
                 "' || substr(payload, 101) WHERE key = 'c0ffee00c0ffee00'");
}

TEST_F(PlanCacheTest, BitFlippedPayloadViaBlobApiIsAMiss) {
  const std::string key = "c0ffee00c0ffee00";
  {
    PlanCache c = PlanCache::open(path_);
    ASSERT_TRUE(c.store(make_entry(key, 512)).ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_int64 rowid = 0;
  {
    sqlite3_stmt* s = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT rowid FROM entries WHERE key = ?1", -1, &s, nullptr), SQLITE_OK);
    sqlite3_bind_text(s, 1, key.c_str(), -1, SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(s), SQLITE_ROW);
    rowid = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
  }
  sqlite3_blob* blob = nullptr;
  ASSERT_EQ(sqlite3_blob_open(db, "main", "entries", "payload", rowid, 1, &blob), SQLITE_OK);
  unsigned char b = 0;
  ASSERT_EQ(sqlite3_blob_read(blob, &b, 1, 300), SQLITE_OK);
  b ^= 0x10;
  ASSERT_EQ(sqlite3_blob_write(blob, &b, 1, 300), SQLITE_OK);
  sqlite3_blob_close(blob);
  sqlite3_close(db);

  PlanCache c = PlanCache::open(path_);
  EXPECT_FALSE(must_lookup(c, key).has_value());
  EXPECT_NE(c.warning().find(key), std::string::npos);
  EXPECT_NE(c.warning().find("checksum"), std::string::npos) << c.warning();
  EXPECT_EQ(raw_count(path_), 0);
}

TEST_F(PlanCacheTest, TruncatedPayloadIsAMissAndDeleted) {
  expect_corrupt_entry_is_dropped(
      path_, "UPDATE entries SET payload = substr(payload, 1, 200) WHERE key = 'c0ffee00c0ffee00'");
}

TEST_F(PlanCacheTest, EmptyPayloadIsAMissAndDeleted) {
  expect_corrupt_entry_is_dropped(path_, "UPDATE entries SET payload = X'' WHERE key = 'c0ffee00c0ffee00'");
}

TEST_F(PlanCacheTest, GarbageMetadataIsAMissAndDeleted) {
  expect_corrupt_entry_is_dropped(path_,
                                  "UPDATE entries SET meta = 'not json {' WHERE key = 'c0ffee00c0ffee00'");
}

TEST_F(PlanCacheTest, RandomRowIsAMissAndDeleted) {
  expect_corrupt_entry_is_dropped(
      path_,
      "UPDATE entries SET meta = CAST(randomblob(300) AS TEXT), payload = randomblob(512) "
      "WHERE key = 'c0ffee00c0ffee00'");
}

TEST_F(PlanCacheTest, EntryUnderAnotherKeyIsAMiss) {
  // A row whose checksummed metadata names a different key (swapped rows).
  expect_corrupt_entry_is_dropped(
      path_,
      "UPDATE entries SET meta = (SELECT meta FROM entries WHERE key = 'other'), "
      "payload = (SELECT payload FROM entries WHERE key = 'other') WHERE key = 'c0ffee00c0ffee00'");
}

TEST_F(PlanCacheTest, EvictsLeastRecentlyUsed) {
  // Each entry is ~1000 payload + ~450 meta bytes: room for three.
  PlanCache c = PlanCache::open(path_, 4600);
  ASSERT_TRUE(c.enabled()) << c.warning();
  ASSERT_TRUE(c.store(make_entry("a", 1000)).ok());
  ASSERT_TRUE(c.store(make_entry("b", 1000)).ok());
  ASSERT_TRUE(c.store(make_entry("c", 1000)).ok());
  ASSERT_EQ(raw_count(path_), 3) << "limit too small for the test's assumption: " << c.total_bytes();
  ASSERT_TRUE(must_lookup(c, "a").has_value());  // a is now the most recent
  ASSERT_TRUE(c.store(make_entry("d", 1000)).ok());
  EXPECT_EQ(raw_count(path_), 3);
  EXPECT_FALSE(must_lookup(c, "b").has_value()) << "b was least recently used";
  EXPECT_TRUE(must_lookup(c, "a").has_value());
  EXPECT_TRUE(must_lookup(c, "c").has_value());
  EXPECT_TRUE(must_lookup(c, "d").has_value());
  EXPECT_LE(c.total_bytes(), 4600);
  EXPECT_TRUE(c.warning().empty()) << c.warning();

  // list() is most recently used first.
  auto l = c.list();
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 3u);
  EXPECT_EQ((*l)[0].key, "d");
  EXPECT_EQ((*l)[2].key, "a");
  EXPECT_TRUE((*l)[0].payload.empty());

  // One entry larger than the whole cache is refused, nothing evicted.
  EXPECT_FALSE(c.store(make_entry("huge", 10000)).ok());
  EXPECT_EQ(raw_count(path_), 3);
  EXPECT_NE(c.warning().find("huge"), std::string::npos);
}

TEST_F(PlanCacheTest, ExplicitReadOnlyServesHitsAndStoresNothing) {
  {
    PlanCache c = PlanCache::open(path_);
    ASSERT_TRUE(c.store(make_entry("k1")).ok());
  }
  PlanCacheOptions o;
  o.read_only = true;
  PlanCache c = PlanCache::open(path_, o);
  ASSERT_TRUE(c.enabled()) << c.warning();
  EXPECT_TRUE(c.read_only());
  EXPECT_TRUE(must_lookup(c, "k1").has_value());
  EXPECT_TRUE(c.store(make_entry("k2")).ok());  // a no-op
  EXPECT_FALSE(must_lookup(c, "k2").has_value());
  EXPECT_FALSE(c.clear().ok());
  EXPECT_EQ(raw_count(path_), 1);
}

TEST_F(PlanCacheTest, ReadOnlyOfMissingFileIsDisabled) {
  PlanCacheOptions o;
  o.read_only = true;
  PlanCache c = PlanCache::open(path_, o);
  EXPECT_FALSE(c.enabled());
  EXPECT_FALSE(c.warning().empty());
  EXPECT_FALSE(must_lookup(c, "k").has_value());
  EXPECT_TRUE(c.store(make_entry("k")).ok());
  EXPECT_FALSE(fs::exists(path_));
}

TEST_F(PlanCacheTest, ReadOnlyFileAndDirectoryDegrade) {
  if (geteuid() == 0)
    GTEST_SKIP() << "running as root: chmod does not stop writes (read_only option tested above)";
  {
    PlanCache c = PlanCache::open(path_);
    ASSERT_TRUE(c.store(make_entry("k1")).ok());
  }
  fs::permissions(path_, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  PlanCache c = PlanCache::open(path_);
  EXPECT_NE(c.warning().find("read-only"), std::string::npos) << c.warning();
  ASSERT_TRUE(c.enabled()) << c.warning();
  EXPECT_TRUE(c.read_only());
  EXPECT_TRUE(must_lookup(c, "k1").has_value()) << "hits are still served";
  EXPECT_TRUE(c.store(make_entry("k2")).ok());
  EXPECT_FALSE(must_lookup(c, "k2").has_value());
  // A new cache in a read-only folder: disabled, no crash.
  PlanCache d = PlanCache::open((dir_ / "sub" / "new.sqlite").string());
  EXPECT_FALSE(d.enabled());
  EXPECT_FALSE(must_lookup(d, "k").has_value());
}

TEST_F(PlanCacheTest, UnopenablePathIsDisabled) {
  // A path under a regular file can never be created.
  { std::ofstream(dir_ / "file") << "x"; }
  PlanCache c = PlanCache::open((dir_ / "file" / "plans.sqlite").string());
  EXPECT_FALSE(c.enabled());
  EXPECT_NE(c.warning().find("running without a cache"), std::string::npos) << c.warning();
  EXPECT_FALSE(must_lookup(c, "k").has_value());
  EXPECT_TRUE(c.store(make_entry("k")).ok());
  EXPECT_FALSE(c.list().ok());
  PlanCache e = PlanCache::open("");
  EXPECT_FALSE(e.enabled());
  PlanCache d = PlanCache::open(dir_.string());  // a folder
  EXPECT_FALSE(d.enabled());
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST_F(PlanCacheTest, GarbageFileIsLeftUntouched) {
  std::string garbage(5000, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>((i * 131 + 17) & 0xff);
  { std::ofstream(path_, std::ios::binary) << garbage; }
  PlanCache c = PlanCache::open(path_);
  EXPECT_FALSE(c.enabled());
  EXPECT_NE(c.warning().find(path_), std::string::npos) << c.warning();
  EXPECT_FALSE(must_lookup(c, "k").has_value());
  EXPECT_TRUE(c.store(make_entry("k")).ok());
  EXPECT_FALSE(c.clear().ok());
  EXPECT_TRUE(read_all(path_) == garbage) << "the file was modified";
  EXPECT_FALSE(fs::exists(path_ + "-wal"));
}

TEST_F(PlanCacheTest, SqliteHeaderWithGarbageIsLeftUntouched) {
  std::string garbage = std::string("SQLite format 3", 16) + std::string(4080, '\x7f');
  { std::ofstream(path_, std::ios::binary) << garbage; }
  PlanCache c = PlanCache::open(path_);
  EXPECT_FALSE(c.enabled());
  EXPECT_FALSE(c.warning().empty());
  EXPECT_TRUE(c.store(make_entry("k")).ok());
  EXPECT_TRUE(read_all(path_) == garbage) << "the file was modified";
}

TEST_F(PlanCacheTest, ForeignSqliteDatabaseIsLeftUntouched) {
  raw_sql(path_,
          "CREATE TABLE photos(id INTEGER PRIMARY KEY, data BLOB); INSERT INTO photos VALUES(1, X'00');");
  const std::string before = read_all(path_);
  PlanCache c = PlanCache::open(path_);
  EXPECT_FALSE(c.enabled());
  EXPECT_NE(c.warning().find("not a fusebox plan cache"), std::string::npos) << c.warning();
  EXPECT_TRUE(read_all(path_) == before) << "the file was modified";
}

// ---------------------------------------------------------------- issue #32: a cache file is data, never
// code

// A file with fusebox's identity (application_id, user_version) and the given schema statements.
void make_foreign_cache(const std::string& path, const std::string& ddl) {
  raw_sql(path, "PRAGMA application_id = 1178750808; PRAGMA user_version = 1; " + ddl);
}

constexpr const char* kFusebox =
    "CREATE TABLE entries(key TEXT PRIMARY KEY NOT NULL, meta TEXT NOT NULL, payload BLOB NOT NULL, "
    "created_utc TEXT NOT NULL, stored_bytes INTEGER NOT NULL, last_used_us INTEGER NOT NULL);"
    "CREATE INDEX entries_last_used ON entries(last_used_us);";

// Case 6/7: a payload column declared AS (zeroblob(900000000)) took 7 GB and 30 s to import.
TEST_F(PlanCacheTest, GeneratedColumnIsRefusedBeforeAnyRowIsRead) {
  const std::string src = (dir_ / "generated.sqlite").string();
  make_foreign_cache(
      src,
      "CREATE TABLE entries(key TEXT PRIMARY KEY NOT NULL, meta TEXT NOT NULL, payload BLOB AS "
      "(zeroblob(900000000)) VIRTUAL, created_utc TEXT NOT NULL, stored_bytes INTEGER NOT NULL, "
      "last_used_us INTEGER NOT NULL); CREATE INDEX entries_last_used ON entries(last_used_us);"
      "INSERT INTO entries(key, meta, created_utc, stored_bytes, last_used_us) VALUES('k', '{}', "
      "'2026', 1, 1);");
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.enabled()) << c.warning();
  const auto start = std::chrono::steady_clock::now();
  Status st = c.import_from(src);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kParseError) << st.ToString();
  EXPECT_NE(st.message().find("generated column"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("expected exactly"), std::string::npos) << st.message();
  EXPECT_LT(s, 5.0);
  EXPECT_EQ(raw_count(path_), 0);
  PlanCache direct = PlanCache::open(src);
  EXPECT_FALSE(direct.enabled());
  EXPECT_NE(direct.warning().find("generated column"), std::string::npos) << direct.warning();
}

// Case 8: a trigger that wrote 200 MB on every cache hit.
TEST_F(PlanCacheTest, TriggerViewAndExtraObjectsAreRefused) {
  {
    PlanCache c = PlanCache::open(path_);
    ASSERT_TRUE(c.store(make_entry("k")).ok());
  }
  raw_sql(path_,
          "CREATE TABLE junk(x); CREATE TRIGGER grow AFTER UPDATE ON entries BEGIN INSERT INTO junk "
          "VALUES(zeroblob(200000000)); END;");
  const auto size_before = fs::file_size(path_);
  {
    PlanCache c = PlanCache::open(path_);
    EXPECT_FALSE(c.enabled());
    EXPECT_NE(c.warning().find("trigger 'grow' on 'entries'"), std::string::npos) << c.warning();
    EXPECT_NE(c.warning().find("table 'junk'"), std::string::npos) << c.warning();
    EXPECT_FALSE(must_lookup(c, "k").has_value());
  }
  EXPECT_EQ(fs::file_size(path_), size_before) << "the trigger ran";
  const std::string v = (dir_ / "view.sqlite").string();
  make_foreign_cache(v, std::string(kFusebox) + "CREATE VIEW everything AS SELECT * FROM entries;");
  PlanCache cv = PlanCache::open(v);
  EXPECT_FALSE(cv.enabled());
  EXPECT_NE(cv.warning().find("view 'everything'"), std::string::npos) << cv.warning();
  // The exact schema fusebox writes, made by hand, is accepted.
  const std::string same = (dir_ / "same.sqlite").string();
  make_foreign_cache(same, kFusebox);
  PlanCache cs = PlanCache::open(same);
  EXPECT_TRUE(cs.enabled()) << cs.warning();
}

// Case 14: an entries table without the expected columns said "not an error".
TEST_F(PlanCacheTest, WrongSchemaImportSaysWhatWasExpected) {
  const std::string src = (dir_ / "wrong.sqlite").string();
  make_foreign_cache(src, "CREATE TABLE entries(key TEXT PRIMARY KEY, blob BLOB);");
  PlanCache c = PlanCache::open(path_);
  Status st = c.import_from(src);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kParseError) << st.ToString();
  EXPECT_EQ(st.message().find("not an error"), std::string::npos) << st.message();
  EXPECT_NE(
      st.message().find("expected exactly the table and index fusebox writes (CREATE TABLE entries(key TEXT"),
      std::string::npos)
      << st.message();
}

// Case 3: a writer killed mid-write left -wal/-shm beside the export target;
// the rename kept them and the new file read as malformed.
TEST_F(PlanCacheTest, ExportOverAKilledWritersSideFilesKeepsEverything) {
  const std::string target = (dir_ / "target.sqlite").string();
  {
    PlanCache t = PlanCache::open(target);
    ASSERT_TRUE(t.store(make_entry("old-1", 300, 1)).ok());
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    PlanCache t = PlanCache::open(target);
    (void)t.store(make_entry("old-2", 300, 2));
    ::kill(::getpid(), SIGKILL);  // no close: -wal and -shm stay, old-2 only in the -wal
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_TRUE(fs::exists(target + "-wal")) << "the killed writer left no -wal: the test tests nothing";
  PlanCache a = PlanCache::open(path_);
  ASSERT_TRUE(a.store(make_entry("mine", 300, 3)).ok());
  Status st = a.export_to(target);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(fs::exists(target + "-wal"));
  EXPECT_FALSE(fs::exists(target + "-shm"));
  PlanCache t = PlanCache::open(target);
  ASSERT_TRUE(t.enabled()) << t.warning();
  std::vector<std::string> bad;
  auto checked = t.verify(&bad);
  ASSERT_TRUE(checked.ok()) << checked.status().ToString();
  EXPECT_EQ(*checked, 3);
  EXPECT_TRUE(bad.empty());
  for (const char* k : {"old-1", "old-2", "mine"}) EXPECT_TRUE(must_lookup(t, k).has_value()) << k;
}

// Case 4: an export onto a cache another connection holds open reported
// success, but that connection never saw the exported entries.
TEST_F(PlanCacheTest, ExportOntoACacheOpenElsewhereIsRefused) {
  const std::string target = (dir_ / "live.sqlite").string();
  PlanCache live = PlanCache::open(target);
  ASSERT_TRUE(live.store(make_entry("theirs", 300, 1)).ok());
  PlanCache a = PlanCache::open(path_);
  ASSERT_TRUE(a.store(make_entry("mine", 300, 2)).ok());
  Status st = a.export_to(target);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("open in another connection or process"), std::string::npos) << st.message();
  EXPECT_TRUE(must_lookup(live, "theirs").has_value());
  ASSERT_TRUE(live.store(make_entry("theirs-2", 300, 3)).ok()) << "the live cache still works";
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // Closed, the same export goes through and keeps both.
  { PlanCache closed = std::move(live); }
  ASSERT_TRUE(a.export_to(target).ok());
  PlanCache t = PlanCache::open(target);
  for (const char* k : {"theirs", "theirs-2", "mine"}) EXPECT_TRUE(must_lookup(t, k).has_value()) << k;
}

TEST_F(PlanCacheTest, ExportRefusesTheCachesOwnSideFiles) {
  PlanCache a = PlanCache::open(path_);
  ASSERT_TRUE(a.store(make_entry("k")).ok());
  Status st = a.export_to(path_ + "-wal");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_TRUE(must_lookup(a, "k").has_value());
}

TEST_F(PlanCacheTest, NewerFormatIsDisabled) {
  { PlanCache c = PlanCache::open(path_); }
  raw_sql(path_, "PRAGMA user_version = 99");
  PlanCache c = PlanCache::open(path_);
  EXPECT_FALSE(c.enabled());
  EXPECT_NE(c.warning().find("newer"), std::string::npos) << c.warning();
}

TEST_F(PlanCacheTest, FullDiskStoreFailsWithWarningAndLookupsContinue) {
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.store(make_entry("small", 100)).ok());
  PlanCacheTestPeer::limit_pages(c, 1);  // below the current size: nothing may grow
  const Status st = c.store(make_entry("big", 100000));
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_NE(c.warning().find("store big failed"), std::string::npos) << c.warning();
  EXPECT_TRUE(c.enabled());
  EXPECT_TRUE(must_lookup(c, "small").has_value());
  EXPECT_FALSE(must_lookup(c, "big").has_value());
  EXPECT_EQ(raw_count(path_), 1) << "the failed transaction left nothing behind";
}

TEST_F(PlanCacheTest, CreatesParentFolders) {
  const std::string deep = (dir_ / "a" / "b" / "c" / "plans.sqlite").string();
  PlanCache c = PlanCache::open(deep);
  ASSERT_TRUE(c.enabled()) << c.warning();
  ASSERT_TRUE(c.store(make_entry("k")).ok());
  EXPECT_TRUE(fs::exists(deep));
}

TEST_F(PlanCacheTest, EightProcessesShareOneFile) {
  constexpr int kProcs = 8, kPerProc = 20, kShared = 5;
  { PlanCache warm = PlanCache::open(path_); }  // not needed, but mirrors a real first run
  fs::remove(path_);                            // ...and then race the creation too
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int failures = 0;
      PlanCache c = PlanCache::open(path_);
      if (!c.enabled() || !c.warning().empty()) _exit(100);
      for (int i = 0; i < kPerProc; ++i) {
        const std::string own = "p" + std::to_string(p) + "-" + std::to_string(i);
        if (!c.store(make_entry(own, 300, static_cast<uint8_t>(p))).ok()) ++failures;
        const std::string shared = "shared-" + std::to_string(i % kShared);
        if (!c.store(make_entry(shared, 300, 0x33)).ok()) ++failures;
        auto r = c.lookup(own);
        if (!r.ok() || !r->has_value() ||
            (*r)->payload != make_entry(own, 300, static_cast<uint8_t>(p)).payload) {
          ++failures;
        }
        auto s = c.lookup(shared);
        if (!s.ok() || !s->has_value() || (*s)->payload != make_entry(shared, 300, 0x33).payload) ++failures;
      }
      if (!c.warning().empty()) ++failures;
      _exit(failures > 99 ? 99 : failures);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child " << pid << " failed (100: open failed)";
  }
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.enabled()) << c.warning();
  for (int p = 0; p < kProcs; ++p) {
    for (int i = 0; i < kPerProc; ++i) {
      const std::string own = "p" + std::to_string(p) + "-" + std::to_string(i);
      auto e = must_lookup(c, own);
      ASSERT_TRUE(e.has_value()) << own;
      EXPECT_EQ(e->payload, make_entry(own, 300, static_cast<uint8_t>(p)).payload);
    }
  }
  EXPECT_EQ(raw_count(path_), kProcs * kPerProc + kShared);
  std::vector<std::string> bad;
  auto n = c.verify(&bad);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, kProcs * kPerProc + kShared);
  EXPECT_TRUE(bad.empty());
}

TEST_F(PlanCacheTest, KillNineMidWriteLeavesOldEntryOrNone) {
  // A writer killed with SIGKILL at random points while replacing entries:
  // afterwards every entry is whole (old or new), none is torn.
  int replaced = 0;  // entries the killed writer did replace: the test must exercise writes
  for (int round = 0; round < 5; ++round) {
    {
      PlanCache c = PlanCache::open(path_);
      ASSERT_TRUE(c.enabled()) << c.warning();
      for (int i = 0; i < 10; ++i) ASSERT_TRUE(c.store(make_entry("k" + std::to_string(i), 4096, 0x11)).ok());
    }
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      PlanCache c = PlanCache::open(path_);
      for (int n = 0;; ++n) {
        (void)c.store(make_entry("k" + std::to_string(n % 10), 4096 + n % 977, static_cast<uint8_t>(n)));
      }
    }
    usleep(20000 + 15000 * round);  // let it write for a while
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status));

    PlanCache c = PlanCache::open(path_);
    ASSERT_TRUE(c.enabled()) << c.warning();
    std::vector<std::string> bad;
    auto checked = c.verify(&bad);
    ASSERT_TRUE(checked.ok()) << checked.status().ToString();
    EXPECT_EQ(*checked, 10) << "round " << round;
    EXPECT_TRUE(bad.empty()) << "round " << round << ": torn entry " << (bad.empty() ? "" : bad.front());
    for (int i = 0; i < 10; ++i) {
      auto e = must_lookup(c, "k" + std::to_string(i));
      EXPECT_TRUE(e.has_value()) << "k" << i << " lost in round " << round;
      if (e && e->payload != make_entry("k" + std::to_string(i), 4096, 0x11).payload) ++replaced;
    }
    EXPECT_TRUE(c.warning().empty()) << c.warning();
  }
  EXPECT_GT(replaced, 0) << "the writer never replaced an entry before being killed";
}

TEST_F(PlanCacheTest, ExportImportMergeRoundTrip) {
  const std::string a_path = (dir_ / "a.sqlite").string(), b_path = (dir_ / "b.sqlite").string();
  const std::string x_path = (dir_ / "export.sqlite").string();
  PlanCache a = PlanCache::open(a_path);
  PlanCache b = PlanCache::open(b_path);
  CacheEntry old_shared = make_entry("shared", 100, 1);
  old_shared.created_utc = "2026-01-01T00:00:00.000000Z";
  CacheEntry new_shared = make_entry("shared", 100, 2);
  new_shared.created_utc = "2026-06-01T00:00:00.000000Z";
  ASSERT_TRUE(a.store(make_entry("only-a", 100, 3)).ok());
  ASSERT_TRUE(a.store(old_shared).ok());
  ASSERT_TRUE(b.store(make_entry("only-b", 100, 4)).ok());
  ASSERT_TRUE(b.store(new_shared).ok());

  ASSERT_TRUE(a.export_to(x_path).ok());
  PlanCache x = PlanCache::open(x_path);
  ASSERT_TRUE(x.enabled()) << x.warning();
  auto xl = x.list(true);
  ASSERT_TRUE(xl.ok());
  EXPECT_EQ(xl->size(), 2u);
  auto xa = must_lookup(x, "only-a");
  ASSERT_TRUE(xa.has_value());
  EXPECT_EQ(xa->payload, make_entry("only-a", 100, 3).payload);
  EXPECT_EQ(xa->info.engine, "eng7_k2=3_k3=0");

  // Merge b into a: newer "shared" wins, both unique entries present.
  ASSERT_TRUE(a.import_from(b_path).ok()) << a.warning();
  EXPECT_EQ(raw_count(a_path), 3);
  auto s = must_lookup(a, "shared");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->payload, new_shared.payload);
  EXPECT_EQ(s->created_utc, new_shared.created_utc);
  EXPECT_TRUE(must_lookup(a, "only-b").has_value());

  // Merging the older one back into b does not overwrite b's newer entry.
  ASSERT_TRUE(b.import_from(x_path).ok());
  auto bs = must_lookup(b, "shared");
  ASSERT_TRUE(bs.has_value());
  EXPECT_EQ(bs->payload, new_shared.payload);
  EXPECT_TRUE(must_lookup(b, "only-a").has_value());

  // Import skips (and names) a corrupt entry of the source.
  raw_sql(x_path, "UPDATE entries SET payload = substr(payload, 1, 10) WHERE key = 'only-a'");
  PlanCache c = PlanCache::open((dir_ / "c.sqlite").string());
  ASSERT_TRUE(c.import_from(x_path).ok());
  EXPECT_FALSE(must_lookup(c, "only-a").has_value());
  EXPECT_TRUE(must_lookup(c, "shared").has_value());
  EXPECT_NE(c.warning().find("only-a"), std::string::npos) << c.warning();

  // Import of a missing or garbage file fails cleanly.
  EXPECT_FALSE(c.import_from((dir_ / "missing.sqlite").string()).ok());
  { std::ofstream(dir_ / "junk.sqlite") << "junk junk junk junk junk"; }
  EXPECT_FALSE(c.import_from((dir_ / "junk.sqlite").string()).ok());
  EXPECT_TRUE(c.enabled());
  EXPECT_FALSE(a.export_to(a_path).ok()) << "exporting onto itself";
}

TEST_F(PlanCacheTest, ImportRespectsSizeLimit) {
  const std::string big = (dir_ / "big.sqlite").string();
  {
    PlanCache b = PlanCache::open(big);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(b.store(make_entry("k" + std::to_string(i), 1000)).ok());
  }
  PlanCache small = PlanCache::open(path_, 5000);
  ASSERT_TRUE(small.import_from(big).ok());
  EXPECT_LE(small.total_bytes(), 5000);
  EXPECT_GT(raw_count(path_), 0);
  EXPECT_LT(raw_count(path_), 10);
  EXPECT_TRUE(must_lookup(small, "k9").has_value()) << "the most recently used survive";
  EXPECT_NE(small.warning().find("stopped after 5000 bytes"), std::string::npos) << small.warning();
}

TEST_F(PlanCacheTest, VerifyFindsCorruptedEntry) {
  PlanCache c = PlanCache::open(path_);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c.store(make_entry("k" + std::to_string(i))).ok());
  raw_sql(path_, "UPDATE entries SET payload = randomblob(256) WHERE key = 'k2'");
  std::vector<std::string> bad;
  auto n = c.verify(&bad);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 4);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0], "k2");
  EXPECT_EQ(raw_count(path_), 4) << "verify deletes nothing";
  auto l = c.list();
  ASSERT_TRUE(l.ok());
  int flagged = 0;
  for (const auto& e : *l) flagged += e.payload_bytes == -1;
  EXPECT_EQ(flagged, 1);
}

// A row with a good checksum whose payload the cuDNN frontend would crash on
// (Graph::deserialize reads "fe_workspace_size" without checking it exists):
// what an entry from a hostile or older cache looks like.
CacheEntry hostile_entry(const std::string& key) {
  CacheEntry e = make_entry(key);
  auto j = nlohmann::json::from_ubjson(e.payload);
  j.erase("fe_workspace_size");
  e.payload = nlohmann::json::to_ubjson(j);
  return e;
}

TEST_F(PlanCacheTest, PayloadTheFrontendWouldCrashOnIsAMissAndDeleted) {
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.store(hostile_entry("bad")).ok());
  ASSERT_TRUE(c.store(make_entry("good")).ok());
  EXPECT_FALSE(must_lookup(c, "bad").has_value());
  EXPECT_NE(c.warning().find("plan cache entry bad: plan payload field 'fe_workspace_size' is missing"),
            std::string::npos)
      << c.warning();
  EXPECT_NE(c.warning().find("deleted"), std::string::npos) << c.warning();
  EXPECT_EQ(raw_count(path_), 1);
  EXPECT_TRUE(must_lookup(c, "good").has_value()) << "one bad entry breaks nothing else";
  ASSERT_TRUE(c.store(make_entry("bad")).ok());
  EXPECT_TRUE(must_lookup(c, "bad").has_value()) << "and its key can be stored again";
}

TEST_F(PlanCacheTest, VerifyImportAndExportFlagEntriesThatWouldFailToLoad) {
  const std::string src = (dir_ / "src.sqlite").string();
  {
    PlanCache s = PlanCache::open(src);
    ASSERT_TRUE(s.store(hostile_entry("bad")).ok());
    ASSERT_TRUE(s.store(make_entry("good")).ok());
    std::vector<std::string> bad, why;
    auto n = s.verify(&bad, &why);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 2);
    EXPECT_EQ(bad, std::vector<std::string>{"bad"});
    ASSERT_EQ(why.size(), 1u);
    EXPECT_EQ(why[0], "plan cache entry bad: plan payload field 'fe_workspace_size' is missing");
  }
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.import_from(src).ok());
  EXPECT_EQ(raw_count(path_), 1);
  EXPECT_NE(c.warning().find("fe_workspace_size"), std::string::npos) << c.warning();
  EXPECT_NE(c.warning().find("not imported"), std::string::npos) << c.warning();
  PlanCache s = PlanCache::open(src);
  const std::string out = (dir_ / "out.sqlite").string();
  ASSERT_TRUE(s.export_to(out).ok());
  EXPECT_EQ(raw_count(out), 1);
  EXPECT_NE(s.warning().find("not exported"), std::string::npos) << s.warning();
}

TEST_F(PlanCacheTest, RemoveByPrefixAndClear) {
  PlanCache c = PlanCache::open(path_);
  ASSERT_TRUE(c.store(make_entry("abc1")).ok());
  ASSERT_TRUE(c.store(make_entry("abc2")).ok());
  ASSERT_TRUE(c.store(make_entry("abd1")).ok());
  ASSERT_TRUE(c.store(make_entry("a%c_")).ok());
  EXPECT_FALSE(c.remove("").ok());
  ASSERT_TRUE(c.remove("abc").ok());
  EXPECT_EQ(raw_count(path_), 2);
  ASSERT_TRUE(c.remove("a%").ok());  // no LIKE wildcards
  EXPECT_EQ(raw_count(path_), 1);
  EXPECT_TRUE(must_lookup(c, "abd1").has_value());
  ASSERT_TRUE(c.clear().ok());
  EXPECT_EQ(raw_count(path_), 0);
  EXPECT_EQ(c.total_bytes(), 0);
}

TEST(DefaultCachePath, FollowsEnvironment) {
  const char* saved_fc = std::getenv("FUSEBOX_CACHE");
  const char* saved_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string fc = saved_fc ? saved_fc : "", xdg = saved_xdg ? saved_xdg : "";
  setenv("FUSEBOX_CACHE", "/x/y.sqlite", 1);
  EXPECT_EQ(default_cache_path(), "/x/y.sqlite");
  unsetenv("FUSEBOX_CACHE");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(default_cache_path(), "/xdg/fusebox/plans.sqlite");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", getenv("HOME") ? getenv("HOME") : "/home/u", 1);
  EXPECT_EQ(default_cache_path(), std::string(getenv("HOME")) + "/.cache/fusebox/plans.sqlite");
  if (saved_fc) setenv("FUSEBOX_CACHE", fc.c_str(), 1);
  if (saved_xdg) setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
}

TEST(EntryCodec, ValidRoundTripAndEveryFieldChecked) {
  using namespace cache_internal;
  CacheEntry e = make_entry("key1", 64);
  e.created_utc = "2026-11-29T21:00:05.000000Z";
  const std::string meta = encode_entry_meta(e, e.payload.data(), e.payload.size());
  CacheEntry out;
  ASSERT_TRUE(validate_entry_bytes("key1", meta, e.payload.data(), e.payload.size(), &out).ok());
  EXPECT_EQ(out.info.engine, e.info.engine);
  EXPECT_EQ(out.created_utc, e.created_utc);
  EXPECT_FALSE(validate_entry_bytes("key2", meta, e.payload.data(), e.payload.size(), nullptr).ok());
  EXPECT_FALSE(validate_entry_bytes("key1", meta, e.payload.data(), e.payload.size() - 1, nullptr).ok());
  EXPECT_FALSE(validate_entry_bytes("key1", meta, nullptr, 0, nullptr).ok());
  EXPECT_FALSE(validate_entry_bytes("key1", "", e.payload.data(), e.payload.size(), nullptr).ok());
  // Each field removed or retyped is rejected, not thrown.
  for (const char* field : {"magic", "format", "key", "engine", "workspace_bytes", "sm_count", "deviceless",
                            "cudnn", "xxh3", "payload_bytes", "tuned_median_ms", "created_utc"}) {
    std::string needle = std::string("\"") + field + "\":";
    const size_t at = meta.find(needle);
    ASSERT_NE(at, std::string::npos) << field;
    std::string renamed = meta;
    renamed.replace(at + 1, 1, "_");
    EXPECT_FALSE(validate_entry_bytes("key1", renamed, e.payload.data(), e.payload.size(), nullptr).ok())
        << field;
    std::string retyped = meta;
    retyped.insert(at + needle.size(), "[");
    const size_t end = retyped.find_first_of(",}", at + needle.size() + 1);
    retyped.insert(end, "]");
    EXPECT_FALSE(validate_entry_bytes("key1", retyped, e.payload.data(), e.payload.size(), nullptr).ok())
        << field;
  }
}

}  // namespace
}  // namespace fusebox

// The plan_cache_entry_fuzzer's seeds and kept crashers (fuzz/README.md), as
// raw rows (its mode 0): validation gives a Status, never a crash.
TEST(PlanCacheFuzzRegression, SeedsAndCrashersAreAStatus) {
  using namespace fusebox;
  namespace fs = std::filesystem;
  int n = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(FUSEBOX_SOURCE_DIR) / "fuzz" / kind / "plan_cache_entry";
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!e.is_regular_file() || e.path().filename() == "README.md") continue;
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      const std::string rest = ss.str().empty() ? "" : ss.str().substr(1);
      const size_t a = rest.find('\n');
      const size_t b = a == std::string::npos ? a : rest.find('\n', a + 1);
      const std::string key = rest.substr(0, a);
      const std::string meta =
          a == std::string::npos ? "" : rest.substr(a + 1, b == std::string::npos ? b : b - a - 1);
      const std::string payload = b == std::string::npos ? "" : rest.substr(b + 1);
      CacheEntry out;
      const Status st = cache_internal::validate_entry_bytes(
          key, meta, reinterpret_cast<const uint8_t*>(payload.data()), payload.size(), &out);
      if (!st.ok()) EXPECT_EQ(st.code(), StatusCode::kParseError) << e.path() << ": " << st.ToString();
      ++n;
    }
  }
  EXPECT_GT(n, 0);
}
