// fusebox_common: bounded reads and atomic writes (see common/file_io.h).
#include "common/file_io.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>

namespace fusebox::common {
namespace {

std::string quoted(std::string_view what, const std::string& path) {
  return std::string(what) + " '" + path + "'";
}

std::string errno_text(int err) { return std::strerror(err); }

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

Status not_regular(std::string_view what, const std::string& path, mode_t m) {
  return IoError(quoted(what, path) + ": is " + kind_of(m) + ", not a regular file");
}

Status has_nul(std::string_view what, const std::string& path) {
  return IoError(quoted(what, path) + ": the path contains a NUL byte");
}

uint64_t random_u64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof v)) return v;
  // No entropy yet: O_EXCL still guarantees exclusivity, the name is only less surprising.
  static std::atomic<uint64_t> counter{0};
  v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (static_cast<uint64_t>(getpid()) << 32) ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull);
  return v;
}

// The folder holding `path` ("." or "/" when it has none) and its last component.
struct SplitPath {
  std::string dir, base;
};
SplitPath split_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {std::string(1, '.'), path};
  return {slash == 0 ? std::string(1, '/') : path.substr(0, slash), path.substr(slash + 1)};
}

}  // namespace

std::string format_limit(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30) && bytes % (uint64_t{1} << 30) == 0)
    return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (uint64_t{1} << 10) && bytes % (uint64_t{1} << 10) == 0)
    return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " bytes";
}

Status require_regular_file(const std::string& path, std::string_view what) {
  if (path.find('\0') != std::string::npos) return has_nul(what, path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return IoError(quoted(what, path) + ": cannot open: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return not_regular(what, path, st.st_mode);
  return Status::Ok();
}

Result<std::string> read_file_bounded(const std::string& path, uint64_t max_bytes, std::string_view what) {
  // stat first: opening a FIFO would block and opening a device may act.
  FUSEBOX_RETURN_IF_ERROR(require_regular_file(path, what));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return IoError(quoted(what, path) + ": cannot open: " + errno_text(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoError(quoted(what, path) + ": cannot stat: " + errno_text(errno));
  // Swapped for something else since the stat above.
  if (!S_ISREG(st.st_mode)) return not_regular(what, path, st.st_mode);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return IoError(quoted(what, path) + ": is " + std::to_string(size) + " bytes; " + std::string(what) +
                   "s are limited to " + format_limit(max_bytes));
  }
  std::string out;
  try {
    out.reserve(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    return out_of_host_memory("reading " + quoted(what, path) + " (" + std::to_string(size) + " bytes)");
  }
  // Read one byte past the limit so that a file growing meanwhile is caught.
  const uint64_t cap = max_bytes == UINT64_MAX ? max_bytes : max_bytes + 1;
  char buf[1 << 16];
  while (out.size() < cap) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(sizeof buf, cap - out.size()));
    const ssize_t n = ::read(fd, buf, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError(quoted(what, path) + ": read failed: " + errno_text(errno));
    }
    if (n == 0) break;
    try {
      out.append(buf, static_cast<size_t>(n));
    } catch (const std::bad_alloc&) {
      return out_of_host_memory("reading " + quoted(what, path));
    }
  }
  if (out.size() > max_bytes) {
    return IoError(quoted(what, path) + ": grew past " + format_limit(max_bytes) + " while being read; " +
                   std::string(what) + "s are limited to " + format_limit(max_bytes));
  }
  return out;
}

Status check_replaceable(const std::string& path, std::string_view what) {
  if (path.empty()) return IoError(std::string(what) + ": empty path");
  if (path.find('\0') != std::string::npos) return has_nul(what, path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return IoError(quoted(what, path) + ": cannot stat: " + errno_text(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    return IoError(quoted(what, path) +
                   ": is a symbolic link; refusing to replace it (name the file itself)");
  }
  if (!S_ISREG(st.st_mode)) {
    return IoError(quoted(what, path) + ": is " + kind_of(st.st_mode) + "; only a regular file is replaced");
  }
  return Status::Ok();
}

Result<AtomicFile> AtomicFile::create(const std::string& path, std::string_view what) {
  ignore_file_size_signal();  // a write past `ulimit -f` fails with EFBIG instead of killing us
  FUSEBOX_RETURN_IF_ERROR(check_replaceable(path, what));
  auto [dir, base] = split_path(path);
  if (base.empty() || base == "." || base == "..") {
    return IoError(quoted(what, path) + ": names a folder, not a file");
  }
  if (base.size() > 200) base.resize(200);  // room for the suffix within NAME_MAX
  AtomicFile f;
  f.path_ = path;
  f.what_ = std::string(what);
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(random_u64()));
    std::string temp = (dir == "/" ? "" : dir) + "/." + base + ".tmp-" + suffix;
    const int fd =
        ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0666);
    if (fd >= 0) {
      f.fd_ = fd;
      f.temp_ = std::move(temp);
      break;
    }
    if (errno != EEXIST) {
      return IoError(quoted(what, path) + ": cannot create a temporary file in '" + dir +
                     "': " + errno_text(errno));
    }
  }
  if (f.fd_ < 0) return IoError(quoted(what, path) + ": no unused temporary file name in '" + dir + "'");
  // Replacing a file keeps its permission bits (not its owner).
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) (void)::fchmod(f.fd_, st.st_mode & 07777);
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : path_(std::move(o.path_)),
      temp_(std::move(o.temp_)),
      what_(std::move(o.what_)),
      fd_(o.fd_),
      done_(o.done_) {
  o.fd_ = -1;
  o.done_ = true;
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!done_ && !temp_.empty()) ::unlink(temp_.c_str());
  done_ = true;
}

