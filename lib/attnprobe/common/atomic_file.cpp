#include "attnprobe/common/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "attnprobe/common/error.h"

namespace attnprobe {

namespace {

std::string temp_path_for(const std::string& path) { return fmt::format("{}.tmp.{}", path, ::getpid()); }

void rename_over(const std::string& temp, const std::string& path) {
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(temp, ec);
    throw InputError(fmt::format("cannot write '{}': {}", path, why));
  }
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents) {
  const std::string temp = temp_path_for(path);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InputError(fmt::format("cannot write '{}': {}. Check that the folder exists and is writable.", path,
                                 std::strerror(errno)));
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      throw InputError(fmt::format("writing '{}' failed: {} (disk full?)", path, std::strerror(error)));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw InputError(fmt::format("writing '{}' failed: {} (disk full?)", path, std::strerror(error)));
  }
  rename_over(temp, path);
}

void replace_file_atomically(const std::string& path, const std::function<void(const std::string& temp)>& write) {
  const std::string temp = temp_path_for(path);
  try {
    write(temp);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(temp, ec);
    throw;
  }
  rename_over(temp, path);
}

}  // namespace attnprobe
