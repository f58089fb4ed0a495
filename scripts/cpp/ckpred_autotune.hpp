// ckpred_autotune.hpp: tune on first call from C++ -- benchmark a few of the model's top kernels,
// keep the fastest, and remember it in the result store the Python runtime shares.
//
// Same rules and file format as ckpred/autotune/store.py (docs/autotune.md):
//   * load_model_info verifies the export exactly as ckpred_select and the Python runtime do
//     (manifest.hpp's verify_export: sha256s, the embedded manifest, the calibration, the
//     catalogue hash) and keeps what the store needs, the catalogue's kernel names included;
//   * candidates (valid kernels, model order, e.g. ckpred_select's answer) are benchmarked by the
//     caller's std::function until the budget is spent; a benchmark that throws or returns a
//     non-finite or non-positive time is recorded and skipped; with a timeout, each call runs in
//     its own thread and one that does not return in time stops the search (see autotune_ranked);
//   * budgets: fixed k successes, a time budget (kernel seconds or wall seconds), or a confidence
//     budget sized, once per problem, by the calibration exported in manifest.json ("autotune":
//     a logistic model of the score gaps and the problem's fields, or a score-gap table; its
//     fallback_k where it has nothing to learn, at least fallback_k for a problem outside the
//     training ranges or an arch never trained on: shift_of); every budget stops at
//     max_benchmarks calls and, once spent, continues only while nothing succeeded;
//   * the store: JSON lines ("format":"ckpred.autotune/1"), keyed by (model sha256, op, problem),
//     appended under an exclusive flock on <store>.lock, compacted past 2 * max_entries lines
//     into an exclusively created, unpredictably named temporary file; a regular file, never
//     opened through a symbolic link; a line is served only when it checks against the model.
// Header-only; needs json.hpp, manifest.hpp, sha256.hpp (this directory) and POSIX.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "json.hpp"
#include "manifest.hpp"

namespace ckpred {
namespace autotune {

inline const char* kStoreFormat = "ckpred.autotune/1";
using ckpred::kCalibrationFormat;
using ckpred::kLogisticFormat;
// Longest store line read and deepest nesting, as ckpred.autotune (MAX_LINE_BYTES, MAX_LINE_DEPTH).
constexpr size_t kMaxLineBytes = size_t(1) << 20;
constexpr int kMaxLineDepth = 8;
// A compaction file older than this is removed by the next compaction (ckpred.autotune.STALE_TEMP_S).
constexpr double kStaleTempSeconds = 3600.0;

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Measurement {
  int64_t kernel_id = -1;
  std::string kernel;
  double seconds = std::numeric_limits<double>::quiet_NaN();  // NaN: failed
  std::string error;
  bool ok() const { return !std::isnan(seconds); }
};

struct Result {
  std::string problem;
  std::string kernel;  // empty: nothing measured successfully
  int64_t kernel_id = -1;
  double seconds = std::numeric_limits<double>::quiet_NaN();
  std::vector<Measurement> measured;
  bool from_store = false;
  std::string policy, stop;
  bool stored = false;      // the answer is in the store (read from it, or written by this call)
  std::string store_error;  // why writing it failed (the measurements are here all the same)
  bool timed_out = false;   // a benchmark call did not return within the timeout
  bool ok() const { return !kernel.empty(); }
};

// One ranked candidate (a valid kernel, best first).
struct Candidate {
  int64_t id;
  std::string name;
  double score;
};

// Top score minus the gap_to-th highest (infinite with fewer finite scores).
inline double score_gap(const std::vector<double>& scores, size_t gap_to = 2) {
  std::vector<double> s;
  for (double v : scores)
    if (std::isfinite(v)) s.push_back(v);
  if (s.size() < gap_to) return std::numeric_limits<double>::infinity();
  std::partial_sort(s.begin(), s.begin() + static_cast<long>(gap_to), s.end(), std::greater<double>());
  return s[0] - s[gap_to - 1];
}

// The confidence budget's stated fixed k where its calibration cannot size it (ckpred.autotune.FALLBACK_K).
constexpr int kFallbackK = 5;

// What either calibration carries besides its model (ckpred.autotune._policy): the tolerances it has
// nothing to learn at (the budget spends fallback_k there), the fallback k, and whether it was fitted
// on GPUs the folds never trained on.
struct Policy {
  std::vector<double> uninformative;
  int fallback_k = kFallbackK;
  bool zero_shot = false;

  static Policy from_json(const json::Value& v) {  // after check_calibration
    Policy p;
    if (v.has("fallback_k")) p.fallback_k = static_cast<int>(std::min<int64_t>(v.o.at("fallback_k").int64(), 1000000));
    if (v.has("uninformative_within"))
      for (const auto& x : v.o.at("uninformative_within").arr()) p.uninformative.push_back(x.num());
    if (v.has("zero_shot")) p.zero_shot = v.o.at("zero_shot").b;
    return p;
  }
  bool uninformative_at(double within) const {
    return std::find(uninformative.begin(), uninformative.end(), within) != uninformative.end();
  }
};

// P(best of the top j within `within` of the best kernel) by score-gap bin (see ckpred.autotune.Calibration).
struct Calibration {
  std::vector<double> within, edges;
  std::vector<std::vector<std::vector<double>>> probability;  // [within][bin][j-1]
  size_t gap_to = 2;
  Policy policy;