Status AtomicFile::write(std::string_view bytes) {
  if (done_ || fd_ < 0) return Internal(quoted(what_, path_) + ": write after commit");
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      discard();
      return IoError(quoted(what_, path_) + ": write failed: " + errno_text(err) +
                     "; the old file is unchanged");
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Status AtomicFile::commit() {
  if (done_ || fd_ < 0) return Internal(quoted(what_, path_) + ": commit twice");
  auto failed = [&](const std::string& step, int err) {
    discard();
    return IoError(quoted(what_, path_) + ": " + step + " failed: " + errno_text(err) +
                   "; the old file is unchanged");
  };
  if (::fsync(fd_) != 0) return failed("fsync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return failed("close", errno);
  // The target may have been swapped for a link or a device meanwhile.
  if (Status st = check_replaceable(path_, what_); !st.ok()) {
    discard();
    return st;
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) return failed("rename", errno);
  done_ = true;
  const std::string dir = split_path(path_).dir;
  // Best effort: makes the rename itself durable.
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Status write_file_atomic(const std::string& path, std::string_view bytes, std::string_view what) {
  FUSEBOX_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path, what));
  FUSEBOX_RETURN_IF_ERROR(f.write(bytes));
  return f.commit();
}

std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (path.empty() || path.find('\0') != std::string::npos || ::stat(path.c_str(), &st) != 0)
    return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

namespace {

// The absolute name of `path`, with links and "." / ".." resolved as far as
// the path exists (a file not written yet keeps its last components).
std::string normal_name(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  if (ec) return path;
  const std::filesystem::path canon = std::filesystem::weakly_canonical(abs, ec);
  return (ec ? abs.lexically_normal() : canon).string();
}

struct KnownPath {
  std::string what, path, name;
  std::optional<FileId> id;
};

KnownPath known(std::string what, std::string path) {
  KnownPath k{std::move(what), std::move(path), "", std::nullopt};
  k.name = normal_name(k.path);
  k.id = file_id(k.path);
  return k;
}

bool same(const KnownPath& a, const KnownPath& b) { return a.name == b.name || (a.id && a.id == b.id); }

}  // namespace

Status check_outputs_spare_inputs(const std::vector<NamedPath>& outputs,
                                  const std::vector<NamedPath>& inputs) {
  std::vector<KnownPath> ins;
  for (const auto& in : inputs) {
    if (in.path.empty() || in.path.find('\0') != std::string::npos) continue;
    ins.push_back(known(in.what, in.path));
    if (!in.database) continue;
    for (const char* side : {"-wal", "-shm", "-journal"})
      ins.push_back(known(in.what + " (its " + std::string(side + 1) + " file)", in.path + side));
  }
  std::vector<KnownPath> outs;
  for (const auto& out : outputs) {
    if (out.path.empty() || out.path.find('\0') != std::string::npos) continue;
    KnownPath o = known(out.what, out.path);
    for (const auto& in : ins) {
      if (same(o, in)) {
        return InvalidArgument(quoted(o.what, o.path) + " is the same file as the " + in.what + " '" +
                               in.path +
                               "': refusing to overwrite an input of this command (write to another file)");
      }
    }
    for (const auto& prev : outs) {
      if (same(o, prev)) {
        return InvalidArgument(quoted(o.what, o.path) + " is the same file as the " + prev.what + " '" +
                               prev.path + "': each output needs a file of its own");
      }
    }
    outs.push_back(std::move(o));
  }
  return Status::Ok();
}

Status refuse_overwriting_input(const std::string& output, std::string_view output_what,
                                const std::vector<NamedPath>& inputs) {
  return check_outputs_spare_inputs({{std::string(output_what), output}}, inputs);
}

void ignore_file_size_signal() {
  // Checked on every call (one system call): a program may reset it meanwhile.
  struct sigaction old {};
  if (::sigaction(SIGXFSZ, nullptr, &old) != 0) return;
  // A handler the program installed is its own business.
  if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  (void)::sigaction(SIGXFSZ, &ign, nullptr);
}

void remove_sqlite_side_files(const std::string& path) {
  for (const char* side : {"-wal", "-shm", "-journal"}) (void)::unlink((path + side).c_str());
}

Status out_of_host_memory(std::string_view doing) {
  return IoError("out of host memory while " + std::string(doing) +
                 " (free memory, raise the process's memory limit, or use a smaller file)");
}

}  // namespace fusebox::common
