// json.cpp: a recursive-descent JSON reader that follows RFC 8259's grammar production by production,
// and the writer.
#include "01_sequence/base/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <new>

#include "01_sequence/base/common.h"
#include "01_sequence/base/utf8.h"

namespace nanovllm {

// ---------------------------------------------------------------------------------------------------
// Reader

class JsonParser {
 public:
  JsonParser(std::string_view text, std::string_view source, bool one_line)
      : text_(text), source_(source), one_line_(one_line) {}

  Json parse_document() {
    skip_whitespace();
    Json value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) error("unexpected text after the JSON value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 512;  // deeper input would only be an attack on the stack

  [[noreturn]] void error(std::string_view what) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); i++) {
      if (text_[i] == '\n') line++, column = 1;
      else column++;
    }
    if (one_line_) fail(source_, ", column ", column, ": ", what);
    fail(source_, ":", line, ":", column, ": ", what);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) pos_++;
  }

  void expect_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) error("invalid literal (expected a JSON value)");
    pos_ += word.size();
  }

  // depth: the arrays and objects around this value (0 at the top), so an array or object here is
  // nesting level depth + 1; the 513th is refused at its bracket.
  Json parse_value(int depth) {
    if (at_end()) error("unexpected end of input (expected a JSON value)");
    if ((peek() == '{' || peek() == '[') && depth >= kMaxDepth) error("nesting deeper than 512 levels");
    switch (peek()) {
      case '{': return parse_object(depth);
      case '[': return parse_array(depth);
      case '"': return Json(parse_string());
      case 't': expect_literal("true"); return Json(true);
      case 'f': expect_literal("false"); return Json(false);
      case 'n': expect_literal("null"); return Json();
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        error("unexpected character (expected a JSON value)");
    }
  }

  Json parse_object(int depth) {
    Json object = Json::object();
    pos_++;  // '{'
    skip_whitespace();
    if (peek() == '}') {
      pos_++;
      return object;
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') error("expected a string key in the object");
      std::string key = parse_string();
      skip_whitespace();
      if (peek() != ':') error("expected ':' after an object key");
      pos_++;
      skip_whitespace();
      // Duplicate keys are legal JSON; find() returns the last one, as Python's json module keeps.
      // (No duplicate check here: it would make a 150k-entry vocabulary quadratic to read.)
      object.object_.emplace_back(std::move(key), parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        pos_++;
        continue;
      }
      if (peek() == '}') {
        pos_++;
        return object;
      }
      error("expected ',' or '}' after an object member");
    }
  }

  Json parse_array(int depth) {
    Json array = Json::array();
    pos_++;  // '['
    skip_whitespace();
    if (peek() == ']') {
      pos_++;
      return array;
    }
    while (true) {
      skip_whitespace();
      array.array_.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        pos_++;
        continue;
      }
      if (peek() == ']') {
        pos_++;
        return array;
      }
      error("expected ',' or ']' after an array element");
    }
  }

  // number = [ minus ] int [ frac ] [ exp ];  int = zero / ( digit1-9 *DIGIT )
  Json parse_number() {
    size_t start = pos_;
    bool integral = true;
    if (peek() == '-') pos_++;
    if (peek() == '0') {
      pos_++;
      if (peek() >= '0' && peek() <= '9') error("leading zeros are not allowed in numbers");
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') pos_++;
    } else {
      error("expected a digit in the number");
    }
    if (peek() == '.') {
      integral = false;
      pos_++;
      if (!(peek() >= '0' && peek() <= '9')) error("expected a digit after the decimal point");
      while (peek() >= '0' && peek() <= '9') pos_++;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      pos_++;
      if (peek() == '+' || peek() == '-') pos_++;
      if (!(peek() >= '0' && peek() <= '9')) error("expected a digit in the exponent");
      while (peek() >= '0' && peek() <= '9') pos_++;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    Json number;
    number.type_ = Json::Type::Number;
    if (integral) {
      int64_t v;
      auto [end, ec] = std::from_chars(first, last, v);
      if (ec == std::errc() && end == last) {
        number.int_ = v;
        number.is_int_ = true;
        number.uint_ = uint64_t(v);
        number.is_uint_ = v >= 0;
        number.number_ = double(v);
        return number;
      }
      uint64_t u;  // above INT64_MAX: still exact as an unsigned 64-bit value (hashes are written so)
      auto [uend, uec] = std::from_chars(first, last, u);
      if (uec == std::errc() && uend == last) {
        number.uint_ = u;
        number.is_uint_ = true;
        number.number_ = double(u);
        return number;
      }
    }
    // Out-of-range magnitudes become +-inf, as in Python; the grammar above was already checked. A
    // number a double cannot hold (out of range, or an integer past 64 bits) keeps its text, so that
    // dump() and so an error message quote it as the file wrote it.
    if (integral) number.string_.assign(first, last);
    auto [end, ec] = std::from_chars(first, last, number.number_);
    if (ec == std::errc::result_out_of_range) {
      number.string_.assign(first, last);
      number.number_ = (*first == '-') ? -HUGE_VAL : HUGE_VAL;
      // from_chars leaves the value untouched on underflow too; a tiny exponent means zero.
      std::string_view digits(first, size_t(last - first));
      size_t e = digits.find_first_of("eE");
      if (e != std::string_view::npos && digits[e + 1] == '-') number.number_ = (*first == '-') ? -0.0 : 0.0;
    } else if (ec != std::errc() || end != last) {
      error("malformed number");
    }
    return number;
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > text_.size()) error("truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; i++) {
      char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') value |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') value |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') value |= uint32_t(c - 'A' + 10);
      else {
        pos_--;  // point at the bad digit
        error("invalid hex digit in \\u escape");
      }
    }
    return value;
  }

  std::string parse_string() {
    pos_++;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) error("unterminated string");
      char c = text_[pos_];
      if (c == '"') {
        pos_++;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) error("control character in a string (must be escaped)");
      if (c == '\\') {
        pos_++;
        if (at_end()) error("unterminated escape in a string");
        char e = text_[pos_++];
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
            uint32_t cp = parse_hex4();
            if (cp >= 0xdc00 && cp <= 0xdfff) error("lone low surrogate in \\u escape");
            if (cp >= 0xd800 && cp <= 0xdbff) {  // a high surrogate must be followed by a low one
              if (text_.substr(pos_, 2) != "\\u") error("lone high surrogate in \\u escape");
              pos_ += 2;
              uint32_t low = parse_hex4();
              if (low < 0xdc00 || low > 0xdfff) error("high surrogate not followed by a low surrogate");
              cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            }
            utf8_append(out, cp);
            break;
          }
          default: pos_--; error("invalid escape in a string");
        }
        continue;
      }
      // Copy a run of plain bytes, checking that it is well-formed UTF-8.
      uint32_t cp;
      size_t len = utf8_decode(text_.data() + pos_, text_.size() - pos_, &cp);
      if (len == 0) error("invalid UTF-8 in a string");
      out.append(text_.data() + pos_, len);
      pos_ += len;
    }
  }

  std::string_view text_;
  std::string_view source_;
  bool one_line_;  // errors name the column only: the source names the line
  size_t pos_ = 0;
};