  // Parse a score-gap table after manifest.hpp's check_calibration (the Python runtime's checks).
  static Calibration from_json(const json::Value& v) {
    try {
      if (v.is_null() || !v.has("format") || !v.o.at("format").is_string() || v.o.at("format").s != kCalibrationFormat)
        throw ckpred::CalibrationError(std::string("autotune calibration: expected format '") + kCalibrationFormat + "'");
      ckpred::check_calibration(v, nullptr);
    } catch (const ckpred::CalibrationError& e) {
      throw Error(e.what());
    }
    Calibration c;
    for (const auto& x : v["within"].arr()) c.within.push_back(x.num());
    for (const auto& x : v["edges"].arr()) c.edges.push_back(x.num());
    if (v.has("gap_to")) c.gap_to = static_cast<size_t>(v.o.at("gap_to").int64());
    for (const auto& table : v["probability"].arr()) {
      std::vector<std::vector<double>> t;
      for (const auto& row : table.arr()) {
        std::vector<double> r;
        for (const auto& p : row.arr()) r.push_back(p.num());
        t.push_back(r);
      }
      c.probability.push_back(t);
    }
    c.policy = Policy::from_json(v);
    return c;
  }

  int needed(const std::vector<double>& scores, double target, double within_) const {
    auto it = std::find(within.begin(), within.end(), within_);
    if (it == within.end()) throw Error("autotune calibration: no table for within=" + std::to_string(within_));
    if (policy.uninformative_at(within_)) return policy.fallback_k;
    const auto& table = probability[static_cast<size_t>(it - within.begin())];
    if (scores.size() < 2) return 1;
    double gap = score_gap(scores, gap_to);
    size_t bin = static_cast<size_t>(std::upper_bound(edges.begin(), edges.end(), gap) - edges.begin());
    const auto& row = table[bin];
    for (size_t j = 0; j < row.size(); ++j)
      if (row[j] >= target) return static_cast<int>(j + 1);
    return static_cast<int>(row.size());
  }
};

// The key's field values: "n=1,c=256,..." (problem_key) -> {"n": 1, "c": 256, ...}.
inline std::map<std::string, double> key_values(const std::string& key) {
  std::map<std::string, double> out;
  size_t s = 0;
  while (s < key.size()) {
    size_t e = key.find(',', s);
    if (e == std::string::npos) e = key.size();
    std::string pair = key.substr(s, e - s);
    size_t eq = pair.find('=');
    if (eq != std::string::npos) out[pair.substr(0, eq)] = std::strtod(pair.c_str() + eq + 1, nullptr);
    s = e + 1;
  }
  return out;
}

// P(best of the top j within `within` of the best kernel) from a logistic model per (within, j)
// on the score gaps and the problem's size (see ckpred.autotune.LogisticCalibration).
struct Logistic {
  std::vector<double> within, fill, lo, hi, mean, scale;
  std::vector<std::string> fields;
  std::vector<std::vector<std::vector<double>>> coef;  // [within][j-1][feature]
  std::vector<std::vector<double>> intercept;          // [within][j-1]
  Policy policy;

  static std::vector<double> numbers(const json::Value& v) {
    std::vector<double> out;
    for (const auto& x : v.arr()) out.push_back(x.num());
    return out;
  }

  // Parse a logistic model after manifest.hpp's check_calibration (the Python runtime's checks).
  static Logistic from_json(const json::Value& v) {
    try {
      if (v.is_null() || !v.has("format") || !v.o.at("format").is_string() || v.o.at("format").s != kLogisticFormat)
        throw ckpred::CalibrationError(std::string("autotune calibration: expected format '") + kLogisticFormat + "'");
      ckpred::check_calibration(v, nullptr);
    } catch (const ckpred::CalibrationError& e) {
      throw Error(e.what());
    }
    Logistic c;
    c.within = numbers(v["within"]), c.fill = numbers(v["fill"]), c.lo = numbers(v["lo"]), c.hi = numbers(v["hi"]);
    c.mean = numbers(v["mean"]), c.scale = numbers(v["scale"]);
    for (const auto& f : v["fields"].arr()) c.fields.push_back(f.str());
    for (const auto& t : v["coef"].arr()) {
      std::vector<std::vector<double>> rows;
      for (const auto& r : t.arr()) rows.push_back(numbers(r));
      c.coef.push_back(rows);
    }
    for (const auto& r : v["intercept"].arr()) c.intercept.push_back(numbers(r));
    c.policy = Policy::from_json(v);
    return c;
  }

  // ckpred.autotune.signal_features, then fill / clip / standardise.
  std::vector<double> features(const std::vector<double>& scores, const std::map<std::string, double>& problem) const {
    std::vector<double> s;
    for (double x : scores)
      if (std::isfinite(x)) s.push_back(x);
    std::sort(s.begin(), s.end(), std::greater<double>());
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> f;
    for (size_t g = 2; g <= 5; ++g) f.push_back(s.size() >= g ? s[0] - s[g - 1] : nan);
    f.push_back(s.empty() ? nan : s[0]);
    double sd = nan;
    if (!s.empty()) {
      size_t m = std::min<size_t>(5, s.size());
      double mu = 0, var = 0;
      for (size_t i = 0; i < m; ++i) mu += s[i];
      mu /= static_cast<double>(m);
      for (size_t i = 0; i < m; ++i) var += (s[i] - mu) * (s[i] - mu);
      sd = std::sqrt(var / static_cast<double>(m));
    }
    f.push_back(sd);
    f.push_back(static_cast<double>(s.size()));
    double size = 0;
    for (const auto& name : fields) {
      auto it = problem.find(name);
      if (it == problem.end()) throw Error("autotune calibration: the problem has no field '" + name + "'");
      double l = std::log2(1.0 + std::fabs(it->second));
      f.push_back(l);
      size += l;
    }
    f.push_back(size);
    for (size_t i = 0; i < f.size(); ++i) {
      double x = std::isnan(f[i]) ? fill[i] : f[i];
      x = std::min(std::max(x, lo[i]), hi[i]);
      f[i] = (x - mean[i]) / scale[i];
    }
    return f;
  }

