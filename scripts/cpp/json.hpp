// Minimal strict JSON reader for ckpred's manifest.json (objects, arrays, strings, numbers, bools,
// null). Enough for what the C++ selector needs; not a general-purpose library.
//
// Hostile input is expected: every failure is a json::Error (never another exception type, an
// out-of-range read or a stack overflow): RFC 8259 grammar only (no NaN/Infinity, no leading
// zeros), nesting depth bounded, input must be UTF-8. Numbers keep their source text, so
// integers beyond 2^53 are read exactly (int64()) and refused beyond int64.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace json {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Value {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool b = false;
  bool integer = false;  // a number written without fraction or exponent
  double n = 0.0;
  std::string s;  // a string's value, or a number's source text
  std::vector<Value> a;
  std::map<std::string, Value> o;

  bool is_null() const { return kind == Kind::Null; }
  bool is_bool() const { return kind == Kind::Bool; }
  bool is_int() const { return kind == Kind::Number && integer; }
  bool is_string() const { return kind == Kind::String; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }
  bool has(const std::string& key) const { return kind == Kind::Object && o.count(key) != 0; }

  double num() const {
    if (kind != Kind::Number) throw Error("expected a number");
    return n;
  }
  // The exact value of an integer number; Error when not an integer or beyond int64.
  int64_t int64() const {
    if (!is_int()) throw Error("expected an integer");
    bool neg = s[0] == '-';
    uint64_t v = 0, limit = neg ? 9223372036854775808ULL : 9223372036854775807ULL;
    for (size_t i = neg ? 1 : 0; i < s.size(); ++i) {
      uint64_t d = static_cast<uint64_t>(s[i] - '0');
      if (v > (limit - d) / 10) throw Error("integer " + s + " is beyond int64");
      v = v * 10 + d;
    }
    return neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  }
  const std::string& str() const {
    if (kind != Kind::String) throw Error("expected a string");
    return s;
  }
  const std::vector<Value>& arr() const {
    if (kind != Kind::Array) throw Error("expected an array");
    return a;
  }
  const Value& operator[](const std::string& key) const {
    if (kind != Kind::Object) throw Error("expected an object with key '" + key + "'");
    auto it = o.find(key);
    if (it == o.end()) throw Error("missing key '" + key + "'");
    return it->second;
  }
};

// Structural equality as Python compares parsed JSON: numbers by value (1 == 1.0), booleans
// equal to the numbers 1 and 0 (True == 1 in Python), the rest by kind and content.
inline bool equal(const Value& x, const Value& y) {
  if (x.kind == Value::Kind::Bool && y.kind == Value::Kind::Number) return y.n == (x.b ? 1.0 : 0.0);
  if (x.kind == Value::Kind::Number && y.kind == Value::Kind::Bool) return x.n == (y.b ? 1.0 : 0.0);
  if (x.kind != y.kind) return false;
  switch (x.kind) {
    case Value::Kind::Null: return true;
    case Value::Kind::Bool: return x.b == y.b;
    case Value::Kind::Number:
      if (x.integer && y.integer) return x.s == y.s || (x.s == "-0" && y.s == "0") || (x.s == "0" && y.s == "-0");
      return x.n == y.n;
    case Value::Kind::String: return x.s == y.s;
    case Value::Kind::Array:
      if (x.a.size() != y.a.size()) return false;
      for (size_t i = 0; i < x.a.size(); ++i)
        if (!equal(x.a[i], y.a[i])) return false;
      return true;
    case Value::Kind::Object:
      if (x.o.size() != y.o.size()) return false;
      for (auto ix = x.o.begin(), iy = y.o.begin(); ix != x.o.end(); ++ix, ++iy)
        if (ix->first != iy->first || !equal(ix->second, iy->second)) return false;
      return true;
  }
  return false;
}

