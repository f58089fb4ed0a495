// ckpred export manifest for the C++ selector: read it, check it, verify what it binds.
//
// The same checks as the Python runtime (ckpred.runtime.KernelSelector.load and
// ckpred.export.manifest.check_manifest), so a model either runtime refuses the other refuses too:
//   check_manifest            every key the selector reads, with its type (catalogue rows, ids
//                             0..n-1, cell kinds, file names, sha256s, ranges, minima)
//   verify_identity           op/arch/dtype/layout asked for == the manifest's
//   verify_files_sha256       sha256 of every listed file (model.onnx, scorer.onnx) == the manifest's
//   verify_catalogue_hash     the catalogue rows re-hashed exactly as OpDefinition.catalogue_hash
//                             does == the recorded hash (a renamed row is caught here)
//   (ckpred_select.cpp) verify_embedded_manifest / verify_graph_width: the manifest inside
//                             model.onnx == manifest.json; the graph ranks `candidates` kernels
// Problems are parsed by parse_problem (int64, >= the field's minimum, no negatives) and flagged
// by out_of_distribution (outside training.problem_ranges). Every failure is a UsageError
// (exit 2: bad input) or a ModelError (exit 3: model refused) with a one-line message.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "json.hpp"
#include "sha256.hpp"

namespace ckpred {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ModelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int64_t kInt64Max = INT64_MAX;
constexpr const char* kFormat = "ckpred.export/1";

struct Field {
  std::string name, kind;  // kind: int | float (kernel fields only) | bool | category
  std::vector<std::string> categories;
  bool has_default = false;
  int64_t default_code = 0;  // the default as the graph's int64 input
  int64_t minimum = 0;       // training.problem_minimum (0 when not recorded); never negative
  bool has_range = false;
  int64_t lo = 0, hi = 0;  // training.problem_ranges
};

struct Manifest {
  std::string path;                       // DIR/manifest.json, for messages
  json::Value doc;                        // the whole parsed manifest
  std::map<std::string, std::string> ident;  // op/arch/dtype/layout
  std::vector<Field> fields;              // problem fields, input column order
  std::vector<std::string> kernel_names;  // by kernel id
  int64_t candidates = 0;                 // kernels the graph ranks: catalogue or selection.candidate_ids
  std::string selector_file, selector_sha256, catalogue_hash;
};

// `text` with control characters escaped (\n, \x1b): a message stays one line.
inline std::string printable(const std::string& text) {
  std::string out;
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (ch == '\n') out += "\\n";
    else if (ch == '\r') out += "\\r";
    else if (ch == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += ch;
  }
  return out;
}

// A short rendering of a JSON value for messages (control characters escaped).
inline std::string show(const json::Value& v, size_t limit = 80) {
  std::string out;
  switch (v.kind) {
    case json::Value::Kind::Null: out = "null"; break;
    case json::Value::Kind::Bool: out = v.b ? "true" : "false"; break;
    case json::Value::Kind::Number: out = v.s; break;
    case json::Value::Kind::String: out = "'" + printable(v.s) + "'"; break;
    case json::Value::Kind::Array:
      out = "[";
      for (size_t i = 0; i < v.a.size() && out.size() < limit; ++i) out += (i ? ", " : "") + show(v.a[i], limit);
      out += "]";
      break;
    case json::Value::Kind::Object:
      out = "{";
      for (auto it = v.o.begin(); it != v.o.end() && out.size() < limit; ++it)
        out += (it == v.o.begin() ? "'" : ", '") + printable(it->first) + "': " + show(it->second, limit);
      out += "}";
      break;
  }
  return out.size() <= limit ? out : out.substr(0, limit - 3) + "...";
}

// A JSON number Python reads as a finite int or float (an integer literal is always fine).
inline bool finite_number(const json::Value& v) {
  return v.kind == json::Value::Kind::Number && (v.integer || std::isfinite(v.n));
}

// Type checks of one manifest; each failure names the file, the key, the value and what is expected.
class ManifestChecker {
 public:
  explicit ManifestChecker(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const json::Value& v, const std::string& expected) const {
    throw ModelError(path_ + ": key '" + printable(key) + "' is " + show(v) + "; expected " + printable(expected));
  }
  [[noreturn]] void fail_text(const std::string& key, const std::string& shown, const std::string& expected) const {
    throw ModelError(path_ + ": key '" + printable(key) + "' is " + shown + "; expected " + printable(expected));
  }
  const json::Value& get(const json::Value& obj, const std::string& key, const std::string& where) const {
    auto it = obj.o.find(key);
    if (!obj.is_object() || it == obj.o.end()) throw ModelError(path_ + ": key '" + printable(where + key) + "' is missing");
    return it->second;
  }
  const json::Value& object(const json::Value& v, const std::string& key) const {
    if (!v.is_object()) fail(key, v, "an object");
    return v;
  }
  const std::vector<json::Value>& array(const json::Value& v, const std::string& key, bool nonempty = false) const {
    if (!v.is_array() || (nonempty && v.a.empty())) fail(key, v, nonempty ? "a non-empty array" : "an array");
    return v.a;
  }
  const std::string& string(const json::Value& v, const std::string& key) const {
    if (!v.is_string() || v.s.empty()) fail(key, v, "a non-empty string");
    return v.s;
  }
  int64_t integer(const json::Value& v, const std::string& key, int64_t lo = 0, int64_t hi = kInt64Max) const {
    std::string expected = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v.is_int()) fail(key, v, expected);
    int64_t x = 0;
    try {
      x = v.int64();
    } catch (const json::Error&) {
      fail(key, v, expected);
    }
    if (x < lo || x > hi) fail(key, v, expected);
    return x;
  }
  const std::string& file_name(const json::Value& v, const std::string& key) const {
    const std::string& name = string(v, key);
    bool control = std::any_of(name.begin(), name.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7F; });
    if (name.find('/') != std::string::npos || name.find('\\') != std::string::npos || name == "." || name == ".." || control)
      fail(key, v, "a file name inside the export directory (no path separators)");
    return name;
  }
  const std::string& sha256(const json::Value& v, const std::string& key) const {
    if (!v.is_string() || v.s.size() != 64 ||
        v.s.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail(key, v, "a sha256 (64 lowercase hex digits)");
    return v.s;
  }
  std::vector<Field> fields(const json::Value& v, const std::string& key, bool problem) const {
    std::vector<Field> out;
    const auto& items = array(v, key, true);
    for (size_t i = 0; i < items.size(); ++i) {
      std::string where = key + "[" + std::to_string(i) + "]";
      const json::Value& f = object(items[i], where);
      Field field;
      field.name = string(get(f, "name", where + "."), where + ".name");
      const json::Value& kind = get(f, "kind", where + ".");
      // The selector graph's problem input is int64: no float problem fields.
      bool known = kind.is_string() && (kind.s == "int" || kind.s == "bool" || kind.s == "category" ||
                                        (!problem && kind.s == "float"));
      if (!known) fail(where + ".kind", kind, problem ? "one of ['int', 'bool', 'category']" : "one of ['int', 'float', 'bool', 'category']");
      field.kind = kind.s;
      if (f.has("categories")) {
        for (const json::Value& c : array(f.o.at("categories"), where + ".categories")) {
          if (!c.is_string()) fail(where + ".categories", f.o.at("categories"), "an array of strings");
          field.categories.push_back(c.s);
        }
      }
      if (field.kind == "category" && field.categories.empty())
        fail(where + ".categories", f.has("categories") ? f.o.at("categories") : json::Value(), "a non-empty array of strings");
      if (f.has("default") && !f.o.at("default").is_null()) {
        const json::Value& d = f.o.at("default");
        field.has_default = true;
        if (field.kind == "int") {
          if (!d.is_int()) fail(where + ".default", d, "null or a value of kind int");
          try {
            field.default_code = d.int64();
          } catch (const json::Error&) {
            fail(where + ".default", d, "null or a value of kind int");
          }
        } else if (field.kind == "float") {
          if (!finite_number(d)) fail(where + ".default", d, "null or a value of kind float");
        } else if (field.kind == "bool") {
          if (!d.is_bool()) fail(where + ".default", d, "null or a value of kind bool");
          field.default_code = d.b ? 1 : 0;
        } else {
          auto it = d.is_string() ? std::find(field.categories.begin(), field.categories.end(), d.s) : field.categories.end();
          if (it == field.categories.end()) fail(where + ".default", d, "null or a value of kind category");
          field.default_code = it - field.categories.begin();
        }
      }
      for (const Field& prev : out)
        if (prev.name == field.name) fail(where + ".name", get(f, "name", where + "."), "distinct field names");
      out.push_back(field);
    }
    return out;
  }

 private:
  std::string path_;
};

