// Config fuzzing: thousands of generated and mutated configs through the real `train` binary.
// Every run must end by itself (no signal, no hang) with exit 0, 1 or 2; exit 2 must say where
// (file:line:col or the --set flag); exit 0 must not print a non-finite loss; stderr must carry
// no sanitizer report; a config that was not mutated must train (exit 0). All failures are
// counted and reported once, grouped by class. README "Config fuzzing" explains the switches:
//   PA_FUZZ_SEED (24), PA_FUZZ_CASES (12000; 2000 with sanitizers), PA_FUZZ_CASE=i[,j...] (only those,
//   each printed), PA_FUZZ_JOBS (2),
//   PA_FUZZ_TIMEOUT (seconds, 60), PA_FUZZ_OUT=DIR (write every failing case there, replayable,
//   and a minimised reproducer per class with PA_FUZZ_MINIMIZE, on by default with PA_FUZZ_OUT).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "tests/fuzz/child_process.h"
#include "tests/fuzz/config_gen.h"

namespace pa::fuzz {
namespace {

namespace fs = std::filesystem;

int64_t envInt(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}

std::string envStr(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string replaceAll(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

std::string shellQuote(const std::string& s) { return "'" + replaceAll(s, "'", "'\\''") + "'"; }

// Numbers, addresses and the run folder vary between cases of one class; quoted values too.
// (Hand-written rather than std::regex: GCC 12 warns inside <regex> under -fsanitize at -O1.)
std::string normalise(std::string s, const std::string& dir) {
  s = replaceAll(s, dir, "{DIR}");
  s = replaceAll(s, std::string(PA_SOURCE_DIR) + "/", "");
  std::string r;
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '0' && i + 1 < s.size() && s[i + 1] == 'x') {
      r += "0x?";
      for (i += 2; i < s.size() && std::isxdigit(static_cast<unsigned char>(s[i])); ++i) {
      }
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      r += 'N';
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    } else if (c == '\'' && s.find('\'', i + 1) != std::string::npos) {
      r += "'?'";
      i = s.find('\'', i + 1) + 1;
    } else {
      r += c;
      ++i;
    }
  }
  // One class for a message whatever the key path, shapes and listed choices it names.
  for (const char* list : {" Valid keys:", " Valid choices:", "; valid:", " Valid ops:", "; columns:", " Valid layers:"}) {
    const size_t at = r.find(list);
    if (at != std::string::npos) r = r.substr(0, at) + list + " ...";
  }
  r = replaceAll(r, "; did you mean '?'?", "");
  for (size_t at = r.find("[N"); at != std::string::npos; at = r.find("[N", at + 1)) {
    size_t end = at + 2;
    while (r.compare(end, 3, ", N") == 0) end += 3;
    if (end < r.size() && r[end] == ']') r.replace(at, end + 1 - at, "[shape]");
  }
  const size_t file = r.find("{DIR}/config.yaml: ");
  if (file != std::string::npos) {  // the key path after the file name
    const size_t key = file + std::strlen("{DIR}/config.yaml: "), colon = r.find(": ", key);
    if (colon != std::string::npos && r.find(' ', key) > colon) r.replace(key, colon - key, "<key>");
  }
  if (r.size() > 200) r = r.substr(0, 200) + "...";
  return r;
}

// ASan reports an allocation it cannot serve instead of throwing std::bad_alloc: that is the
// release build's exit 1 ("std::bad_alloc"), allowed, not a memory error.
bool outOfMemoryReport(const std::string& err) {
  for (const char* s : {"allocator is out of memory", "allocation-size-too-big", "requested allocation size",
                        "out-of-memory", "rss limit exhausted", "calloc-overflow"})
    if (err.find(s) != std::string::npos) return true;
  return false;
}

// Whether `s` holds ":<digits>:<digits>:", the file:line:col of a located message.
bool hasLineAndColumn(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != ':') continue;
    size_t j = i + 1, digits = 0;
    for (; j < s.size() && std::isdigit(static_cast<unsigned char>(s[j])); ++j) ++digits;
    if (!digits || j >= s.size() || s[j] != ':') continue;
    size_t k = j + 1, digits2 = 0;
    for (; k < s.size() && std::isdigit(static_cast<unsigned char>(s[k])); ++k) ++digits2;
    if (digits2 && k < s.size() && s[k] == ':') return true;
  }
  return false;
}

