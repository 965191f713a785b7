// tokenizer.cpp: Qwen3's tokenizer (tokenizer.h's overview gives encode's stages in their order). This file
// goes: byte map and lossy UTF-8 -> pre-tokenizer -> loading tokenizer.json -> encode (added tokens, NFC,
// pieces, BPE) -> decode and streaming decode.
#include "01_sequence/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <queue>

#include "01_sequence/base/common.h"
#include "01_sequence/base/files.h"
#include "01_sequence/base/json.h"
#include "01_sequence/tokenizer/unicode.h"
#include "01_sequence/base/utf8.h"

namespace nanovllm {

// ===================================================================================================
// Byte level: GPT-2's byte <-> printable character map, and lossy UTF-8.

namespace {

// Bytes that GPT-2 left as themselves: '!'..'~', '¡'..'¬', '®'..'ÿ'. The rest (control characters,
// space, DEL, NBSP, soft hyphen) would be invisible or ambiguous in a vocab file, so they were moved
// to U+0100.. in byte order: 0x00 -> 'Ā', ..., 0x20 (space) -> 'Ġ', 0x0A -> 'Ċ'.
bool is_printable_byte(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

struct ByteMap {
  std::array<uint32_t, 256> to_unicode;
  std::array<int16_t, 0x144> to_byte;  // code points U+0000..U+0143 -> byte, -1 for none
  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; b++) {
      to_unicode[b] = is_printable_byte(b) ? uint32_t(b) : next++;
      to_byte[to_unicode[b]] = int16_t(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// How the bytes at p[0..n) start: a complete well-formed character, the beginning of one that the
// bytes run out before finishing, or an ill-formed sequence. *len gets the length of the character,
// of the unfinished prefix, or of the maximal ill-formed subpart (at least 1), respectively.
// The ranges are those of Unicode's Table 3-7 (well-formed UTF-8 byte sequences).
enum class Utf8Scan { kComplete, kUnfinished, kInvalid };

Utf8Scan scan_utf8(const unsigned char* p, size_t n, size_t* len) {
  unsigned char b = p[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b < 0x80) {
    *len = 1;
    return Utf8Scan::kComplete;
  } else if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;  // no overlong forms
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;  // no overlong forms
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *len = 1;  // a continuation byte, C0/C1 or F5..FF can start nothing
    return Utf8Scan::kInvalid;
  }
  size_t k = 1;
  for (; k < need && k < n; k++) {
    unsigned char c = p[k];
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) {
      *len = k;
      return Utf8Scan::kInvalid;
    }
  }
  *len = k;
  return k == need ? Utf8Scan::kComplete : Utf8Scan::kUnfinished;
}

constexpr const char* kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) { return cp < 0x144 ? byte_map().to_byte[cp] : -1; }

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0, len = 0; i < bytes.size(); i += len) {
    if (scan_utf8(p + i, bytes.size() - i, &len) == Utf8Scan::kComplete) out.append(bytes.data() + i, len);
    else out += kReplacementCharacter;  // at the end of the input, an unfinished character is ill-formed
  }
  return out;
}

// ===================================================================================================
// Pre-tokenizer: Qwen's split regex, one function per alternative.
//
// The regex engine (Oniguruma in Hugging Face tokenizers) tries the alternatives left to right at the
// current position and takes the first that matches ("leftmost-first"), with greedy, backtracking
// quantifiers inside each. Every character is a letter (\p{L}), a number (\p{N}), white space (\s) or
// "other", and some alternative matches each kind, so no text is ever skipped. Each function below
// returns the end of its alternative's match at `i`, or 0 when it does not match there (a match is never
// empty, so 0 is never a real end).