// Check every key the selector reads and fill a Manifest (same checks as Python's check_manifest).
inline Manifest check_manifest(json::Value doc, const std::string& path) {
  ManifestChecker c(path);
  Manifest man;
  man.path = path;
  c.object(doc, "(top level)");
  if (!doc.has("format") || !doc.o.at("format").is_string() || doc.o.at("format").s != kFormat)
    throw ModelError(path + ": format " + (doc.has("format") ? show(doc.o.at("format")) : std::string("missing")) +
                     ", expected '" + kFormat + "'");
  for (const char* key : {"op", "arch", "dtype", "layout"}) man.ident[key] = c.string(c.get(doc, key, ""), key);
  const std::string& op = man.ident["op"];
  bool identifier = !std::isdigit(static_cast<unsigned char>(op[0]));
  for (char ch : op) identifier = identifier && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_');
  if (!identifier) c.fail("op", doc.o.at("op"), "an op name (a Python identifier such as 'gemm_universal')");

  const json::Value& graphs = c.object(c.get(doc, "graphs", ""), "graphs");
  const json::Value& selector = c.object(c.get(graphs, "selector", "graphs."), "graphs.selector");
  man.selector_file = c.file_name(c.get(selector, "file", "graphs.selector."), "graphs.selector.file");
  for (const char* io : {"inputs", "outputs"}) {
    std::string key = std::string("graphs.selector.") + io;
    const auto& items = c.array(c.get(selector, io, "graphs.selector."), key);
    for (size_t i = 0; i < items.size(); ++i) {
      std::string where = key + "[" + std::to_string(i) + "]";
      c.string(c.get(c.object(items[i], where), "name", where + "."), where + ".name");
    }
  }
  const json::Value& files = c.object(c.get(doc, "files", ""), "files");
  for (const auto& [name, info] : files.o) {
    json::Value n;
    n.kind = json::Value::Kind::String;
    n.s = name;
    c.file_name(n, "files");
    c.sha256(c.get(c.object(info, "files." + name), "sha256", "files." + name + "."), "files." + name + ".sha256");
  }
  if (!files.has(man.selector_file)) c.fail("files", files, "an entry for the selector file '" + man.selector_file + "'");
  man.selector_sha256 = files.o.at(man.selector_file).o.at("sha256").s;

  man.fields = c.fields(c.get(doc, "problem_fields", ""), "problem_fields", true);
  std::vector<Field> kernel = c.fields(c.get(doc, "kernel_fields", ""), "kernel_fields", false);

  const json::Value& cat = c.object(c.get(doc, "catalogue", ""), "catalogue");
  man.catalogue_hash = c.sha256(c.get(cat, "hash", "catalogue."), "catalogue.hash");
  int64_t count = c.integer(c.get(cat, "count", "catalogue."), "catalogue.count", 1);
  std::vector<std::string> columns = {"kernel_id", "kernel_name"};
  for (const Field& f : kernel) columns.push_back(f.name);
  const json::Value& cols = c.get(cat, "columns", "catalogue.");
  bool same = cols.is_array() && cols.a.size() == columns.size();
  for (size_t j = 0; same && j < columns.size(); ++j) same = cols.a[j].is_string() && cols.a[j].s == columns[j];
  if (!same) c.fail("catalogue.columns", cols, "kernel_id, kernel_name and the kernel fields, in order");
  const auto& rows = c.array(c.get(cat, "rows", "catalogue."), "catalogue.rows");
  if (static_cast<int64_t>(rows.size()) != count)
    c.fail_text("catalogue.rows", "<" + std::to_string(rows.size()) + " rows>",
                "catalogue.count = " + std::to_string(count) + " rows");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string key = "catalogue.rows[" + std::to_string(i) + "]";
    if (!rows[i].is_array() || rows[i].a.size() != columns.size())
      c.fail(key, rows[i], "an array of " + std::to_string(columns.size()) + " values (one per column)");
    const auto& row = rows[i].a;
    for (size_t j = 0; j < row.size(); ++j) {
      const json::Value& v = row[j];
      std::string where = key + "[" + std::to_string(j) + "] (" + columns[j] + ")";
      if (j == 0) {
        bool ok = v.is_int();
        try {
          ok = ok && v.int64() == static_cast<int64_t>(i);
        } catch (const json::Error&) {
          ok = false;
        }
        if (!ok) c.fail(where, v, std::to_string(i) + " (kernel ids are 0..n-1 in row order)");
      } else if (j == 1) {
        if (!v.is_string() || v.s.empty()) c.fail(where, v, "a kernel name");
        man.kernel_names.push_back(v.s);
      } else {
        const Field& f = kernel[j - 2];
        if (f.kind == "int") {
          bool ok = v.is_int();
          try {
            if (ok) v.int64();
          } catch (const json::Error&) {
            ok = false;
          }
          if (!ok) c.fail(where, v, "an integer");
        } else if (f.kind == "float") {
          if (!finite_number(v)) c.fail(where, v, "a finite number");
        } else if (f.kind == "bool") {
          if (!v.is_bool()) c.fail(where, v, "true or false");
        } else if (!v.is_string() || std::find(f.categories.begin(), f.categories.end(), v.s) == f.categories.end()) {
          c.fail(where, v, "one of the field's categories");
        }
      }
    }
  }
  man.candidates = count;
  if (doc.has("selection") && !doc.o.at("selection").is_null()) {
    const json::Value& sel = c.object(doc.o.at("selection"), "selection");
    if (sel.has("candidate_ids") && !sel.o.at("candidate_ids").is_null()) {
      const json::Value& ids = sel.o.at("candidate_ids");
      const auto& items = c.array(ids, "selection.candidate_ids", true);
      std::vector<int64_t> seen;
      for (const json::Value& id : items) {
        bool ok = id.is_int();
        int64_t x = -1;
        try {
          if (ok) x = id.int64();
        } catch (const json::Error&) {
          ok = false;
        }
        if (!ok || x < 0 || x >= count) c.fail("selection.candidate_ids", ids, "distinct kernel ids in [0, " + std::to_string(count) + ")");
        seen.push_back(x);
      }
      std::sort(seen.begin(), seen.end());
      if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
        c.fail("selection.candidate_ids", ids, "distinct kernel ids in [0, " + std::to_string(count) + ")");
      man.candidates = static_cast<int64_t>(items.size());
    }
  }
  if (doc.has("training") && !doc.o.at("training").is_null()) {
    const json::Value& training = c.object(doc.o.at("training"), "training");
    auto field_named = [&](const std::string& name, const std::string& key, const json::Value& v) -> Field& {
      for (Field& f : man.fields)
        if (f.name == name) return f;
      c.fail(key, v, "an entry of a problem field");
    };
    if (training.has("problem_ranges")) {
      for (const auto& [name, rng] : c.object(training.o.at("problem_ranges"), "training.problem_ranges").o) {
        std::string key = "training.problem_ranges." + name;
        Field& f = field_named(name, key, rng);
        bool ok = rng.is_array() && rng.a.size() == 2 && rng.a[0].is_int() && rng.a[1].is_int();
        try {
          if (ok) {
            f.lo = rng.a[0].int64();
            f.hi = rng.a[1].int64();
          }
        } catch (const json::Error&) {
          ok = false;
        }
        if (!ok || f.lo > f.hi) c.fail(key, rng, "[min, max] integers with min <= max");
        f.has_range = true;
      }
    }
    if (training.has("problem_minimum")) {
      for (const auto& [name, v] : c.object(training.o.at("problem_minimum"), "training.problem_minimum").o) {
        std::string key = "training.problem_minimum." + name;
        field_named(name, key, v).minimum = c.integer(v, key, 0, 1);
      }
    }
  }
  man.doc = std::move(doc);
  return man;
}