// The first "loss nan", "MSE inf", "val -nan" ... in the output, or "".
std::string nonFiniteLoss(const std::string& out) {
  for (const char* word : {"loss", "MSE", "val"}) {
    for (size_t at = out.find(word); at != std::string::npos; at = out.find(word, at + 1)) {
      size_t i = at + std::strlen(word);
      while (i < out.size() && (out[i] == ' ' || out[i] == '=' || out[i] == ':')) ++i;
      if (i < out.size() && (out[i] == '-' || out[i] == '+')) ++i;
      std::string w = out.substr(i, 3);
      for (char& ch : w) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (w == "nan" || w == "inf") return out.substr(at, i + 3 - at);
    }
  }
  return "";
}

// 73-128 s on the 2-core build machine (6-10 ms a config); the sanitizer build runs the first
// 2,000 of the same cases, at about 50 ms each (100 s).
#ifdef PA_SANITIZE
constexpr int64_t kDefaultCases = 2000;
#else
constexpr int64_t kDefaultCases = 12000;
#endif

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> r;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) r.push_back(l);
  return r;
}

std::string signalName(int sig) {
  const char* d = ::sigabbrev_np(sig);
  return d ? std::string("SIG") + d : "signal " + std::to_string(sig);
}

// The line that best says what went wrong, from stderr.
std::string keyLine(const std::string& err) {
  const std::vector<std::string> ls = lines(err);
  for (const std::string& l : ls)  // an assertion or an exception that nothing caught
    if (l.find("Assertion") != std::string::npos || l.find("what():") != std::string::npos) return l;
  for (auto it = ls.rbegin(); it != ls.rend(); ++it)
    if (!it->empty()) return *it;
  return "(no stderr)";
}

// The sanitizer's report: its kind and the first frame in our sources.
std::string sanitizerSignature(const std::string& err) {
  const std::vector<std::string> ls = lines(err);
  std::string kind;
  for (const std::string& l : ls) {
    size_t at = l.find("runtime error:");
    if (at != std::string::npos) {  // UBSan: "file:line:col: runtime error: what"
      return "UBSan " + l;
    }
    at = l.find("ERROR: AddressSanitizer:");
    if (at == std::string::npos) at = l.find("ERROR: LeakSanitizer:");
    if (at != std::string::npos && kind.empty()) kind = l.substr(at + 7);
  }
  if (kind.empty()) return "";
  const size_t on = kind.find(" on ");
  if (on != std::string::npos) kind = kind.substr(0, on);
  for (const std::string& l : ls)
    if (l.find(" in ") != std::string::npos && l.find(PA_SOURCE_DIR) != std::string::npos &&
        l.find("/tests/") == std::string::npos)
      return kind + " | " + l.substr(l.find(" in ") + 1);
  return kind;
}

struct Verdict {
  std::string cls;        // empty: the run is fine
  std::string signature;  // what groups failures within the class
};

Verdict judge(const FuzzCase& c, const ChildResult& r, const std::string& dir) {
  const std::string sanitizer = outOfMemoryReport(r.err) ? "" : sanitizerSignature(r.err);
  if (!sanitizer.empty()) return {"sanitizer", normalise(sanitizer, dir)};
  if (outOfMemoryReport(r.err)) return {};
  if (r.timedOut) return {"timeout", normalise(keyLine(r.err), dir)};
  if (r.signal) return {"signal " + signalName(r.signal), normalise(keyLine(r.err), dir)};
  if (r.exitCode < 0 || r.exitCode > 2) return {"exit " + std::to_string(r.exitCode), normalise(keyLine(r.err), dir)};
  if (r.exitCode == 2 && !hasLineAndColumn(r.err) && r.err.find("--set ") == std::string::npos)
    return {"exit 2 without file:line:col", normalise(keyLine(r.err), dir)};
  const std::string nonFinite = r.exitCode == 0 ? nonFiniteLoss(r.out) : "";
  if (!nonFinite.empty()) return {"exit 0 with a non-finite loss", normalise(nonFinite, dir)};
  if (c.mutations.empty() && r.exitCode != 0)
    return {"valid config fails (exit " + std::to_string(r.exitCode) + ")", normalise(keyLine(r.err), dir)};
  return {};
}

