// The library reads FFV_REMOTE_WAIT_US once, on its first sleep: make a sleep on the
// router's wake word long enough (300 ms) that a test can tell a sleep that was woken
// from one that ran out.
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  ::setenv("FFV_REMOTE_WAIT_US", "300000", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
