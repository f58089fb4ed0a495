// ckpred_autotune_demo: drive ckpred_autotune.hpp from rankings (ckpred_select's output lines)
// with a table-driven benchmark, against the shared result store. A dispatcher does the same
// with its own selector and a real kernel timer; this program exists to show and test it
// without a GPU (and without onnxruntime: the ranking comes in as JSON).
//
//   ckpred_select MODEL --top-k 16 SHAPE... | ckpred_autotune_demo MODEL --store FILE --times TIMES.json
//     --budget fixed:K | time:SECONDS | wall:SECONDS | confidence:TARGET:WITHIN   (default fixed:2)
//     --max-benchmarks N   hard cap of benchmark calls per problem (default 16)
//     --max-entries N      store bound (default 10000)
//     --timeout S          seconds to wait for one benchmark call (default: no limit)
//     --refresh            benchmark even when the store has an answer
//   TIMES.json: {"<kernel name>": seconds | "throw" | "nan" | "hang", ...}; a kernel not listed
//   throws; "hang" never returns (to try --timeout).
// The model is verified as ckpred_select verifies it (sha256s, embedded manifest, calibration,
// catalogue hash) and the store is checked before the first ranking is read.
// Output: one JSON object per ranking line:
//   {"problem":"m=128,...","ok":true,"kernel":"...","kernel_id":4,"seconds":1e-05,"from_store":false,
//    "benchmarks":2,"failures":0,"stop":"budget spent","stored":true,"timed_out":false}
//   ("store_error":"..." when the result could not be stored).
// Exit codes: 0 ok, 2 usage/input error or model refused (one line on stderr).

#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "ckpred_autotune.hpp"

namespace at = ckpred::autotune;