// Writes a case's files into `dir` and returns `train`'s argv for it.
std::vector<std::string> prepare(const FuzzCase& c, const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.yaml", std::ios::binary) << c.yaml;
  for (const auto& f : c.files) std::ofstream(dir / f.first, std::ios::binary) << f.second;
  std::vector<std::string> argv = {PA_TRAIN_BINARY};
  for (const std::string& a : c.args) argv.push_back(replaceAll(a, kDirToken, dir.string()));
  return argv;
}

// The per-case limit detects hangs, so it sits above the slowest legitimate case: a mutation to
// 100,000 units makes tiny_llama 62.6 M parameters, which trained 3 steps in 17.7 s alone on the
// 2-core build machine (seed 24, case 7509; past 20 s beside other tests) and 35-53 s under
// --compare (three trainings; seed 707, case 9547).
ChildLimits limits() {
  ChildLimits l;
  l.seconds = static_cast<double>(envInt("PA_FUZZ_TIMEOUT", 60));
  std::vector<std::string> env = {"OMP_NUM_THREADS=1", "OMP_WAIT_POLICY=passive"};
#ifdef PA_SANITIZE
  // A config that asks for terabytes gets bad_alloc, as in the release build under RLIMIT_AS,
  // instead of ASan's own allocation report. The CI's options come first; ours fill gaps only.
  env.push_back("ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=3072:" + envStr("ASAN_OPTIONS"));
#else
  l.addressSpaceBytes = size_t{6} << 30;  // such a config fails fast instead of paging the machine
#endif
  l.env = environmentWith(env);
  return l;
}

struct Outcome {
  FuzzCase c;
  ChildResult r;
  Verdict v;
};

// Runs cases in batches, each in its own folder under `root`, removed afterwards.
std::vector<Outcome> runCases(const std::vector<FuzzCase>& cases, const fs::path& root, const ChildLimits& lim) {
  const int jobs = static_cast<int>(envInt("PA_FUZZ_JOBS", 2));
  std::vector<Outcome> out;
  for (size_t start = 0; start < cases.size(); start += 64) {
    const size_t end = std::min(cases.size(), start + 64);
    std::vector<ChildJob> batch;
    for (size_t i = start; i < end; ++i) {
      const fs::path dir = root / ("case-" + std::to_string(cases[i].index));
      batch.push_back({prepare(cases[i], dir), dir.string()});
    }
    const std::vector<ChildResult> res = runChildren(batch, jobs, lim);
    for (size_t i = start; i < end; ++i) {
      const std::string dir = batch[i - start].dir;
      out.push_back({cases[i], res[i - start], judge(cases[i], res[i - start], dir)});
      fs::remove_all(dir);
    }
  }
  return out;
}

std::string argsLine(const FuzzCase& c, const std::string& dir) {
  std::string s;
  for (const std::string& a : c.args) s += " " + shellQuote(replaceAll(a, kDirToken, dir));
  return s;
}

