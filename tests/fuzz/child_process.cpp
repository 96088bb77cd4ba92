// Child processes with fork/exec: each in its own process group (a timeout kills the whole group,
// OpenMP threads included), no core files, optional address-space limit.
#include "tests/fuzz/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace pa::fuzz {

namespace {

using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<char*> cStrings(const std::vector<std::string>& v) {
  std::vector<char*> r;
  for (const std::string& s : v) r.push_back(const_cast<char*>(s.c_str()));
  r.push_back(nullptr);
  return r;
}

struct Running {
  size_t job = 0;
  pid_t pid = -1;
  Clock::time_point start;
};

pid_t start(const ChildJob& job, const ChildLimits& limits) {
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  const std::string outPath = job.dir + "/stdout.txt", errPath = job.dir + "/stderr.txt";
  const int out = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (out < 0 || err < 0 || in < 0) throw std::runtime_error("cannot open the output files in " + job.dir);
  std::vector<char*> argv = cStrings(job.argv), envp = cStrings(limits.env);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    struct rlimit noCore = {0, 0};
    ::setrlimit(RLIMIT_CORE, &noCore);
    if (limits.addressSpaceBytes) {
      struct rlimit as = {limits.addressSpaceBytes, limits.addressSpaceBytes};
      ::setrlimit(RLIMIT_AS, &as);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(out);
  ::close(err);
  ::close(in);
  if (pid < 0) throw std::runtime_error("fork failed");
  ::setpgid(pid, pid);  // also here, so a kill right after the fork reaches the group
  return pid;
}

}  // namespace

std::vector<ChildResult> runChildren(const std::vector<ChildJob>& jobs, int parallel, const ChildLimits& limits) {
  std::vector<ChildResult> results(jobs.size());
  std::vector<Running> running;
  size_t next = 0;
  while (next < jobs.size() || !running.empty()) {
    while (next < jobs.size() && static_cast<int>(running.size()) < std::max(parallel, 1)) {
      running.push_back({next, start(jobs[next], limits), Clock::now()});
      ++next;
    }
    bool progressed = false;
    for (size_t i = 0; i < running.size();) {
      Running& r = running[i];
      ChildResult& res = results[r.job];
      int status = 0;
      pid_t done = ::waitpid(r.pid, &status, WNOHANG);
      const double elapsed = std::chrono::duration<double>(Clock::now() - r.start).count();
      if (done == 0 && elapsed > limits.seconds) {
        ::kill(-r.pid, SIGKILL);
        done = ::waitpid(r.pid, &status, 0);
        res.timedOut = true;
      }
      if (done == 0) {
        ++i;
        continue;
      }
      ::kill(-r.pid, SIGKILL);  // threads or grandchildren left behind in its group
      res.seconds = elapsed;
      if (WIFSIGNALED(status)) res.signal = WTERMSIG(status);
      else if (WIFEXITED(status)) res.exitCode = WEXITSTATUS(status);
      if (res.timedOut) res.signal = 0;
      res.out = slurp(jobs[r.job].dir + "/stdout.txt");
      res.err = slurp(jobs[r.job].dir + "/stderr.txt");
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      progressed = true;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return results;
}

std::vector<std::string> environmentWith(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const std::string& o : overrides)
      if (o.substr(0, o.find('=')) == key) replaced = true;
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

}  // namespace pa::fuzz
