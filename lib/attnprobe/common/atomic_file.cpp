#include "attnprobe/common/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
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

// Writes all of `contents` to `fd` and closes it; on failure returns errno (0 on success).
int write_all_and_close(int fd, const std::string& contents, bool sync) {
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      ::close(fd);
      return error;
    }
    written += static_cast<size_t>(n);
  }
  if (sync && ::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    return error;
  }
  return ::close(fd) == 0 ? 0 : errno;
}

[[noreturn]] void write_failed(const std::string& path, int error) {
  throw InputError(fmt::format("writing '{}' failed: {}{}", path, std::strerror(error),
                               error == ENOSPC || error == EFBIG || error == EDQUOT ? " (disk full?)" : ""));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents) {
  struct stat target;
  if (::stat(path.c_str(), &target) == 0 && !S_ISREG(target.st_mode)) {
    // A device (/dev/stdout, /dev/null) or a pipe is written in place: a temporary file renamed over it
    // would replace the device node itself (as root, in /dev).
    if (S_ISDIR(target.st_mode))
      throw InputError(fmt::format("cannot write '{}': it is a directory. Give a file name.", path));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    if (const int error = write_all_and_close(fd, contents, false)) write_failed(path, error);
    return;
  }
  const std::string temp = temp_path_for(path);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InputError(fmt::format("cannot write '{}': {}. Check that the folder exists and is writable.", path,
                                 std::strerror(errno)));
  if (const int error = write_all_and_close(fd, contents, true)) {
    ::unlink(temp.c_str());
    write_failed(path, error);
  }
  rename_over(temp, path);
}

}  // namespace attnprobe
