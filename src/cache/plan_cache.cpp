#include "fusebox/plan_cache.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>

#include "common/file_io.h"
#include "entry_codec.h"

namespace fusebox {
namespace {

using cache_internal::encode_entry_meta;
using cache_internal::validate_entry_bytes;

constexpr int32_t kApplicationId = 0x46424F58;  // "FBOX" in PRAGMA application_id

struct StmtFinalizer {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using Stmt = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

int prepare(sqlite3* db, const char* sql, Stmt* out) {
  sqlite3_stmt* s = nullptr;
  const int rc = sqlite3_prepare_v2(db, sql, -1, &s, nullptr);
  out->reset(s);
  return rc;
}

int exec(sqlite3* db, const char* sql) { return sqlite3_exec(db, sql, nullptr, nullptr, nullptr); }

std::string db_error(sqlite3* db, int rc) {
  std::string m = sqlite3_errstr(rc);
  if (db) {
    const char* detail = sqlite3_errmsg(db);
    if (detail && m != detail) m += std::string(" (") + detail + ")";
  }
  return m;
}

// Rolls back unless commit() succeeded: every write is one transaction.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  int begin() {
    const int rc = exec(db_, "BEGIN IMMEDIATE");
    open_ = rc == SQLITE_OK;
    return rc;
  }
  int commit() {
    const int rc = exec(db_, "COMMIT");
    if (rc == SQLITE_OK) open_ = false;
    return rc;
  }
  ~Transaction() {
    if (open_) exec(db_, "ROLLBACK");
  }

 private:
  sqlite3* db_;
  bool open_ = false;
};

int64_t now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

// Fixed width, so string order is time order: "2026-11-29T21:00:05.123456Z".
std::string format_utc(int64_t us) {
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(us % 1000000));
  return buf;
}

void append_field(std::string* out, std::string_view s) {
  const uint64_t n = s.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out->append(len, 8);
  out->append(s);
}

// A path for an SQLite "file:" URI: %-escape what URIs reserve.
std::string uri_path(const std::string& path) {
  std::string out;
  for (unsigned char ch : path) {
    if (ch == '%' || ch == '?' || ch == '#' || ch <= 0x20 || ch >= 0x7f) {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

// The cache path itself must be absent or a regular file: never a link (a
// link could point SQLite's writes anywhere), a FIFO (would block) or a device.
bool looks_like_sqlite_or_empty(const std::string& path, std::string* why) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return true;  // absent: created; otherwise sqlite3_open_v2 reports why
  if (S_ISLNK(st.st_mode)) {
    *why = "is a symbolic link (give the path of the file itself)";
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = "is not a regular file";
    return false;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return true;  // sqlite3_open_v2 reports why
  char head[16] = {};
  ssize_t got = 0;
  struct stat fst {};
  if (::fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode)) {
    got = ::read(fd, head, sizeof head);
  } else {
    got = -2;
  }
  ::close(fd);
  if (got == -2) {
    *why = "is not a regular file";
    return false;
  }
  if (got == 0) return true;  // empty: a fresh database
  if (got < 16 || std::memcmp(head, "SQLite format 3", 16) != 0) {
    *why = "is not an SQLite database";
    return false;
  }
  return true;
}

// One stored row, as read back.
struct Row {
  std::string key;
  std::string meta;
  const uint8_t* payload = nullptr;
  size_t payload_size = 0;
  std::string created_utc;
  int64_t last_used_us = 0;
};

constexpr const char* kSelectAll =
    "SELECT key, meta, payload, created_utc, last_used_us FROM entries ORDER BY last_used_us DESC, key";

Row read_row(sqlite3_stmt* s) {
  Row r;
  auto text = [&](int col) {
    const unsigned char* t = sqlite3_column_text(s, col);
    const int n = sqlite3_column_bytes(s, col);
    return t ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(n)) : std::string();
  };
  r.key = text(0);
  r.meta = text(1);
  r.payload = static_cast<const uint8_t*>(sqlite3_column_blob(s, 2));
  r.payload_size = r.payload ? static_cast<size_t>(sqlite3_column_bytes(s, 2)) : 0;
  r.created_utc = text(3);
  r.last_used_us = sqlite3_column_int64(s, 4);
  return r;
}

// Newest-created wins; last-used time travels with the entry.
constexpr const char* kUpsertIfNewer =
    "INSERT INTO entries(key, meta, payload, created_utc, stored_bytes, last_used_us) VALUES(?1, ?2, ?3, ?4, "
    "?5, ?6) "
    "ON CONFLICT(key) DO UPDATE SET meta = excluded.meta, payload = excluded.payload, "
    "created_utc = excluded.created_utc, stored_bytes = excluded.stored_bytes, last_used_us = "
    "excluded.last_used_us "
    "WHERE excluded.created_utc > entries.created_utc";

// Within one transaction: keep the most recently used entries whose running
// total fits in max_bytes, delete the rest.
constexpr const char* kEvict =
    "DELETE FROM entries WHERE key IN (SELECT key FROM (SELECT key, SUM(stored_bytes) OVER "
    "(ORDER BY last_used_us DESC, key ROWS UNBOUNDED PRECEDING) AS running FROM entries) WHERE running > ?1)";

// Later than any last-use so far, even within one microsecond or across clocks.
constexpr const char* kNextUse = "MAX(?1, (SELECT COALESCE(MAX(last_used_us), 0) + 1 FROM entries))";

bool is_write_refused(int rc) {
  const int p = rc & 0xff;
  return p == SQLITE_READONLY || p == SQLITE_CANTOPEN || p == SQLITE_PERM || p == SQLITE_AUTH;
}

// The schema fusebox writes, statement for statement as sqlite_master keeps it.
constexpr const char* kCreateEntries =
    "CREATE TABLE entries(key TEXT PRIMARY KEY NOT NULL, meta TEXT NOT NULL, payload BLOB NOT NULL, "
    "created_utc TEXT NOT NULL, stored_bytes INTEGER NOT NULL, last_used_us INTEGER NOT NULL)";
constexpr const char* kCreateLastUsedIndex = "CREATE INDEX entries_last_used ON entries(last_used_us)";

// The longest value a cache row holds (the payload; metadata is far smaller),
// plus room for the row around it: SQLite refuses to make a longer one.
constexpr int kMaxValueBytes = static_cast<int>(cache_internal::kMaxPayloadBytes + (int64_t{1} << 20));

// A cache file is data, never code: no schema-defined function runs with
// privileges, no value grows past the largest entry.
void harden(sqlite3* db) {
  int* const no_result = nullptr;
  sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, no_result);
  sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, no_result);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0, no_result);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_VIEW, 0, no_result);
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, kMaxValueBytes);
  sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  exec(db, "PRAGMA trusted_schema = OFF");
}