  int needed(const std::vector<double>& scores, const std::map<std::string, double>& problem, double target,
             double within_) const {
    auto it = std::find(within.begin(), within.end(), within_);
    if (it == within.end()) throw Error("autotune calibration: no table for within=" + std::to_string(within_));
    if (policy.uninformative_at(within_)) return policy.fallback_k;
    if (scores.size() < 2) return 1;
    size_t w = static_cast<size_t>(it - within.begin());
    std::vector<double> x = features(scores, problem);
    double best = 0;
    for (size_t j = 0; j < intercept[w].size(); ++j) {
      double z = intercept[w][j];
      for (size_t i = 0; i < x.size(); ++i) z += coef[w][j][i] * x[i];
      best = std::max(best, 1.0 / (1.0 + std::exp(-z)));  // non-decreasing in j
      if (best >= target) return static_cast<int>(j + 1);
    }
    return static_cast<int>(intercept[w].size());
  }
};

struct Budget {
  enum class Kind { Fixed, Time, Confidence } kind = Kind::Fixed;
  int k = 2;                  // Fixed
  double seconds = 1.0;       // Time
  bool wall = false;          // Time: wall seconds inside benchmark instead of kernel seconds
  double target = 0.95;       // Confidence
  double within = 0.05;       // Confidence
  const Calibration* calibration = nullptr;  // Confidence: the score-gap table, or
  const Logistic* logistic = nullptr;        // the logistic model
  int max_benchmarks = 16;

  static Budget fixed(int k, int max_benchmarks = 16) {
    if (k < 1 || max_benchmarks < 1) throw Error("fixed budget: k and max_benchmarks must be >= 1");
    Budget b;
    b.kind = Kind::Fixed, b.k = k, b.max_benchmarks = max_benchmarks;
    return b;
  }
  static Budget time(double seconds, bool wall = false, int max_benchmarks = 16) {
    if (!(std::isfinite(seconds) && seconds > 0)) throw Error("time budget: seconds must be finite and > 0");
    Budget b;
    b.kind = Kind::Time, b.seconds = seconds, b.wall = wall, b.max_benchmarks = max_benchmarks;
    return b;
  }
  static Budget confidence(double target, double within, const Calibration* cal, int max_benchmarks = 16,
                           const Logistic* logistic = nullptr) {
    if (!(target > 0 && target <= 1)) throw Error("confidence budget: target must be in (0, 1]");
    if (cal == nullptr && logistic == nullptr)
      throw Error("confidence budget: the model's manifest has no autotune calibration");
    const auto& ws = cal ? cal->within : logistic->within;
    if (std::find(ws.begin(), ws.end(), within) == ws.end())
      throw Error("confidence budget: no calibration for within=" + std::to_string(within));
    Budget b;
    b.kind = Kind::Confidence, b.target = target, b.within = within, b.calibration = cal, b.logistic = logistic;
    b.max_benchmarks = max_benchmarks;
    return b;
  }
  // The confidence budget with whichever calibration the model's manifest carries.
  template <class Info>
  static Budget confidence(double target, double within, const Info& info, int max_benchmarks = 16) {
    return confidence(target, within, info.calibration ? &*info.calibration : nullptr, max_benchmarks,
                      info.logistic ? &*info.logistic : nullptr);
  }

  const Policy& policy() const { return logistic != nullptr ? logistic->policy : calibration->policy; }

  // Successful measurements a confidence budget wants for this problem (its key and ranked
  // scores); `shifted`: outside what the calibration measured, at least fallback_k (size_confidence).
  int planned(const std::vector<double>& scores, const std::string& problem, bool shifted = false) const {
    int k = logistic != nullptr ? logistic->needed(scores, key_values(problem), target, within)
                                : calibration->needed(scores, target, within);
    return shifted ? std::max(k, policy().fallback_k) : k;
  }

  bool spent(const std::vector<double>& scores, int successes, double kernel_s, double wall_s) const {
    switch (kind) {
      case Kind::Fixed: return successes >= k;
      case Kind::Time: return (wall ? wall_s : kernel_s) >= seconds;
      case Kind::Confidence: return successes >= planned(scores, "");  // autotune_ranked sizes it per problem
    }
    return true;
  }