inline std::string read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw ModelError("cannot read " + path);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) throw ModelError("cannot read " + path + " (read error)");
  return out;
}

// Read DIR/manifest.json: UTF-8, strict JSON, then check_manifest.
inline Manifest load_manifest(const std::string& dir) {
  std::string path = dir + "/manifest.json";
  json::Value doc;
  try {
    doc = json::parse(read_file(path));
  } catch (const json::Error& e) {
    throw ModelError(path + ": not valid JSON (" + e.what() + ")");
  }
  return check_manifest(std::move(doc), path);
}

inline void verify_identity(const Manifest& man, const std::string& dir, const std::map<std::string, std::string>& wanted) {
  for (const auto& [key, want] : wanted) {
    auto it = man.ident.find(key);
    if (it == man.ident.end() || it->second != want)
      throw ModelError(dir + ": model is for " + key + " '" + printable(it == man.ident.end() ? "" : it->second) +
                       "', asked for '" + printable(want) + "'");
  }
}

// Every file the manifest lists (the selector graph and the scorer) against its sha256, as the
// Python runtime's verify_files: a missing file or a different digest refuses the model.
inline void verify_files_sha256(const Manifest& man, const std::string& dir) {
  for (const auto& [name, info] : man.doc["files"].o) {
    std::string path = dir + "/" + name;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw ModelError(path + ": listed in the manifest but missing");
    std::fclose(f);
    std::string digest = sha256::hex(read_file(path));
    const std::string& want = info["sha256"].str();
    if (digest != want)
      throw ModelError(path + ": sha256 " + digest + " does not match the manifest's " + want +
                       " (file modified or replaced after export)");
  }
}

