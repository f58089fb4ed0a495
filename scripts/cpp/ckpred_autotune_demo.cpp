// ckpred_autotune_demo: drive ckpred_autotune.hpp from rankings (ckpred_select's output lines)
// with a table-driven benchmark, against the shared result store. A dispatcher does the same
// with its own selector and a real kernel timer; this program exists to show and test it
// without a GPU (and without onnxruntime: the ranking comes in as JSON).
//
//   ckpred_select MODEL --top-k 16 SHAPE... | ckpred_autotune_demo MODEL --store FILE --times TIMES.json
//     --budget fixed:K | time:SECONDS | wall:SECONDS | confidence:TARGET:WITHIN   (default fixed:2)
//     --max-benchmarks N   hard cap of benchmark calls per problem (default 16)
//     --max-entries N      store bound (default 10000)
//     --refresh            benchmark even when the store has an answer
//   TIMES.json: {"<kernel name>": seconds | "throw" | "nan", ...}; a kernel not listed throws.
// Output: one JSON object per ranking line:
//   {"problem":"m=128,...","ok":true,"kernel":"...","kernel_id":4,"seconds":1e-05,"from_store":false,
//    "benchmarks":2,"failures":0,"stop":"budget spent"}
// Exit codes: 0 ok, 2 usage/input error.

#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "ckpred_autotune.hpp"

namespace at = ckpred::autotune;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw at::Error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, store_path, times_path, budget_text = "fixed:2";
  int max_benchmarks = 16;
  size_t max_entries = 10000;
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
      else if (a == "--max-benchmarks") max_benchmarks = std::stoi(need());
      else if (a == "--max-entries") max_entries = static_cast<size_t>(std::stoul(need()));
      else if (a == "--refresh") refresh = true;
      else if (model_dir.empty()) model_dir = a;
      else throw at::Error("unexpected argument " + a);
    }
    if (model_dir.empty() || store_path.empty() || times_path.empty())
      throw at::Error("usage: ckpred_autotune_demo MODEL_DIR --store FILE --times TIMES.json [--budget B] < rankings");
    at::ModelInfo info = at::load_model_info(model_dir);
    json::Value times = json::parse(slurp(times_path));
    at::Budget budget;
    auto parts = std::vector<std::string>();
    for (size_t s = 0, e; s <= budget_text.size(); s = e + 1) {
      e = budget_text.find(':', s);
      if (e == std::string::npos) e = budget_text.size();
      parts.push_back(budget_text.substr(s, e - s));
    }
    if (parts[0] == "fixed" && parts.size() == 2) budget = at::Budget::fixed(std::stoi(parts[1]), max_benchmarks);
    else if ((parts[0] == "time" || parts[0] == "wall") && parts.size() == 2)
      budget = at::Budget::time(std::stod(parts[1]), parts[0] == "wall", max_benchmarks);
    else if (parts[0] == "confidence" && parts.size() == 3)
      budget = at::Budget::confidence(std::stod(parts[1]), std::stod(parts[2]), info, max_benchmarks);
    else throw at::Error("--budget '" + budget_text + "'; allowed: fixed:K, time:S, wall:S, confidence:TARGET:WITHIN");
    at::ResultStore store(store_path, max_entries);
    // The caller's benchmark: here a table lookup; a real dispatcher launches and times the kernel.
    at::Benchmark bench = [&](const at::Candidate& c) -> double {
      auto it = times.o.find(c.name);
      if (it == times.o.end() || (it->second.kind == json::Value::Kind::String && it->second.s == "throw"))
        throw std::runtime_error("kernel " + c.name + " failed to launch");
      if (it->second.kind == json::Value::Kind::String) return std::numeric_limits<double>::quiet_NaN();
      return it->second.num();
    };
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json::Value answer = json::parse(line);
      std::vector<int64_t> values;
      for (const auto& f : info.fields) values.push_back(static_cast<int64_t>(answer["problem"][f].num()));
      std::vector<at::Candidate> ranked;
      for (const auto& k : answer["kernels"].arr())
        ranked.push_back({static_cast<int64_t>(k["id"].num()), k["name"].str(), k["score"].num()});
      at::Result r = at::autotune(&store, info, at::problem_key(info.fields, values), ranked, bench, budget, refresh);
      size_t failures = 0;
      for (const auto& m : r.measured) failures += !m.ok();
      std::cout << "{\"problem\":" << at::quote(r.problem) << ",\"ok\":" << (r.ok() ? "true" : "false")
                << ",\"kernel\":" << (r.ok() ? at::quote(r.kernel) : "null") << ",\"kernel_id\":" << r.kernel_id
                << ",\"seconds\":" << (r.ok() ? at::number(r.seconds) : "null")
                << ",\"from_store\":" << (r.from_store ? "true" : "false") << ",\"benchmarks\":" << r.measured.size()
                << ",\"failures\":" << failures << ",\"stop\":" << at::quote(r.stop) << "}\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "ckpred_autotune_demo: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