// SQLITE_OK when sqlite_master holds exactly fusebox's schema (or nothing: a
// fresh file); SQLITE_MISMATCH with *why naming every object found that is
// not fusebox's and what was expected; another code when it cannot be read.
int check_schema(sqlite3* db, std::string* why) {
  Stmt s;
  int rc = prepare(db, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid", &s);
  if (rc != SQLITE_OK) return rc;
  auto text = [&](int col) {
    const unsigned char* t = sqlite3_column_text(s.get(), col);
    return t ? std::string(reinterpret_cast<const char*>(t),
                           static_cast<size_t>(sqlite3_column_bytes(s.get(), col)))
             : std::string();
  };
  bool table = false, autoindex = false, index = false, any = false;
  std::vector<std::string> found;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    any = true;
    const std::string type = text(0), name = text(1), tbl = text(2), sql = text(3);
    const bool sql_null = sqlite3_column_type(s.get(), 3) == SQLITE_NULL;
    if (type == "table" && name == "entries" && sql == kCreateEntries && !table) {
      table = true;
    } else if (type == "index" && name == "sqlite_autoindex_entries_1" && tbl == "entries" && sql_null &&
               !autoindex) {
      autoindex = true;
    } else if (type == "index" && name == "entries_last_used" && tbl == "entries" &&
               sql == kCreateLastUsedIndex && !index) {
      index = true;
    } else if (type == "table" && name == "entries") {
      const std::string upper = [&] {
        std::string u = sql;
        for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return u;
      }();
      const bool generated = upper.find("GENERATED") != std::string::npos ||
                             upper.find(" AS (") != std::string::npos ||
                             upper.find(" AS(") != std::string::npos;
      found.push_back(std::string("table 'entries' declared differently") +
                      (generated ? " (with a generated column)" : "") + ": " + sql.substr(0, 300));
    } else {
      found.push_back(type + " '" + name.substr(0, 100) + "'" +
                      (tbl.empty() || tbl == name ? "" : " on '" + tbl.substr(0, 100) + "'"));
    }
    if (found.size() > 20) break;
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rc;
  if (!any) return SQLITE_OK;
  if (!table && found.empty()) found.push_back("no table 'entries'");
  if (table && (!autoindex || !index)) found.push_back("the table's indexes are missing");
  if (found.empty()) return SQLITE_OK;
  std::string list;
  for (const auto& f : found) list += (list.empty() ? "" : "; ") + f;
  *why = "is not a fusebox plan cache: its schema holds " + list +
         "; expected exactly the table and index fusebox writes (" + kCreateEntries + "; " +
         kCreateLastUsedIndex + ") and nothing else (no trigger, view, generated column or other object)";
  return SQLITE_MISMATCH;
}

}  // namespace

std::string cache_key_hash(const CacheKey& k) {
  std::string s = "fusebox-plan-cache-key";
  append_field(&s, std::to_string(kPlanCacheFormatVersion));
  append_field(&s, k.graph_canonical);
  append_field(&s, k.device_name);
  append_field(&s, std::to_string(k.sm_version));
  append_field(&s, std::to_string(k.sm_count));
  append_field(&s, std::to_string(k.cudnn_version));
  append_field(&s, k.frontend_version);
  append_field(&s, k.policy);
  return cache_internal::hex64(XXH3_64bits(s.data(), s.size()));
}