namespace {

struct Char {
  uint32_t cp;
  uint8_t flags;  // UnicodeFlag bits
  size_t len;     // bytes
};

// The character at byte i of s (valid UTF-8, i < s.size()).
Char char_at(std::string_view s, size_t i) {
  uint32_t cp = static_cast<unsigned char>(s[i]);
  size_t len = 1;
  if (cp >= 0x80) len = utf8_decode(s.data() + i, s.size() - i, &cp);
  if (len == 0) len = 1, cp = 0xFFFD;  // cannot happen on validated input; never loop forever
  return {cp, unicode_flags(cp), len};
}

bool is_newline(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d): an English contraction suffix, in any letter case. Case-insensitive
// matching uses Unicode case folding, under which only 'ſ' (U+017F, long s) folds onto one of these
// letters besides the ASCII capitals.
size_t match_contraction(std::string_view s, size_t i) {
  if (s[i] != '\'') return 0;
  auto folded = [&](size_t at) -> uint32_t {
    if (at >= s.size()) return 0;
    Char c = char_at(s, at);
    if (c.cp >= 'A' && c.cp <= 'Z') return c.cp + 32;
    return c.cp == 0x17F ? 's' : c.cp;
  };
  size_t at = i + 1;
  uint32_t c1 = folded(at);
  if (c1 == 0) return 0;
  size_t after1 = at + char_at(s, at).len;
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return after1;
  uint32_t c2 = folded(after1);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return after1 + 1;
  return 0;
}

// [^\r\n\p{L}\p{N}]?\p{L}+ : a run of letters, with at most one leading character that is neither a
// newline, a letter nor a number (typically the space before a word: " world").
size_t match_letters(std::string_view s, size_t i) {
  Char c = char_at(s, i);
  size_t j = i;
  if (!(c.flags & kLetterFlag)) {
    if (is_newline(c.cp) || (c.flags & kNumberFlag)) return 0;
    j += c.len;  // the optional leading character
    if (j >= s.size() || !(char_at(s, j).flags & kLetterFlag)) return 0;
  }
  while (j < s.size()) {
    c = char_at(s, j);
    if (!(c.flags & kLetterFlag)) break;
    j += c.len;
  }
  return j;
}

// \p{N} : one number character. Digits are never grouped ("2024" is four pieces).
size_t match_number(std::string_view s, size_t i) {
  Char c = char_at(s, i);
  return (c.flags & kNumberFlag) ? i + c.len : 0;
}

//  ?[^\s\p{L}\p{N}]+[\r\n]* : a run of punctuation/symbols, maybe after one space, with the newlines
// that follow it ("!\n\n", " {").
size_t match_punctuation(std::string_view s, size_t i) {
  size_t j = (s[i] == ' ') ? i + 1 : i;  // without the space the run could not start at a space anyway
  size_t run_start = j;
  while (j < s.size()) {
    Char c = char_at(s, j);
    if (c.flags & (kLetterFlag | kNumberFlag | kWhiteSpaceFlag)) break;
    j += c.len;
  }
  if (j == run_start) return 0;
  while (j < s.size() && is_newline(static_cast<unsigned char>(s[j]))) j++;
  return j;
}

// The maximal run of white space starting at i, which the three white-space alternatives all look at.
struct WhiteSpaceRun {
  size_t end = 0;           // end of the run (0: s[i] is not white space)
  size_t last_start = 0;    // start of its last character
  size_t newline_end = 0;   // end of its last '\r' or '\n' (0: none)
};

WhiteSpaceRun white_space_run(std::string_view s, size_t i) {
  WhiteSpaceRun run;
  for (size_t j = i; j < s.size();) {
    Char c = char_at(s, j);
    if (!(c.flags & kWhiteSpaceFlag)) break;
    run.last_start = j;
    j += c.len;
    run.end = j;
    if (is_newline(c.cp)) run.newline_end = j;
  }
  return run;
}

// \s*[\r\n]+ : white space up to and including its last newline. (\s* first takes the whole run, then
// backtracks until [\r\n]+ can match; [\r\n]+ then stops at the next non-newline.)
size_t match_newlines(const WhiteSpaceRun& run) { return run.newline_end; }

// \s+(?!\S) : white space not followed by a non-space. At the end of the text that is the whole run;
// before a word it is the run minus its last character, which stays to lead the word (" world"); a
// single space before a word does not match at all.
size_t match_trailing_space(std::string_view s, size_t i, const WhiteSpaceRun& run) {
  if (run.end == s.size()) return run.end;
  return run.last_start > i ? run.last_start : 0;
}

// \s+ : any white space run (the one case left: a single space before a word or a digit that the
// letters alternative could not take, e.g. "\t" before "1").
size_t match_space(const WhiteSpaceRun& run) { return run.end; }

}  // namespace

