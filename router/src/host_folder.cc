#include "host_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace ff::router {

bool HostFolder::Take(const std::string& dir, const std::string& name,
                      const std::string& library_source, std::string* error) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = "--dir " + dir + " is not a directory (create it, or mount the host folder)";
    return false;
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    *error = "--dir " + dir + " is not writable: " + std::strerror(errno);
    return false;
  }
  if (name.empty() || name.find('/') != std::string::npos) {
    *error = "--name must be a plain file name, got '" + name + "'";
    return false;
  }
  dir_ = dir;
  name_ = name;
  const std::string lock_path = dir + "/" + name + ".lock";
  lock_.reset(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock_) {
    *error = "cannot open " + lock_path + ": " + std::strerror(errno);
    return false;
  }
  if (::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    *error = "another router already serves " + socket_path() + " (it holds " + lock_path + ")";
    return false;
  }
  return library_source.empty() || InstallLibrary(library_source, error);
}

bool HostFolder::InstallLibrary(const std::string& source, std::string* error) {
  namespace fs = std::filesystem;
  const fs::path target = fs::path(dir_) / "libffverbs.so";
  const fs::path tmp = fs::path(dir_) / (".libffverbs.so." + std::to_string(::getpid()));
  std::error_code ec;
  fs::copy_file(source, tmp, fs::copy_options::overwrite_existing, ec);
  if (!ec) fs::permissions(tmp, fs::perms(0755), ec);
  // rename() replaces the file atomically: pods that already mapped the old library keep
  // their copy, new pods get the new one.
  if (!ec) fs::rename(tmp, target, ec);
  if (ec) {
    *error = "cannot install the container library " + source + " into " + target.string() + ": " +
             ec.message();
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace ff::router
