// json.h: a strict JSON reader and a small writer (RFC 8259), for config.json, tokenizer.json,
// safetensors headers, the golden test files and the command line's JSON Lines.
//
// Strict means: no comments, no trailing commas, no NaN, no leading zeros, no control characters in
// strings, no lone surrogates, nothing after the value. Every error names the source and the line:column
// where reading stopped: "config.json:3:17: expected ',' or '}' after an object member".
#pragma once

#include <cstdint>
#include <climits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nanovllm {

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };
  using Member = std::pair<std::string, Json>;

  // Parses one JSON text. `source` names it in error messages (a file name, "stdin line 3", ...).
  // Throws Error on malformed input, when nesting is deeper than 512 levels, or when the tree does not fit
  // in memory ("SOURCE: out of memory while parsing N bytes of JSON").
  static Json parse(std::string_view text, std::string_view source);
  // The same for one line of a JSON Lines stream, `source` naming the line ("stdin line 3"): its errors read
  // "stdin line 3, column 7: ...", where parse's would read "stdin line 3:1:7: ...".
  static Json parse_line(std::string_view text, std::string_view source);

  // Builders, for writing.
  Json() = default;  // null
  Json(bool b) : type_(Type::Bool), bool_(b) {}
  Json(int v) : Json(int64_t(v)) {}
  Json(int64_t v) : type_(Type::Number), number_(double(v)), int_(v), is_int_(true), uint_(uint64_t(v)), is_uint_(v >= 0) {}
  Json(uint64_t v) : type_(Type::Number), number_(double(v)), int_(int64_t(v)), is_int_(v <= uint64_t(INT64_MAX)), uint_(v), is_uint_(true) {}
  Json(double v) : type_(Type::Number), number_(v) {}
  Json(std::string s) : type_(Type::String), string_(std::move(s)) {}
  Json(const char* s) : Json(std::string(s)) {}
  static Json array() { return Json(Type::Array); }
  static Json object() { return Json(Type::Object); }
  void push_back(Json value);                // array only
  void set(std::string key, Json value);     // object only; replaces an existing key

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }
  // True for a number written without fraction or exponent that fits in int64.
  bool is_integer() const { return type_ == Type::Number && is_int_; }

  // Accessors throw Error ("expected an integer, got a string") on the wrong type; callers add the
  // file and field to the message.
  bool as_bool() const;
  double as_double() const;
  int64_t as_int64() const;
  uint64_t as_uint64() const;  // exact for every integer in [0, 2^64), e.g. a 64-bit hash
  const std::string& as_string() const;
  const std::vector<Json>& as_array() const;
  const std::vector<Member>& as_object() const;  // members in file order

  const Json* find(std::string_view key) const;  // nullptr when absent (or not an object)
  const Json& at(std::string_view key) const;    // throws Error "missing field 'key'"
  size_t size() const;                           // array elements or object members

  // Compact serialisation (no spaces); strings as UTF-8, with invalid bytes replaced by U+FFFD so that
  // the output is always valid JSON. Numbers: integers exactly, doubles in the shortest form that reads
  // back to the same double and still a double (1.0 as "1.0"), and a parsed number that no double holds
  // (1e400, an integer past 64 bits) as its text.
  std::string dump() const;
  void dump_to(std::string& out) const;

  static const char* type_name(Type type);

 private:
  explicit Json(Type type) : type_(type) {}
  friend class JsonParser;

  Type type_ = Type::Null;
  bool bool_ = false;
  double number_ = 0;
  int64_t int_ = 0;
  bool is_int_ = false;
  uint64_t uint_ = 0;
  bool is_uint_ = false;
  std::string string_;
  std::vector<Json> array_;
  std::vector<Member> object_;
};

// For an object read as a request (a --requests line, a chat message), where a misspelt field would otherwise
// be a silent default: throws Error `unknown field "max_token" (WHAT has a, b, c)` for a member not in `known`,
// and `field "a" given twice` for a repeated one (which of the two was meant?). `object` must be an object.
void check_fields(const Json& object, const std::vector<std::string_view>& known, std::string_view what);

// Appends `s` as a JSON string literal (quotes included) to `out`. Invalid UTF-8 becomes U+FFFD.
void json_append_quoted(std::string& out, std::string_view s);

// Appends a float in the shortest decimal form that reads back to the same float (NaN/inf -> null).
void json_append_float(std::string& out, float value);

}  // namespace nanovllm
