// unicode.cpp: character classes and NFC normalization over the generated tables (unicode_tables.cpp).
//
// NFC (UAX #15, section 3) in three passes over a buffer of code points:
//   1. decompose every character canonically and recursively (Hangul syllables by arithmetic);
//   2. put each run of combining marks in order of combining class (a stable sort);
//   3. compose: walk left to right, joining a character to the last starter when the pair has a primary
//      composite and no character in between "blocks" it.
#include "01_sequence/tokenizer/unicode.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "01_sequence/tokenizer/unicode_tables.h"
#include "01_sequence/base/utf8.h"

namespace nanovllm {

namespace t = unicode_tables;

namespace {

// Binary search of a sorted, non-overlapping range table.
template <class R>
const R* find_range(const R* table, size_t count, uint32_t cp) {
  const R* end = table + count;
  const R* it = std::upper_bound(table, end, cp, [](uint32_t c, const R& r) { return c < r.first; });
  if (it == table || cp > (it - 1)->last) return nullptr;
  return it - 1;
}

uint8_t flags_by_search(uint32_t cp) {
  uint8_t flags = 0;
  if (find_range(t::kLetter, t::kLetterCount, cp)) flags |= kLetterFlag;
  if (find_range(t::kNumber, t::kNumberCount, cp)) flags |= kNumberFlag;
  if (find_range(t::kWhiteSpace, t::kWhiteSpaceCount, cp)) flags |= kWhiteSpaceFlag;
  if (find_range(t::kNfcQuickCheckNotYes, t::kNfcQuickCheckNotYesCount, cp) ||
      find_range(t::kCombiningClass, t::kCombiningClassCount, cp))
    flags |= kNfcSensitiveFlag;
  return flags;
}

// Flags of U+0000..U+FFFF, one byte each: the pre-tokenizer asks for every character it reads.
const std::vector<uint8_t>& bmp_flags() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> flags(0x10000);
    for (uint32_t cp = 0; cp < 0x10000; cp++) flags[cp] = flags_by_search(cp);
    return flags;
  }();
  return table;
}

// Hangul syllables: S = 0xAC00 + (L * 21 + V) * 28 + T (Unicode chapter 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr uint32_t kSCount = kLCount * kNCount;

const t::Decomposition* find_decomposition(uint32_t cp) {
  const t::Decomposition* end = t::kDecomposition + t::kDecompositionCount;
  const t::Decomposition* it = std::lower_bound(
      t::kDecomposition, end, cp, [](const t::Decomposition& d, uint32_t c) { return d.code_point < c; });
  return (it != end && it->code_point == cp) ? it : nullptr;
}

// Appends the full canonical decomposition of cp.
void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const t::Decomposition* d = find_decomposition(cp);
  if (!d) {
    out.push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second) decompose(d->second, out);
}

// Primary composites: (first, second) -> composite, for every two-character canonical decomposition
// whose composite is not excluded from composition.
const std::unordered_map<uint64_t, uint32_t>& compositions() {
  static const std::unordered_map<uint64_t, uint32_t> table = [] {
    std::unordered_map<uint64_t, uint32_t> map;
    for (size_t i = 0; i < t::kDecompositionCount; i++) {
      const t::Decomposition& d = t::kDecomposition[i];
      if (d.second && !find_range(t::kCompositionExclusion, t::kCompositionExclusionCount, d.code_point))
        map[uint64_t(d.first) << 32 | d.second] = d.code_point;
    }
    return map;
  }();
  return table;
}

// The primary composite of (a, b), or 0 if there is none.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)  // L + V -> LV
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)  // LV + T -> LVT
    return a + (b - kTBase);
  auto it = compositions().find(uint64_t(a) << 32 | b);
  return it == compositions().end() ? 0 : it->second;
}

}  // namespace

uint8_t unicode_flags(uint32_t cp) {
  return cp < 0x10000 ? bmp_flags()[cp] : flags_by_search(cp);
}

uint8_t combining_class(uint32_t cp) {
  const t::CombiningClassRange* r = find_range(t::kCombiningClass, t::kCombiningClassCount, cp);
  return r ? r->combining_class : 0;
}

