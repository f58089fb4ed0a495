// Minimal JSON reader for ckpred's manifest.json (objects, arrays, strings, numbers, bools, null).
// Enough for what the C++ selector needs; not a general-purpose library.
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
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
  double n = 0.0;
  std::string s;
  std::vector<Value> a;
  std::map<std::string, Value> o;

  bool is_null() const { return kind == Kind::Null; }
  double num() const {
    if (kind != Kind::Number) throw Error("expected a number");
    return n;
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

class Parser {
 public:
  explicit Parser(const std::string& text) : t_(text) {}
  Value parse() {
    Value v = value();
    ws();
    if (i_ != t_.size()) fail("trailing characters");
    return v;
  }

 private:
  const std::string& t_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) { throw Error(what + " at offset " + std::to_string(i_)); }
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
  Value value() {
    ws();
    if (i_ >= t_.size()) fail("unexpected end");
    Value v;
    char c = t_[i_];
    if (c == '{') {
      v.kind = Value::Kind::Object;
      ++i_;
      ws();
      if (t_[i_] == '}') { ++i_; return v; }
      for (;;) {
        ws();
        if (t_[i_] != '"') fail("expected a key");
        std::string k = string();
        ws();
        if (t_[i_++] != ':') fail("expected ':'");
        v.o[k] = value();
        ws();
        if (t_[i_] == ',') { ++i_; continue; }
        if (t_[i_] == '}') { ++i_; return v; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::Array;
      ++i_;
      ws();
      if (t_[i_] == ']') { ++i_; return v; }
      for (;;) {
        v.a.push_back(value());
        ws();
        if (t_[i_] == ',') { ++i_; continue; }
        if (t_[i_] == ']') { ++i_; return v; }
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
    if (lit("NaN") || lit("Infinity") || lit("-Infinity")) { v.kind = Value::Kind::Number; return v; }
    const char* start = t_.c_str() + i_;
    char* end = nullptr;
    v.n = std::strtod(start, &end);
    if (end == start) fail("unexpected character");
    i_ += static_cast<size_t>(end - start);
    v.kind = Value::Kind::Number;
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
    unsigned cp = static_cast<unsigned>(std::stoul(t_.substr(i_, 4), nullptr, 16));
    i_ += 4;
    return cp;
  }
  std::string string() {
    std::string out;
    ++i_;  // opening quote
    while (i_ < t_.size() && t_[i_] != '"') {
      char c = t_[i_++];
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
            i_ += 2;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4() - 0xDC00);
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