// Append `text` (UTF-8) as Python's json.dumps writes a str (ensure_ascii: every character
// outside ' '..'~' as \uXXXX, lowercase hex, astral characters as surrogate pairs).
inline void append_python_json_string(std::string& out, const std::string& text) {
  static const char* hex = "0123456789abcdef";
  auto u = [&](unsigned cp) {
    out += "\\u";
    for (int s = 12; s >= 0; s -= 4) out += hex[(cp >> s) & 0xF];
  };
  out += '"';
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    unsigned cp;
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + len > text.size()) len = text.size() - i;  // validated UTF-8 at parse: cannot happen
    cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t j = 1; j < len; ++j) cp = (cp << 6) | (static_cast<unsigned char>(text[i + j]) & 0x3F);
    i += len;
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp >= 0x20 && cp <= 0x7E) out += static_cast<char>(cp);
        else if (cp < 0x10000) u(cp);
        else {
          cp -= 0x10000;
          u(0xD800 | (cp >> 10));
          u(0xDC00 | (cp & 0x3FF));
        }
    }
  }
  out += '"';
}

// Python's repr() of a float (the shortest digits that read back, fixed notation for
// exponents -4..15, else d.ddde+XX; always a '.' or an exponent).
inline std::string python_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s(buf);
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  size_t e = s.find('e');
  int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits += s[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exp + 1) {
    out = digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
  }
  return (neg ? "-" : "") + out;
}

