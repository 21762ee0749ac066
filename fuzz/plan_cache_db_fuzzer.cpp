// libFuzzer target: cache database files from an attacker, through what
// `fusebox cache import` and a build's lookup do (PlanCache::open, import_from,
// lookup, verify). See fuzz/README.md.
//
// The first byte picks how the rest makes the database:
//   0: the rest is the database file itself (raw bytes);
//   1: the rest is SQL run on a copy of a valid cache (two entries) by a
//      connection with no hardening: schema mutations (triggers, views,
//      generated columns, extra tables and indexes, a replaced `entries`)
//      and content mutations (UPDATE, INSERT, DELETE of rows);
//   2: as 1, on a cache whose file keeps its -wal (a writer killed mid-write).
//
// Properties: nothing crashes or hangs (libFuzzer's -timeout) or grows past
// -rss_limit_mb; an import that succeeds brings only entries that verify;
// a lookup in the attacker's file, opened as a cache, adds at most 1 MiB to
// it and its -wal (no trigger runs); import errors are ParseError or IoError.
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "entry_codec.h"
#include "fusebox/plan_cache.h"

namespace {

using fusebox::CacheEntry;
using fusebox::PlanCache;
using fusebox::StatusCode;

void check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "plan_cache_db_fuzzer: property violated: %s\n", what);
    abort();
  }
}

// A scratch folder: /dev/shm when there is one (fsync is free there).
const std::string& scratch() {
  static const std::string dir = [] {
    std::string tmpl = access("/dev/shm", W_OK) == 0 ? "/dev/shm/plan_cache_db_fuzzer.XXXXXX"
                                                     : "/tmp/plan_cache_db_fuzzer.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) abort();
    return std::string(buf.data());
  }();
  return dir;
}

void remove_db(const std::string& p) {
  for (const char* s : {"", "-wal", "-shm", "-journal"}) unlink((p + s).c_str());
}

