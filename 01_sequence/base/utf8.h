// utf8.h: decoding and encoding UTF-8 (RFC 3629), shared by the JSON reader and the tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "01_sequence/base/common.h"

namespace nanovllm {

// Length (1..4) of the well-formed UTF-8 sequence at the start of s[0..n), or 0 if it is not
// well-formed (bad lead byte, bad continuation, overlong form, surrogate, above U+10FFFF, truncated).
// Writes the code point to *code_point when the sequence is well-formed.
inline size_t utf8_decode(const char* s, size_t n, uint32_t* code_point) {
  if (n == 0) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  unsigned char b0 = p[0];
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  }
  size_t len;
  uint32_t cp, min;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    len = 2, cp = b0 & 0x1f, min = 0x80;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    len = 3, cp = b0 & 0x0f, min = 0x800;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;  // 0x80..0xc1 (continuation or overlong lead) or 0xf5..0xff
  }
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  *code_point = cp;
  return len;
}

// Appends the UTF-8 encoding of a code point (assumed valid: <= 0x10FFFF and not a surrogate).
inline void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

// True when all of s is well-formed UTF-8.
inline bool utf8_is_valid(const std::string& s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    size_t len = utf8_decode(s.data() + i, s.size() - i, &cp);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

// Throws Error "[what: ]invalid UTF-8 at byte offset I (byte 0xHH)" at the first byte of `text` that does not
// start a well-formed sequence; `what` names the text (a prompt, a file) so that the offset is in it as given.
inline void check_utf8(std::string_view text, const std::string& what = "") {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {  // ASCII, most of any text: no decode
      i++;
      continue;
    }
    uint32_t code_point;
    const size_t len = utf8_decode(text.data() + i, text.size() - i, &code_point);
    if (len == 0)
      fail(what, what.empty() ? "" : ": ", "invalid UTF-8 at byte offset ", i, " (byte 0x", std::hex,
           int(uint8_t(text[i])), ")");
    i += len;
  }
}

}  // namespace nanovllm
