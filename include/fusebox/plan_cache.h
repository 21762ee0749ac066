// fusebox: the persistent plan cache.
//
// One SQLite file (WAL mode, busy timeout) holds serialized execution plans
// keyed by cache_key_hash(): a stable XXH3-64 of the canonical graph, the
// target device, the cuDNN and frontend versions, the tuning policy and the
// cache format. Several processes may use one file at once.
//
// Never worse than no cache:
//   * every entry's magic, format, key, length and XXH3 checksum are checked
//     before lookup() returns it; a corrupt entry is a miss, is deleted, and
//     leaves one warning naming its key;
//   * a file that cannot be opened or written (read-only, not SQLite, not a
//     fusebox cache, newer format, a symbolic link or anything but a regular
//     file) gives a disabled cache: lookups miss,
//     stores do nothing, warning() says why. The file is never overwritten.
// Warnings are collected in the object; the library prints nothing.
//
// Thread safety: one PlanCache per thread (or external locking). Do not
// carry an open PlanCache across fork(); open one in each process.
//
// Schema (format 1), for tools and tests:
//   entries(key TEXT PRIMARY KEY, meta TEXT, payload BLOB, created_utc TEXT,
//           stored_bytes INTEGER, last_used_us INTEGER)
// stored_bytes = payload + meta bytes (what max_bytes bounds).
// `meta` is a JSON object: magic, format, key, provenance (PlanFileInfo
// fields), tuned_median_ms, created_utc, payload_bytes and the payload's xxh3.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/plan_info.h"
#include "fusebox/status.h"

struct sqlite3;

namespace fusebox {

// Bumped whenever the stored layout or the key serialization changes: old
// entries then simply stop matching.
inline constexpr int kPlanCacheFormatVersion = 1;

struct CacheKey {
  std::string graph_canonical;  // canonical_form(resolved graph), versioned
  std::string device_name;
  int sm_version = 0;
  int sm_count = 0;
  int64_t cudnn_version = 0;  // the runtime's version
  std::string frontend_version;
  std::string policy;  // tuning policy, e.g. "heuristic:a" or "tune:median,budget=..."
};

// 16 hex digits: XXH3-64 of a length-prefixed serialization of every field
// plus kPlanCacheFormatVersion. Stable across runs, processes and machines.
std::string cache_key_hash(const CacheKey& key);

struct CacheEntry {
  std::string key;               // cache_key_hash(...)
  PlanFileInfo info;             // provenance: engine, workspace, device, versions
  double tuned_median_ms = -1;   // -1: heuristic choice, not tuned
  std::string created_utc;       // "2026-11-29T21:00:05.123456Z"; store(): empty = now
  std::string last_used_utc;     // set by the cache (ignored by store())
  int64_t payload_bytes = 0;     // set by the cache from payload.size()
  std::vector<uint8_t> payload;  // the frontend's serialized plan
};

struct PlanCacheOptions {
  int64_t max_bytes = int64_t{1} << 30;  // payload + metadata bytes kept; LRU eviction beyond
  bool read_only = false;                // open read-only: lookups work, nothing is written
  int busy_timeout_ms = 30000;           // how long to wait for another process's write
};

class PlanCache {
 public:
  // Never fails: on any problem the returned cache is disabled and warning()
  // says why. Creates the parent folders and the file if missing. A file
  // that exists but cannot be opened read-write is retried read-only.
  // A cache file is data, never code: before anything reads it, its schema
  // (sqlite_master) must be exactly the one fusebox writes (no trigger, view,
  // generated column or other object), and it is read with trusted_schema
  // off and a bound on the length of any one value.
  static PlanCache open(const std::string& path, int64_t max_bytes = int64_t{1} << 30);
  static PlanCache open(const std::string& path, const PlanCacheOptions& options);

  PlanCache(PlanCache&&) noexcept;
  PlanCache& operator=(PlanCache&&) noexcept;
  ~PlanCache();

  bool enabled() const { return db_ != nullptr; }
  bool read_only() const { return read_only_; }
  const std::string& path() const { return path_; }
  // All warnings so far, one per line ("" if none); warnings() lists them.
  const std::string& warning() const { return warning_; }
  const std::vector<std::string>& warnings() const { return warnings_; }

  // A hit, or nullopt for a miss, a corrupt entry (deleted, with a warning)
  // or a disabled cache. A hit updates the entry's last-used time.
  // Never an error today: a database failure (busy past the timeout, I/O)
  // is a miss with a warning; callers may treat an error as a miss.
  Result<std::optional<CacheEntry>> lookup(const std::string& key);

  // Inserts or replaces entry.key in one transaction, then evicts the least
  // recently used entries until the total is within max_bytes. Ok and a
  // no-op on a disabled or read-only cache. A failed write (disk full, I/O
  // error) returns IoError and adds a warning: callers building plans should
  // treat a failed store as a warning, not a failure.
  Status store(const CacheEntry& entry);

  // Every entry, most recently used first; payloads only if asked. Entries
  // that fail validation are listed with an empty engine and payload_bytes -1
  // (verify() names them).
  Result<std::vector<CacheEntry>> list(bool with_payload = false);
  // Deletes the entries whose key starts with key_prefix (non-empty);
  // *removed (if given) receives how many were deleted.
  Status remove(const std::string& key_prefix, int64_t* removed = nullptr);
  Status clear(int64_t* removed = nullptr);
  // Checks the database and every entry; appends the keys of bad entries to
  // *bad (may be null). Returns how many entries were checked. Deletes nothing.
  // `why`, if given, gets each bad entry's reason (the check that failed), in step with `bad`.
  Result<int> verify(std::vector<std::string>* bad, std::vector<std::string>* why = nullptr);

  // Copies every valid entry into the cache file at `path` (created if
  // missing; an existing fusebox cache there is merged into, newer wins).
  // Written to a temporary file next to `path` (checkpointed, no -wal or
  // -shm of its own), then renamed over it, removing the stale side files of
  // the old one: a failure leaves `path` as it was. `path` must be absent or
  // a regular file (not a symbolic link), not this cache's own file (or one
  // of its side files), and not open in another connection or process (then
  // InvalidArgument: nothing is written).
  Status export_to(const std::string& path);
  // Merges every valid entry of the cache file at `path` into this one: an
  // entry replaces ours only if it was created later. Evicts afterwards.
  // Reads at most max_bytes of entries (most recently used first; the rest
  // would be evicted anyway) and warns when it stops early. A file that is not
  // a fusebox cache (schema, identity) is a ParseError saying what was expected.
  Status import_from(const std::string& path);

  int64_t total_bytes();  // payload + metadata bytes held; 0 when disabled

 private:
  friend struct PlanCacheTestPeer;  // tests: simulate a full disk
  PlanCache() = default;
  void warn(std::string message);
  void disable(std::string message);
  Status write_failed(const std::string& what, int rc);
  Status evict_locked();

  struct DbCloser {
    void operator()(sqlite3* db) const;
  };
  std::unique_ptr<sqlite3, DbCloser> db_;
  std::string path_;
  int64_t max_bytes_ = 0;
  bool read_only_ = false;
  std::string warning_;
  std::vector<std::string> warnings_;
  Status open_error_;  // why open() disabled the cache, when it was the file's fault
};

// $FUSEBOX_CACHE, else $XDG_CACHE_HOME/fusebox/plans.sqlite,
// else $HOME/.cache/fusebox/plans.sqlite.
std::string default_cache_path();

}  // namespace fusebox