size_t pretokenize_next(std::string_view s, size_t i) {
  if (size_t end = match_contraction(s, i)) return end;
  if (size_t end = match_letters(s, i)) return end;
  if (size_t end = match_number(s, i)) return end;
  if (size_t end = match_punctuation(s, i)) return end;
  WhiteSpaceRun run = white_space_run(s, i);
  if (size_t end = match_newlines(run)) return end;
  if (size_t end = match_trailing_space(s, i, run)) return end;
  if (size_t end = match_space(run)) return end;
  return i + char_at(s, i).len;  // unreachable: every character is covered above
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = pretokenize_next(text, pos);
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

// ===================================================================================================
// Loading tokenizer.json.

namespace {

constexpr const char* kQwenPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Ids index dense tables of ~65 bytes an id (tokens_, bytes_, kind_), so one stray large id would cost its
// whole range: 2^21 ids are 136 MB, eight times the largest real vocabularies (Gemma's 262,144).
constexpr int32_t kMaxTokenId = (1 << 21) - 1;

// The bytes a token string stands for: each character mapped back through the byte map. A token with a
// character outside the map (an added token such as "<|im_start|>" could have one) stands for its own
// UTF-8, as in Hugging Face's ByteLevel decoder.
std::string token_to_bytes(const std::string& token) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    uint32_t cp = 0;
    size_t len = utf8_decode(token.data() + i, token.size() - i, &cp);
    int b = len ? unicode_to_byte(cp) : -1;
    if (b < 0) return token;
    bytes += char(b);
    i += len;
  }
  return bytes;
}

// A field that must be a string, or absent/null (-> fallback).
std::string optional_string(const Json& object, std::string_view key, std::string_view fallback = "") {
  const Json* value = object.find(key);
  return (value && !value->is_null()) ? value->as_string() : std::string(fallback);
}

bool optional_bool(const Json& object, std::string_view key) {
  const Json* value = object.find(key);
  return value && !value->is_null() && value->as_bool();
}

}  // namespace

struct Tokenizer::WordCache {
  static constexpr size_t kMaxEntries = 1 << 16;    // then stop adding (the common words are in by then)
  static constexpr size_t kMaxPieceBytes = 64;      // longer pieces are rare and would bloat it
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> ids;  // piece bytes -> its BPE ids
};

Tokenizer::Tokenizer() : cache_(std::make_shared<WordCache>()) { std::fill(byte_ids_, byte_ids_ + 256, -1); }