static Json parse_text(std::string_view text, std::string_view source, bool one_line) {
  try {
    return JsonParser(text, source, one_line).parse_document();
  } catch (const std::bad_alloc&) {  // the tree is freed by now, so the message can be built
    fail(source, ": out of memory while parsing ", text.size(), " bytes of JSON");
  }
}

Json Json::parse(std::string_view text, std::string_view source) { return parse_text(text, source, false); }

Json Json::parse_line(std::string_view text, std::string_view source) { return parse_text(text, source, true); }

// ---------------------------------------------------------------------------------------------------
// Accessors

const char* Json::type_name(Type type) {
  switch (type) {
    case Type::Null: return "null";
    case Type::Bool: return "a boolean";
    case Type::Number: return "a number";
    case Type::String: return "a string";
    case Type::Array: return "an array";
    case Type::Object: return "an object";
  }
  return "?";
}

bool Json::as_bool() const {
  if (type_ != Type::Bool) fail("expected a boolean, got ", type_name(type_));
  return bool_;
}

double Json::as_double() const {
  if (type_ != Type::Number) fail("expected a number, got ", type_name(type_));
  return number_;
}

int64_t Json::as_int64() const {
  if (type_ != Type::Number) fail("expected an integer, got ", type_name(type_));
  if (!is_int_) {
    // Accept 2.0 or 1e3 when exactly integral (Python writes some integers that way).
    if (std::isfinite(number_) && number_ == std::floor(number_) && std::fabs(number_) < 9.007199254740992e15)
      return int64_t(number_);
    fail("expected an integer, got ", dump());
  }
  return int_;
}

uint64_t Json::as_uint64() const {
  if (type_ != Type::Number) fail("expected an unsigned integer, got ", type_name(type_));
  if (!is_uint_) fail("expected an unsigned 64-bit integer, got ", dump());
  return uint_;
}