void writeCase(const FuzzCase& c, const ChildResult& r, const Verdict& v, const fs::path& dir) {
  prepare(c, dir);
  std::ofstream(dir / "stdout.txt", std::ios::binary) << r.out;
  std::ofstream(dir / "stderr.txt", std::ios::binary) << r.err;
  std::ofstream info(dir / "case.txt");
  info << "case " << c.index << " of seed " << envInt("PA_FUZZ_SEED", 24) << " from " << c.origin << "\n"
       << "class: " << v.cls << "\nsignature: " << v.signature << "\n";
  info << "ended: " << (r.timedOut ? "timeout" : r.signal ? signalName(r.signal) : "exit " + std::to_string(r.exitCode))
       << " after " << r.seconds << " s\nmutations:\n";
  for (const std::string& m : c.mutations) info << "  " << m << "\n";
  const fs::path replay = dir / "replay.sh";
  std::ofstream(replay) << "#!/bin/sh\n# Replays this case: TRAIN=path/to/train overrides the binary.\ncd \"$(dirname \"$0\")\" && "
                        << "OMP_NUM_THREADS=1 exec \"${TRAIN:-" << PA_TRAIN_BINARY << "}\"" << argsLine(c, ".") << "\n";
  fs::permissions(replay, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
}

// Greedy reduction of a failing case that keeps its class and signature: drop --set flags and
// optional flags, then YAML lines, then CSV rows.
FuzzCase minimise(const FuzzCase& original, const Verdict& want, const fs::path& root, const ChildLimits& lim) {
  FuzzCase best = original;
  int runs = 0;
  auto same = [&](const FuzzCase& c) {
    if (++runs > 400) return false;
    std::vector<Outcome> o = runCases({c}, root, lim);
    return o[0].v.cls == want.cls && o[0].v.signature == want.signature;
  };
  // Flags: the --set pairs and the optional ones after the eight that every case has.
  std::vector<std::pair<size_t, size_t>> groups;  // [from, to) in args
  for (size_t j = 8; j < best.args.size();) {
    const bool pair = best.args[j] == "--set" || best.args[j] == "--metrics" || best.args[j] == "--dump-graph";
    groups.emplace_back(j, std::min(best.args.size(), j + (pair ? 2 : 1)));
    j = groups.back().second;
  }
  for (auto g = groups.rbegin(); g != groups.rend(); ++g) {  // from the back: earlier indices stay valid
    FuzzCase t = best;
    t.args.erase(t.args.begin() + static_cast<std::ptrdiff_t>(g->first), t.args.begin() + static_cast<std::ptrdiff_t>(g->second));
    if (same(t)) best = t;
  }
  for (int pass = 0; pass < 3; ++pass) {
    bool changed = false;
    std::vector<std::string> ls = lines(best.yaml);
    for (size_t i = ls.size(); i-- > 0;) {
      std::vector<std::string> t = ls;
      t.erase(t.begin() + static_cast<std::ptrdiff_t>(i));
      FuzzCase c = best;
      c.yaml.clear();
      for (const std::string& l : t) c.yaml += l + "\n";
      if (same(c)) {
        best = c;
        ls = t;
        changed = true;
      }
    }
    if (!changed) break;
  }
  for (auto& f : best.files) {
    for (bool shrunk = true; shrunk;) {
      shrunk = false;
      const std::vector<std::string> ls = lines(f.second);
      if (ls.size() < 3) break;
      FuzzCase c = best;
      for (auto& g : c.files)
        if (g.first == f.first) {
          g.second.clear();
          for (size_t i = 0; i < ls.size() / 2 + 1; ++i) g.second += ls[i] + "\n";
        }
      if (same(c)) {
        best = c;
        shrunk = true;
      }
    }
  }
  best.mutations.push_back("(minimised from case " + std::to_string(original.index) + ")");
  return best;
}

struct ClassReport {
  std::string cls, signature;
  std::vector<const Outcome*> cases;
};

std::string slug(const std::string& s) {
  std::string r;
  for (char ch : s) r += std::isalnum(static_cast<unsigned char>(ch)) ? static_cast<char>(std::tolower(ch)) : '-';
  return r.substr(0, 40);
}

std::vector<FuzzCase> makeCases(uint64_t seed, const std::vector<uint64_t>& indices) {
  const CaseGenerator gen(seed, loadSeedConfigs(std::string(PA_SOURCE_DIR) + "/configs"));
  std::vector<FuzzCase> cases;
  for (uint64_t i : indices) cases.push_back(gen.make(i));
  return cases;
}

std::vector<uint64_t> caseIndices() {
  std::vector<uint64_t> idx;
  const std::string only = envStr("PA_FUZZ_CASE");
  if (!only.empty()) {
    std::stringstream ss(only);
    for (std::string t; std::getline(ss, t, ',');) idx.push_back(std::stoull(t));
    return idx;
  }
  const int64_t n = envInt("PA_FUZZ_CASES", kDefaultCases);
  for (int64_t i = 0; i < n; ++i) idx.push_back(static_cast<uint64_t>(i));
  return idx;
}

TEST(ConfigFuzz, SameSeedGivesTheSameCases) {
  std::vector<uint64_t> idx;
  for (uint64_t i = 0; i < 300; ++i) idx.push_back(i);
  const std::vector<FuzzCase> a = makeCases(24, idx), b = makeCases(24, idx), c = makeCases(25, idx);
  size_t differ = 0, mutated = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].yaml, b[i].yaml) << i;
    EXPECT_EQ(a[i].args, b[i].args) << i;
    EXPECT_EQ(a[i].files, b[i].files) << i;
    differ += a[i].yaml != c[i].yaml;
    mutated += !a[i].mutations.empty();
  }
  EXPECT_GT(differ, a.size() / 2) << "another seed should give other configs";
  EXPECT_GT(mutated, a.size() / 2);
  EXPECT_LT(mutated, a.size());  // some valid configs, which must train
}