Tokenizer Tokenizer::load(const std::string& dir) {
  std::string path = dir + "/tokenizer.json";
  std::string config_path = dir + "/tokenizer_config.json";
  std::string config;
  if (optional_file_exists(config_path)) {
    config = read_file(config_path, kConfigFile);
    if (config.empty()) fail(config_path, ": the file is empty (a JSON object was expected)");
  }
  return from_json(read_file(path, kTokenizerFile), path, config, config_path);
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view source,
                               std::string_view config_json, std::string_view config_source) {
  Json root = Json::parse(tokenizer_json, source);
  if (!root.is_object()) fail(source, ": expected a JSON object");
  Tokenizer tok;
  unicode_flags(0);  // builds the character-class table now rather than in the first encode()
  tok.check_pipeline(root, source);
  const Json* model = root.find("model");
  if (!model) fail(source, ": missing field 'model'");
  tok.load_model(*model, source);
  if (const Json* added = root.find("added_tokens"); added && !added->is_null())
    tok.load_added_tokens(*added, source);

  if (!config_json.empty()) {
    Json config = Json::parse(config_json, config_source);
    if (!config.is_object()) fail(config_source, ": expected a JSON object");
    // Options of transformers' decode and encode that change their output, and that this tokenizer does
    // not have: refused when on, rather than ignored.
    // add_bos_token, add_eos_token: a token before or after every encoding; add_prefix_space: a space before
    // the text (transformers' fast tokenizers rewrite their pipeline for each when it is true).
    for (const char* option : {"clean_up_tokenization_spaces", "split_special_tokens", "add_bos_token",
                               "add_eos_token", "add_prefix_space"})
      if (const Json* on = config.find(option); on && !on->is_null() && (on->type() != Json::Type::Bool || on->as_bool()))
        fail(config_source, ": ", option, ": ", on->dump(), " is not implemented (only false)");
    const Json* eos = config.find("eos_token");
    if (eos && !eos->is_null()) {
      // Either "<|im_end|>" or {"content": "<|im_end|>", ...} (older transformers wrote the latter).
      try {
        const std::string& name = eos->is_object() ? eos->at("content").as_string() : eos->as_string();
        std::optional<int32_t> id = tok.token_to_id(name);
        if (!id) fail("not a token: '", name, "'");
        tok.eos_token_id_ = id;
      } catch (const Error& e) {
        fail(config_source, ": eos_token: ", e.what());
      }
    }
    // transformers also adds each token of added_tokens_decoder that tokenizer.json lacks (at the next free
    // id). This tokenizer reads tokenizer.json alone, so such a token would be plain text here and one id
    // there: refused by name, as is an id that tokenizer.json gives to another token.
    if (const Json* decoder = config.find("added_tokens_decoder"); decoder && !decoder->is_null()) {
      std::string where = "added_tokens_decoder";
      try {
        for (const auto& [key, entry] : decoder->as_object()) {
          where = "added_tokens_decoder['" + key + "']";
          const std::string& content = entry.at("content").as_string();
          const std::optional<int32_t> id = tok.token_to_id(content);
          if (!id) fail("'", content, "' is not a token of ", source, " (only its tokens are read)");
          if (std::to_string(*id) != key) fail("'", content, "' is id ", *id, " in ", source);
        }
      } catch (const Error& e) {
        fail(config_source, ": ", where, ": ", e.what());
      }
    }
  }
  return tok;
}

