// The shared folder against a pod (or anyone) that planted things in it: links where the
// root router writes, a lock file that is not a file, a folder others can write. Each test
// performs the attack on a temporary folder and checks that the router neither writes
// through a link nor starts on a folder it cannot trust. No root needed.
#include "base/host_folder.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ff::router {
namespace {

namespace fs = std::filesystem;

std::string MakeTempDir(const char* tag) {
  std::string tmpl = "/tmp/ff-folder-" + std::string(tag) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp");
  return tmpl;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

bool IsLink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

class HostFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("dir");
    outside_ = MakeTempDir("outside");
    victim_ = outside_ + "/victim";
    Write(victim_, "VICTIM");
    library_ = outside_ + "/libffverbs-build.so";
    Write(library_, "LIBRARY-NEW");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::remove_all(outside_, ec);
  }
  // Everything the router writes through Take must stay out of `outside_`.
  void ExpectVictimUntouched() {
    EXPECT_EQ(Read(victim_), "VICTIM");
    EXPECT_EQ(fs::file_size(victim_), 6u);
  }
  void ExpectLibraryInstalled() {
    const std::string lib = dir_ + "/libffverbs.so";
    EXPECT_FALSE(IsLink(lib));
    EXPECT_EQ(Read(lib), "LIBRARY-NEW");
    EXPECT_EQ(fs::status(lib).permissions(), fs::perms(0755));
  }
  std::string Temporary(const std::string& final_name) const {
    return dir_ + "/." + final_name + ".tmp." + std::to_string(::getpid());
  }

  std::string dir_, outside_, victim_, library_;
};

TEST_F(HostFolderTest, InstallsTheLibraryAtomically) {
  Write(dir_ + "/libffverbs.so", "LIBRARY-OLD");
  HostFolder folder;
  std::string error;
  ASSERT_TRUE(folder.Take(dir_, "ffrouter", library_, &error)) << error;
  ExpectLibraryInstalled();
  EXPECT_FALSE(fs::exists(Temporary("libffverbs.so")));
}

TEST_F(HostFolderTest, ALinkAtTheLibraryIsReplacedNotFollowed) {
  fs::create_symlink(victim_, dir_ + "/libffverbs.so");
  HostFolder folder;
  std::string error;
  ASSERT_TRUE(folder.Take(dir_, "ffrouter", library_, &error)) << error;
  ExpectVictimUntouched();
  ExpectLibraryInstalled();
}

TEST_F(HostFolderTest, ALinkAtTheTemporaryNameIsNotWrittenThrough) {
  fs::create_symlink(victim_, Temporary("libffverbs.so"));
  fs::create_symlink(outside_ + "/created-through-link", Temporary("ffrouter.sock"));
  HostFolder folder;
  std::string error;
  ASSERT_TRUE(folder.Take(dir_, "ffrouter", library_, &error)) << error;
  UniqueFd sock;
  ASSERT_TRUE(folder.BindSocket(&sock, &error)) << error;
  ExpectVictimUntouched();
  ExpectLibraryInstalled();
  EXPECT_FALSE(fs::exists(outside_ + "/created-through-link"));
  EXPECT_TRUE(fs::is_socket(fs::symlink_status(dir_ + "/ffrouter.sock")));
}

// TCP mode's library is installed the same way, beside the container library: links at its
// name or at its temporary name are replaced, never written through.
TEST_F(HostFolderTest, TheSocketLibraryIsInstalledWithoutFollowingLinks) {
  fs::create_symlink(victim_, dir_ + "/libfsocket.so");
  fs::create_symlink(outside_ + "/created-through-link", Temporary("libfsocket.so"));
  const std::string source = outside_ + "/libfsocket-build.so";
  Write(source, "SOCKET-LIBRARY");
  HostFolder folder;
  std::string error;
  ASSERT_TRUE(folder.Take(dir_, "ffrouter", library_, &error)) << error;
  ASSERT_TRUE(folder.InstallSocketLibrary(source, &error)) << error;
  ExpectVictimUntouched();
  EXPECT_FALSE(fs::exists(outside_ + "/created-through-link"));
  EXPECT_FALSE(IsLink(dir_ + "/libfsocket.so"));
  EXPECT_EQ(Read(dir_ + "/libfsocket.so"), "SOCKET-LIBRARY");
  EXPECT_EQ(fs::status(dir_ + "/libfsocket.so").permissions(), fs::perms(0755));
  EXPECT_FALSE(fs::exists(Temporary("libfsocket.so")));
  ExpectLibraryInstalled();
  EXPECT_FALSE(folder.InstallSocketLibrary(outside_ + "/missing.so", &error));
  EXPECT_NE(error.find("libfsocket.so"), std::string::npos);
}