// Byte offset of the first invalid UTF-8 sequence, or npos.
inline size_t invalid_utf8(const std::string& t) {
  size_t i = 0;
  while (i < t.size()) {
    unsigned char c = static_cast<unsigned char>(t[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > t.size() || (len == 2 && c < 0xC2)) return i;
    for (size_t j = 1; j < len; ++j)
      if ((static_cast<unsigned char>(t[i + j]) & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

class Parser {
 public:
  explicit Parser(const std::string& text) : t_(text) {}
  Value parse() {
    size_t bad = invalid_utf8(t_);
    if (bad != std::string::npos) throw Error("not UTF-8 text (invalid byte at offset " + std::to_string(bad) + ")");
    Value v = value(0);
    ws();
    if (i_ != t_.size()) fail("trailing characters");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 200;
  const std::string& t_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) { throw Error(what + " at offset " + std::to_string(i_)); }
  char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) ++i_;
  }
  bool lit(const char* w) {
    size_t n = std::char_traits<char>::length(w);
    if (t_.compare(i_, n, w) == 0) {
      i_ += n;
      return true;
    }
    return false;
  }
  static bool digit(char c) { return c >= '0' && c <= '9'; }
  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    ws();
    if (i_ >= t_.size()) fail("unexpected end");
    Value v;
    char c = t_[i_];
    if (c == '{') {
      v.kind = Value::Kind::Object;
      ++i_;
      ws();
      if (peek() == '}') { ++i_; return v; }
      for (;;) {
        ws();
        if (peek() != '"') fail("expected a key");
        std::string k = string();
        ws();
        if (peek() != ':') fail("expected ':'");
        ++i_;
        v.o[k] = value(depth + 1);
        ws();
        if (peek() == ',') { ++i_; continue; }
        if (peek() == '}') { ++i_; return v; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::Array;
      ++i_;
      ws();
      if (peek() == ']') { ++i_; return v; }
      for (;;) {
        v.a.push_back(value(depth + 1));
        ws();
        if (peek() == ',') { ++i_; continue; }
        if (peek() == ']') { ++i_; return v; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::String;
      v.s = string();
      return v;
    }
    if (lit("true")) { v.kind = Value::Kind::Bool; v.b = true; return v; }
    if (lit("false")) { v.kind = Value::Kind::Bool; return v; }
    if (lit("null")) return v;
    return number();
  }
  Value number() {
    size_t start = i_;
    Value v;
    v.kind = Value::Kind::Number;
    v.integer = true;
    if (peek() == '-') ++i_;
    if (peek() == '0') ++i_;
    else if (digit(peek())) while (digit(peek())) ++i_;
    else fail("unexpected character");
    if (peek() == '.') {
      v.integer = false;
      ++i_;
      if (!digit(peek())) fail("bad number");
      while (digit(peek())) ++i_;
    }
    if (peek() == 'e' || peek() == 'E') {
      v.integer = false;
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (!digit(peek())) fail("bad number");
      while (digit(peek())) ++i_;
    }
    v.s = t_.substr(start, i_ - start);
    v.n = std::strtod(v.s.c_str(), nullptr);
    return v;
  }
  void utf8(unsigned cp, std::string& out) {
    if (cp < 0x80) out += static_cast<char>(cp);
    else if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18)); out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  unsigned hex4() {
    if (i_ + 4 > t_.size()) fail("short \\u escape");
    unsigned cp = 0;
    for (int j = 0; j < 4; ++j) {
      char h = t_[i_++];
      unsigned d = digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : 16;
      if (d == 16) fail("bad \\u escape");
      cp = cp * 16 + d;
    }
    return cp;
  }
  std::string string() {
    std::string out;
    ++i_;  // opening quote
    while (i_ < t_.size() && t_[i_] != '"') {
      char c = t_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') { out += c; continue; }
      if (i_ >= t_.size()) fail("bad escape");
      char e = t_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && t_.compare(i_, 2, "\\u") == 0) {
            size_t save = i_;
            i_ += 2;
            unsigned lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else i_ = save;  // a lone high surrogate, kept as is (as Python does)
          }
          utf8(cp, out);
          break;
        }
        default: fail("bad escape");
      }
    }
    if (i_ >= t_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
};

inline Value parse(const std::string& text) { return Parser(text).parse(); }

}  // namespace json
