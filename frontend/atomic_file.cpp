// Atomic file replacement: write a temporary beside the target, fsync, rename, fsync the folder.
#include "frontend/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <system_error>

#include "common/errors.h"

namespace pa {

namespace {

std::string errnoText(int err) { return std::generic_category().message(err); }

// The temporary file until it is renamed: closed and removed on every way out but success.
class Temporary {
public:
  Temporary(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~Temporary() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;

  int fd() const { return fd_; }
  // close(2) reports delayed write errors (NFS, quotas), so its result counts. It is not
  // retried on EINTR: Linux frees the descriptor whatever close returns.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  void markRenamed() { renamed_ = true; }

private:
  std::string path_;
  int fd_;
  bool renamed_ = false;
};

}  // namespace

void writeFileAtomically(const std::string& path, const std::string& bytes) {
  const auto fail = [&path](const std::string& reason) { return UserError(path + ": cannot write: " + reason); };
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) throw fail("the path names a folder, not a file");

  // Unique per process and per call, so that concurrent writers never share a temporary.
  static std::atomic<unsigned long> counter{0};
  const std::string tmp = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "." + base +
                          ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw fail(errnoText(errno));
  Temporary file(tmp, fd);

  // write(2) may write less than asked (a signal, a file size limit reached part way): go on
  // from where it stopped until it fails outright.
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(file.fd(), p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw fail(errnoText(errno));
    if (n == 0) throw fail("write(2) wrote nothing");
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(file.fd()) != 0) throw fail(errnoText(errno));
  if (file.close() != 0) throw fail(errnoText(errno));
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw fail(errnoText(errno));
  file.markRenamed();
  // The new file is in place; without this its directory entry may not survive a power cut.
  try {
    syncFolder(dir);
  } catch (const UserError& e) {
    throw fail(e.what());
  }
}

void syncFolder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw UserError(dir + ": cannot open the folder to sync it: " + errnoText(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a folder and say EINVAL; there is nothing more to do there.
  if (rc != 0 && err != EINVAL) throw UserError(dir + ": cannot sync the folder: " + errnoText(err));
}

}  // namespace pa