// We implement one pipeline: Qwen2/Qwen3's. Anything else in tokenizer.json would be silently
// tokenized wrong, so it is refused by name.
void Tokenizer::check_pipeline(const Json& root, std::string_view source) {
  std::string where;
  try {
    where = "normalizer";  // NFC, or none at all (null or absent: the text is taken as it is)
    const Json* n = root.find("normalizer");
    if (n && !n->is_null() && n->at("type").as_string() != "NFC")
      fail("unsupported type '", n->at("type").as_string(), "' (only NFC, or none, is implemented)");
    nfc_ = n && !n->is_null();

    where = "pre_tokenizer";
    const Json& pre = root.at("pre_tokenizer");
    const auto& steps = pre.at("pretokenizers").as_array();
    bool qwen = pre.at("type").as_string() == "Sequence" && steps.size() == 2 &&
                steps[0].at("type").as_string() == "Split" &&
                optional_string(steps[0].at("pattern"), "Regex") == kQwenPattern &&
                steps[0].at("behavior").as_string() == "Isolated" && !optional_bool(steps[0], "invert") &&
                steps[1].at("type").as_string() == "ByteLevel" && !optional_bool(steps[1], "add_prefix_space") &&
                !optional_bool(steps[1], "use_regex");
    if (!qwen) fail("only Qwen2/Qwen3's (Split on its regex, then ByteLevel without regex) is implemented");

    where = "decoder";  // without one, Hugging Face joins the tokens' spellings with spaces: not implemented
    const Json* d = root.find("decoder");
    if (!d || d->is_null()) fail("none given (only ByteLevel is implemented)");
    if (d->at("type").as_string() != "ByteLevel")
      fail("unsupported type '", d->at("type").as_string(), "' (only ByteLevel is implemented)");

    // What encode() adds around the text: ByteLevel's post-processor adds nothing (it only trims
    // offsets), nor does none; a template (TemplateProcessing, BertProcessing, ...) would add tokens.
    where = "post_processor";
    if (const Json* pp = root.find("post_processor"); pp && !pp->is_null() && pp->at("type").as_string() != "ByteLevel")
      fail("unsupported type '", pp->at("type").as_string(), "' (only ByteLevel, or none, is implemented)");

    // Hugging Face's encode() cuts (truncation) or fills (padding) the ids to a length when these are set;
    // Qwen3's file has both null.
    for (const char* option : {"truncation", "padding"}) {
      where = option;
      if (const Json* o = root.find(option); o && !o->is_null()) fail(o->dump(), " is not implemented (only null)");
    }
  } catch (const Error& e) {
    fail(source, ": ", where, ": ", e.what());
  }
}

void Tokenizer::set_token(int32_t id, std::string token, bool added) {
  if (id >= int32_t(tokens_.size())) {
    tokens_.resize(size_t(id) + 1);
    bytes_.resize(size_t(id) + 1);
    kind_.resize(size_t(id) + 1, Kind::kNone);
  }
  if (kind_[id] != Kind::kNone && tokens_[id] != token)
    fail("token id ", id, " is given to both '", tokens_[id], "' and '", token, "'");
  bytes_[id] = token_to_bytes(token);
  token_ids_[token] = id;
  tokens_[id] = std::move(token);
  kind_[id] = added ? Kind::kAdded : Kind::kVocab;
}

void Tokenizer::load_model(const Json& model, std::string_view source) {
  std::string where = "model";
  try {
    if (optional_string(model, "type", "BPE") != "BPE")
      fail("unsupported type '", model.at("type").as_string(), "' (only BPE is implemented)");
    const Json* dropout = model.find("dropout");
    if ((dropout && !dropout->is_null()) || optional_bool(model, "byte_fallback") ||
        optional_bool(model, "ignore_merges") || !optional_string(model, "continuing_subword_prefix").empty() ||
        !optional_string(model, "end_of_word_suffix").empty())
      fail("unsupported option (dropout, byte_fallback, ignore_merges or a subword prefix/suffix)");

    const Json& vocab_json = model.at("vocab");
    const Json& merges_json = model.at("merges");
    where = "model.vocab";
    const auto& vocab = vocab_json.as_object();
    token_ids_.reserve(vocab.size() + 64);
    tokens_.reserve(vocab.size() + 64);
    bytes_.reserve(vocab.size() + 64);
    kind_.reserve(vocab.size() + 64);
    for (const auto& [token, value] : vocab) {
      where = "model.vocab['" + token + "']";
      int64_t id = value.as_int64();
      if (id < 0 || id > kMaxTokenId) fail("id ", id, " is out of range [0, ", kMaxTokenId, "]");
      if (token.empty()) fail("empty token");
      // JSON allows a repeated key; Hugging Face's reader keeps the last id, and the first is left with no token.
      if (const auto seen = token_ids_.find(token); seen != token_ids_.end())
        fail("the token appears twice (ids ", seen->second, " and ", id, ")");
      set_token(int32_t(id), token, false);
    }
    where = "model.vocab";
    for (int b = 0; b < 256; b++) {
      std::string spelling;
      utf8_append(spelling, byte_to_unicode(uint8_t(b)));
      auto it = token_ids_.find(spelling);
      if (it == token_ids_.end()) fail("no token for byte 0x", std::hex, b, " ('", spelling, "')");
      byte_ids_[b] = it->second;
    }

    // Merges: ["Ġ", "t"] pairs (tokenizers >= 0.20) or "Ġ t" strings (older files). The rank is the
    // position in the list: earlier merges were more frequent in training and are applied first.
    where = "model.merges";
    const auto& merges = merges_json.as_array();
    merges_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); rank++) {
      where = "model.merges[" + std::to_string(rank) + "]";
      const Json& merge = merges[rank];
      std::string left, right;
      if (merge.is_string()) {
        const std::string& text = merge.as_string();
        size_t space = text.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == text.size())
          fail("expected \"left right\", got '", text, "'");
        left = text.substr(0, space), right = text.substr(space + 1);
      } else {
        const auto& pair = merge.as_array();
        if (pair.size() != 2) fail("expected a pair of tokens");
        left = pair[0].as_string(), right = pair[1].as_string();
      }
      auto l = token_ids_.find(left), r = token_ids_.find(right), m = token_ids_.find(left + right);
      if (l == token_ids_.end()) fail("unknown token '", left, "'");
      if (r == token_ids_.end()) fail("unknown token '", right, "'");
      if (m == token_ids_.end()) fail("the merged token '", left + right, "' is not in the vocabulary");
      const auto [listed, added] = merges_.emplace(pair_key(l->second, r->second), Merge{int32_t(rank), m->second});
      if (!added)  // which rank would Hugging Face keep? Not a question a real tokenizer asks
        fail("'", left, " ", right, "' is listed twice (also at ", listed->second.rank, ")");
    }
  } catch (const Error& e) {
    fail(source, ": ", where, ": ", e.what());
  }
}