TEST_F(HostFolderTest, APodHoldingALockFileDoesNotStopTheRouter) {
  // flock() needs only read access: a pod could hold any file it sees, even on a read-only
  // mount. The router takes no lock in the folder, so neither a held file nor a link there
  // matters to it.
  const std::string lock = dir_ + "/ffrouter.lock";
  Write(lock, "");
  UniqueFd held(::open(lock.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_EQ(::flock(held.get(), LOCK_EX | LOCK_NB), 0);
  HostFolder folder;
  std::string error;
  EXPECT_TRUE(folder.Take(dir_, "ffrouter", library_, &error)) << error;
  ExpectLibraryInstalled();

  fs::remove(lock);
  fs::create_symlink(outside_ + "/created-through-link", lock);
  HostFolder again;
  EXPECT_FALSE(again.Take(dir_, "ffrouter", "", &error));  // the router above still runs
  EXPECT_FALSE(fs::exists(outside_ + "/created-through-link"));
  ExpectVictimUntouched();
}

TEST_F(HostFolderTest, OneRouterPerSocketName) {
  HostFolder first, second, other_name;
  std::string error;
  ASSERT_TRUE(first.Take(dir_, "ffrouter", "", &error)) << error;
  EXPECT_FALSE(second.Take(dir_, "ffrouter", "", &error));
  EXPECT_NE(error.find("another router"), std::string::npos) << error;
  EXPECT_TRUE(other_name.Take(dir_, "ffrouter2", "", &error)) << error;
}

// The liveness probe's heartbeat: made when the folder is taken, its time moved by each
// Beat(), a link planted at its name replaced (not followed), and gone with the router.
TEST_F(HostFolderTest, TheHeartbeatIsTouchedNotFollowedAndRemovedOnExit) {
  const std::string alive = dir_ + "/ffrouter.alive";
  ASSERT_EQ(::symlink(victim_.c_str(), alive.c_str()), 0);
  const std::string before = Read(victim_);
  {
    HostFolder folder;
    std::string error;
    ASSERT_TRUE(folder.Take(dir_, "ffrouter", "", &error)) << error;
    EXPECT_EQ(folder.alive_path(), alive);
    EXPECT_FALSE(IsLink(alive)) << "the planted link must be replaced";
    EXPECT_EQ(Read(victim_), before);
    struct stat st {};
    ASSERT_EQ(::stat(alive.c_str(), &st), 0);
    const timespec old{1, 0};
    const timespec times[2] = {old, old};
    ASSERT_EQ(::utimensat(AT_FDCWD, alive.c_str(), times, 0), 0);
    ASSERT_EQ(folder.Beat(), 0);
    ASSERT_EQ(::stat(alive.c_str(), &st), 0);
    EXPECT_GT(st.st_mtim.tv_sec, ::time(nullptr) - 60) << "Beat() must move the time to now";
  }
  EXPECT_FALSE(fs::exists(alive)) << "a router that stopped leaves no heartbeat";
}

TEST_F(HostFolderTest, ARouterServingTheSocketFromElsewhereIsDetected) {
  // Stands in for a router of another network namespace (whose abstract lock this one
  // cannot see) that serves the same folder: something listens on the socket.
  UniqueFd other(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/ffrouter.sock", dir_.c_str());
  ASSERT_EQ(::bind(other.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(other.get(), 4), 0);
  HostFolder folder;
  std::string error;
  EXPECT_FALSE(folder.Take(dir_, "ffrouter", "", &error));
  EXPECT_NE(error.find("another router"), std::string::npos) << error;
  other.reset();  // it died: its socket is stale now
  HostFolder next;
  EXPECT_TRUE(next.Take(dir_, "ffrouter", "", &error)) << error;
}

TEST_F(HostFolderTest, AFolderOthersCanWriteOrThatIsALinkIsRefused) {
  HostFolder folder;
  std::string error;
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  EXPECT_FALSE(folder.Take(dir_, "ffrouter", library_, &error));
  EXPECT_NE(error.find("writable by group or others"), std::string::npos) << error;
  ASSERT_EQ(::chmod(dir_.c_str(), 0775), 0);
  EXPECT_FALSE(folder.Take(dir_, "ffrouter", library_, &error));
  EXPECT_FALSE(fs::exists(dir_ + "/libffverbs.so"));

  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  fs::create_directory_symlink(dir_, outside_ + "/link-to-folder");
  HostFolder through_link;
  EXPECT_FALSE(through_link.Take(outside_ + "/link-to-folder", "ffrouter", "", &error));
  EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
}

TEST_F(HostFolderTest, AFolderOfAnotherUserIsRefused) {
  // As root: a folder handed to another user. Otherwise: a folder root owns.
  std::string other = "/proc";
  if (::geteuid() == 0) {
    other = dir_;
    ASSERT_EQ(::chown(dir_.c_str(), 65534, 65534), 0);
  }
  HostFolder folder;
  std::string error;
  EXPECT_FALSE(folder.Take(other, "ffrouter", "", &error));
  EXPECT_NE(error.find("not to the router's user"), std::string::npos) << error;
}

TEST_F(HostFolderTest, OnlyAStaleSocketIsReplaced) {
  // A dead router's socket is replaced by a live one.
  {
    UniqueFd stale(::socket(AF_UNIX, SOCK_SEQPACKET, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/ffrouter.sock", dir_.c_str());
    ASSERT_EQ(::bind(stale.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  {
    HostFolder folder;
    std::string error;
    ASSERT_TRUE(folder.Take(dir_, "ffrouter", "", &error)) << error;
    UniqueFd sock;
    ASSERT_TRUE(folder.BindSocket(&sock, &error)) << error;
    ASSERT_EQ(::listen(sock.get(), 4), 0);
    UniqueFd client(::socket(AF_UNIX, SOCK_SEQPACKET, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", folder.socket_path().c_str());
    EXPECT_EQ(::connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(fs::status(dir_ + "/ffrouter.sock").permissions(), fs::perms(0666));
  }
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ + "/ffrouter.sock")));  // removed at exit

  // Anything else at the socket's name is left alone and refused.
  fs::create_symlink(victim_, dir_ + "/ffrouter.sock");
  HostFolder folder;
  std::string error;
  ASSERT_TRUE(folder.Take(dir_, "ffrouter", "", &error)) << error;
  UniqueFd sock;
  EXPECT_FALSE(folder.BindSocket(&sock, &error));
  EXPECT_NE(error.find("not a socket"), std::string::npos) << error;
  EXPECT_TRUE(IsLink(dir_ + "/ffrouter.sock"));
  ExpectVictimUntouched();
}

}  // namespace
}  // namespace ff::router
