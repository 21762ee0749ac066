// fusebox_common: bounded reads, atomic writes, output-is-input, printable
// text, checked JSON integers and the .npy reader's limits.
#include "common/file_io.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/checked_math.h"
#include "common/json_util.h"
#include "common/text.h"
#include "fusebox/tensor.h"

namespace fusebox {
namespace {

namespace fs = std::filesystem;
using common::read_file_bounded;
using common::write_file_atomic;

class FileIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fusebox_file_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static void put(const std::string& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
  }
  static std::string get(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // Names in the folder other than `keep`: leftover temporary files.
  std::set<std::string> others(const std::set<std::string>& keep) const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string n = e.path().filename().string();
      if (!keep.count(n)) out.insert(n);
    }
    return out;
  }
  fs::path dir_;
};

// ---------------------------------------------------------------- reading

TEST_F(FileIoTest, ReadsARegularFileAndFollowsALinkToOne) {
  put(path("a.json"), "{\"x\": 1}");
  auto r = read_file_bounded(path("a.json"), 100, "graph file");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "{\"x\": 1}");
  fs::create_symlink(path("a.json"), path("link.json"));
  auto l = read_file_bounded(path("link.json"), 100, "graph file");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(*l, *r);
}

TEST_F(FileIoTest, SizeLimitIsCheckedBeforeReadingAndNamesFileAndLimit) {
  put(path("big"), std::string(101, 'x'));
  auto r = read_file_bounded(path("big"), 100, "plan file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find(path("big")), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("101 bytes"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("limited to 100 bytes"), std::string::npos) << r.status().message();
  auto exact = read_file_bounded(path("big"), 101, "plan file");
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->size(), 101u);
  put(path("mib"), std::string(10, 'x'));
  auto mib = read_file_bounded(path("mib"), 5, "graph file");
  EXPECT_NE(mib.status().message().find("graph files are limited to 5 bytes"), std::string::npos);
  EXPECT_EQ(common::format_limit(64ull << 20), "64 MiB");
}

TEST_F(FileIoTest, RefusesADirectory) {
  auto r = read_file_bounded(dir_.string(), 100, "graph file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("directory"), std::string::npos) << r.status().message();
}

TEST_F(FileIoTest, RefusesAFifoWithoutBlocking) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  // Nobody writes to it: opening it for reading would block forever.
  auto r = read_file_bounded(path("fifo"), 100, "device-properties file");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status().message();
  EXPECT_FALSE(common::require_regular_file(path("fifo"), "import file").ok());
}

TEST_F(FileIoTest, RefusesDevZeroAndDevNull) {
  for (const char* dev : {"/dev/zero", "/dev/null", "/dev/urandom"}) {
    auto r = read_file_bounded(dev, 1 << 20, "graph file");
    ASSERT_FALSE(r.ok()) << dev;
    EXPECT_NE(r.status().message().find("character device"), std::string::npos) << r.status().message();
  }
}

TEST_F(FileIoTest, MissingFileIsAnIoErrorNamingIt) {
  auto r = read_file_bounded(path("nope.json"), 100, "graph file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("nope.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("No such file"), std::string::npos) << r.status().message();
}

// ---------------------------------------------------------------- writing

