// ckpred_select: run an exported ckpred selector (model.onnx + manifest.json) from C++.
//
// This is what a HIP kernel dispatcher does: pass the problem's integers in, get ranked kernel
// ids out, map them to names through the manifest's catalogue. No feature is re-implemented
// here: the features, the trees, the validity mask and the ranking are all inside model.onnx.
//
//   ckpred_select MODEL_DIR [options] [SHAPE ...]
//     SHAPE            problem fields in manifest order, comma-separated: 128,1536,7168
//                      (trailing fields with a default, e.g. split_k, may be left out),
//                      or by name: m=128,n=1536,k=7168
//     --shapes FILE    one SHAPE per line ('#' comments and blank lines skipped)
//     --top-k K        kernels per problem (default 5)
//     --threads T      onnxruntime intra-op threads (default 1; at most the CPUs this process may use)
//     --arch A / --dtype D / --layout L / --op O   refuse a model made for anything else
//     --bench R        time R passes over the shapes (one Run per shape), print median/p99;
//                      pass 1 is cold (cache misses), passes 2..R hit the cache (hit_* figures)
//     --cache N        answers kept per (problem, top_k) in a bounded LRU cache (default 4096,
//                      0 = off); a repeated problem is answered without running the model
//     --cache-stats    print {"cache":{"hits","misses","size","capacity"}} to stderr at the end
//     --no-verify      skip the sha256 check of the model's files against the manifest
//
// Before answering, the model is verified as the Python runtime verifies it (manifest.hpp's
// verify_export, shared with the autotune header): the manifest's structure, op/arch/dtype/layout
// asked for, the sha256 of every listed file, the manifest embedded in model.onnx equal to
// manifest.json, the autotune calibration, the catalogue rows re-hashed; then the number of
// kernels the graph ranks equal to the catalogue's (or the candidates'). The session is made
// from the bytes that were verified. Manifest, model and --shapes must be regular files.
//
// Output: one JSON object per shape and line, e.g.
//   {"problem":{"m":128,"n":1536,"k":7168,"split_k":1},"ok":true,"num_valid":4608,
//    "out_of_distribution":false,"ood_fields":{},
//    "kernels":[{"id":4,"name":"gemm_universal_fp8_rcr_...","score":540.95334125793372}]}
// Scores are printed with 17 significant digits, so they round-trip exactly. A problem outside
// the training ranges is answered and flagged ("out_of_distribution":true, "ood_fields":
// {"m":[100000,[1,16384]]}); a problem no kernel can run gets "ok":false, a "reason", no kernels.
// A selector with an applicability mask (an op whose table lists only the kernels that apply)
// adds "applicability_fallback": true when no kernel is predicted to apply to the problem and the
// kernels are ranked among every rule-valid one instead (false otherwise), as the Python runtime.
// Exit codes: 0 ok, 2 usage/input error (bad option, bad problem value), 3 model refused
// (manifest, sha256, catalogue, mismatch, onnxruntime). Every failure is one line on stderr.

#include <onnxruntime_cxx_api.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "json.hpp"
#include "manifest.hpp"
#include "sha256.hpp"

namespace {

using ckpred::Manifest;
using ckpred::ModelError;
using ckpred::UsageError;

struct Options {
  std::string model_dir;
  std::vector<std::string> shapes;
  int64_t top_k = 5;
  int threads = 1;
  int bench = 0;
  int64_t cache = 4096;
  bool cache_stats = false;
  bool verify = true;
  std::map<std::string, std::string> expect;  // op/arch/dtype/layout the caller runs on
};

constexpr int64_t kMaxShapesBytes = int64_t(64) << 20;  // a --shapes file (about 2 million shapes)

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(trim(cur));
  return out;
}

