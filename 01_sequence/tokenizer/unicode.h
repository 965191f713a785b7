// unicode.h: the few Unicode services the tokenizer needs, over the generated tables in unicode_tables.h.
//
//   is_letter / is_number / is_white_space   the classes \p{L}, \p{N} and \s of the pre-tokenizer regex
//   combining_class                          canonical combining class (0 for starters)
//   nfc_normalize                            Unicode Normalization Form C (UAX #15)
//
// All functions take code points or well-formed UTF-8; checking the input is the caller's job.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace nanovllm {

// Bits of unicode_flags(): a code point may have several (or none).
enum UnicodeFlag : uint8_t {
  kLetterFlag = 1,       // general category L*
  kNumberFlag = 2,       // general category N*
  kWhiteSpaceFlag = 4,   // property White_Space
  kNfcSensitiveFlag = 8  // NFC_Quick_Check != Yes, or combining class != 0: NFC may change the text here
};

// The flags of one code point: O(1) for the Basic Multilingual Plane (a 64 KiB table built on first use),
// a binary search above it.
uint8_t unicode_flags(uint32_t cp);

inline bool is_letter(uint32_t cp) { return unicode_flags(cp) & kLetterFlag; }
inline bool is_number(uint32_t cp) { return unicode_flags(cp) & kNumberFlag; }
inline bool is_white_space(uint32_t cp) { return unicode_flags(cp) & kWhiteSpaceFlag; }

// Canonical combining class, 0..254 (0 = starter).
uint8_t combining_class(uint32_t cp);

// True when `text` (valid UTF-8) is certainly in NFC already: no character that NFC could touch. This is
// the fast path of nfc_normalize: almost all real text passes it.
bool is_nfc_quick(std::string_view text);

// The NFC form of `text` (valid UTF-8): canonical decomposition, canonical reordering of combining
// marks, then canonical composition (with the composition exclusions; Hangul computed).
std::string nfc_normalize(std::string_view text);

}  // namespace nanovllm