TEST_F(FileIoTest, AtomicWriteCreatesThenReplacesKeepingMode) {
  ASSERT_TRUE(write_file_atomic(path("out"), "first", "plan file").ok());
  EXPECT_EQ(get(path("out")), "first");
  ASSERT_EQ(::chmod(path("out").c_str(), 0640), 0);
  ASSERT_TRUE(write_file_atomic(path("out"), "second", "plan file").ok());
  EXPECT_EQ(get(path("out")), "second");
  struct stat st {};
  ASSERT_EQ(::stat(path("out").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_TRUE(others({"out"}).empty()) << "temporary files left behind";
}

TEST_F(FileIoTest, AtomicWriteRefusesASymlinkTarget) {
  put(path("victim"), "precious");
  fs::create_symlink(path("victim"), path("link"));
  Status st = write_file_atomic(path("link"), "overwritten", "plan file");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("symbolic link"), std::string::npos) << st.message();
  EXPECT_EQ(get(path("victim")), "precious");
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_TRUE(others({"victim", "link"}).empty());
}

TEST_F(FileIoTest, AtomicWriteRefusesDirectoryFifoAndDeviceTargets) {
  fs::create_directory(path("d"));
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  std::vector<std::string> targets = {path("d"), path("fifo")};
  // A device node of our own (root only), never /dev/null itself: a regression
  // would replace the system's /dev/null with a regular file.
  const bool have_dev = ::mknod(path("null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  if (have_dev) targets.push_back(path("null"));
  for (const std::string& target : targets) {
    Status st = write_file_atomic(target, "x", "plan file");
    EXPECT_FALSE(st.ok()) << target;
    EXPECT_NE(st.message().find("only a regular file is replaced"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(fs::is_directory(path("d")));
  EXPECT_TRUE(fs::is_fifo(path("fifo")));
  if (have_dev) EXPECT_TRUE(fs::is_character_file(path("null")));
  EXPECT_TRUE(others({"d", "fifo", "null"}).empty());
}

TEST_F(FileIoTest, FailedWriteLeavesTheOldFileAndNoTemporary) {
  put(path("out"), "old contents");
  // A file-size limit makes write() fail with EFBIG, even for root.
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Status st = write_file_atomic(path("out"), std::string(100000, 'n'), "npy file");
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("old file is unchanged"), std::string::npos) << st.message();
  EXPECT_EQ(get(path("out")), "old contents");
  EXPECT_TRUE(others({"out"}).empty()) << "temporary file left behind";
}

TEST_F(FileIoTest, WriteIntoAReadOnlyFolderFailsCleanly) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "root ignores folder permissions (EFBIG test above covers the failure path)";
  put(path("out"), "old");
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  Status st = write_file_atomic(path("out"), "new", "plan file");
  fs::permissions(dir_, fs::perms::owner_all);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(get(path("out")), "old");
}

TEST_F(FileIoTest, TemporaryNamesAreUniqueAndNeverAFixedName) {
  // A link planted at the old fixed name "out.tmp" must not be followed.
  put(path("victim"), "precious");
  fs::create_symlink(path("victim"), path("out.tmp"));
  auto a = common::AtomicFile::create(path("out"), "plan file");
  auto b = common::AtomicFile::create(path("out"), "plan file");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->temp_path(), b->temp_path());
  EXPECT_EQ(fs::path(a->temp_path()).parent_path(), dir_) << "the temporary file is next to the target";
  EXPECT_NE(a->temp_path(), path("out.tmp"));
  ASSERT_TRUE(a->write("from a").ok());
  ASSERT_TRUE(a->commit().ok());
  EXPECT_EQ(get(path("out")), "from a");
  EXPECT_EQ(get(path("victim")), "precious");
  const std::string b_temp = b->temp_path();
  { auto discard = std::move(b).value(); }  // not committed: removed
  EXPECT_FALSE(fs::exists(b_temp));
  EXPECT_TRUE(others({"out", "victim", "out.tmp"}).empty());
}

TEST_F(FileIoTest, OutputThatIsAnInputIsRefused) {
  put(path("g.json"), "{}");
  fs::create_hard_link(path("g.json"), path("hard.json"));
  const std::vector<common::NamedPath> inputs = {{"graph file", path("g.json")}};
  Status same = common::refuse_overwriting_input(path("g.json"), "--plan-out", inputs);
  ASSERT_FALSE(same.ok());
  EXPECT_EQ(same.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(same.message().find("graph file"), std::string::npos) << same.message();
  EXPECT_FALSE(common::refuse_overwriting_input(path("hard.json"), "--plan-out", inputs).ok())
      << "a hard link";
  EXPECT_FALSE(common::refuse_overwriting_input(dir_.string() + "/./g.json", "--plan-out", inputs).ok());
  EXPECT_TRUE(common::refuse_overwriting_input(path("new.plan"), "--plan-out", inputs).ok());
  put(path("other"), "x");
  EXPECT_TRUE(common::refuse_overwriting_input(path("other"), "--plan-out", inputs).ok());
}

// Issue #32 cases 1-2: outputs are checked against every input and against
// each other, by name (files not written yet too) and by identity.
TEST_F(FileIoTest, OutputsAreCheckedAgainstInputsAndEachOther) {
  put(path("g.json"), "{}");
  put(path("x.npy"), "npy");
  put(path("c.sqlite"), "");
  const std::vector<common::NamedPath> inputs = {{"graph file", path("g.json")},
                                                 {"--inputs file", path("x.npy")},
                                                 {"plan cache", path("c.sqlite"), /*database=*/true}};
  Status st = common::check_outputs_spare_inputs({{"--dot file", path("x.npy")}}, inputs);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--inputs file"), std::string::npos) << st.message();
  st = common::check_outputs_spare_inputs(
      {{"--dot file", dir_.string() + "/../" + dir_.filename().string() + "/c.sqlite"}}, inputs);
  EXPECT_NE(st.message().find("plan cache"), std::string::npos) << st.message();
  // A side file of the cache, not there yet: caught by name.
  st = common::check_outputs_spare_inputs({{"--plan-out", path("c.sqlite-wal")}}, inputs);
  EXPECT_FALSE(st.ok());
  // Two outputs, one file that does not exist yet.
  st = common::check_outputs_spare_inputs(
      {{"--dot file", path("out")}, {"--plan-out", dir_.string() + "/./out"}}, inputs);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("each output needs a file of its own"), std::string::npos) << st.message();
  EXPECT_TRUE(
      common::check_outputs_spare_inputs({{"--dot file", path("a")}, {"--plan-out", path("b")}}, inputs)
          .ok());
  // A symbolic link to an input, by name resolution and identity.
  fs::create_symlink(path("g.json"), path("link.json"));
  EXPECT_FALSE(common::check_outputs_spare_inputs({{"--dot file", path("link.json")}}, inputs).ok());
}

// Issue #32 case 5: under `ulimit -f`, SIGXFSZ used to kill the writer and leave
// its temporary file; ignored, the write fails with EFBIG and is cleaned up.
TEST_F(FileIoTest, FileSizeLimitIsAnErrorNotASignal) {
  put(path("out"), "old contents");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_DFL);  // as a fresh process has it
    struct rlimit small {};
    ::getrlimit(RLIMIT_FSIZE, &small);
    small.rlim_cur = 2048;
    ::setrlimit(RLIMIT_FSIZE, &small);
    Status st = write_file_atomic(path("out"), std::string(100000, 'n'), "plan file");
    const bool named = st.message().find(path("out")) != std::string::npos &&
                       st.message().find("File too large") != std::string::npos;
    ::_exit(!st.ok() && st.code() == StatusCode::kIoError && named ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the write did not fail with EFBIG naming the path";
  EXPECT_EQ(get(path("out")), "old contents");
  EXPECT_TRUE(others({"out"}).empty()) << "temporary file left behind";
}

TEST(OutOfHostMemory, NamesWhatWasBeingDone) {
  const Status st = common::out_of_host_memory("reading graph file 'g.json'");
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.message().rfind("out of host memory while reading graph file 'g.json'", 0), 0u)
      << st.message();
}

// ---------------------------------------------------------------- text and numbers

TEST(Printable, EscapesControlBytesAndInvalidUtf8KeepsText) {
  using common::printable;
  EXPECT_EQ(printable("conv1"), "conv1");
  EXPECT_EQ(printable("caf\xC3\xA9 \xE6\x97\xA5"), "caf\xC3\xA9 \xE6\x97\xA5");  // valid UTF-8 passes
  EXPECT_EQ(printable("a\x1b]0;pwned\x07"), "a\\x1B]0;pwned\\x07");
  EXPECT_EQ(printable("x\ry"), "x\\x0Dy");
  EXPECT_EQ(printable("\x7f"), "\\x7F");
  EXPECT_EQ(printable("\xC2\x9B"
                      "2J"),
            "\\xC2\\x9B2J");  // C1 CSI
  EXPECT_EQ(printable("\xff\xfe"), "\\xFF\\xFE");
  EXPECT_EQ(printable("\xC0\xAF"), "\\xC0\\xAF");  // overlong '/'
  EXPECT_EQ(printable("\xE6\x97"), "\\xE6\\x97");  // truncated sequence
  EXPECT_EQ(printable("a\nb"), "a\\x0Ab");
  EXPECT_EQ(printable("a\nb\tc", /*keep_newlines=*/true), "a\nb\tc");
  EXPECT_TRUE(common::is_printable("plain"));
  EXPECT_FALSE(common::is_printable("\x1b[31m"));
}

TEST(JsonUtil, DumpReplacesInvalidUtf8InsteadOfThrowing) {
  nlohmann::json j = {{"graph_file", std::string("bad\xff\xfe.json")}, {"ok", false}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  std::string out;
  EXPECT_NO_THROW(out = common::json_dump(j, 2));
  auto back = nlohmann::json::parse(out);
  EXPECT_EQ(back["graph_file"], "bad\xEF\xBF\xBD\xEF\xBF\xBD.json");
}

TEST(JsonUtil, IntegersBeyondInt64AndNonIntegersAreRefused) {
  auto j = nlohmann::json::parse(
      R"({"ok": 90, "u64": 18446744073709551615, "big": 1e300, "huge": 123456789012345678901234567890,
          "frac": 1.0, "neg": -5, "str": "7", "edge": 9223372036854775807})");
  EXPECT_EQ(common::json_int_at(j, "ok", 0, 1000), 90);
  EXPECT_EQ(common::json_int_at(j, "edge"), INT64_MAX);
  for (const char* k : {"u64", "big", "huge", "frac", "str", "missing"}) {
    EXPECT_THROW((void)common::json_int_at(j, k), std::out_of_range) << k;
  }
  EXPECT_THROW((void)common::json_int_at(j, "neg", 0), std::out_of_range);
  EXPECT_THROW((void)common::json_int_at(j, "ok", 0, 89), std::out_of_range);
  // nlohmann refuses 1e400 while parsing: a parse error, never a number.
  EXPECT_TRUE(nlohmann::json::parse(R"({"x": 1e400})", nullptr, false).is_discarded());
  try {
    (void)common::json_int_at(j, "u64", 0, 2147483647);
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("u64"), std::string::npos) << e.what();
  }
}

TEST(CheckedMath, OverflowIsReported) {
  EXPECT_EQ(common::checked_product({2, 3, 4}), 24);
  EXPECT_FALSE(common::checked_product({4294967296, 4294967296}).has_value());
  EXPECT_FALSE(common::checked_product({-1, 2}).has_value());
  EXPECT_FALSE(common::checked_mul(INT64_MAX / 2 + 1, 2).has_value());
  EXPECT_FALSE(common::checked_add(INT64_MAX, 1).has_value());
}

// ---------------------------------------------------------------- .npy limits

ResolvedTensor tensor(std::vector<int64_t> dims) {
  ResolvedTensor t;
  t.name = "x";
  t.dims = std::move(dims);
  t.strides.assign(t.dims.size(), 1);
  for (int i = static_cast<int>(t.dims.size()) - 2; i >= 0; --i)
    t.strides[i] = t.strides[i + 1] * t.dims[i + 1];
  t.dtype = DType::kFP32;
  t.is_input = true;
  return t;
}

std::string npy_bytes(const std::string& shape, size_t data_bytes) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST_F(FileIoTest, NpyShapeWhoseSizeOverflowsIsAParseError) {
  put(path("x.npy"), npy_bytes("(4294967296, 4294967296, 4294967296)", 16));
  auto r = read_npy_for(path("x.npy"), tensor({2, 2}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kParseError) << r.status().ToString();
  EXPECT_NE(r.status().message().find("overflow"), std::string::npos) << r.status().message();
  put(path("y.npy"), npy_bytes("(99999999999999999999,)", 16));
  auto y = read_npy_for(path("y.npy"), tensor({2, 2}));
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), StatusCode::kParseError) << y.status().ToString();
}