const std::string& Json::as_string() const {
  if (type_ != Type::String) fail("expected a string, got ", type_name(type_));
  return string_;
}

const std::vector<Json>& Json::as_array() const {
  if (type_ != Type::Array) fail("expected an array, got ", type_name(type_));
  return array_;
}

const std::vector<Json::Member>& Json::as_object() const {
  if (type_ != Type::Object) fail("expected an object, got ", type_name(type_));
  return object_;
}

const Json* Json::find(std::string_view key) const {
  if (type_ != Type::Object) return nullptr;
  for (auto m = object_.rbegin(); m != object_.rend(); ++m)  // the last duplicate wins
    if (m->first == key) return &m->second;
  return nullptr;
}

const Json& Json::at(std::string_view key) const {
  if (type_ != Type::Object) fail("expected an object, got ", type_name(type_));
  const Json* value = find(key);
  if (!value) fail("missing field '", key, "'");
  return *value;
}

size_t Json::size() const {
  if (type_ == Type::Array) return array_.size();
  if (type_ == Type::Object) return object_.size();
  return 0;
}

void Json::push_back(Json value) {
  if (type_ != Type::Array) fail("push_back on ", type_name(type_));
  array_.push_back(std::move(value));
}

void Json::set(std::string key, Json value) {
  if (type_ != Type::Object) fail("set on ", type_name(type_));
  for (Member& m : object_) {
    if (m.first == key) {
      m.second = std::move(value);
      return;
    }
  }
  object_.emplace_back(std::move(key), std::move(value));
}

void check_fields(const Json& object, const std::vector<std::string_view>& known, std::string_view what) {
  const std::vector<Json::Member>& members = object.as_object();
  for (size_t i = 0; i < members.size(); i++) {
    const std::string& key = members[i].first;
    std::string quoted;
    json_append_quoted(quoted, key);
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (std::string_view k : known) list += std::string(list.empty() ? "" : ", ") + std::string(k);
      fail("unknown field ", quoted, " (", what, " has ", list, ")");
    }
    for (size_t j = 0; j < i; j++)
      if (members[j].first == key) fail("field ", quoted, " given twice");
  }
}

// ---------------------------------------------------------------------------------------------------
// Writer

void json_append_quoted(std::string& out, std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      uint32_t cp;
      size_t len = utf8_decode(s.data() + i, s.size() - i, &cp);
      if (len == 0) {
        out += "\xef\xbf\xbd";  // U+FFFD REPLACEMENT CHARACTER for each invalid byte
        i++;
      } else {
        out.append(s.data() + i, len);
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += char(c);
        }
    }
    i++;
  }
  out += '"';
}

void json_append_float(std::string& out, float value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, end);
}

void Json::dump_to(std::string& out) const {
  switch (type_) {
    case Type::Null: out += "null"; break;
    case Type::Bool: out += bool_ ? "true" : "false"; break;
    case Type::Number: {
      char buffer[32];
      if (!string_.empty()) {  // a parsed number a double cannot hold: its text, as read
        out += string_;
      } else if (is_int_) {
        auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, int_);
        out.append(buffer, end);
      } else if (is_uint_) {
        auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, uint_);
        out.append(buffer, end);
      } else if (std::isinf(number_)) {
        // An infinity made in code (a parsed 1e400 keeps its text, above): written as 1e999, valid JSON
        // that reads back as the same infinity, where "null" would say the value was absent.
        out += number_ > 0 ? "1e999" : "-1e999";
      } else if (std::isnan(number_)) {
        out += "null";
      } else {
        auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, number_);
        out.append(buffer, end);
        // A double stays a double when read back: 1.0 is written "1.0", as Python writes it, not "1", which
        // reads back as an integer (and an error quoting it would call 1.0 the integer 1).
        if (std::find_if(buffer, end, [](char c) { return c == '.' || c == 'e'; }) == end) out += ".0";
      }
      break;
    }
    case Type::String: json_append_quoted(out, string_); break;
    case Type::Array:
      out += '[';
      for (size_t i = 0; i < array_.size(); i++) {
        if (i) out += ',';
        array_[i].dump_to(out);
      }
      out += ']';
      break;
    case Type::Object:
      out += '{';
      for (size_t i = 0; i < object_.size(); i++) {
        if (i) out += ',';
        json_append_quoted(out, object_[i].first);
        out += ':';
        object_[i].second.dump_to(out);
      }
      out += '}';
      break;
  }
}

std::string Json::dump() const {
  std::string out;
  dump_to(out);
  return out;
}

}  // namespace nanovllm