bool is_nfc_quick(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {  // ASCII is always NFC
      i++;
      continue;
    }
    uint32_t cp = 0;
    size_t len = utf8_decode(text.data() + i, text.size() - i, &cp);
    if (len == 0 || (unicode_flags(cp) & kNfcSensitiveFlag)) return false;
    i += len;
  }
  return true;
}

namespace {

// NFC of a span that starts at a boundary and ends before one (see nfc_normalize), appended to `result`:
// the three passes of the file comment.
void normalize_span(std::string_view text, std::string& result) {
  // 1. Decompose.
  std::vector<uint32_t> decomposed;
  decomposed.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    size_t len = utf8_decode(text.data() + i, text.size() - i, &cp);
    if (len == 0) {  // the caller promised valid UTF-8; keep going rather than loop forever
      cp = 0xFFFD;
      len = 1;
    }
    decompose(cp, decomposed);
    i += len;
  }

  // 2. Canonical ordering: a stable sort by combining class of every run of non-starters.
  struct Mark {
    uint32_t cp;
    uint8_t ccc;
  };
  std::vector<Mark> cps(decomposed.size());
  for (size_t i = 0; i < cps.size(); i++) cps[i] = {decomposed[i], combining_class(decomposed[i])};
  for (size_t i = 0; i < cps.size();) {
    size_t end = i;
    while (end < cps.size() && cps[end].ccc != 0) end++;
    std::stable_sort(cps.begin() + i, cps.begin() + end, [](Mark a, Mark b) { return a.ccc < b.ccc; });
    i = end + 1;
  }

  // 3. Compose. `starter` is the output index of the last starter; a character c may join it when it
  // comes right after it, or when every character in between has a class below c's (the last one kept,
  // whose class is last_ccc, has the largest class of those in between after reordering).
  size_t out = 0, starter = SIZE_MAX;
  uint8_t last_ccc = 0;
  for (size_t i = 0; i < cps.size(); i++) {
    Mark c = cps[i];
    if (starter != SIZE_MAX) {
      bool adjacent = out == starter + 1;
      if (adjacent || (last_ccc != 0 && last_ccc < c.ccc)) {
        if (uint32_t composite = compose_pair(cps[starter].cp, c.cp)) {
          cps[starter].cp = composite;
          continue;
        }
      }
    }
    if (c.ccc == 0) starter = out;
    last_ccc = c.ccc;
    cps[out++] = c;
  }

  for (size_t i = 0; i < out; i++) utf8_append(result, cps[i].cp);
}

}  // namespace

// Normalization never acts across a character that is a starter (class 0) and NFC_Quick_Check = Yes,
// i.e. one without kNfcSensitiveFlag: nothing before it can reorder past it or compose with it. So only
// the spans from the boundary before each sensitive character to the boundary after it need the full
// algorithm; the rest of the text is copied as it is.
std::string nfc_normalize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t copied = 0;         // text[0, copied) is already in `out`
  size_t last_boundary = 0;  // start of the last boundary character seen
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = static_cast<unsigned char>(text[i]);
    size_t len = cp < 0x80 ? 1 : utf8_decode(text.data() + i, text.size() - i, &cp);
    if (len == 0) len = 1, cp = 0xFFFD;  // invalid input: keep going rather than loop forever
    if (!(unicode_flags(cp) & kNfcSensitiveFlag)) {
      last_boundary = i;
      i += len;
      continue;
    }
    size_t end = i + len;  // extend the span to the next boundary character (or the end)
    while (end < text.size()) {
      size_t n = utf8_decode(text.data() + end, text.size() - end, &cp);
      if (n == 0 || !(unicode_flags(cp) & kNfcSensitiveFlag)) break;
      end += n;
    }
    out.append(text, copied, last_boundary - copied);
    normalize_span(text.substr(last_boundary, end - last_boundary), out);
    copied = i = end;
  }
  out.append(text, copied, std::string_view::npos);
  return out;
}

}  // namespace nanovllm