void Tokenizer::load_added_tokens(const Json& added, std::string_view source) {
  std::string where = "added_tokens";
  try {
    const auto& list = added.as_array();
    for (size_t i = 0; i < list.size(); i++) {
      where = "added_tokens[" + std::to_string(i) + "]";
      const Json& entry = list[i];
      int64_t id = entry.at("id").as_int64();
      const std::string& content = entry.at("content").as_string();
      if (id < 0 || id > kMaxTokenId) fail("id ", id, " is out of range [0, ", kMaxTokenId, "]");
      if (content.empty()) fail("empty content");
      // Qwen3's added tokens match exactly, in the raw text (not normalized), with no stripping of
      // spaces around them; other settings would need code that Qwen3 never exercises.
      for (const char* flag : {"lstrip", "rstrip", "single_word", "normalized"})
        if (optional_bool(entry, flag)) fail("'", flag, "': true is not supported");
      // One text under two ids: encode would take one, eos_token the other.
      if (const auto other = token_ids_.find(content); other != token_ids_.end() && other->second != id &&
                                                       kind_[size_t(other->second)] != Kind::kVocab)
        fail("'", content, "' is also added as id ", other->second);
      set_token(int32_t(id), content, true);
      if (optional_bool(entry, "special")) kind_[id] = Kind::kSpecial;
      added_.push_back({content, int32_t(id)});
      added_first_byte_[static_cast<unsigned char>(content[0])] = true;
    }
  } catch (const Error& e) {
    fail(source, ": ", where, ": ", e.what());
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
}

// ===================================================================================================
// Lookups.

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = token_ids_.find(std::string(token));
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || kind_[id] == Kind::kNone)
    fail("unknown token id ", id, " (the vocabulary has ids 0..", vocab_size() - 1, ")");
  return tokens_[id];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  id_to_token(id);  // checks the id
  return bytes_[id];
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && kind_[id] == Kind::kSpecial; }

