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

// An input or output path of one call, for check_outputs_spare_inputs().
struct NamedPath {
  std::string what;  // "graph file", "--plan", ...
  std::string path;  // empty: not given (skipped)
  // An SQLite database: its side files (PATH-wal, PATH-shm, PATH-journal) count as inputs too.
  bool database = false;
};
// The one check every command and API that writes files makes before writing
// (issue #32): InvalidArgument naming both paths when an output is one of the
// inputs, or two outputs are one file. Paths are compared by name (absolute,
// links and "." / ".." resolved, so a file not written yet is caught too) and,
// where they exist, by identity (st_dev, st_ino: hard links too).
Status check_outputs_spare_inputs(const std::vector<NamedPath>& outputs,
                                  const std::vector<NamedPath>& inputs);
// check_outputs_spare_inputs() for one output.
Status refuse_overwriting_input(const std::string& output, std::string_view output_what,
                                const std::vector<NamedPath>& inputs);

// Ignores SIGXFSZ when it has its default action (a handler the program installed stays):
// a write past the file-size limit (ulimit -f) then fails with EFBIG, which is
// reported with the path and cleaned up, instead of killing the process.
void ignore_file_size_signal();

// Removes PATH-wal, PATH-shm and PATH-journal (SQLite's side files) if present.
void remove_sqlite_side_files(const std::string& path);

// "out of host memory while <doing>" as an IoError: what a std::bad_alloc at a
// file-reading boundary becomes (exit 2 in the CLI, as other resource limits).
Status out_of_host_memory(std::string_view doing);

// "64 MiB" for exact multiples, else "N bytes".
std::string format_limit(uint64_t bytes);

}  // namespace fusebox::common