std::string default_cache_path() {
  if (const char* p = std::getenv("FUSEBOX_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/fusebox/plans.sqlite";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/fusebox/plans.sqlite";
  return ".fusebox-cache/plans.sqlite";
}

void PlanCache::DbCloser::operator()(sqlite3* db) const { sqlite3_close_v2(db); }

PlanCache::PlanCache(PlanCache&&) noexcept = default;
PlanCache& PlanCache::operator=(PlanCache&&) noexcept = default;
PlanCache::~PlanCache() = default;

void PlanCache::warn(std::string message) {
  if (!warning_.empty()) warning_ += '\n';
  warning_ += message;
  warnings_.push_back(std::move(message));
}

void PlanCache::disable(std::string message) {
  db_.reset();
  warn("plan cache " + path_ + ": " + message + "; running without a cache");
}

Status PlanCache::write_failed(const std::string& what, int rc) {
  const std::string err = db_error(db_.get(), rc);
  const int p = rc & 0xff;
  if (p == SQLITE_CORRUPT || p == SQLITE_NOTADB) {
    disable(what + ": " + err);
  } else {
    warn("plan cache " + path_ + ": " + what + " failed: " + err + " (continuing uncached)");
  }
  return IoError("plan cache " + path_ + ": " + what + ": " + err);
}

PlanCache PlanCache::open(const std::string& path, int64_t max_bytes) {
  PlanCacheOptions o;
  o.max_bytes = max_bytes;
  return open(path, o);
}

PlanCache PlanCache::open(const std::string& path, const PlanCacheOptions& options) {
  PlanCache c;
  c.path_ = path;
  c.max_bytes_ = options.max_bytes;
  c.read_only_ = options.read_only;
  if (path.empty()) {
    c.warn("plan cache: no path given; running without a cache");
    return c;
  }
  if (options.max_bytes <= 0) {
    c.warn("plan cache " + path + ": max_bytes must be positive; running without a cache");
    return c;
  }
  std::string why;
  if (!looks_like_sqlite_or_empty(path, &why)) {
    c.open_error_ = IoError("plan cache '" + path + "' " + why);
    c.warn("plan cache " + path + ": " + why + "; leaving it untouched and running without a cache");
    return c;
  }
  if (!c.read_only_) {
    std::error_code ec;
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);  // open reports a failure
  }

  auto connect = [&](bool read_only, bool immutable = false) -> int {
    sqlite3* raw = nullptr;
    int flags = (read_only ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)) |
                SQLITE_OPEN_NOFOLLOW;
    std::string name = path;
    if (immutable) {
      flags |= SQLITE_OPEN_URI;
      name = "file:" + uri_path(path) + "?immutable=1";
    }
    const int rc = sqlite3_open_v2(name.c_str(), &raw, flags, nullptr);
    c.db_.reset(raw);
    if (rc != SQLITE_OK) return rc;
    sqlite3_extended_result_codes(raw, 1);
    harden(raw);
    sqlite3_busy_timeout(raw, options.busy_timeout_ms);
    return SQLITE_OK;
  };
  // Reads the header pragmas: refuses foreign or newer databases.
  auto check_identity = [&](bool* has_table) -> int {
    Stmt s;
    int rc = prepare(c.db_.get(),
                     "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'entries'", &s);
    if (rc != SQLITE_OK) return rc;
    rc = sqlite3_step(s.get());
    if (rc != SQLITE_ROW) return rc;
    *has_table = sqlite3_column_int(s.get(), 0) > 0;
    Stmt t;
    rc = prepare(
        c.db_.get(),
        "SELECT (SELECT count(*) FROM sqlite_master), (SELECT application_id FROM pragma_application_id), "
        "(SELECT user_version FROM pragma_user_version)",
        &t);
    if (rc != SQLITE_OK) return rc;
    rc = sqlite3_step(t.get());
    if (rc != SQLITE_ROW) return rc;
    const int objects = sqlite3_column_int(t.get(), 0);
    const int32_t app = sqlite3_column_int(t.get(), 1);
    const int version = sqlite3_column_int(t.get(), 2);
    if (objects > 0 && app != kApplicationId) {
      why = "is an SQLite database but not a fusebox plan cache; leaving it untouched";
      return SQLITE_MISMATCH;
    }
    if (version > kPlanCacheFormatVersion) {
      why = "was written by a newer fusebox (cache format " + std::to_string(version) + ", this one reads " +
            std::to_string(kPlanCacheFormatVersion) + ")";
      return SQLITE_MISMATCH;
    }
    return check_schema(c.db_.get(), &why);
  };
  auto init_read_write = [&]() -> int {
    // WAL lets readers and one writer proceed at once; changing it may
    // briefly meet another opener's lock.
    // Refuse a foreign database before anything (even journal_mode) writes to it.
    bool has_table = false;
    int rc = check_identity(&has_table);
    if (rc != SQLITE_OK) return rc;
    rc = SQLITE_BUSY;
    for (int attempt = 0; attempt < 50 && (rc & 0xff) == SQLITE_BUSY; ++attempt) {
      rc = exec(c.db_.get(), "PRAGMA journal_mode = WAL");
      if ((rc & 0xff) == SQLITE_BUSY) sqlite3_sleep(20);
    }
    if (rc != SQLITE_OK) return rc;
    exec(c.db_.get(), "PRAGMA synchronous = NORMAL");
    Transaction tx(c.db_.get());
    if ((rc = tx.begin()) != SQLITE_OK) return rc;
    if ((rc = check_identity(&has_table)) != SQLITE_OK) return rc;
    if (!has_table) {
      const std::string ddl =
          "CREATE TABLE entries(key TEXT PRIMARY KEY NOT NULL, meta TEXT NOT NULL, payload BLOB NOT NULL, "
          "created_utc TEXT NOT NULL, stored_bytes INTEGER NOT NULL, last_used_us INTEGER NOT NULL);"
          "CREATE INDEX entries_last_used ON entries(last_used_us);"
          "PRAGMA application_id = " +
          std::to_string(kApplicationId) +
          ";"
          "PRAGMA user_version = " +
          std::to_string(kPlanCacheFormatVersion) + ";";
      if ((rc = exec(c.db_.get(), ddl.c_str())) != SQLITE_OK) return rc;
    }
    return tx.commit();
  };

  int rc = SQLITE_OK;
  if (!c.read_only_) {
    rc = connect(false);
    if (rc == SQLITE_OK) rc = init_read_write();
    std::error_code ec;
    if (rc != SQLITE_OK && is_write_refused(rc) && std::filesystem::exists(path, ec)) {
      c.warn("plan cache " + path + ": cannot write (" + db_error(c.db_.get(), rc) +
             "); using it read-only, new plans will not be stored");
      c.read_only_ = true;
    } else if (rc != SQLITE_OK) {
      const std::string reason = rc == SQLITE_MISMATCH ? why : "cannot open: " + db_error(c.db_.get(), rc);
      c.open_error_ = (rc == SQLITE_MISMATCH ? ParseError("plan cache '" + path + "' " + reason)
                                             : IoError("plan cache '" + path + "': " + reason));
      c.disable(reason);
      return c;
    }
  }
  if (c.read_only_) {
    rc = connect(true);
    bool has_table = false;
    if (rc == SQLITE_OK) rc = check_identity(&has_table);
    if (rc != SQLITE_OK && rc != SQLITE_MISMATCH && is_write_refused(rc)) {
      // A WAL database in a read-only folder without its -shm file can only
      // be read as immutable (SQLite >= 3.22 docs, "Read-Only Databases").
      rc = connect(true, /*immutable=*/true);
      if (rc == SQLITE_OK) rc = check_identity(&has_table);
      if (rc == SQLITE_OK) {
        c.warn("plan cache " + path +
               ": folder is read-only; reading it as immutable (a concurrent writer's changes are not seen)");
      }
    }
    if (rc != SQLITE_OK) {
      const std::string reason =
          rc == SQLITE_MISMATCH ? why : "cannot open read-only: " + db_error(c.db_.get(), rc);
      c.open_error_ = (rc == SQLITE_MISMATCH ? ParseError("plan cache '" + path + "' " + reason)
                                             : IoError("plan cache '" + path + "': " + reason));
      c.disable(reason);
      return c;
    }
    if (!has_table) {
      c.open_error_ =
          IoError("plan cache '" + path + "' holds no plan cache (expected a file fusebox wrote)");
      c.disable("holds no plan cache and is read-only");
      return c;
    }
  }
  return c;
}

