// fusebox_common: every file fusebox reads or writes goes through here.
//
// Reading: only regular files, with a size limit checked before reading and
// enforced while reading (a file that grows is caught); directories, FIFOs
// and devices (/dev/zero, a pipe behind /dev/stdin) are refused without
// blocking. Writing: a temporary file created exclusively next to the target
// (unique name, O_EXCL | O_NOFOLLOW), written, fsync'ed, then renamed over
// the target only if the target is absent or a regular file. A failed write
// removes the temporary file and leaves the old file as it was.
//
// `what` names the file in messages ("graph file", "plan file", ...).
// Errors are IoError (exit 2 in the CLI) and name the path and the limit.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/status.h"

namespace fusebox::common {

// Reads at most max_bytes bytes of a regular file (symbolic links to one are
// followed). Refuses anything else before reading a byte.
Result<std::string> read_file_bounded(const std::string& path, uint64_t max_bytes, std::string_view what);

// Ok if `path` names a regular file (following links). Does not block on a FIFO.
Status require_regular_file(const std::string& path, std::string_view what);

// Ok if `path` is absent or a regular file that is not a symbolic link: what
// write_file_atomic() and the plan cache accept as a target.
Status check_replaceable(const std::string& path, std::string_view what);

// Replaces (or creates) `path` with `bytes` atomically; see the file comment.
// An existing target keeps its permission bits.
Status write_file_atomic(const std::string& path, std::string_view bytes, std::string_view what);

// A temporary file next to `path`, renamed over it by commit(); removed by
// the destructor if not committed. For writers that need a path to write to
// (SQLite) rather than bytes: write through temp_path(), then commit().
class AtomicFile {
 public:
  static Result<AtomicFile> create(const std::string& path, std::string_view what);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  ~AtomicFile();

  const std::string& temp_path() const { return temp_; }
  Status write(std::string_view bytes);
  // fsync, close, re-check the target, rename over it, fsync the folder.
  Status commit();

 private:
  AtomicFile() = default;
  void discard();
  std::string path_, temp_, what_;
  int fd_ = -1;
  bool done_ = false;
};

// (st_dev, st_ino) of an existing file, following links; nullopt if absent.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId&) const = default;
};
std::optional<FileId> file_id(const std::string& path);

// An input of the command, for refuse_overwriting_input().
struct NamedPath {
  std::string what;  // "graph file", "--plan", ...
  std::string path;
};
// InvalidArgument if `output` exists and is the same file as one of `inputs`
// (compared by device and inode, so links and other spellings are caught).
Status refuse_overwriting_input(const std::string& output, std::string_view output_what,
                                const std::vector<NamedPath>& inputs);

// "64 MiB" for exact multiples, else "N bytes".
std::string format_limit(uint64_t bytes);

}  // namespace fusebox::common