TEST(ConfigFuzz, TrainSurvivesEveryConfig) {
  const uint64_t seed = static_cast<uint64_t>(envInt("PA_FUZZ_SEED", 24));
  const std::vector<FuzzCase> cases = makeCases(seed, caseIndices());
  const fs::path root = fs::temp_directory_path() / ("pa_fuzz_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const ChildLimits lim = limits();
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Outcome> outcomes = runCases(cases, root, lim);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!envStr("PA_FUZZ_CASE").empty())  // a replay: show each case whatever its verdict
    for (const Outcome& o : outcomes) {
      std::printf("---- case %llu from %s, mutations:", (unsigned long long)o.c.index, o.c.origin.c_str());
      for (const std::string& m : o.c.mutations) std::printf(" [%s]", m.c_str());
      std::printf("\n%s  args: train%s\n  ended: %s%s\n  stderr tail:\n%s\n", o.c.yaml.c_str(), argsLine(o.c, "{DIR}").c_str(),
                  o.r.timedOut ? "timeout" : o.r.signal ? signalName(o.r.signal).c_str() : ("exit " + std::to_string(o.r.exitCode)).c_str(),
                  o.v.cls.empty() ? "" : (" (" + o.v.cls + ")").c_str(), tail(o.r.err, 1200).c_str());
    }

  std::map<int, int> exits;
  std::map<std::pair<std::string, std::string>, ClassReport> classes;
  std::map<std::string, std::vector<uint64_t>> exit1;  // allowed, but worth a look: user mistakes should exit 2
  size_t failures = 0;
  for (const Outcome& o : outcomes) {
    ++exits[o.r.timedOut ? -2 : o.r.signal ? -1 : o.r.exitCode];
    if (o.v.cls.empty() && outOfMemoryReport(o.r.err)) exit1["out of memory (ASan's report)"].push_back(o.c.index);
    else if (o.v.cls.empty() && o.r.exitCode == 1) exit1[normalise(keyLine(o.r.err), "")].push_back(o.c.index);
    if (o.v.cls.empty()) continue;
    ++failures;
    ClassReport& c = classes[{o.v.cls, o.v.signature}];
    c.cls = o.v.cls;
    c.signature = o.v.signature;
    c.cases.push_back(&o);
  }
  std::printf("config fuzz: seed %llu, %zu configs in %.1f s (%d at a time): exit 0: %d, exit 1: %d, exit 2: %d, other "
              "exits: %d, signals: %d, timeouts: %d\n",
              (unsigned long long)seed, outcomes.size(), seconds, static_cast<int>(envInt("PA_FUZZ_JOBS", 2)), exits[0],
              exits[1], exits[2], static_cast<int>(outcomes.size()) - exits[0] - exits[1] - exits[2] - exits[-1] - exits[-2],
              exits[-1], exits[-2]);

  for (const auto& kv : exit1)
    std::printf("  exit 1 (allowed) %zu case(s), first %llu: %s\n", kv.second.size(), (unsigned long long)kv.second[0],
                kv.first.c_str());

  const std::string outDir = envStr("PA_FUZZ_OUT");
  const bool minimiseOn = !outDir.empty() && envInt("PA_FUZZ_MINIMIZE", 1) != 0;
  std::ofstream summary;
  if (!outDir.empty()) {
    fs::create_directories(outDir);
    summary.open(fs::path(outDir) / "summary.md");
    summary << "# Config fuzz: seed " << seed << ", " << outcomes.size() << " configs, " << failures << " failures in "
            << classes.size() << " classes\n\n";
  }
  size_t n = 0;
  for (const auto& kv : classes) {
    const ClassReport& c = kv.second;
    const Outcome& first = *c.cases.front();
    std::string ids;
    for (size_t i = 0; i < c.cases.size() && i < 12; ++i) ids += (i ? "," : "") + std::to_string(c.cases[i]->c.index);
    ++n;
    // Enough to reproduce the first case of each class without anything else.
    std::string text = "---- class " + std::to_string(n) + ": " + c.cls + " | " + c.signature + "\n  " +
                       std::to_string(c.cases.size()) + " case(s): " + ids + (c.cases.size() > 12 ? ",..." : "") +
                       " (replay: PA_FUZZ_CASE=" + std::to_string(first.c.index) + ")\n  first from " + first.c.origin +
                       ", mutations:";
    for (const std::string& m : first.c.mutations) text += " [" + m + "]";
    text += "\n  config.yaml:\n" + tail(first.c.yaml, 2500) + "\n  args: train" + argsLine(first.c, "{DIR}") + "\n";
    for (const auto& f : first.c.files) text += "  " + f.first + " (" + std::to_string(f.second.size()) + " bytes):\n" + tail(f.second, 300) + "\n";
    text += "  stderr tail:\n" + tail(first.r.err, 1200) + "\n";
    std::printf("%s", text.c_str());
    if (outDir.empty()) continue;
    const fs::path classDir = fs::path(outDir) / (std::to_string(n) + "-" + slug(c.cls));
    for (const Outcome* o : c.cases) writeCase(o->c, o->r, o->v, classDir / ("case-" + std::to_string(o->c.index)));
    summary << "## " << n << ". " << c.cls << ": " << c.cases.size() << " case(s)\n\n" << c.signature << "\n\nCases: " << ids
            << (c.cases.size() > 12 ? ",..." : "") << "\n\n";
    if (minimiseOn) {
      FuzzCase m = minimise(first.c, first.v, root, lim);
      std::vector<Outcome> again = runCases({m}, root, lim);
      if (again[0].v.cls != first.v.cls || again[0].v.signature != first.v.signature) {
        // A flaky failure (undefined behaviour often is): keep the case as it first failed.
        m = first.c;
        m.mutations.push_back("(not reduced: the reduced case did not fail the same way when run again)");
        again = {first};
      }
      writeCase(m, again[0].r, again[0].v, classDir / "minimal");
      summary << "Minimal (`" << (classDir / "minimal" / "replay.sh").string() << "`): `train" << argsLine(m, "{DIR}")
              << "`\n\n```yaml\n" << m.yaml << "```\n\n";
      for (const auto& f : m.files) summary << f.first << ":\n```\n" << tail(f.second, 400) << "\n```\n\n";
      summary << "stderr:\n```\n" << tail(again[0].r.err, 600) << "\n```\n\n";
    }
  }
  fs::remove_all(root);

  std::string table;
  for (const auto& kv : classes)
    table += "  " + std::to_string(kv.second.cases.size()) + "\t" + kv.second.cls + " | " + kv.second.signature + "\n";
  EXPECT_EQ(failures, 0u) << failures << " of " << outcomes.size() << " configs failed, in " << classes.size()
                          << " classes (count, class | signature):\n"
                          << table << "Set PA_FUZZ_OUT=DIR to keep every failing case with a replay.sh.";
}

}  // namespace
}  // namespace pa::fuzz