Result<std::optional<CacheEntry>> PlanCache::lookup(const std::string& key) {
  if (!enabled()) return std::optional<CacheEntry>();
  sqlite3* db = db_.get();
  Stmt s;
  int rc =
      prepare(db, "SELECT key, meta, payload, created_utc, last_used_us FROM entries WHERE key = ?1", &s);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(s.get(), 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
    rc = sqlite3_step(s.get());
  }
  if (rc == SQLITE_DONE) return std::optional<CacheEntry>();
  if (rc != SQLITE_ROW) {
    const int p = rc & 0xff;
    if (p == SQLITE_CORRUPT || p == SQLITE_NOTADB) {
      disable("database is corrupt: " + db_error(db, rc));
    } else {
      warn("plan cache " + path_ + ": lookup of " + key + " failed (" + db_error(db, rc) +
           "); treated as a miss");
    }
    return std::optional<CacheEntry>();
  }
  const Row row = read_row(s.get());
  CacheEntry e;
  const Status valid = validate_entry_bytes(key, row.meta, row.payload, row.payload_size, &e);
  if (!valid.ok()) {
    s.reset();
    std::string msg = valid.message() + "; treated as a miss";
    if (!read_only_) {
      Stmt d;
      // Only the row we judged: another process may have replaced it meanwhile.
      if (prepare(db, "DELETE FROM entries WHERE key = ?1 AND CAST(meta AS BLOB) = ?2", &d) == SQLITE_OK) {
        sqlite3_bind_text(d.get(), 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
        sqlite3_bind_blob(d.get(), 2, row.meta.data(), static_cast<int>(row.meta.size()), SQLITE_TRANSIENT);
        msg += sqlite3_step(d.get()) == SQLITE_DONE ? " and deleted" : " (could not delete it)";
      }
    }
    warn(msg);
    return std::optional<CacheEntry>();
  }
  e.payload.assign(row.payload, row.payload + row.payload_size);
  e.last_used_utc = format_utc(row.last_used_us);
  s.reset();
  if (!read_only_) {
    // Best effort: a busy or full database only costs LRU accuracy.
    Stmt u;
    const std::string sql = std::string("UPDATE entries SET last_used_us = ") + kNextUse + " WHERE key = ?2";
    if (prepare(db, sql.c_str(), &u) == SQLITE_OK) {
      const int64_t t = now_us();
      sqlite3_bind_int64(u.get(), 1, t);
      sqlite3_bind_text(u.get(), 2, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
      if (sqlite3_step(u.get()) == SQLITE_DONE) e.last_used_utc = format_utc(t);
    }
  }
  return std::optional<CacheEntry>(std::move(e));
}

Status PlanCache::evict_locked() {
  Stmt s;
  int rc = prepare(db_.get(), kEvict, &s);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(s.get(), 1, max_bytes_);
    rc = sqlite3_step(s.get());
  }
  if (rc != SQLITE_DONE) return IoError(db_error(db_.get(), rc));
  return Status::Ok();
}

Status PlanCache::store(const CacheEntry& entry) {
  if (!enabled() || read_only_) return Status::Ok();
  if (entry.key.empty()) return InvalidArgument("plan cache store: empty key");
  if (entry.payload.empty() ||
      static_cast<int64_t>(entry.payload.size()) > cache_internal::kMaxPayloadBytes) {
    return InvalidArgument("plan cache store " + entry.key + ": payload of " +
                           std::to_string(entry.payload.size()) + " bytes (expected 1 byte to 256 MiB)");
  }
  if (!std::isfinite(entry.tuned_median_ms)) {
    return InvalidArgument("plan cache store " + entry.key +
                           ": tuned_median_ms must be finite (-1: not tuned)");
  }
  const int64_t t = now_us();
  CacheEntry e;  // metadata only; the payload is bound from `entry`
  e.key = entry.key;
  e.info = entry.info;
  e.tuned_median_ms = entry.tuned_median_ms;
  e.created_utc = entry.created_utc.empty() ? format_utc(t) : entry.created_utc;
  const std::string meta = encode_entry_meta(e, entry.payload.data(), entry.payload.size());
  const int64_t stored_bytes = static_cast<int64_t>(meta.size() + entry.payload.size());
  if (stored_bytes > max_bytes_) {
    warn("plan cache " + path_ + ": entry " + entry.key + " (" + std::to_string(stored_bytes) +
         " bytes) is larger than the cache limit " + std::to_string(max_bytes_) + "; not stored");
    return InvalidArgument("plan cache store " + entry.key + ": larger than max_bytes");
  }

  sqlite3* db = db_.get();
  Transaction tx(db);
  int rc = tx.begin();
  if (rc != SQLITE_OK) return write_failed("store " + entry.key, rc);
  Stmt s;
  const std::string sql =
      std::string(
          "INSERT OR REPLACE INTO entries(key, meta, payload, created_utc, stored_bytes, last_used_us) "
          "VALUES(?2, ?3, ?4, ?5, ?6, ") +
      kNextUse + ")";
  rc = prepare(db, sql.c_str(), &s);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(s.get(), 1, t);
    sqlite3_bind_text(s.get(), 2, e.key.data(), static_cast<int>(e.key.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(s.get(), 3, meta.data(), static_cast<int>(meta.size()), SQLITE_TRANSIENT);
    sqlite3_bind_blob(s.get(), 4, entry.payload.data(), static_cast<int>(entry.payload.size()),
                      SQLITE_STATIC);
    sqlite3_bind_text(s.get(), 5, e.created_utc.data(), static_cast<int>(e.created_utc.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_int64(s.get(), 6, stored_bytes);
    rc = sqlite3_step(s.get());
  }
  if (rc != SQLITE_DONE) return write_failed("store " + entry.key, rc);
  s.reset();
  if (Status ev = evict_locked(); !ev.ok()) return write_failed("evict", sqlite3_extended_errcode(db));
  rc = tx.commit();
  if (rc != SQLITE_OK) return write_failed("store " + entry.key, rc);
  return Status::Ok();
}

namespace {

// Streams every row of `src`; invalid rows go to on_bad. fn returns false to stop.
// With max_read_bytes >= 0, stops (setting *stopped) before the row that would
// take the bytes read (key, metadata and payload) past it.
Status for_each_row(sqlite3* src, const std::function<bool(const Row&, const CacheEntry*, const Status&)>& fn,
                    int64_t max_read_bytes = -1, bool* stopped = nullptr) {
  Stmt s;
  int rc = prepare(src, kSelectAll, &s);
  if (rc != SQLITE_OK) return IoError(db_error(src, rc));
  int64_t read_bytes = 0;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    if (max_read_bytes >= 0) {
      // Sizes from the record header: nothing is materialized yet.
      read_bytes += sqlite3_column_bytes(s.get(), 0) + sqlite3_column_bytes(s.get(), 1) +
                    sqlite3_column_bytes(s.get(), 2);
      if (read_bytes > max_read_bytes) {
        if (stopped) *stopped = true;
        return Status::Ok();
      }
    }
    const Row row = read_row(s.get());
    CacheEntry e;
    const Status v = validate_entry_bytes(row.key, row.meta, row.payload, row.payload_size, &e);
    if (!fn(row, v.ok() ? &e : nullptr, v)) return Status::Ok();
  }
  if (rc != SQLITE_DONE) return IoError(db_error(src, rc));
  return Status::Ok();
}

}  // namespace

Result<std::vector<CacheEntry>> PlanCache::list(bool with_payload) {
  if (!enabled()) return IoError("plan cache " + path_ + " is disabled: " + warning_);
  std::vector<CacheEntry> out;
  Status st = for_each_row(db_.get(), [&](const Row& row, const CacheEntry* e, const Status&) {
    CacheEntry x;
    if (e) {
      x = *e;
      if (with_payload) x.payload.assign(row.payload, row.payload + row.payload_size);
    } else {
      x.key = row.key;
      x.created_utc = row.created_utc;
      x.payload_bytes = -1;
    }
    x.last_used_utc = format_utc(row.last_used_us);
    out.push_back(std::move(x));
    return true;
  });
  if (!st.ok()) return st.WithContext("plan cache " + path_ + ": list");
  return out;
}

Status PlanCache::remove(const std::string& key_prefix, int64_t* removed) {
  if (removed) *removed = 0;
  if (key_prefix.empty())
    return InvalidArgument("plan cache remove: empty key prefix (use clear() to remove all)");
  if (!enabled()) return IoError("plan cache " + path_ + " is disabled: " + warning_);
  if (read_only_) return IoError("plan cache " + path_ + " is read-only");
  Stmt s;
  int rc = prepare(db_.get(), "DELETE FROM entries WHERE substr(key, 1, ?1) = ?2", &s);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int(s.get(), 1, static_cast<int>(key_prefix.size()));
    sqlite3_bind_text(s.get(), 2, key_prefix.data(), static_cast<int>(key_prefix.size()), SQLITE_TRANSIENT);
    rc = sqlite3_step(s.get());
  }
  if (rc != SQLITE_DONE) return write_failed("remove " + key_prefix, rc);
  if (removed) *removed = sqlite3_changes64(db_.get());
  return Status::Ok();
}

Status PlanCache::clear(int64_t* removed) {
  if (removed) *removed = 0;
  if (!enabled()) return IoError("plan cache " + path_ + " is disabled: " + warning_);
  if (read_only_) return IoError("plan cache " + path_ + " is read-only");
  const int rc = exec(db_.get(), "DELETE FROM entries");
  if (rc != SQLITE_OK) return write_failed("clear", rc);
  if (removed) *removed = sqlite3_changes64(db_.get());
  return Status::Ok();
}

Result<int> PlanCache::verify(std::vector<std::string>* bad, std::vector<std::string>* why) {
  if (!enabled()) return IoError("plan cache " + path_ + " is disabled: " + warning_);
  {
    Stmt s;
    int rc = prepare(db_.get(), "PRAGMA quick_check", &s);
    std::string problems;
    if (rc == SQLITE_OK) {
      while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
        const char* t = reinterpret_cast<const char*>(sqlite3_column_text(s.get(), 0));
        if (t && std::strcmp(t, "ok") != 0) problems += std::string(problems.empty() ? "" : "; ") + t;
      }
    }
    if (rc != SQLITE_DONE) problems += db_error(db_.get(), rc);
    if (!problems.empty()) return ParseError("plan cache " + path_ + ": database is damaged: " + problems);
  }
  int checked = 0;
  Status st = for_each_row(db_.get(), [&](const Row& row, const CacheEntry* e, const Status& v) {
    ++checked;
    if (!e && bad) bad->push_back(row.key);
    if (!e && why) why->push_back(v.message());
    return true;
  });
  if (!st.ok()) return st.WithContext("plan cache " + path_ + ": verify");
  return checked;
}

namespace {

// Copies src's valid rows into dst in one transaction (newer created wins).
// Returns the keys of rows skipped as corrupt in *skipped. Reads at most
// max_read_bytes (< 0: no bound; *stopped says whether it stopped early).
Status merge_rows(sqlite3* src, sqlite3* dst, std::vector<std::string>* skipped, std::string* error,
                  int64_t max_read_bytes = -1, bool* stopped = nullptr) {
  Transaction tx(dst);
  int rc = tx.begin();
  if (rc != SQLITE_OK) {
    *error = db_error(dst, rc);
    return IoError(*error);
  }
  Stmt ins;
  rc = prepare(dst, kUpsertIfNewer, &ins);
  if (rc != SQLITE_OK) {
    *error = db_error(dst, rc);
    return IoError(*error);
  }
  Status st = for_each_row(
      src,
      [&](const Row& row, const CacheEntry* e, const Status& v) {
        if (!e) {
          skipped->push_back(v.message());
          return true;
        }
        sqlite3_reset(ins.get());
        sqlite3_bind_text(ins.get(), 1, row.key.data(), static_cast<int>(row.key.size()), SQLITE_TRANSIENT);
        sqlite3_bind_text(ins.get(), 2, row.meta.data(), static_cast<int>(row.meta.size()), SQLITE_TRANSIENT);
        sqlite3_bind_blob(ins.get(), 3, row.payload, static_cast<int>(row.payload_size), SQLITE_TRANSIENT);
        // The checksummed metadata is the authority on when it was made.
        sqlite3_bind_text(ins.get(), 4, e->created_utc.data(), static_cast<int>(e->created_utc.size()),
                          SQLITE_TRANSIENT);
        sqlite3_bind_int64(ins.get(), 5, static_cast<int64_t>(row.meta.size() + row.payload_size));
        sqlite3_bind_int64(ins.get(), 6, row.last_used_us);
        rc = sqlite3_step(ins.get());
        return rc == SQLITE_DONE;
      },
      max_read_bytes, stopped);
  if (!st.ok()) return st;
  if (rc != SQLITE_DONE && rc != SQLITE_OK) {
    *error = db_error(dst, rc);
    return IoError(*error);
  }
  ins.reset();
  rc = tx.commit();
  if (rc != SQLITE_OK) {
    *error = db_error(dst, rc);
    return IoError(*error);
  }
  return Status::Ok();
}

// A connection to an existing export target, held with an exclusive lock
// from the check until the new file has replaced it.
struct TargetLock {
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> db{nullptr, sqlite3_close_v2};
};

int exec_all(sqlite3* db, const char* sql) {
  Stmt s;
  int rc = prepare(db, sql, &s);
  if (rc != SQLITE_OK) return rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
  }
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

bool is_busy(int rc) { return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED; }

}  // namespace

Status PlanCache::export_to(const std::string& path) {
  if (!enabled()) return IoError("plan cache " + path_ + " is disabled: " + warning_);
  const std::string where = "plan cache export to '" + path + "'";
  // The shared output-vs-input check: this cache's file and its side files.
  if (!common::check_outputs_spare_inputs({{"cache export file", path}},
                                          {{"plan cache", path_, /*database=*/true}})
           .ok()) {
    return InvalidArgument(where +
                           ": is this cache's own file or one of its side files (-wal, -shm, -journal); "
                           "export to another file");
  }
  // Built in a temporary file next to `path`, renamed over it at the end: a
  // failed export leaves no partial file and an old one intact.
  auto tmp = common::AtomicFile::create(path, "cache export file");
  if (!tmp.ok()) return tmp.status();
  const std::string temp = tmp->temp_path();
  struct SideFiles {  // the temporary database's own -wal/-shm, on every way out
    std::string path;
    ~SideFiles() { common::remove_sqlite_side_files(path); }
  } temp_sides{temp};

  // An existing target: a fusebox cache that nobody else has open, locked
  // until it is replaced. Opening it recovers what a killed writer left in
  // its -wal; leaving WAL mode checkpoints that into the file and needs every
  // other connection closed (SQLITE_BUSY otherwise).
  TargetLock target;
  struct stat tst {};
  if (::stat(path.c_str(), &tst) == 0 && tst.st_size > 0) {
    std::string why;
    if (!looks_like_sqlite_or_empty(path, &why))
      return IoError(where + ": the file there " + why + "; not replaced");
    sqlite3* raw = nullptr;
    int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOFOLLOW, nullptr);
    target.db.reset(raw);
    if (rc != SQLITE_OK) return IoError(where + ": cannot open the file there: " + db_error(raw, rc));
    sqlite3_extended_result_codes(raw, 1);
    harden(raw);
    sqlite3_busy_timeout(raw, 0);  // busy means open elsewhere: refuse, do not wait
    rc = check_schema(raw, &why);
    if (rc == SQLITE_MISMATCH) return ParseError(where + ": the file there " + why + "; not replaced");
    if (rc == SQLITE_OK) {
      Stmt t;
      rc = prepare(
          raw,
          "SELECT (SELECT count(*) FROM sqlite_master), (SELECT application_id FROM pragma_application_id)",
          &t);
      if (rc == SQLITE_OK && (rc = sqlite3_step(t.get())) == SQLITE_ROW) {
        if (sqlite3_column_int(t.get(), 0) > 0 && sqlite3_column_int(t.get(), 1) != kApplicationId)
          return ParseError(
              where + ": the file there is an SQLite database but not a fusebox plan cache; not replaced");
        rc = SQLITE_OK;
      }
    }
    if (rc == SQLITE_OK) rc = exec_all(raw, "PRAGMA journal_mode = DELETE");
    if (rc == SQLITE_OK) rc = exec(raw, "BEGIN EXCLUSIVE");
    if (rc == SQLITE_OK) rc = exec_all(raw, "SELECT count(*) FROM entries");  // takes the lock now
    if (is_busy(rc)) {
      return InvalidArgument(where +
                             ": the file there is open in another connection or process (a Session, a "
                             "running fusebox): close it and export again; nothing was written");
    }
    if (rc != SQLITE_OK) return IoError(where + ": cannot read the file there: " + db_error(raw, rc));
  }

  PlanCacheOptions o;
  o.max_bytes = std::numeric_limits<int64_t>::max();
  std::vector<std::string> skipped;
  std::string error;
  {
    PlanCache dst = PlanCache::open(temp, o);
    if (!dst.enabled() || dst.read_only()) return IoError(where + ": " + dst.warning());
    if (target.db) {
      // An existing cache there is merged into (newer wins).
      std::vector<std::string> dropped;
      Status st_old = merge_rows(target.db.get(), dst.db_.get(), &dropped, &error);
      for (const auto& d : dropped) warn(d + "; dropped from " + path);
      if (!st_old.ok()) return IoError(where + ": " + st_old.message());
    }
    Status st_new = merge_rows(db_.get(), dst.db_.get(), &skipped, &error);
    for (const auto& s : skipped) warn(s + "; not exported");
    if (!st_new.ok()) return IoError(where + ": " + st_new.message());
    // One self-contained file: everything in it, no -wal or -shm beside it.
    int rc = exec_all(dst.db_.get(), "PRAGMA wal_checkpoint(TRUNCATE)");
    if (rc == SQLITE_OK) rc = exec_all(dst.db_.get(), "PRAGMA journal_mode = DELETE");
    if (rc != SQLITE_OK)
      return IoError(where + ": cannot checkpoint the new file: " + db_error(dst.db_.get(), rc));
  }
  // The old file's side files belong to it, not to the new one: a stale -wal
  // would be replayed onto the new file. Removed while the lock is held.
  common::remove_sqlite_side_files(path);
  Status committed = tmp->commit();
  target.db.reset();  // releases the old file's lock (its inode is gone from `path`)
  return committed;
}

