// ckpred_autotune.hpp: tune on first call from C++ -- benchmark a few of the model's top kernels,
// keep the fastest, and remember it in the result store the Python runtime shares.
//
// Same rules and file format as ckpred/autotune.py (docs/autotune.md):
//   * candidates (valid kernels, model order, e.g. ckpred_select's answer) are benchmarked by the
//     caller's std::function until the budget is spent; a benchmark that throws or returns a
//     non-finite or non-positive time is recorded and skipped;
//   * budgets: fixed k successes, a time budget (kernel seconds or wall seconds), or a confidence
//     budget sized, once per problem, by the calibration exported in manifest.json ("autotune":
//     a logistic model of the score gaps and the problem's fields, or a score-gap table); every
//     budget stops at max_benchmarks calls and, once spent, continues only while nothing succeeded;
//   * the store: JSON lines ("format":"ckpred.autotune/1"), keyed by (model sha256, op, problem),
//     appended under an exclusive flock on <store>.lock, compacted past 2 * max_entries lines.
// Header-only; needs json.hpp (this directory) and POSIX (flock, rename).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"

namespace ckpred {
namespace autotune {

inline const char* kStoreFormat = "ckpred.autotune/1";
inline const char* kCalibrationFormat = "ckpred.autotune.calibration/1";
inline const char* kLogisticFormat = "ckpred.autotune.logistic/1";

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

// P(best of the top j within `within` of the best kernel) by score-gap bin (see ckpred.autotune.Calibration).
struct Calibration {
  std::vector<double> within, edges;
  std::vector<std::vector<std::vector<double>>> probability;  // [within][bin][j-1]
  size_t gap_to = 2;

  static Calibration from_json(const json::Value& v) {
    if (v.is_null() || v.kind != json::Value::Kind::Object || v["format"].str() != kCalibrationFormat)
      throw Error(std::string("autotune calibration: expected format '") + kCalibrationFormat + "'");
    Calibration c;
    for (const auto& x : v["within"].arr()) c.within.push_back(x.num());
    for (const auto& x : v["edges"].arr()) c.edges.push_back(x.num());
    auto g = v.o.find("gap_to");
    if (g != v.o.end()) c.gap_to = static_cast<size_t>(g->second.num());
    if (c.gap_to < 2) throw Error("autotune calibration: gap_to must be >= 2");
    for (const auto& table : v["probability"].arr()) {
      std::vector<std::vector<double>> t;
      for (const auto& row : table.arr()) {
        std::vector<double> r;
        for (const auto& p : row.arr()) r.push_back(p.num());
        t.push_back(r);
      }
      if (t.size() != c.edges.size() + 1) throw Error("autotune calibration: probability rows != bins");
      c.probability.push_back(t);
    }
    if (c.probability.size() != c.within.size()) throw Error("autotune calibration: probability tables != within");
    // the same checks as ckpred.autotune.Calibration.from_dict
    if (v["counts"].arr().size() != c.edges.size() + 1) throw Error("autotune calibration: counts != bins");
    for (size_t i = 0; i < c.within.size(); ++i)
      if (!(c.within[i] > 0 && c.within[i] < 1) || std::count(c.within.begin(), c.within.end(), c.within[i]) != 1)
        throw Error("autotune calibration: within must be distinct fractions in (0, 1)");
    for (size_t i = 0; i < c.edges.size(); ++i)
      if (!std::isfinite(c.edges[i]) || (i > 0 && !(c.edges[i] > c.edges[i - 1])))
        throw Error("autotune calibration: edges must be finite and strictly increasing");
    size_t width = c.probability.empty() ? 0 : c.probability[0][0].size();
    if (width == 0) throw Error("autotune calibration: empty probability rows");
    for (const auto& t : c.probability)
      for (const auto& row : t) {
        if (row.size() != width) throw Error("autotune calibration: probability rows of different lengths");
        for (double p : row)
          if (!(p >= 0 && p <= 1)) throw Error("autotune calibration: a probability outside [0, 1]");
      }
    return c;
  }