  std::string describe() const {
    std::ostringstream o;
    o << std::defaultfloat;
    if (kind == Kind::Fixed) o << "fixed(k=" << k << ")";
    else if (kind == Kind::Time) o << "time(" << (wall ? "wall" : "kernel") << "=" << seconds << "s)";
    else o << "confidence(target=" << target << ",within=" << within << ")";
    return o.str();
  }
};

using Benchmark = std::function<double(const Candidate&)>;

namespace detail {

struct Call {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  double value = 0;
  std::string error;
};

// One benchmark call, in the caller's thread (timeout <= 0) or in a thread of its own waited for
// at most `timeout` seconds. C++ cannot stop a running call: one that times out is detached and
// left running; its thread owns copies of the benchmark and the candidate, discards the result
// when the call returns, and ends. (So what the benchmark captures by reference must outlive it.)
// Returns false on a timeout.
inline bool call(const Benchmark& bench, const Candidate& c, double timeout, double& value, std::string& error) {
  auto run = [](const Benchmark& b, const Candidate& k, double& v, std::string& err) {
    try {
      v = b(k);
    } catch (const std::exception& e) {
      err = std::string("exception: ") + e.what();
    } catch (...) {
      err = "exception: unknown";
    }
  };
  if (!(timeout > 0)) {
    run(bench, c, value, error);
    return true;
  }
  auto state = std::make_shared<Call>();
  std::thread t([state, bench, c, run] {
    double v = 0;
    std::string err;
    run(bench, c, v, err);
    std::lock_guard<std::mutex> lock(state->m);
    state->value = v, state->error = err, state->done = true;
    state->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state->m);
  bool done = state->cv.wait_for(lock, std::chrono::duration<double>(timeout), [&] { return state->done; });
  lock.unlock();
  if (!done) {
    t.detach();
    return false;
  }
  t.join();
  value = state->value, error = state->error;
  return true;
}

inline std::string seconds_text(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

}  // namespace detail

// The store-free search (ckpred.autotune.autotune_ranked). With timeout_s > 0 each benchmark
// call runs in its own thread (detail::call); a call still running after timeout_s is recorded
// as failed ("TimeoutError: ..."), the search stops there (nothing else is launched while the
// device may still run it) and the best kernel measured so far is the result (timed_out set).
// A confidence budget is sized as ckpred.autotune.size_confidence sizes it: the calibration's k,
// fallback_k where the calibration has nothing to learn ("+fallback(k=K)"), at least fallback_k
// when `shift` (why the problem is outside what it measured, shift_of) is not empty ("+shifted(k>=K)").
inline Result autotune_ranked(const std::vector<Candidate>& ranked, const Benchmark& benchmark, const Budget& budget,
                              const std::string& problem = "", double timeout_s = 0, const std::string& shift = "") {
  if (std::isnan(timeout_s) || std::isinf(timeout_s) || timeout_s < 0)
    throw Error("timeout " + detail::seconds_text(timeout_s) + "; allowed: 0 (none) or a finite number of seconds > 0");
  Result r;
  r.problem = problem;
  r.policy = budget.describe();
  std::vector<double> scores;
  for (const auto& c : ranked) scores.push_back(c.score);
  Budget sized = budget;  // a confidence budget is sized once per problem, as a fixed count
  if (budget.kind == Budget::Kind::Confidence) {
    sized.kind = Budget::Kind::Fixed, sized.k = budget.planned(scores, problem, !shift.empty());
    const Policy& p = budget.policy();
    if (p.uninformative_at(budget.within)) r.policy += "+fallback(k=" + std::to_string(p.fallback_k) + ")";
    else if (!shift.empty()) r.policy += "+shifted(k>=" + std::to_string(p.fallback_k) + ")";
  }
  int successes = 0;
  double kernel_s = 0, wall_s = 0;
  r.stop = ranked.empty() ? "no valid kernel" : "candidates exhausted";
  bool stopped = false;
  for (const auto& c : ranked) {
    if (successes && sized.spent(scores, successes, kernel_s, wall_s)) {
      r.stop = "budget spent", stopped = true;
      break;
    }
    if (static_cast<int>(r.measured.size()) >= budget.max_benchmarks) {
      r.stop = "max_benchmarks=" + std::to_string(budget.max_benchmarks) + " reached", stopped = true;
      break;
    }
    Measurement m;
    m.kernel_id = c.id;
    m.kernel = c.name;
    auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    std::string error;
    bool returned = detail::call(benchmark, c, timeout_s, s, error);
    wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!returned) {
      m.error = "TimeoutError: no result after " + detail::seconds_text(timeout_s) + " s (the call was left running)";
    } else if (!error.empty()) {
      m.error = error;
    } else if (std::isfinite(s) && s > 0) {
      m.seconds = s;
    } else {
      std::ostringstream o;
      o << "non-finite or non-positive time " << s;
      m.error = o.str();
    }
    if (m.ok()) ++successes, kernel_s += m.seconds;
    r.measured.push_back(m);
    if (!returned) {
      r.stop = "benchmark of " + c.name + " timed out after " + detail::seconds_text(timeout_s) + " s: search stopped";
      r.timed_out = stopped = true;
      break;
    }
  }
  if (!stopped) {
    if (successes && sized.spent(scores, successes, kernel_s, wall_s)) r.stop = "budget spent";
    else if (static_cast<int>(r.measured.size()) >= budget.max_benchmarks)
      r.stop = "max_benchmarks=" + std::to_string(budget.max_benchmarks) + " reached";
  }
  const Measurement* best = nullptr;
  for (const auto& m : r.measured)
    if (m.ok() && (best == nullptr || m.seconds < best->seconds)) best = &m;
  if (best == nullptr) {
    if (!r.measured.empty()) r.stop += ": all " + std::to_string(r.measured.size()) + " benchmarks failed";
    return r;
  }
  r.kernel = best->kernel, r.kernel_id = best->kernel_id, r.seconds = best->seconds;
  return r;
}

// ---- JSON writing -------------------------------------------------------------------------------
inline std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out + "\"";
}

inline std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

inline std::string now_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The problem key: field=value pairs in the manifest's problem-field order (a category field as
// its code, the index of its value in the manifest's categories, as the selector graph takes it).
inline std::string problem_key(const std::vector<std::string>& fields, const std::vector<int64_t>& values) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) out += (i ? "," : "") + fields[i] + "=" + std::to_string(values.at(i));
  return out;
}

// What autotuning needs from a verified export.
struct ModelInfo {
  std::string model, op, arch, dtype, layout;  // model: sha256 of the selector graph
  std::vector<std::string> fields;
  std::vector<std::string> kernel_names;   // the catalogue, by kernel id (a stored kernel must be here)
  std::optional<Calibration> calibration;  // the manifest's "autotune": a score-gap table,
  std::optional<Logistic> logistic;        // or a logistic model
  std::vector<ckpred::Field> problem_fields;  // with their training ranges
  std::vector<std::string> trained_archs;     // training.archs (empty: not recorded)
};