int64_t size_of(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

// A payload that passes the payload check (the keys the frontend reads), as
// the cache tests store: UBJSON of the frontend's serialization.
std::vector<uint8_t> payload(uint8_t fill) {
  nlohmann::json backend = {
      {"cudnnVersion", 91900},
      {"schemaVersion", 4},
      {"engine", {{"engineId", static_cast<int>(fill)}}},
      {"operationGraph", {{"tensors", nlohmann::json::array()}, {"nodes", nlohmann::json::array()}}}};
  nlohmann::json j = {{"json_version", "2.0"},
                      {"cudnn_backend_data", backend.dump()},
                      {"behavior_notes", nlohmann::json::array({nlohmann::json::array()})},
                      {"variant_pack_uids", nlohmann::json::array()},
                      {"variant_pack_replacements", nlohmann::json::array()},
                      {"fe_workspace_size", 0}};
  return nlohmann::json::to_ubjson(j);
}

CacheEntry entry(const std::string& key, uint8_t fill) {
  CacheEntry e;
  e.key = key;
  e.info.graph_fingerprint = "0123456789abcdef";
  e.info.engine = "eng0";
  e.info.device_name = "NVIDIA H200";
  e.info.sm_version = 90;
  e.info.sm_count = 132;
  e.info.cudnn_version = 91900;
  e.info.frontend_version = "1.17.0";
  e.info.fusebox_version = "0.1.0";
  e.payload = payload(fill);
  return e;
}

// The bytes of a valid cache with two entries, made once.
const std::string& template_bytes() {
  static const std::string bytes = [] {
    const std::string p = scratch() + "/template.sqlite";
    remove_db(p);
    {
      PlanCache c = PlanCache::open(p);
      (void)c.store(entry("aaaaaaaaaaaaaaaa", 1));
      (void)c.store(entry("bbbbbbbbbbbbbbbb", 2));
    }
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    remove_db(p);
    return ss.str();
  }();
  return bytes;
}

void write_file(const std::string& p, const void* data, size_t n) {
  FILE* f = fopen(p.c_str(), "wb");
  if (!f) abort();
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

// The attacker: a plain connection, bounded so that making the file stays cheap.
int progress_stop(void* steps) { return ++*static_cast<int*>(steps) > 2000; }

// The attacker may change this file only: no other database attached, no
// VACUUM INTO another file (the fuzzer may run as root).
int attacker_authorizer(void*, int action, const char*, const char*, const char*, const char*) {
  return action == SQLITE_ATTACH || action == SQLITE_DETACH ? SQLITE_DENY : SQLITE_OK;
}

bool mentions_other_files(std::string sql) {
  for (char& c : sql) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return sql.find("vacuum") != std::string::npos || sql.find("attach") != std::string::npos ||
         sql.find("load_extension") != std::string::npos || sql.find("max_page_count") != std::string::npos;
}

void attack(const std::string& p, const std::string& sql, bool leave_wal) {
  if (mentions_other_files(sql)) return;
  sqlite3* db = nullptr;
  if (sqlite3_open(p.c_str(), &db) != SQLITE_OK) {
    sqlite3_close(db);
    return;
  }
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, 1 << 20);
  sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  sqlite3_set_authorizer(db, attacker_authorizer, nullptr);
  // At most 16 MiB of file (zeroblob() is one VM step: the progress handler alone does not bound it).
  sqlite3_exec(db, "PRAGMA max_page_count = 4096", nullptr, nullptr, nullptr);
  int steps = 0;
  sqlite3_progress_handler(db, 1000, progress_stop, &steps);
  if (leave_wal) sqlite3_exec(db, "PRAGMA wal_autocheckpoint = 0", nullptr, nullptr, nullptr);
  sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  if (leave_wal) {
    // Keep the -wal: copy the three files aside as a killed writer leaves them.
    const std::string copy = p + ".killed";
    for (const char* s : {"", "-wal", "-shm"}) {
      std::ifstream in(p + s, std::ios::binary);
      std::ofstream out(copy + s, std::ios::binary);
      out << in.rdbuf();
    }
    sqlite3_close(db);
    remove_db(p);
    for (const char* s : {"", "-wal", "-shm"}) rename((copy + s).c_str(), (p + s).c_str());
    return;
  }
  sqlite3_close(db);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 3;
  const std::string src = scratch() + "/src.sqlite";
  const std::string dst = scratch() + "/dst.sqlite";
  remove_db(src);
  remove_db(dst);
  if (mode == 0) {
    write_file(src, data + 1, size - 1);
  } else {
    const std::string& t = template_bytes();
    write_file(src, t.data(), t.size());
    attack(src, std::string(reinterpret_cast<const char*>(data + 1), size - 1), mode == 2);
  }

  {
    PlanCache cache = PlanCache::open(dst, 1 << 20);
    check(cache.enabled(), "a fresh destination cache opens");
    const fusebox::Status st = cache.import_from(src);
    if (st.ok()) {
      std::vector<std::string> bad;
      auto checked = cache.verify(&bad);
      check(checked.ok() && bad.empty(), "an import brings only entries that verify");
      auto hit = cache.lookup("aaaaaaaaaaaaaaaa");
      check(hit.ok(), "a lookup is never an error");
    } else {
      check(st.code() == StatusCode::kParseError || st.code() == StatusCode::kIoError ||
                st.code() == StatusCode::kInvalidArgument,
            "an import error is ParseError, IoError or InvalidArgument");
    }
  }
  {
    // The attacker's file as a build's --cache: a lookup must not run its code.
    // A checkpoint may copy what the -wal holds into the file: that much growth is no code running.
    const int64_t before = size_of(src) + 2 * size_of(src + "-wal");
    PlanCache c = PlanCache::open(src, 1 << 20);
    auto hit = c.lookup("aaaaaaaaaaaaaaaa");
    check(hit.ok(), "a lookup is never an error");
    (void)c.lookup("bbbbbbbbbbbbbbbb");
    const int64_t after = size_of(src) + size_of(src + "-wal");
    check(after <= before + (int64_t{1} << 20), "a lookup grew the cache file by more than 1 MiB");
  }
  return 0;
}