// ===================================================================================================
// Encode.

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  check_utf8(text);  // once, up front, so that every later stage can trust the bytes

  // Stage 1: cut out added tokens; the text between them goes through the other stages.
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  for (size_t pos = 0;;) {
    size_t which = 0;
    size_t start = find_added_token(text, pos, &which);
    encode_segment(text.substr(pos, start == std::string_view::npos ? std::string_view::npos : start - pos), ids);
    if (start == std::string_view::npos) break;
    ids.push_back(added_[which].id);
    pos = start + added_[which].content.size();
  }
  return ids;
}

size_t Tokenizer::find_added_token(std::string_view text, size_t pos, size_t* which) const {
  if (added_.empty()) return std::string_view::npos;
  for (size_t i = pos; i < text.size(); i++) {
    if (!added_first_byte_[static_cast<unsigned char>(text[i])]) continue;
    for (size_t k = 0; k < added_.size(); k++) {  // longest first
      const std::string& content = added_[k].content;
      if (text.compare(i, content.size(), content) == 0) {
        *which = k;
        return i;
      }
    }
  }
  return std::string_view::npos;
}

// Stages 2-5 on text without added tokens.
void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& ids) const {
  std::string normalized;
  if (nfc_ && !is_nfc_quick(text)) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  for (size_t pos = 0; pos < text.size();) {
    size_t end = pretokenize_next(text, pos);
    encode_piece(text.substr(pos, end - pos), ids);
    pos = end;
  }
}

// One pre-tokenizer piece -> ids, through the word cache.
void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.size() == 1) {
    ids.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (piece.size() > WordCache::kMaxPieceBytes) {
    bpe(piece, ids);
    return;
  }
  std::string key(piece);  // most pieces are under 16 bytes: the string's inline buffer, no allocation
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->ids.find(key);
    if (it != cache_->ids.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = ids.size();
  bpe(piece, ids);
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (cache_->ids.size() < WordCache::kMaxEntries)
    cache_->ids.emplace(std::move(key), std::vector<int32_t>(ids.begin() + first, ids.end()));
}

// Byte-pair encoding of one piece. The piece starts as one symbol per byte, in a doubly linked list;
// a min-heap holds every adjacent pair that has a merge, keyed by (rank, position) so that the
// lowest-ranked pair, leftmost among equals, merges first. A merge changes its two symbols, which makes
// heap entries about them stale: an entry is checked against the current symbols when popped, and the
// new pairs the merge creates with its neighbours are pushed. O(n log n) for a piece of n bytes.
void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;          // token id; -1 once merged into its left neighbour
    int32_t prev, next;  // neighbours' indices, -1 at the ends
  };
  struct Candidate {
    int32_t rank, left;           // the pair (symbols[left], its next) merges at this rank
    int32_t left_id, right_id;    // the two ids when pushed: a mismatch later means stale
    int32_t merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  const int32_t n = int32_t(piece.size());
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; i++)
    symbols[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push_pair = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    int32_t right = symbols[left].next;
    auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it != merges_.end())
      heap.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; i++) push_pair(i);

  while (!heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    Symbol& left = symbols[top.left];
    if (left.id != top.left_id || left.next < 0 || symbols[left.next].id != top.right_id) continue;  // stale
    Symbol& right = symbols[left.next];
    left.id = top.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.id = -1;
    push_pair(left.prev);
    push_pair(top.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

// ===================================================================================================
// Decode.

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_unknown) const {
  std::string bytes;
  for (int32_t id : ids)
    if (!skip_unknown || (id >= 0 && id < vocab_size() && kind_[id] != Kind::kNone)) bytes += token_bytes(id);
  return utf8_lossy(bytes);
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tokenizer_->token_bytes(id);
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  size_t i = 0, len = 0;
  for (; i < pending_.size(); i += len) {
    Utf8Scan scan = scan_utf8(p + i, pending_.size() - i, &len);
    if (scan == Utf8Scan::kUnfinished) break;  // wait for the next token's bytes
    if (scan == Utf8Scan::kComplete) out.append(pending_, i, len);
    else out += kReplacementCharacter;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace nanovllm