// Why a problem (its key) is outside what the confidence calibration measured, "" when it is not
// (ckpred.autotune.shift_of): an int field outside its training range, or a selector arch not
// among the GPUs trained on (unless the calibration was fitted on held-out GPUs).
inline std::string shift_of(const ModelInfo& info, const std::string& problem) {
  std::map<std::string, double> values = key_values(problem);
  std::string outside;
  for (const auto& f : info.problem_fields) {
    auto it = values.find(f.name);
    if (f.has_range && it != values.end() && (it->second < static_cast<double>(f.lo) || it->second > static_cast<double>(f.hi)))
      outside += (outside.empty() ? "" : ", ") + f.name;
  }
  std::string out = outside.empty() ? "" : "out of distribution (" + outside + ")";
  bool zero_shot = info.logistic ? info.logistic->policy.zero_shot : info.calibration && info.calibration->policy.zero_shot;
  if (!info.trained_archs.empty() && !zero_shot &&
      std::find(info.trained_archs.begin(), info.trained_archs.end(), info.arch) == info.trained_archs.end())
    out += (out.empty() ? "" : "; ") + ("arch " + info.arch + " never trained on");
  return out;
}

// Verify the export as ckpred_select and the Python runtime do (manifest.hpp's verify_export)
// and keep what autotuning needs. Error "model refused: ..." names what failed.
inline ModelInfo load_model_info(const std::string& model_dir) {
  ckpred::Export ex;
  try {
    ex = ckpred::verify_export(model_dir);
  } catch (const ckpred::ModelError& e) {
    throw Error(std::string("model refused: ") + e.what());
  }
  const ckpred::Manifest& m = ex.man;
  ModelInfo info;
  info.model = m.selector_sha256;
  info.op = m.ident.at("op"), info.arch = m.ident.at("arch"), info.dtype = m.ident.at("dtype"), info.layout = m.ident.at("layout");
  for (const auto& f : m.fields) info.fields.push_back(f.name);
  info.kernel_names = m.kernel_names;
  info.problem_fields = m.fields, info.trained_archs = m.trained_archs;
  auto it = m.doc.o.find("autotune");
  if (it != m.doc.o.end() && !it->second.is_null()) {  // checked by verify_export
    if (it->second["format"].str() == kLogisticFormat) info.logistic = Logistic::from_json(it->second);
    else info.calibration = Calibration::from_json(it->second);
  }
  return info;
}

// ---- the store ----------------------------------------------------------------------------------
struct Entry {
  std::string model, op, problem, kernel, policy, line;  // line: the raw JSON line (kept verbatim)
  int64_t kernel_id = -1;
  double seconds = 0;
};

using Warn = std::function<void(const std::string&)>;
inline void warn_to_stderr(const std::string& message) { std::cerr << "ckpred autotune: " << ckpred::printable(message) << "\n"; }

// True when a line nests arrays/objects deeper than kMaxLineDepth (brackets in strings do not count).
inline bool too_deep(const std::string& line) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : line) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') in_string = true;
    else if (ch == '[' || ch == '{') {
      if (++depth > kMaxLineDepth) return true;
    } else if (ch == ']' || ch == '}') --depth;
  }
  return false;
}

// What is wrong with one parsed store line ("" when it is a well-formed entry), as
// ckpred.autotune.check_entry; fills `e`.
inline std::string check_entry(const json::Value& v, Entry& e) {
  if (!v.is_object()) return "not a JSON object";
  auto str = [&](const char* key, std::string& out) -> std::string {
    auto it = v.o.find(key);
    if (it == v.o.end() || !it->second.is_string() || it->second.s.empty())
      return std::string(key) + " is " + (it == v.o.end() ? std::string("missing") : ckpred::show(it->second)) + "; expected a non-empty string";
    out = it->second.s;
    return "";
  };
  std::string format;
  if (!v.has("format") || !v.o.at("format").is_string() || v.o.at("format").s != kStoreFormat)
    return std::string("format ") + (v.has("format") ? ckpred::show(v.o.at("format")) : "missing") + ", expected '" + kStoreFormat + "'";
  for (auto [key, out] : {std::pair<const char*, std::string*>{"model", &e.model}, {"op", &e.op}, {"problem", &e.problem},
                          {"kernel", &e.kernel}}) {
    std::string why = str(key, *out);
    if (!why.empty()) return why;
  }
  auto id = v.o.find("kernel_id");
  bool ok = id != v.o.end() && id->second.is_int();
  try {
    if (ok) e.kernel_id = id->second.int64();
  } catch (const json::Error&) {
    ok = false;
  }
  if (!ok || e.kernel_id < 0)
    return "kernel_id is " + (id == v.o.end() ? std::string("missing") : ckpred::show(id->second)) + "; expected an integer >= 0";
  auto sec = v.o.find("seconds");
  if (sec == v.o.end() || sec->second.kind != json::Value::Kind::Number || !std::isfinite(sec->second.n) || !(sec->second.n > 0))
    return "seconds is " + (sec == v.o.end() ? std::string("missing") : ckpred::show(sec->second)) + "; expected a finite number > 0";
  e.seconds = sec->second.n;
  auto p = v.o.find("policy");
  if (p != v.o.end() && p->second.is_string()) e.policy = p->second.s;
  return "";
}

