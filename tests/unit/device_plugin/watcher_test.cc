#include "watcher.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <filesystem>
#include <fstream>

namespace ff::dp {
namespace {
namespace fs = std::filesystem;

TEST(InotifyWatcher, ReportsCreateDeleteAndDirectoryLoss) {
  std::string tmpl = (fs::temp_directory_path() / "ffdp-watch-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  InotifyWatcher w;
  std::string error;
  ASSERT_TRUE(w.watch(dir, &error)) << error;
  EXPECT_TRUE(w.watching(dir));
  std::ofstream(dir + "/kubelet.sock") << "";
  fs::remove(dir + "/kubelet.sock");
  pollfd p{w.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 1000), 1);
  auto events = w.read_events();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0].kind, DirEvent::Kind::kCreated);
  EXPECT_EQ(events[0].name, "kubelet.sock");
  EXPECT_EQ(events[0].dir, dir);
  EXPECT_EQ(events[1].kind, DirEvent::Kind::kDeleted);

  fs::remove_all(dir);
  ASSERT_EQ(::poll(&p, 1, 1000), 1);
  events = w.read_events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, DirEvent::Kind::kDirGone);
  EXPECT_FALSE(w.watching(dir));
  EXPECT_FALSE(w.watch(dir, &error));
  EXPECT_NE(error.find(dir), std::string::npos);
}

}  // namespace
}  // namespace ff::dp