TEST_F(FileIoTest, NpyTensorTooLargeToReadIsAnErrorNotBadAlloc) {
  put(path("x.npy"), npy_bytes("(2, 2)", 16));
  auto r = read_npy_for(path("x.npy"), tensor({int64_t{1} << 40, int64_t{1} << 30}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
}

TEST_F(FileIoTest, NpyFileLargerThanItsTensorIsRefusedBeforeReading) {
  put(path("x.npy"), npy_bytes("(2, 2)", 16) + std::string(2 << 20, '\0'));
  auto r = read_npy_for(path("x.npy"), tensor({2, 2}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status().ToString();
  EXPECT_NE(r.status().message().find("limited to"), std::string::npos) << r.status().message();
  ASSERT_EQ(::mkfifo(path("fifo.npy").c_str(), 0600), 0);
  EXPECT_FALSE(read_npy_for(path("fifo.npy"), tensor({2, 2})).ok());
  auto good = read_npy_for(path("good.npy"), tensor({2, 2}));
  EXPECT_FALSE(good.ok());
  put(path("good.npy"), npy_bytes("(2, 2)", 16));
  good = read_npy_for(path("good.npy"), tensor({2, 2}));
  EXPECT_TRUE(good.ok()) << good.status().ToString();
}

TEST_F(FileIoTest, WriteNpyIsAtomicAndRefusesALink) {
  put(path("victim"), "precious");
  fs::create_symlink(path("victim"), path("y.npy"));
  HostTensor h = HostTensor::like(tensor({2, 2}));
  EXPECT_FALSE(write_npy(path("y.npy"), h).ok());
  EXPECT_EQ(get(path("victim")), "precious");
  ASSERT_TRUE(write_npy(path("z.npy"), h).ok());
  EXPECT_TRUE(read_npy_for(path("z.npy"), tensor({2, 2})).ok());
}

}  // namespace
}  // namespace fusebox