class ResultStore {
 public:
  explicit ResultStore(std::string path, size_t max_entries = 10000, Warn warn = warn_to_stderr)
      : path_(std::move(path)), max_entries_(max_entries), warn_(std::move(warn)) {
    if (path_.empty()) throw Error("ResultStore: an empty path; allowed: a file path");
    if (max_entries_ < 1) throw Error("ResultStore: max_entries must be >= 1");
  }

  const std::string& path() const { return path_; }
  std::string lock_path() const { return path_ + ".lock"; }
  size_t skipped_lines() const { return skipped_; }
  void warn(const std::string& message) const {
    if (warn_) warn_(message);
  }

  // Refuse a store this process cannot append to, before anything is measured (as Python's
  // ResultStore.check): a directory, FIFO or device, a symbolic link, a read-only file, a lock
  // path that is not a file, a directory that is not writable. A full disk shows at put().
  void check() const {
    for (const auto& [p, what, flags] : {std::tuple<std::string, std::string, int>{path_, "store", O_WRONLY | O_APPEND},
                                         {lock_path(), "store lock", O_RDWR}}) {
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) continue;  // the directory check below names it
        throw Error("cannot use " + what + " " + p + ": " + std::strerror(errno));
      }
      if (!S_ISREG(st.st_mode)) throw Error(refusal(p, what, st.st_mode));
      int fd = ::open(p.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) throw Error("cannot " + std::string(what == "store" ? "append to " : "open ") + what + " " + p + ": " + std::strerror(errno));
      ::close(fd);
    }
    std::string dir = parent(path_);
    struct stat st {};
    while (::stat(dir.c_str(), &st) != 0 && dir != "/" && dir != ".") dir = parent(dir);
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw Error("cannot create store " + path_ + ": " + dir + " is not a directory");
    bool both = ::access(path_.c_str(), F_OK) == 0 && ::access(lock_path().c_str(), F_OK) == 0;
    if (!both && ::access(dir.c_str(), W_OK | X_OK) != 0)
      throw Error("cannot create store " + path_ + ": directory " + dir + " is not writable");
  }

  // Newest well-formed entry of (model, op, problem); entries of any other model never match
  // (and are not parsed).
  std::optional<Entry> get(const std::string& model, const std::string& op, const std::string& problem) {
    std::optional<Entry> found;
    scan(&model, [&](Entry&& e) {
      if (e.model == model && e.op == op && e.problem == problem) found = std::move(e);
    });
    return found;
  }

  // The newest entry of (info's model, op, problem) when its kernel id is in the model's
  // catalogue under that name; otherwise nothing (and a warning): the caller benchmarks.
  std::optional<Entry> get(const ModelInfo& info, const std::string& problem) {
    std::optional<Entry> hit = get(info.model, info.op, problem);
    if (!hit) return hit;
    std::string why;
    if (hit->kernel_id >= static_cast<int64_t>(info.kernel_names.size()))
      why = "kernel_id " + std::to_string(hit->kernel_id) + " is not in the model's catalogue of " +
            std::to_string(info.kernel_names.size()) + " kernels";
    else if (info.kernel_names[static_cast<size_t>(hit->kernel_id)] != hit->kernel)
      why = "kernel_id " + std::to_string(hit->kernel_id) + " is '" + info.kernel_names[static_cast<size_t>(hit->kernel_id)] +
            "' in the model's catalogue, the line says '" + hit->kernel.substr(0, 80) + "'";
    if (why.empty()) return hit;
    warn(path_ + ": skipped the stored answer for " + problem + " (" + why + "); benchmarking");
    return std::nullopt;
  }

  // Current entries (last per key), oldest first.
  std::vector<Entry> entries() {
    std::vector<Entry> all;
    scan(nullptr, [&](Entry&& e) { all.push_back(std::move(e)); });
    return latest(all);
  }

  void put(const ModelInfo& info, const Result& r) {
    std::ostringstream o;
    o << "{\"format\":" << quote(kStoreFormat) << ",\"model\":" << quote(info.model) << ",\"op\":" << quote(info.op)
      << ",\"arch\":" << quote(info.arch) << ",\"dtype\":" << quote(info.dtype) << ",\"layout\":" << quote(info.layout)
      << ",\"problem\":" << quote(r.problem) << ",\"kernel_id\":" << r.kernel_id << ",\"kernel\":" << quote(r.kernel)
      << ",\"seconds\":" << number(r.seconds) << ",\"policy\":" << quote(r.policy) << ",\"measured\":[";
    for (size_t i = 0; i < r.measured.size(); ++i) {
      const auto& m = r.measured[i];
      o << (i ? "," : "") << "{\"kernel_id\":" << m.kernel_id << ",\"kernel\":" << quote(m.kernel);
      if (m.ok()) o << ",\"seconds\":" << number(m.seconds) << "}";
      else o << ",\"error\":" << quote(m.error.substr(0, 500)) << "}";
    }
    o << "],\"created\":" << quote(now_utc()) << ",\"writer\":\"cpp\"}\n";
    std::string line = o.str();
    if (line.size() > kMaxLineBytes) throw Error("store entry refused: longer than " + std::to_string(kMaxLineBytes) + " bytes");
    append(line);
  }

  void compact() {
    Lock lock(*this);
    compact_locked();
  }

 private:
  struct Lock {
    int fd;
    explicit Lock(const ResultStore& store) : fd(-1) {
      store.make_parent();
      std::string p = store.lock_path();
      fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
      if (fd < 0) throw Error(store.open_failure(p, "store lock", "open", errno));
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(store.refusal(p, "store lock", st.st_mode));
      }
      if (::flock(fd, LOCK_EX) != 0) {
        ::close(fd);
        throw Error("cannot lock " + p + ": " + std::strerror(errno));
      }
    }
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    ~Lock() { ::close(fd); }
  };

  static std::string parent(const std::string& p) {
    size_t slash = p.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : p.substr(0, slash);
  }

  std::string refusal(const std::string& p, const std::string& what, mode_t mode) const {
    return what + " " + p + ": " + (S_ISLNK(mode) ? std::string("a symbolic link (a store is never used through one)") : ckpred::file_kind(mode)) +
           "; allowed: a regular file (or a path that does not exist yet)";
  }

  std::string open_failure(const std::string& p, const std::string& what, const std::string& doing, int err) const {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return refusal(p, what, st.st_mode);
    return "cannot " + doing + " " + what + " " + p + ": " + std::strerror(err);
  }

  void make_parent() const {  // mkdir -p of the store's directory, as Python's put
    std::string dir = parent(path_);
    std::vector<std::string> missing;
    struct stat st {};
    while (dir != "/" && dir != "." && ::stat(dir.c_str(), &st) != 0) missing.push_back(dir), dir = parent(dir);
    for (auto it = missing.rbegin(); it != missing.rend(); ++it)
      if (::mkdir(it->c_str(), 0755) != 0 && errno != EEXIST)
        throw Error("cannot create the directory of store " + path_ + ": " + std::strerror(errno));
  }

  // Open the store (never through a symlink, never waiting on a FIFO), checked to be a regular
  // file; -1 when it does not exist and `flags` does not create it.
  int open_store(int flags, const std::string& doing) const {
    int fd = ::open(path_.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (errno == ENOENT && !(flags & O_CREAT)) return -1;
      throw Error(open_failure(path_, "store", doing, errno));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(refusal(path_, "store", st.st_mode));
    }
    return fd;
  }

  void skip(size_t lineno, const std::string& why) {
    ++skipped_;
    if (warned_.insert(lineno).second) warn(path_ + ":" + std::to_string(lineno) + ": skipped a store line (" + why.substr(0, 300) + ")");
  }

  // Every complete line of the file in bounded blocks; a line is parsed only when it mentions
  // `model` (nullptr: every line), is at most kMaxLineBytes long and at most kMaxLineDepth deep,
  // and `on_entry` sees it only when check_entry passes. Counts the file's lines in lines_.
  template <class F>
  void scan(const std::string* model, F on_entry) {
    int fd = open_store(O_RDONLY, "read");
    lines_ = 0;
    if (fd < 0) return;
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    ::fstat(fd, &st);
    if (st.st_ino != ino_ || st.st_dev != dev_) warned_.clear(), ino_ = st.st_ino, dev_ = st.st_dev;
    std::string carry;
    bool long_line = false;
    std::vector<char> buf(size_t(1) << 20);
    for (off_t pos = 0; pos < st.st_size;) {
      ssize_t n = ::pread(fd, buf.data(), std::min<off_t>(static_cast<off_t>(buf.size()), st.st_size - pos), pos);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error("cannot read store " + path_ + ": " + std::strerror(errno));
      }
      if (n == 0) break;
      pos += n;
      size_t start = 0, len = static_cast<size_t>(n);
      for (;;) {
        const char* nl = static_cast<const char*>(std::memchr(buf.data() + start, '\n', len - start));
        if (nl == nullptr) {
          if (!long_line) carry.append(buf.data() + start, len - start);
          if (carry.size() > kMaxLineBytes) carry.clear(), long_line = true;
          break;
        }
        size_t end = static_cast<size_t>(nl - buf.data());
        ++lines_;
        if (long_line) {
          long_line = false;
          skip(lines_, "longer than " + std::to_string(kMaxLineBytes) + " bytes");
        } else {
          carry.append(buf.data() + start, end - start);
          take(carry, model, on_entry);
        }
        carry.clear();
        start = end + 1;
      }
    }
  }

  template <class F>
  void take(const std::string& line, const std::string* model, F& on_entry) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) return;
    if (model != nullptr && line.find(*model) == std::string::npos) return;  // another model's line: not parsed
    std::string why;
    Entry e;
    if (line.size() > kMaxLineBytes) why = "longer than " + std::to_string(kMaxLineBytes) + " bytes";
    else if (too_deep(line)) why = "nested deeper than " + std::to_string(kMaxLineDepth);
    else {
      try {
        why = check_entry(json::parse(line), e);
      } catch (const json::Error& err) {
        why = std::string("does not parse: ") + err.what();
      }
    }
    if (!why.empty()) return skip(lines_, why);
    e.line = line;
    on_entry(std::move(e));
  }

  static std::vector<Entry> latest(const std::vector<Entry>& all) {
    std::map<std::string, size_t> last;  // key -> index of its last line
    auto key = [](const Entry& e) { return e.model + '\x1f' + e.op + '\x1f' + e.problem; };
    for (size_t i = 0; i < all.size(); ++i) last[key(all[i])] = i;
    std::vector<Entry> out;
    for (size_t i = 0; i < all.size(); ++i)
      if (last[key(all[i])] == i) out.push_back(all[i]);
    return out;
  }

  static void write_all(int fd, const std::string& data, const std::string& shown) {
    for (size_t done = 0; done < data.size();) {
      ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error("cannot write " + shown + ": " + (n < 0 ? std::strerror(errno) : "no progress"));
      done += static_cast<size_t>(n);
    }
  }

  void append(std::string line) {
    Lock lock(*this);
    if (!cleaned_) clean_temps();
    int fd = open_store(O_RDWR | O_APPEND | O_CREAT, "append to");
    struct stat st {};
    char last = '\n';
    if (::fstat(fd, &st) == 0 && st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n')
      line = "\n" + line;  // a crashed writer's partial line must not swallow ours
    ssize_t n = ::write(fd, line.data(), line.size());  // one write: concurrent readers never see half a line
    int err = errno;
    ::close(fd);
    if (n != static_cast<ssize_t>(line.size()))
      throw Error("cannot write store " + path_ + ": " +
                  (n < 0 ? std::string(std::strerror(err)) : "wrote " + std::to_string(n) + " of " + std::to_string(line.size()) + " bytes"));
    scan(&kNoModel, [](Entry&&) {});  // counts the lines, parses none
    if (lines_ > 2 * max_entries_) compact_locked();
  }

  // Remove compaction files of writers that died (same host, pid gone) or are older than
  // kStaleTempSeconds; called under the lock, so no live writer of this store is compacting.
  void clean_temps() {
    cleaned_ = true;
    std::string dir = parent(path_), name = path_.substr(path_.find_last_of('/') == std::string::npos ? 0 : path_.find_last_of('/') + 1);
    std::string prefix = "." + name + ".tmp-", host = hostname();
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return;
    std::vector<std::string> stale;
    while (dirent* ent = ::readdir(d)) {
      std::string f = ent->d_name;
      if (f.compare(0, prefix.size(), prefix) != 0) continue;
      std::string rest = f.substr(prefix.size());
      size_t b = rest.find_last_of('-'), a = b == std::string::npos || b == 0 ? std::string::npos : rest.find_last_of('-', b - 1);
      bool dead = false;
      if (a != std::string::npos) {
        std::string h = rest.substr(0, a), pid = rest.substr(a + 1, b - a - 1);
        dead = h == host && !pid.empty() && pid.size() < 10 && pid.find_first_not_of("0123456789") == std::string::npos &&
               ::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH;
      }
      struct stat st {};
      std::string full = dir + "/" + f;
      if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (dead || std::difftime(std::time(nullptr), st.st_mtime) > kStaleTempSeconds) stale.push_back(full);
    }
    ::closedir(d);
    for (const auto& f : stale) ::unlink(f.c_str());
  }

  static std::string hostname() {
    char buf[256] = {0};
    ::gethostname(buf, sizeof buf - 1);
    return buf;
  }

  static std::string random_hex() {
    unsigned char bytes[8] = {0};
    if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
      uint64_t x = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^ (uint64_t(::getpid()) << 32);
      for (auto& b : bytes) b = static_cast<unsigned char>(x), x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned char b : bytes) out += hex[b >> 4], out += hex[b & 15];
    return out;
  }

  void compact_locked() {
    std::vector<Entry> all;
    scan(nullptr, [&](Entry&& e) { all.push_back(std::move(e)); });
    auto keep = latest(all);
    if (keep.size() > max_entries_) keep.erase(keep.begin(), keep.end() - static_cast<long>(max_entries_));
    clean_temps();
    std::string dir = parent(path_), name = path_.substr(path_.find_last_of('/') == std::string::npos ? 0 : path_.find_last_of('/') + 1);
    // An unpredictable name, created exclusively and never through a link, in the store's directory.
    std::string tmp = dir + "/." + name + ".tmp-" + hostname() + "-" + std::to_string(::getpid()) + "-" + random_hex();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("cannot compact store " + path_ + ": cannot create " + tmp + ": " + std::strerror(errno));
    try {
      std::string data;
      for (const auto& e : keep) data += e.line + "\n";
      write_all(fd, data, tmp);
      if (::fsync(fd) != 0) throw Error("cannot compact store " + path_ + ": fsync: " + std::strerror(errno));
      ::close(fd);
      fd = -1;
      if (std::rename(tmp.c_str(), path_.c_str()) != 0) throw Error("cannot replace " + path_ + ": " + std::strerror(errno));
    } catch (...) {
      if (fd >= 0) ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
  }

  inline static const std::string kNoModel = std::string(1, '\0');  // matches no line: count only
  std::string path_;
  size_t max_entries_;
  Warn warn_;
  size_t skipped_ = 0, lines_ = 0;
  bool cleaned_ = false;
  ino_t ino_ = 0;
  dev_t dev_ = 0;
  std::set<size_t> warned_;  // line numbers already warned about in this file (a re-read does not repeat)
};