// sha256 of the catalogue rows exactly as OpDefinition.catalogue_hash computes it: the rows as
// a pandas frame, every cell through astype(str), dumped by json.dumps(rows, separators=(",", ":")).
// pandas makes a column of integers int64 ("64"), of bools bool ("True"), of strings object (as
// is), and a column with any non-integer number float64 (every cell as Python's repr of the
// float: "64.0", "0.5"). check_manifest has already checked each cell's kind.
inline std::string catalogue_hash(const json::Value& doc) {
  const auto& rows = doc["catalogue"]["rows"].arr();
  size_t ncol = rows.empty() ? 0 : rows[0].a.size();
  std::vector<bool> float_column(ncol, false);
  for (const json::Value& row : rows)
    for (size_t j = 0; j < ncol; ++j)
      if (row.a[j].kind == json::Value::Kind::Number && !row.a[j].integer) float_column[j] = true;
  std::string blob = "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    blob += i ? ",[" : "[";
    for (size_t j = 0; j < rows[i].a.size(); ++j) {
      const json::Value& v = rows[i].a[j];
      if (j) blob += ',';
      if (v.is_bool()) append_python_json_string(blob, v.b ? "True" : "False");
      else if (float_column[j]) append_python_json_string(blob, python_float_repr(v.n));
      else if (v.is_int()) append_python_json_string(blob, std::to_string(v.int64()));
      else append_python_json_string(blob, v.str());
    }
    blob += ']';
  }
  blob += ']';
  return sha256::hex(blob);
}

inline void verify_catalogue_hash(const Manifest& man) {
  std::string got = catalogue_hash(man.doc);
  if (got != man.catalogue_hash)
    throw ModelError(man.path + ": catalogue rows do not hash to the recorded " + man.catalogue_hash + " (they hash to " +
                     got + "; manifest edited?)");
}

// Strict decimal int64 (optional sign, digits only); false on anything else, `overflow` set
// when the digits are beyond int64.
inline bool parse_int64(const std::string& text, int64_t& out, bool& overflow) {
  overflow = false;
  size_t i = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (i == text.size() || text.find_first_not_of("0123456789", i) != std::string::npos) return false;
  bool neg = text[0] == '-';
  uint64_t v = 0, limit = neg ? 9223372036854775808ULL : 9223372036854775807ULL;
  for (; i < text.size(); ++i) {
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (limit - d) / 10) {
      overflow = true;
      return false;
    }
    v = v * 10 + d;
  }
  out = neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  return true;
}

