// ckpred export manifest for the C++ runtimes: read it, check it, verify what it binds.
//
// The same checks as the Python runtime (ckpred.runtime.KernelSelector.load and
// ckpred.export.manifest.check_manifest), so a model either runtime refuses the other refuses too.
// verify_export() runs them all, for both C++ entry points (ckpred_select and the autotune
// header's load_model_info):
//   check_manifest            every key the selector reads, with its type (catalogue rows, ids
//                             0..n-1, cell kinds, file names, sha256s, ranges, minima)
//   verify_identity           op/arch/dtype/layout asked for == the manifest's
//   sha256                    of the bytes read of every listed file (model.onnx, scorer.onnx)
//   embedded manifest         the manifest inside model.onnx (metadata ckpred.manifest, read from
//                             the protobuf without onnxruntime) == manifest.json minus "files"
//   check_calibration         the "autotune" section: numbers (not text), finite, scale > 0,
//                             shapes, tolerances, the logistic model's fields (Python's rules)
//   verify_catalogue_hash     the catalogue rows re-hashed exactly as OpDefinition.catalogue_hash
//                             does == the recorded hash (a renamed row is caught here)
// Files are read through one descriptor of the export directory, each at most once, and must be
// regular files of bounded size (a FIFO or /dev/zero is refused before a byte is read); the
// bytes verified are the bytes used. (ckpred_select.cpp then checks the graph's width.)
// Problems are parsed by parse_problem (int64, >= the field's minimum, no negatives) and flagged
// by out_of_distribution (outside training.problem_ranges). Every failure is a UsageError
// (exit 2: bad input) or a ModelError (exit 3: model refused) with a one-line message.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
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
  std::vector<std::string> trained_archs;  // training.archs: the GPUs the model trained on (empty: not recorded)
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
    if (training.has("archs")) {
      const json::Value& archs = training.o.at("archs");
      if (!archs.is_array()) c.fail("training.archs", archs, "an array");
      for (size_t i = 0; i < archs.a.size(); ++i) {
        if (!archs.a[i].is_string() || archs.a[i].s.empty())
          c.fail("training.archs[" + std::to_string(i) + "]", archs.a[i], "a non-empty string");
        man.trained_archs.push_back(archs.a[i].s);
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

// Largest manifest and model file read (bytes), as the Python runtime (ckpred/runtime.py).
constexpr int64_t kMaxManifestBytes = int64_t(256) << 20;
constexpr int64_t kMaxModelBytes = int64_t(2) << 30;
constexpr size_t kEagerFiles = 64;  // files of an export directory opened before its manifest is read

// Why a file that is not a regular file cannot be read ("a FIFO", "a directory", ...).
inline std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// A file read failure: `missing` when the file does not exist (the caller decides what that means).
struct FileError : std::runtime_error {
  bool missing;
  FileError(const std::string& what, bool missing_) : std::runtime_error(what), missing(missing_) {}
};

// A descriptor of `name` relative to directory descriptor `dirfd` (AT_FDCWD: a path), opened
// non-blocking (a FIFO does not wait for a writer); FileError (missing) when it does not exist.
// Anything but a regular file (a FIFO, a device, a directory) is refused by its kind unopened.
inline int open_file(int dirfd, const std::string& name, const std::string& shown) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, 0) == 0 && !S_ISREG(st.st_mode))
    throw FileError(shown + ": " + file_kind(st.st_mode) + ", not a regular file", false);
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    throw FileError(err == ENOENT ? shown + ": missing" : "cannot read " + shown + ": " + std::strerror(err), err == ENOENT);
  }
  return fd;
}

// The bytes of the open file `fd` (closed here): a regular file of at most `limit` bytes, checked
// before a byte is read (a device is never read); `shown` names it in messages.
inline std::string read_fd(int fd, const std::string& shown, int64_t limit) {
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw FileError("cannot read " + shown + ": " + std::strerror(errno), false);
  if (!S_ISREG(st.st_mode)) throw FileError(shown + ": " + file_kind(st.st_mode) + ", not a regular file", false);
  if (st.st_size > limit)
    throw FileError(shown + ": larger than " + std::to_string(limit) + " bytes, the most this file may hold", false);
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw FileError("cannot read " + shown + ": " + std::strerror(errno), false);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > limit)
      throw FileError(shown + ": larger than " + std::to_string(limit) + " bytes, the most this file may hold", false);
  }
  return out;
}