namespace {

constexpr int64_t kMaxInputBytes = int64_t(64) << 20;  // --times file

// An option's integer in [lo, hi], named when it is anything else (text, overflow, out of range).
int64_t int_option(const std::string& name, const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  bool overflow = false;
  if (!ckpred::parse_int64(text, v, overflow) || v < lo || v > hi)
    throw at::Error(name + " '" + text + "': allowed: an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

// An option's finite number (the whole text, nothing after it) in (lo, hi].
double real_option(const std::string& name, const std::string& text, double lo, double hi) {
  char* end = nullptr;
  double v = text.empty() ? std::nan("") : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || !(v > lo) || !(v <= hi))
    throw at::Error(name + " '" + text + "': allowed: a number in (" + at::detail::seconds_text(lo) + ", " +
                    at::detail::seconds_text(hi) + "]");
  return v;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  for (size_t s = 0, e; s <= text.size(); s = e + 1) {
    e = text.find(sep, s);
    if (e == std::string::npos) e = text.size();
    parts.push_back(text.substr(s, e - s));
  }
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, store_path, times_path, budget_text = "fixed:2";
  int max_benchmarks = 16;
  size_t max_entries = 10000;
  double timeout = 0;
  bool refresh = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto need = [&]() -> std::string {
        if (i + 1 >= argc) throw at::Error(a + " needs a value");
        return argv[++i];
      };
      if (a == "--store") store_path = need();
      else if (a == "--times") times_path = need();
      else if (a == "--budget") budget_text = need();
      else if (a == "--max-benchmarks") max_benchmarks = static_cast<int>(int_option(a, need(), 1, 1000000));
      else if (a == "--max-entries") max_entries = static_cast<size_t>(int_option(a, need(), 1, int64_t(1) << 40));
      else if (a == "--timeout") timeout = real_option(a, need(), 0, 1e9);
      else if (a == "--refresh") refresh = true;
      else if (!a.empty() && a[0] == '-') throw at::Error("unknown option " + a);
      else if (model_dir.empty()) model_dir = a;
      else throw at::Error("unexpected argument " + a);
    }
    if (model_dir.empty() || store_path.empty() || times_path.empty())
      throw at::Error("usage: ckpred_autotune_demo MODEL_DIR --store FILE --times TIMES.json [--budget B] < rankings");
    at::ModelInfo info = at::load_model_info(model_dir);
    json::Value times;
    try {
      times = json::parse(ckpred::read_regular_file(AT_FDCWD, times_path, "times file " + times_path, kMaxInputBytes));
    } catch (const ckpred::FileError& e) {
      throw at::Error(e.what());
    } catch (const json::Error& e) {
      throw at::Error("times file " + times_path + ": not valid JSON (" + e.what() + ")");
    }
    if (!times.is_object()) throw at::Error("times file " + times_path + ": expected an object of kernel name -> seconds");
    at::Budget budget;
    std::vector<std::string> parts = split(budget_text, ':');
    if (parts[0] == "fixed" && parts.size() == 2)
      budget = at::Budget::fixed(static_cast<int>(int_option("--budget fixed:K", parts[1], 1, 1000000)), max_benchmarks);
    else if ((parts[0] == "time" || parts[0] == "wall") && parts.size() == 2)
      budget = at::Budget::time(real_option("--budget " + parts[0] + ":S", parts[1], 0, 1e9), parts[0] == "wall", max_benchmarks);
    else if (parts[0] == "confidence" && parts.size() == 3)
      budget = at::Budget::confidence(real_option("--budget confidence:TARGET", parts[1], 0, 1),
                                      real_option("--budget confidence:WITHIN", parts[2], 0, 1), info, max_benchmarks);
    else throw at::Error("--budget '" + budget_text + "'; allowed: fixed:K, time:S, wall:S, confidence:TARGET:WITHIN");
    at::ResultStore store(store_path, max_entries);
    store.check();  // before the first ranking is read or anything measured
    // The caller's benchmark: here a table lookup; a real dispatcher launches and times the kernel.
    // It copies the table it reads: with --timeout, a call may outlive this scope.
    auto table = std::make_shared<json::Value>(times);
    at::Benchmark bench = [table](const at::Candidate& c) -> double {
      auto it = table->o.find(c.name);
      if (it == table->o.end() || (it->second.is_string() && it->second.s == "throw"))
        throw std::runtime_error("kernel " + c.name + " failed to launch");
      if (it->second.is_string() && it->second.s == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      if (it->second.is_string()) return std::numeric_limits<double>::quiet_NaN();
      return it->second.num();
    };
    std::string line;
    for (size_t lineno = 1; std::getline(std::cin, line); ++lineno) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::vector<int64_t> values;
      std::vector<at::Candidate> ranked;
      try {
        json::Value answer = json::parse(line);
        for (const auto& f : info.fields) values.push_back(answer["problem"][f].int64());
        for (const auto& k : answer["kernels"].arr()) ranked.push_back({k["id"].int64(), k["name"].str(), k["score"].num()});
      } catch (const json::Error& e) {
        throw at::Error("ranking line " + std::to_string(lineno) + ": " + e.what() +
                        " (expected ckpred_select's output: problem fields and kernels with id, name, score)");
      }
      at::Result r = at::autotune(&store, info, at::problem_key(info.fields, values), ranked, bench, budget, refresh, timeout);
      size_t failures = 0;
      for (const auto& m : r.measured) failures += !m.ok();
      std::cout << "{\"problem\":" << at::quote(r.problem) << ",\"ok\":" << (r.ok() ? "true" : "false")
                << ",\"kernel\":" << (r.ok() ? at::quote(r.kernel) : "null") << ",\"kernel_id\":" << r.kernel_id
                << ",\"seconds\":" << (r.ok() ? at::number(r.seconds) : "null")
                << ",\"from_store\":" << (r.from_store ? "true" : "false") << ",\"benchmarks\":" << r.measured.size()
                << ",\"failures\":" << failures << ",\"policy\":" << at::quote(r.policy) << ",\"stop\":" << at::quote(r.stop)
                << ",\"stored\":" << (r.stored ? "true" : "false") << ",\"timed_out\":" << (r.timed_out ? "true" : "false");
      if (!r.store_error.empty()) std::cout << ",\"store_error\":" << at::quote(r.store_error);
      std::cout << "}" << std::endl;
    }
  } catch (const std::exception& e) {
    std::cerr << "ckpred_autotune_demo: " << ckpred::printable(e.what()) << "\n";
    return 2;
  }
  // A timed-out benchmark may still be running in its thread: end without waiting for it.
  std::cout.flush();
  std::_Exit(0);
}