// Parse one problem value of `f` from text: int fields as int64 in [minimum, 2^63-1], bool
// fields true/false, category fields one of the categories. Returns the graph's int64 code.
inline int64_t parse_problem_value(const Field& f, const std::string& text) {
  std::string what = "problem field " + f.name + "=" + (text.empty() ? "''" : text);
  if (f.kind == "bool") {
    if (text == "true" || text == "True") return 1;
    if (text == "false" || text == "False") return 0;
    throw UsageError(what + ": allowed: true or false");
  }
  if (f.kind == "category") {
    auto it = std::find(f.categories.begin(), f.categories.end(), text);
    if (it == f.categories.end()) {
      std::string all;
      for (const auto& cat : f.categories) all += (all.empty() ? "" : ", ") + cat;
      throw UsageError(what + ": allowed: one of " + all);
    }
    return it - f.categories.begin();
  }
  std::string allowed = "allowed: an integer in [" + std::to_string(f.minimum) + ", " + std::to_string(kInt64Max) + "]";
  int64_t v = 0;
  bool overflow = false;
  if (!parse_int64(text, v, overflow)) throw UsageError(what + (overflow ? " is beyond int64; " : " is not an integer; ") + allowed);
  if (v < 0) throw UsageError(what + " is negative; " + allowed);
  if (v < f.minimum) throw UsageError(what + " is below the field's minimum; " + allowed);
  return v;
}

// Field -> (value, [min, max]) for each int field of `problem` outside its training range, as
// Python's Selection.ood_fields; JSON: {"m":[100000,[1,16384]]}.
inline std::string out_of_distribution_json(const Manifest& man, const std::vector<int64_t>& problem, bool& any) {
  std::string out = "{";
  any = false;
  for (size_t i = 0; i < man.fields.size() && i < problem.size(); ++i) {
    const Field& f = man.fields[i];
    if (!f.has_range || (problem[i] >= f.lo && problem[i] <= f.hi)) continue;
    out += (any ? ",\"" : "\"") + f.name + "\":[" + std::to_string(problem[i]) + ",[" + std::to_string(f.lo) + "," +
           std::to_string(f.hi) + "]]";
    any = true;
  }
  return out + "}";
}

}  // namespace ckpred