  int needed(const std::vector<double>& scores, double target, double within_) const {
    auto it = std::find(within.begin(), within.end(), within_);
    if (it == within.end()) throw Error("autotune calibration: no table for within=" + std::to_string(within_));
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

  static std::vector<double> numbers(const json::Value& v) {
    std::vector<double> out;
    for (const auto& x : v.arr()) out.push_back(x.num());
    return out;
  }

  static Logistic from_json(const json::Value& v) {
    if (v.is_null() || v.kind != json::Value::Kind::Object || v["format"].str() != kLogisticFormat)
      throw Error(std::string("autotune calibration: expected format '") + kLogisticFormat + "'");
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
    // the same checks as ckpred.autotune.LogisticCalibration.from_dict
    size_t n = 7 + c.fields.size() + 1;
    for (size_t i = 0; i < c.within.size(); ++i)
      if (!(c.within[i] > 0 && c.within[i] < 1) || std::count(c.within.begin(), c.within.end(), c.within[i]) != 1)
        throw Error("autotune calibration: within must be distinct fractions in (0, 1)");
    for (const auto* vec : {&c.fill, &c.lo, &c.hi, &c.mean, &c.scale})
      if (vec->size() != n) throw Error("autotune calibration: fill/lo/hi/mean/scale must hold one value per feature");
    if (c.coef.size() != c.within.size() || c.intercept.size() != c.within.size() || c.intercept.empty() ||
        c.intercept[0].empty())
      throw Error("autotune calibration: coef and intercept must hold one table per within");
    for (size_t w = 0; w < c.within.size(); ++w) {
      if (c.intercept[w].size() != c.intercept[0].size() || c.coef[w].size() != c.intercept[0].size())
        throw Error("autotune calibration: coef/intercept rows of different lengths");
      for (const auto& r : c.coef[w]) {
        if (r.size() != n) throw Error("autotune calibration: a coef row without one value per feature");
        for (double x : r)
          if (!std::isfinite(x)) throw Error("autotune calibration: non-finite numbers, or a scale <= 0");
      }
      for (double x : c.intercept[w])
        if (!std::isfinite(x)) throw Error("autotune calibration: non-finite numbers, or a scale <= 0");
    }
    for (const auto* vec : {&c.fill, &c.lo, &c.hi, &c.mean, &c.scale})
      for (double x : *vec)
        if (!std::isfinite(x)) throw Error("autotune calibration: non-finite numbers, or a scale <= 0");
    for (double x : c.scale)
      if (!(x > 0)) throw Error("autotune calibration: non-finite numbers, or a scale <= 0");
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

  // Successful measurements a confidence budget wants for this problem (its key and ranked scores).
  int planned(const std::vector<double>& scores, const std::string& problem) const {
    if (logistic != nullptr) return logistic->needed(scores, key_values(problem), target, within);
    return calibration->needed(scores, target, within);
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

// The store-free search (ckpred.autotune.autotune_ranked).
inline Result autotune_ranked(const std::vector<Candidate>& ranked, const Benchmark& benchmark, const Budget& budget,
                              const std::string& problem = "") {
  Result r;
  r.problem = problem;
  r.policy = budget.describe();
  std::vector<double> scores;
  for (const auto& c : ranked) scores.push_back(c.score);
  Budget sized = budget;  // a confidence budget is sized once per problem, as a fixed count
  if (budget.kind == Budget::Kind::Confidence) sized.kind = Budget::Kind::Fixed, sized.k = budget.planned(scores, problem);
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
    try {
      double s = benchmark(c);
      if (std::isfinite(s) && s > 0) m.seconds = s;
      else {
        std::ostringstream o;
        o << "non-finite or non-positive time " << s;
        m.error = o.str();
      }
    } catch (const std::exception& e) {
      m.error = std::string("exception: ") + e.what();
    } catch (...) {
      m.error = "exception: unknown";
    }
    wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (m.ok()) ++successes, kernel_s += m.seconds;
    r.measured.push_back(m);
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

// The problem key: field=value pairs in the manifest's problem-field order.
inline std::string problem_key(const std::vector<std::string>& fields, const std::vector<int64_t>& values) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) out += (i ? "," : "") + fields[i] + "=" + std::to_string(values.at(i));
  return out;
}

// What the store needs from an export's manifest.json.
struct ModelInfo {
  std::string model, op, arch, dtype, layout;  // model: sha256 of the selector graph
  std::vector<std::string> fields;
  std::optional<Calibration> calibration;  // the manifest's "autotune": a score-gap table,
  std::optional<Logistic> logistic;        // or a logistic model
};

inline ModelInfo load_model_info(const std::string& model_dir) {
  std::ifstream in(model_dir + "/manifest.json", std::ios::binary);
  if (!in) throw Error("cannot read " + model_dir + "/manifest.json");
  std::stringstream ss;
  ss << in.rdbuf();
  json::Value m = json::parse(ss.str());
  ModelInfo info;
  info.model = m["files"][m["graphs"]["selector"]["file"].str()]["sha256"].str();
  info.op = m["op"].str(), info.arch = m["arch"].str(), info.dtype = m["dtype"].str(), info.layout = m["layout"].str();
  for (const auto& f : m["problem_fields"].arr()) info.fields.push_back(f["name"].str());
  auto it = m.o.find("autotune");
  if (it != m.o.end() && !it->second.is_null()) {
    if (it->second.kind == json::Value::Kind::Object && it->second.o.count("format") &&
        it->second["format"].kind == json::Value::Kind::String && it->second["format"].str() == kLogisticFormat)
      info.logistic = Logistic::from_json(it->second);
    else
      info.calibration = Calibration::from_json(it->second);
  }
  return info;
}

// ---- the store ----------------------------------------------------------------------------------
struct Entry {
  std::string model, op, problem, kernel, policy, line;  // line: the raw JSON line (kept verbatim)
  int64_t kernel_id = -1;
  double seconds = 0;
};

class ResultStore {
 public:
  explicit ResultStore(std::string path, size_t max_entries = 10000) : path_(std::move(path)), max_entries_(max_entries) {
    if (max_entries_ < 1) throw Error("ResultStore: max_entries must be >= 1");
  }

  const std::string& path() const { return path_; }
  size_t skipped_lines() const { return skipped_; }

  // Newest entry of (model, op, problem); entries of any other model never match.
  std::optional<Entry> get(const std::string& model, const std::string& op, const std::string& problem) {
    size_t lines = 0;
    auto all = read(lines);
    for (auto it = all.rbegin(); it != all.rend(); ++it)
      if (it->model == model && it->op == op && it->problem == problem) return *it;
    return std::nullopt;
  }

  // Current entries (last per key), oldest first.
  std::vector<Entry> entries() {
    size_t lines = 0;
    return latest(read(lines));
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
      else o << ",\"error\":" << quote(m.error) << "}";
    }
    o << "],\"created\":" << quote(now_utc()) << ",\"writer\":\"cpp\"}\n";
    append(o.str());
  }

  void compact() {
    Lock lock(path_ + ".lock");
    compact_locked();
  }

 private:
  struct Lock {
    int fd;
    explicit Lock(const std::string& p) : fd(::open(p.c_str(), O_RDWR | O_CREAT, 0644)) {
      if (fd < 0) throw Error("cannot open lock file " + p);
      if (::flock(fd, LOCK_EX) != 0) {
        ::close(fd);
        throw Error("cannot lock " + p);
      }
    }
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    ~Lock() { ::close(fd); }
  };

  std::vector<Entry> read(size_t& lines) {
    std::vector<Entry> out;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return out;
    std::stringstream ss;
    ss << in.rdbuf();
    std::string data = ss.str();
    size_t end = data.rfind('\n');
    if (end == std::string::npos) return out;  // no complete line yet
    std::istringstream body(data.substr(0, end + 1));
    std::string line;
    while (std::getline(body, line)) {
      ++lines;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        json::Value v = json::parse(line);
        if (v["format"].str() != kStoreFormat) throw json::Error("format");
        Entry e;
        e.model = v["model"].str(), e.op = v["op"].str(), e.problem = v["problem"].str();
        e.kernel = v["kernel"].str(), e.kernel_id = static_cast<int64_t>(v["kernel_id"].num());
        e.seconds = v["seconds"].num();
        auto p = v.o.find("policy");
        if (p != v.o.end() && p->second.kind == json::Value::Kind::String) e.policy = p->second.s;
        e.line = line;
        out.push_back(e);
      } catch (const json::Error&) {
        ++skipped_;  // a torn or foreign line: skipped and counted (skipped_lines())
      }
    }
    return out;
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

  void append(std::string line) {
    Lock lock(path_ + ".lock");
    int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) throw Error("cannot open " + path_ + " for appending");
    struct stat st{};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {  // a crashed writer's partial line must not swallow ours
      std::ifstream in(path_, std::ios::binary);
      in.seekg(st.st_size - 1);
      if (in.get() != '\n') line = "\n" + line;
    }
    ssize_t n = ::write(fd, line.data(), line.size());
    ::close(fd);
    if (n != static_cast<ssize_t>(line.size())) throw Error("short write to " + path_);
    size_t lines = 0;
    read(lines);
    if (lines > 2 * max_entries_) compact_locked();
  }

  void compact_locked() {
    size_t lines = 0;
    auto keep = latest(read(lines));
    if (keep.size() > max_entries_) keep.erase(keep.begin(), keep.end() - static_cast<long>(max_entries_));
    std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw Error("cannot write " + tmp);
      for (const auto& e : keep) out << e.line << "\n";
      out.flush();
      if (!out) throw Error("cannot write " + tmp);
    }
    int fd = ::open(tmp.c_str(), O_RDONLY);
    if (fd >= 0) ::fsync(fd), ::close(fd);
    if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw Error("cannot replace " + path_);
    }
  }

  std::string path_;
  size_t max_entries_;
  size_t skipped_ = 0;
};

// Autotune one problem: the stored winner of this model when there is one, else benchmark the
// ranked candidates and store the winner.
inline Result autotune(ResultStore* store, const ModelInfo& info, const std::string& problem,
                       const std::vector<Candidate>& ranked, const Benchmark& benchmark, const Budget& budget,
                       bool refresh = false) {
  if (store != nullptr && !refresh) {
    if (auto hit = store->get(info.model, info.op, problem)) {
      Result r;
      r.problem = problem, r.kernel = hit->kernel, r.kernel_id = hit->kernel_id, r.seconds = hit->seconds;
      r.from_store = true, r.policy = hit->policy, r.stop = "from store";
      return r;
    }
  }
  Result r = autotune_ranked(ranked, benchmark, budget, problem);
  if (store != nullptr && r.ok()) store->put(info, r);
  return r;
}

}  // namespace autotune
}  // namespace ckpred