inline std::string read_regular_file(int dirfd, const std::string& name, const std::string& shown, int64_t limit) {
  return read_fd(open_file(dirfd, name, shown), shown, limit);
}

inline std::string read_file(const std::string& path, int64_t limit = kMaxManifestBytes) {
  try {
    return read_regular_file(AT_FDCWD, path, path, limit);
  } catch (const FileError& e) {
    throw ModelError(e.what());
  }
}

// Parse manifest bytes read from `path`: UTF-8, strict JSON, then check_manifest.
inline Manifest parse_manifest(const std::string& text, const std::string& path) {
  json::Value doc;
  try {
    doc = json::parse(text);
  } catch (const json::Error& e) {
    throw ModelError(path + ": not valid JSON (" + e.what() + ")");
  }
  return check_manifest(std::move(doc), path);
}

// Read DIR/manifest.json (a regular file of bounded size): UTF-8, strict JSON, then check_manifest.
inline Manifest load_manifest(const std::string& dir) {
  std::string path = dir + "/manifest.json";
  return parse_manifest(read_file(path), path);
}

inline void verify_identity(const Manifest& man, const std::string& dir, const std::map<std::string, std::string>& wanted) {
  for (const auto& [key, want] : wanted) {
    auto it = man.ident.find(key);
    if (it == man.ident.end() || it->second != want)
      throw ModelError(dir + ": model is for " + key + " '" + printable(it == man.ident.end() ? "" : it->second) +
                       "', asked for '" + printable(want) + "'");
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

// ---- the manifest embedded in the selector graph -------------------------------------------------
namespace protobuf {

inline bool varint(const std::string& b, size_t& i, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (i >= b.size()) return false;
    uint8_t c = static_cast<uint8_t>(b[i++]);
    v |= static_cast<uint64_t>(c & 0x7F) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

// Walk the top-level fields of a protobuf message; `on_bytes(field, begin, length)` sees each
// length-delimited one. False when the wire format is broken (truncated, a group, field 0).
template <class F>
bool fields(const std::string& b, size_t begin, size_t end, F on_bytes) {
  size_t i = begin;
  while (i < end) {
    uint64_t tag = 0, v = 0;
    if (!varint(b, i, tag) || i > end || (tag >> 3) == 0) return false;
    switch (tag & 7) {
      case 0:
        if (!varint(b, i, v) || i > end) return false;
        break;
      case 1:
        if (end - i < 8) return false;
        i += 8;
        break;
      case 5:
        if (end - i < 4) return false;
        i += 4;
        break;
      case 2:
        if (!varint(b, i, v) || i > end || v > end - i) return false;
        on_bytes(tag >> 3, i, static_cast<size_t>(v));
        i += static_cast<size_t>(v);
        break;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace protobuf

// The value of metadata_props[key] (ModelProto field 14: StringStringEntryProto key=1, value=2)
// of a serialized ONNX model, read without onnxruntime; the last entry of a key wins, as in Python.
inline std::optional<std::string> onnx_metadata(const std::string& model, const std::string& key, const std::string& where) {
  std::optional<std::string> found;
  bool ok = protobuf::fields(model, 0, model.size(), [&](uint64_t field, size_t at, size_t len) {
    if (field != 14) return;
    std::string k, v;
    bool entry = protobuf::fields(model, at, at + len, [&](uint64_t f, size_t a, size_t l) {
      if (f == 1) k = model.substr(a, l);
      else if (f == 2) v = model.substr(a, l);
    });
    if (!entry) throw ModelError(where + ": not a readable ONNX model (a broken metadata entry)");
    if (k == key) found = v;
  });
  if (!ok) throw ModelError(where + ": not a readable ONNX model (its protobuf encoding is broken)");
  return found;
}

// manifest.json minus "files" == the manifest embedded in the selector graph's metadata: a
// catalogue edited and re-signed in manifest.json, or files of two exports put together, differ.
inline void verify_embedded_manifest(const Manifest& man, const std::string& model_bytes, const std::string& model_path) {
  std::optional<std::string> text = onnx_metadata(model_bytes, "ckpred.manifest", model_path);
  json::Value embedded;
  if (text) {
    try {
      embedded = json::parse(*text);
    } catch (const json::Error& e) {
      throw ModelError(model_path + ": embedded manifest is not valid JSON (" + e.what() + ")");
    }
  }
  bool same = embedded.is_object() && embedded.o.size() + (man.doc.has("files") ? 1 : 0) == man.doc.o.size();
  for (auto it = man.doc.o.begin(); same && it != man.doc.o.end(); ++it) {
    if (it->first == "files") continue;
    auto e = embedded.o.find(it->first);
    same = e != embedded.o.end() && json::equal(e->second, it->second);
  }
  if (!same)
    throw ModelError(man.path + " does not match the manifest embedded in " + man.selector_file +
                     " (manifest edited, or files from different exports?)");
}

// ---- the autotune calibration (ckpred.autotune.Calibration / LogisticCalibration.from_dict) -------
constexpr const char* kCalibrationFormat = "ckpred.autotune.calibration/1";
constexpr const char* kLogisticFormat = "ckpred.autotune.logistic/1";

struct CalibrationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace calib {

[[noreturn]] inline void fail(const std::string& what) { throw CalibrationError("autotune calibration: " + what); }

inline const json::Value& key(const json::Value& v, const char* k) {
  auto it = v.o.find(k);
  if (it == v.o.end()) fail(std::string("missing key '") + k + "'");
  return it->second;
}
inline const std::vector<json::Value>& array(const json::Value& v, const std::string& k) {
  if (!v.is_array()) fail(k + " is " + show(v) + "; allowed: an array");
  return v.a;
}
// A JSON array of numbers (not text, not booleans), as doubles (an integer beyond double: inf).
inline std::vector<double> reals(const json::Value& v, const std::string& k) {
  std::vector<double> out;
  for (const json::Value& x : array(v, k)) {
    if (x.kind != json::Value::Kind::Number) fail(k + " holds " + show(x) + "; allowed: numbers (not text or booleans)");
    out.push_back(x.n);
  }
  return out;
}
inline int64_t integer(const json::Value& v, const std::string& k, int64_t lo) {
  bool ok = v.is_int();
  int64_t x = 0;
  try {
    if (ok) x = v.int64();
  } catch (const json::Error&) {
    ok = false;
  }
  if (!ok || x < lo) fail(k + " is " + show(v) + "; allowed: an integer in [" + std::to_string(lo) + ", 2^63-1]");
  return x;
}
inline void within(const std::vector<double>& w) {
  for (size_t i = 0; i < w.size(); ++i)
    if (!(w[i] > 0 && w[i] < 1) || std::count(w.begin(), w.end(), w[i]) != 1)
      fail("within must be distinct fractions in (0, 1)");
}
// The keys of either kind besides its model (ckpred.autotune._policy): fallback_k an integer
// >= 1, uninformative_within tolerances of `w`, zero_shot a boolean; each optional.
inline void policy(const json::Value& v, const std::vector<double>& w) {
  if (v.has("fallback_k")) integer(v.o.at("fallback_k"), "fallback_k", 1);
  if (v.has("uninformative_within"))
    for (double x : reals(v.o.at("uninformative_within"), "uninformative_within"))
      if (std::find(w.begin(), w.end(), x) == w.end())
        fail("uninformative_within=" + show(v.o.at("uninformative_within")) + "; allowed: tolerances of within");
  if (v.has("zero_shot") && v.o.at("zero_shot").kind != json::Value::Kind::Bool)
    fail("zero_shot is " + show(v.o.at("zero_shot")) + "; allowed: true or false");
}

}  // namespace calib

// Check a manifest's "autotune" section exactly as the Python runtime does at load (null: none).
// `int_fields`: the manifest's integer problem fields, which a logistic model's fields must be
// (nullptr: not checked, for a calibration read outside a manifest).
inline void check_calibration(const json::Value& v, const std::vector<std::string>* int_fields) {
  using namespace calib;
  if (v.is_null()) return;
  if (!v.is_object() || !v.has("format") || !v.o.at("format").is_string() ||
      (v.o.at("format").s != kCalibrationFormat && v.o.at("format").s != kLogisticFormat))
    fail(std::string("format ") + (v.has("format") ? show(v.o.at("format")) : std::string("missing")) + ", expected '" +
         kCalibrationFormat + "' or '" + kLogisticFormat + "'");
  if (v.o.at("format").s == kCalibrationFormat) {
    std::vector<double> w = reals(key(v, "within"), "within"), edges = reals(key(v, "edges"), "edges");
    const auto& tables = array(key(v, "probability"), "probability");
    const auto& counts = array(key(v, "counts"), "counts");
    std::vector<std::vector<std::vector<double>>> prob;
    for (const json::Value& t : tables) {
      prob.emplace_back();
      for (const json::Value& row : array(t, "probability")) prob.back().push_back(reals(row, "probability"));
    }
    for (const json::Value& c : counts) integer(c, "counts", 0);
    if (v.has("gap_to")) integer(v.o.at("gap_to"), "gap_to", 2);
    size_t bins = edges.size() + 1, width = 0;
    bool shaped = prob.size() == w.size() && counts.size() == bins && !prob.empty();
    for (size_t t = 0; shaped && t < prob.size(); ++t) {
      shaped = prob[t].size() == bins;
      for (size_t r = 0; shaped && r < prob[t].size(); ++r) {
        if (t == 0 && r == 0) width = prob[t][r].size();
        shaped = prob[t][r].size() == width;
      }
    }
    if (!shaped)
      fail("probability must be [" + std::to_string(w.size()) + " within][" + std::to_string(bins) + " bins][max_k], counts [" +
           std::to_string(bins) + "]");
    within(w);
    for (size_t i = 0; i < edges.size(); ++i)
      if (!std::isfinite(edges[i]) || (i > 0 && !(edges[i] > edges[i - 1]))) fail("edges must be finite and strictly increasing");
    if (width == 0) fail("probability holds a value outside [0, 1] (or an empty row)");
    for (const auto& t : prob)
      for (const auto& row : t)
        for (double x : row)
          if (!(x >= 0 && x <= 1)) fail("probability holds a value outside [0, 1] (or an empty row)");
    policy(v, w);
    return;
  }
  std::vector<double> w = reals(key(v, "within"), "within");
  std::vector<std::string> fields;
  for (const json::Value& f : array(key(v, "fields"), "fields")) {
    if (!f.is_string() || f.s.empty()) fail("fields=" + show(key(v, "fields")) + "; allowed: problem field names (strings)");
    fields.push_back(f.s);
  }
  std::vector<std::vector<double>> vecs;
  for (const char* k : {"fill", "lo", "hi", "mean", "scale"}) vecs.push_back(reals(key(v, k), k));
  std::vector<std::vector<std::vector<double>>> coef;
  for (const json::Value& t : array(key(v, "coef"), "coef")) {
    coef.emplace_back();
    for (const json::Value& r : array(t, "coef")) coef.back().push_back(reals(r, "coef"));
  }
  std::vector<std::vector<double>> intercept;
  for (const json::Value& r : array(key(v, "intercept"), "intercept")) intercept.push_back(reals(r, "intercept"));
  if (v.has("problems")) integer(v.o.at("problems"), "problems", 0);
  size_t n = 7 + fields.size() + 1;
  within(w);
  bool shaped = coef.size() == w.size() && intercept.size() == w.size() && !intercept.empty() && !intercept[0].empty();
  for (const auto& vec : vecs) shaped = shaped && vec.size() == n;
  for (size_t t = 0; shaped && t < w.size(); ++t) {
    shaped = intercept[t].size() == intercept[0].size() && coef[t].size() == intercept[0].size();
    for (const auto& r : coef[t]) shaped = shaped && r.size() == n;
  }
  if (!shaped)
    fail("fill/lo/hi/mean/scale must hold " + std::to_string(n) + " features, coef [" + std::to_string(w.size()) +
         " within][max_k][" + std::to_string(n) + "], intercept [" + std::to_string(w.size()) + " within][max_k]");
  bool finite = true;
  for (const auto& vec : vecs)
    for (double x : vec) finite = finite && std::isfinite(x);
  for (const auto& t : coef)
    for (const auto& r : t)
      for (double x : r) finite = finite && std::isfinite(x);
  for (const auto& r : intercept)
    for (double x : r) finite = finite && std::isfinite(x);
  for (double x : vecs[4]) finite = finite && x > 0;
  if (!finite) fail("non-finite numbers, or a scale <= 0");
  policy(v, w);
  for (const std::string& f : fields)
    if (int_fields != nullptr && std::find(int_fields->begin(), int_fields->end(), f) == int_fields->end())
      fail("fields ['" + printable(f) + "'] are not integer problem fields");
}

// ---- one verification for both C++ entry points ---------------------------------------------------
struct Export {
  Manifest man;
  std::string selector_bytes;  // the selector graph as verified: build the session from these bytes
};

// Read and verify an export directory as KernelSelector.load does (see the top of this file):
// structure, identity (`wanted`: op/arch/dtype/layout, empty = any), the sha256 of every listed
// file (unless !verify_sha256), the embedded manifest, the calibration, the catalogue hash.
// Every file is read once through one descriptor of `dir` (a symlinked directory is followed
// once); a re-export swapped in meanwhile gives the old export or the new one, never a mix.
inline Export verify_export(const std::string& dir, const std::map<std::string, std::string>& wanted = {},
                            bool verify_sha256 = true) {
  for (int attempt = 0;; ++attempt) {
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
      int err = errno;
      throw ModelError(err == ENOENT || err == ENOTDIR ? dir + "/manifest.json: no manifest; is " + dir + " an export directory?"
                                                       : "cannot read " + dir + ": " + std::strerror(err));
    }
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{dfd};
    struct stat pinned {};
    ::fstat(dfd, &pinned);
    auto replaced = [&]() {
      struct stat now {};
      return ::stat(dir.c_str(), &now) != 0 || now.st_dev != pinned.st_dev || now.st_ino != pinned.st_ino;
    };
    // Every file of the directory is opened first (an export holds three), so a re-export that
    // swaps the directory out and deletes it meanwhile leaves them readable.
    std::map<std::string, int> fds;
    std::map<std::string, FileError> failed;  // raised only if the manifest lists the file
    struct FdsCloser {
      std::map<std::string, int>& fds;
      ~FdsCloser() {
        for (auto& [name, fd] : fds) ::close(fd);
      }
    } fds_closer{fds};
    try {
      Export ex;
      std::string path = dir + "/manifest.json";
      std::vector<std::string> names;
      int lfd = ::dup(dfd);
      DIR* d = lfd < 0 ? nullptr : ::fdopendir(lfd);
      if (d == nullptr) {
        if (lfd >= 0) ::close(lfd);
        throw ModelError("cannot read " + dir + ": " + std::strerror(errno));
      }
      while (dirent* ent = ::readdir(d))
        if (std::strcmp(ent->d_name, ".") != 0 && std::strcmp(ent->d_name, "..") != 0) names.push_back(ent->d_name);
      ::closedir(d);
      std::sort(names.begin(), names.end());
      if (names.size() > kEagerFiles) names.resize(kEagerFiles);
      for (const std::string& name : names) {
        try {
          fds[name] = open_file(dfd, name, dir + "/" + name);
        } catch (const FileError& e) {
          failed.emplace(name, e);
        }
      }
      auto take = [&](const std::string& name, const std::string& shown) -> int {
        auto f = failed.find(name);
        if (f != failed.end() && !f->second.missing) throw f->second;
        auto it = fds.find(name);
        if (it == fds.end()) return open_file(dfd, name, shown);  // (a directory of more than kEagerFiles files)
        int fd = it->second;
        fds.erase(it);
        return fd;
      };
      std::string text = read_fd(take("manifest.json", path), path, kMaxManifestBytes);
      ex.man = parse_manifest(text, path);
      verify_identity(ex.man, dir, wanted);
      for (const auto& [name, info] : ex.man.doc["files"].o) {
        std::string shown = dir + "/" + name;
        std::string bytes = read_fd(take(name, shown), shown, kMaxModelBytes);
        if (verify_sha256) {
          std::string digest = sha256::hex(bytes);
          const std::string& want = info["sha256"].str();
          if (digest != want)
            throw ModelError(shown + ": sha256 " + digest + " does not match the manifest's " + want +
                             " (file modified or replaced after export)");
        }
        if (name == ex.man.selector_file) ex.selector_bytes = std::move(bytes);
      }
      verify_embedded_manifest(ex.man, ex.selector_bytes, dir + "/" + ex.man.selector_file);
      std::vector<std::string> ints;
      for (const Field& f : ex.man.fields)
        if (f.kind == "int") ints.push_back(f.name);
      try {
        check_calibration(ex.man.doc.has("autotune") ? ex.man.doc.o.at("autotune") : json::Value(), &ints);
      } catch (const CalibrationError& e) {
        throw ModelError(path + ": " + e.what());
      }
      verify_catalogue_hash(ex.man);
      return ex;
    } catch (const FileError& e) {
      if (e.missing && attempt < 4 && replaced()) {  // swapped out by a re-export while it was read
        std::this_thread::sleep_for(std::chrono::milliseconds(50 * (attempt + 1)));
        continue;
      }
      if (e.missing && std::string(e.what()).find("/manifest.json: missing") != std::string::npos)
        throw ModelError(dir + "/manifest.json: no manifest; is " + dir + " an export directory?");
      throw ModelError(e.missing ? std::string(e.what()) + " (listed in the manifest)" : e.what());
    }
  }
}

}  // namespace ckpred