// An option's integer in [lo, hi]; anything else (text, overflow, out of range) is a UsageError.
int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  int64_t v = 0;
  bool overflow = false;
  if (!ckpred::parse_int64(text, v, overflow) || v < lo || v > hi)
    throw UsageError(what + " '" + text + "': allowed: an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

// CPUs this process may run on (the cap of --threads, as the Python runtime's max_threads()).
int64_t max_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// One SHAPE (positional or name=value) into the graph's int64 problem row, defaults filled in.
std::vector<int64_t> parse_shape(const std::string& text, const Manifest& man) {
  std::vector<int64_t> row(man.fields.size());
  std::vector<bool> set(man.fields.size(), false);
  std::vector<std::string> parts = split(text, ',');
  bool named = text.find('=') != std::string::npos;
  if (!named && parts.size() > man.fields.size())
    throw UsageError("shape '" + text + "' has " + std::to_string(parts.size()) + " values; fields are " +
                     std::to_string(man.fields.size()));
  for (size_t i = 0; i < parts.size(); ++i) {
    size_t idx = i;
    std::string value = parts[i];
    if (named) {
      size_t eq = parts[i].find('=');
      if (eq == std::string::npos) throw UsageError("shape '" + text + "': mix of named and positional values");
      std::string name = trim(parts[i].substr(0, eq));
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      auto it = std::find_if(man.fields.begin(), man.fields.end(), [&](const ckpred::Field& f) { return f.name == name; });
      if (it == man.fields.end()) throw UsageError("shape '" + text + "': unknown problem field '" + name + "'");
      idx = static_cast<size_t>(it - man.fields.begin());
      if (set[idx]) throw UsageError("shape '" + text + "': problem field '" + name + "' given twice");
      value = trim(parts[i].substr(eq + 1));
    }
    row[idx] = ckpred::parse_problem_value(man.fields[idx], value);
    set[idx] = true;
  }
  for (size_t i = 0; i < row.size(); ++i) {
    if (set[i]) continue;
    if (!man.fields[i].has_default)
      throw UsageError("shape '" + text + "': problem field '" + man.fields[i].name + "' is required");
    row[i] = man.fields[i].default_code;
  }
  return row;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string fmt_double(double v) {
  if (std::isinf(v)) return v > 0 ? "1e999" : "-1e999";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class Selector {
 public:
  // The session is made from the model bytes verify_export checked, not by reading the file again.
  Selector(const Options& opt, const Manifest& man, const std::string& model_bytes)
      : env_(ORT_LOGGING_LEVEL_WARNING, "ckpred"), man_(man), mem_(Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault)) {
    Ort::SessionOptions so;
    so.SetIntraOpNumThreads(opt.threads);
    so.SetInterOpNumThreads(1);
    so.SetExecutionMode(ExecutionMode::ORT_SEQUENTIAL);
    session_ = std::make_unique<Ort::Session>(env_, model_bytes.data(), model_bytes.size(), so);
    Ort::AllocatorWithDefaultOptions alloc;
    for (size_t i = 0; i < session_->GetInputCount(); ++i) inputs_.push_back(session_->GetInputNameAllocated(i, alloc).get());
    for (size_t i = 0; i < session_->GetOutputCount(); ++i) outputs_.push_back(session_->GetOutputNameAllocated(i, alloc).get());
    for (const char* want : {"problem", "top_k"})
      if (std::find(inputs_.begin(), inputs_.end(), want) == inputs_.end())
        throw ModelError(man.selector_file + " has no input '" + want + "'");
    for (const char* want : {"kernel_ids", "scores", "num_valid"})
      if (std::find(outputs_.begin(), outputs_.end(), want) == outputs_.end())
        throw ModelError(man.selector_file + " has no output '" + want + "'");
    for (auto& s : inputs_) input_ptrs_.push_back(s.c_str());
    for (auto& s : outputs_) output_ptrs_.push_back(s.c_str());
  }

  // The graph ranks exactly the manifest's candidates: one run with top_k past their number
  // returns [1, candidates] kernel ids, each a catalogue row. A catalogue shortened or padded
  // after export, or a graph of another export, shows here (never as an out-of-range read).
  void verify_graph_width() {
    std::vector<int64_t> probe;
    for (const ckpred::Field& f : man_.fields)
      probe.push_back(f.kind != "int" ? 0 : f.has_range ? f.lo : std::max<int64_t>(1, f.minimum));
    Answer a = run(probe, man_.candidates + 1);
    bool in_range = std::all_of(a.ids.begin(), a.ids.end(),
                                [&](int64_t id) { return id >= 0 && id < static_cast<int64_t>(man_.kernel_names.size()); });
    if (static_cast<int64_t>(a.ids.size()) != man_.candidates || !in_range)
      throw ModelError("the selector graph ranks " + std::to_string(a.ids.size()) + " kernels, the manifest's catalogue has " +
                       std::to_string(man_.kernel_names.size()) + " rows and " + std::to_string(man_.candidates) +
                       " candidates (catalogue edited after export?)");
  }

  struct Answer {
    std::vector<int64_t> ids;
    std::vector<double> scores;
    int64_t num_valid = 0;
    int applicability_fallback = -1;  // -1: the selector has no applicability mask
  };

  Answer run(std::vector<int64_t> problem, int64_t top_k) {
    const int64_t pshape[2] = {1, static_cast<int64_t>(problem.size())};
    const int64_t kshape[1] = {1};
    std::vector<Ort::Value> in;
    for (const std::string& name : inputs_) {
      if (name == "problem")
        in.push_back(Ort::Value::CreateTensor<int64_t>(mem_, problem.data(), problem.size(), pshape, 2));
      else
        in.push_back(Ort::Value::CreateTensor<int64_t>(mem_, &top_k, 1, kshape, 1));
    }
    std::vector<Ort::Value> out = session_->Run(Ort::RunOptions{nullptr}, input_ptrs_.data(), in.data(), in.size(),
                                                output_ptrs_.data(), output_ptrs_.size());
    Answer a;
    for (size_t i = 0; i < outputs_.size(); ++i) {
      auto info = out[i].GetTensorTypeAndShapeInfo();
      size_t n = info.GetElementCount();
      if (outputs_[i] == "applicability_fallback") {  // bool [B]: the one optional output read
        if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL || n < 1)
          throw ModelError(man_.selector_file + ": output 'applicability_fallback' is not a bool per problem");
        a.applicability_fallback = out[i].GetTensorData<bool>()[0] ? 1 : 0;
        continue;
      }
      if (info.GetElementType() != (outputs_[i] == "scores" ? ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64))
        throw ModelError(man_.selector_file + ": output '" + outputs_[i] + "' has an unexpected element type");
      if (outputs_[i] == "kernel_ids") {
        const int64_t* p = out[i].GetTensorData<int64_t>();
        a.ids.assign(p, p + n);
      } else if (outputs_[i] == "scores") {
        const double* p = out[i].GetTensorData<double>();
        a.scores.assign(p, p + n);
      } else if (outputs_[i] == "num_valid") {
        if (n < 1) throw ModelError(man_.selector_file + ": output 'num_valid' is empty");
        a.num_valid = out[i].GetTensorData<int64_t>()[0];
      }
    }
    return a;
  }

 private:
  Ort::Env env_;
  const Manifest& man_;
  Ort::MemoryInfo mem_;
  std::unique_ptr<Ort::Session> session_;
  std::vector<std::string> inputs_, outputs_;
  std::vector<const char*> input_ptrs_, output_ptrs_;
};

// Bounded LRU cache of answers keyed by (problem fields..., top_k): a dispatcher sees the same
// shapes again and again, and a hit costs a hash lookup instead of a model run.
class CachedSelector {
 public:
  CachedSelector(Selector& sel, size_t capacity) : sel_(sel), capacity_(capacity) {}

  const Selector::Answer& run(const std::vector<int64_t>& problem, int64_t top_k) {
    std::vector<int64_t> key(problem);
    key.push_back(top_k);
    if (capacity_ == 0) {
      ++misses_;
      scratch_ = sel_.run(problem, top_k);
      return scratch_;
    }
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++hits_;
      order_.splice(order_.begin(), order_, it->second);  // most recently used first
      return it->second->second;
    }
    ++misses_;
    order_.emplace_front(key, sel_.run(problem, top_k));
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {  // evict the least recently used answer
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }

  std::string stats_json() const {
    std::ostringstream o;
    o << "{\"cache\":{\"hits\":" << hits_ << ",\"misses\":" << misses_ << ",\"size\":" << order_.size()
      << ",\"capacity\":" << capacity_ << "}}";
    return o.str();
  }

 private:
  struct KeyHash {
    size_t operator()(const std::vector<int64_t>& v) const {
      size_t h = 1469598103934665603ULL;
      for (int64_t x : v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ULL;
      return h;
    }
  };
  using Entry = std::pair<std::vector<int64_t>, Selector::Answer>;
  Selector& sel_;
  size_t capacity_;
  std::list<Entry> order_;
  std::unordered_map<std::vector<int64_t>, std::list<Entry>::iterator, KeyHash> index_;
  Selector::Answer scratch_;
  int64_t hits_ = 0, misses_ = 0;
};

std::string answer_json(const Manifest& man, const std::vector<int64_t>& problem, const Selector::Answer& a, int64_t top_k) {
  std::ostringstream o;
  o << "{\"problem\":{";
  for (size_t i = 0; i < problem.size(); ++i) o << (i ? "," : "") << '"' << man.fields[i].name << "\":" << problem[i];
  int64_t n = std::max<int64_t>(0, std::min<int64_t>({top_k, a.num_valid, static_cast<int64_t>(a.ids.size()),
                                                       static_cast<int64_t>(a.scores.size())}));
  o << "},\"ok\":" << (n > 0 ? "true" : "false") << ",\"num_valid\":" << a.num_valid;
  // No valid kernel (degenerate N=1 / K=1 GEMMs, or no tile divides the problem): say so, never guess.
  if (n == 0) o << ",\"reason\":\"no valid kernel in the catalogue for this problem\"";
  bool ood = false;
  std::string ood_fields = ckpred::out_of_distribution_json(man, problem, ood);
  o << ",\"out_of_distribution\":" << (ood ? "true" : "false") << ",\"ood_fields\":" << ood_fields;
  if (a.applicability_fallback >= 0) o << ",\"applicability_fallback\":" << (a.applicability_fallback ? "true" : "false");
  o << ",\"kernels\":[";
  for (int64_t i = 0; i < n; ++i) {
    if (a.ids[i] < 0 || a.ids[i] >= static_cast<int64_t>(man.kernel_names.size()))
      throw ModelError("the selector graph returned kernel id " + std::to_string(a.ids[i]) + " outside the catalogue's " +
                       std::to_string(man.kernel_names.size()) + " rows");
    o << (i ? "," : "") << "{\"id\":" << a.ids[i] << ",\"name\":\"" << json_escape(man.kernel_names[a.ids[i]])
      << "\",\"score\":" << fmt_double(a.scores[i]) << "}";
  }
  o << "]}";
  return o.str();
}

Options parse_args(int argc, char** argv) {
  Options opt;
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw UsageError(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") throw UsageError("");
    if (a == "--top-k") opt.top_k = parse_int(need(i), "--top-k", 1, ckpred::kInt64Max);
    else if (a == "--threads") opt.threads = static_cast<int>(parse_int(need(i), "--threads", 1, max_threads()));
    else if (a == "--bench") opt.bench = static_cast<int>(parse_int(need(i), "--bench", 0, 1000000));
    else if (a == "--no-verify") opt.verify = false;
    else if (a == "--cache") opt.cache = parse_int(need(i), "--cache", 0, 1LL << 40);
    else if (a == "--cache-stats") opt.cache_stats = true;
    else if (a == "--arch" || a == "--dtype" || a == "--layout" || a == "--op") opt.expect[a.substr(2)] = need(i);
    else if (a == "--shapes") {
      std::string path = need(i), text;
      try {  // a regular file of bounded size: a FIFO or /dev/zero is refused unread
        text = ckpred::read_regular_file(AT_FDCWD, path, "shapes file " + path, kMaxShapesBytes);
      } catch (const ckpred::FileError& e) {
        throw UsageError(e.what());
      }
      std::istringstream in(text);
      std::string line;
      while (std::getline(in, line)) {
        line = trim(line.substr(0, line.find('#')));
        if (!line.empty()) opt.shapes.push_back(line);
      }
    } else if (!a.empty() && a[0] == '-' && !(a.size() > 1 && std::isdigit(static_cast<unsigned char>(a[1]))))
      throw UsageError("unknown option " + a);
    else if (opt.model_dir.empty()) opt.model_dir = a;
    else opt.shapes.push_back(a);
  }
  if (opt.model_dir.empty()) throw UsageError("MODEL_DIR is required");
  return opt;
}

const char* kUsage =
    "usage: ckpred_select MODEL_DIR [--top-k K] [--threads T] [--shapes FILE] [--bench R]\n"
    "                     [--cache N] [--cache-stats] [--arch A] [--dtype D] [--layout L] [--op O]\n"
    "                     [--no-verify]\n"
    "                     [SHAPE ...]\n"
    "  SHAPE: problem fields in manifest order (128,1536,7168) or by name (m=128,n=1536,k=7168)\n";

// With the session open (made from the verified bytes): the graph's width, the check that
// needs onnxruntime; verify_export (manifest.hpp) ran every other check, in the Python order.
void verify_model(Selector& selector) { selector.verify_graph_width(); }

int run_main(int argc, char** argv) {
  Options opt;
  try {
    opt = parse_args(argc, argv);
  } catch (const UsageError& e) {  // one line for a bad option; the usage only when asked or no MODEL_DIR
    if (*e.what()) std::cerr << "ckpred_select: " << ckpred::printable(e.what()) << "\n";
    if (!*e.what() || argc < 2) std::cerr << kUsage;
    return 2;
  }
  try {
    ckpred::Export ex = ckpred::verify_export(opt.model_dir, opt.expect, opt.verify);
    const Manifest& man = ex.man;
    std::vector<std::vector<int64_t>> problems;
    for (const std::string& s : opt.shapes) problems.push_back(parse_shape(s, man));
    Selector selector(opt, man, ex.selector_bytes);
    ex.selector_bytes = std::string();  // onnxruntime keeps its own copy
    verify_model(selector);
    CachedSelector cached(selector, static_cast<size_t>(opt.cache));
    if (opt.bench > 0) {
      selector.run(problems.empty() ? std::vector<int64_t>(man.fields.size(), 1) : problems[0], opt.top_k);  // warm-up
      std::vector<double> cold, hit, cpu;  // pass 1 (unseen problems) / passes 2..R (repeated problems)
      // CPU time of this process per cold run: one intra-op thread runs on this thread, so it is
      // the work done, free of the waiting a loaded machine adds to wall time.
      auto cpu_now = [] {
        timespec ts{};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
      };
      for (int r = 0; r < opt.bench; ++r)
        for (const auto& p : problems) {
          double c0 = cpu_now();
          auto t0 = std::chrono::steady_clock::now();
          cached.run(p, opt.top_k);
          double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
          (r == 0 ? cold : hit).push_back(us);
          if (r == 0) cpu.push_back(cpu_now() - c0);
        }
      auto pct = [](std::vector<double>& v, double q) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
      };
      std::cout << "{\"bench\":{\"runs\":" << cold.size() << ",\"median_us\":" << pct(cold, 0.5) << ",\"p99_us\":"
                << pct(cold, 0.99) << ",\"min_us\":" << (cold.empty() ? 0.0 : cold.front()) << ",\"hit_runs\":" << hit.size()
                << ",\"hit_median_us\":" << pct(hit, 0.5) << ",\"hit_p99_us\":" << pct(hit, 0.99)
                << ",\"cpu_median_us\":" << pct(cpu, 0.5) << ",\"cpu_p99_us\":" << pct(cpu, 0.99) << "}}\n";
      if (opt.cache_stats) std::cerr << cached.stats_json() << "\n";
      return 0;
    }
    for (const auto& p : problems) std::cout << answer_json(man, p, cached.run(p, opt.top_k), opt.top_k) << "\n";
    if (opt.cache_stats) std::cerr << cached.stats_json() << "\n";
  } catch (const UsageError& e) {
    std::cerr << "ckpred_select: " << ckpred::printable(e.what()) << "\n";
    return 2;
  } catch (const ModelError& e) {
    std::cerr << "ckpred_select: model refused: " << ckpred::printable(e.what()) << "\n";
    return 3;
  } catch (const json::Error& e) {
    std::cerr << "ckpred_select: model refused: manifest.json: " << ckpred::printable(e.what()) << "\n";
    return 3;
  } catch (const Ort::Exception& e) {
    std::cerr << "ckpred_select: model refused: onnxruntime: " << ckpred::printable(e.what()) << "\n";
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Nothing escapes as an abort: whatever was not foreseen above still ends as one line.
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ckpred_select: error: " << ckpred::printable(e.what()) << "\n";
  } catch (...) {
    std::cerr << "ckpred_select: error: unknown exception\n";
  }
  return 3;
}