Status PlanCache::import_from(const std::string& path) {
  if (!enabled()) return IoError("plan cache " + path_ + " is disabled: " + warning_);
  if (read_only_) return IoError("plan cache " + path_ + " is read-only");
  if (Status st = common::check_outputs_spare_inputs({{"plan cache", path_, /*database=*/true}},
                                                     {{"import file", path}});
      !st.ok())
    return InvalidArgument("plan cache import: '" + path + "' is this cache's own file");
  // Not a FIFO or device: SQLite would block on one or read it forever.
  if (Status st = common::require_regular_file(path, "plan cache import file"); !st.ok()) return st;
  PlanCacheOptions o;
  o.read_only = true;
  PlanCache src = PlanCache::open(path, o);
  if (!src.enabled()) {
    if (!src.open_error_.ok()) return src.open_error_.WithContext("plan cache import");
    return IoError("plan cache import from " + path + ": " + src.warning());
  }
  std::vector<std::string> skipped;
  std::string error;
  bool stopped = false;
  // Rows are read most recently used first; past this cache's size they would be evicted anyway.
  Status st = merge_rows(src.db_.get(), db_.get(), &skipped, &error, max_bytes_, &stopped);
  for (const auto& s : skipped) warn(s + "; not imported");
  if (stopped) {
    warn("plan cache import from " + path + ": stopped after " + std::to_string(max_bytes_) +
         " bytes of entries (this cache's max_bytes); its older entries were not read");
  }
  if (!st.ok()) {
    const int rc = sqlite3_extended_errcode(db_.get());
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW)
      return write_failed("import from " + path, rc);
    return IoError("plan cache import from " + path + ": " + st.message());
  }
  Transaction tx(db_.get());
  int rc = tx.begin();
  if (rc == SQLITE_OK) rc = evict_locked().ok() ? tx.commit() : sqlite3_extended_errcode(db_.get());
  if (rc != SQLITE_OK) return write_failed("evict after import", rc);
  return Status::Ok();
}

int64_t PlanCache::total_bytes() {
  if (!enabled()) return 0;
  Stmt s;
  if (prepare(db_.get(), "SELECT COALESCE(SUM(stored_bytes), 0) FROM entries", &s) != SQLITE_OK) return 0;
  if (sqlite3_step(s.get()) != SQLITE_ROW) return 0;
  return sqlite3_column_int64(s.get(), 0);
}

}  // namespace fusebox