// Autotune one problem: the stored winner of this model when there is one (and its kernel is
// the model's), else benchmark the ranked candidates and store the winner. The store is checked
// before anything is measured; a write that fails after the search returns the result with
// store_error set (and a warning) instead of losing the measurements.
inline Result autotune(ResultStore* store, const ModelInfo& info, const std::string& problem,
                       const std::vector<Candidate>& ranked, const Benchmark& benchmark, const Budget& budget,
                       bool refresh = false, double timeout_s = 0) {
  if (store != nullptr) {
    store->check();
    if (!refresh) {
      if (auto hit = store->get(info, problem)) {
        Result r;
        r.problem = problem, r.kernel = hit->kernel, r.kernel_id = hit->kernel_id, r.seconds = hit->seconds;
        r.from_store = true, r.stored = true, r.policy = hit->policy, r.stop = "from store";
        return r;
      }
    }
  }
  std::string shift = budget.kind == Budget::Kind::Confidence ? shift_of(info, problem) : "";
  Result r = autotune_ranked(ranked, benchmark, budget, problem, timeout_s, shift);
  if (store != nullptr && r.ok()) {
    try {
      store->put(info, r);
      r.stored = true;
    } catch (const Error& e) {
      r.store_error = e.what();
      store->warn(r.store_error + "; the result is returned but not stored");
    }
  }
  return r;
}

}  // namespace autotune
}  // namespace ckpred
