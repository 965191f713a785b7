// Unit tests for the tokenizer, stage by stage: NFC, the pre-tokenizer's alternatives, the byte map,
// BPE merges, added tokens, decoding (lossy and streaming), a round-trip property, and errors.
//
// Where the truth comes from: Unicode's own data and examples (UAX #15, the Unicode Standard's
// Table 3-8 for U+FFFD substitution), the Qwen3 tokenizer's vocabulary, the regex semantics spelt out
// in tokenizer.cpp (the expected pieces were also checked against Hugging Face tokenizers), and
// invariants (round trips, streaming == one-shot decoding).
#include "01_sequence/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

#include <algorithm>
#include <random>
#include <thread>

#include "01_sequence/base/common.h"
#include "01_sequence/base/json.h"
#include "01_sequence/engine_config.h"
#include "01_sequence/llm_engine.h"
#include "01_sequence/tokenizer/unicode.h"
#include "01_sequence/base/utf8.h"

using namespace nanovllm;

namespace {

const Tokenizer& qwen3() {
  static const Tokenizer tokenizer = Tokenizer::load(data_dir() + "/qwen3-tokenizer");
  return tokenizer;
}

std::string cp(uint32_t code_point) {
  std::string s;
  utf8_append(s, code_point);
  return s;
}

std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out;
  for (std::string_view p : pretokenize(text)) out.emplace_back(p);
  return out;
}

using test::error_of;

// The id of the one-byte token for byte b in the Qwen3 vocabulary.
int32_t byte_token(uint8_t b) { return *qwen3().token_to_id(cp(byte_to_unicode(b))); }

// A tiny tokenizer.json with Qwen's pipeline: the 256 byte tokens (id = byte), then `extra` tokens
// (ids 256, 257, ...), the given merges (each a JSON value: ["a","b"] or "a b") and added tokens.
std::string tiny_tokenizer_json(const std::vector<std::string>& extra, const std::vector<Json>& merges,
                                const std::vector<std::pair<std::string, int>>& added = {}) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; b++) vocab.set(cp(byte_to_unicode(uint8_t(b))), b);
  for (size_t i = 0; i < extra.size(); i++) vocab.set(extra[i], int(256 + i));
  Json merge_list = Json::array();
  for (const Json& m : merges) merge_list.push_back(m);
  Json model = Json::object();
  model.set("type", "BPE");
  model.set("vocab", vocab);
  model.set("merges", merge_list);
  Json added_list = Json::array();
  for (const auto& [content, id] : added) {
    Json token = Json::object();
    token.set("id", id);
    token.set("content", content);
    token.set("special", true);
    added_list.push_back(token);
  }
  Json split = Json::object();
  Json pattern = Json::object();
  pattern.set("Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  split.set("type", "Split");
  split.set("pattern", pattern);
  split.set("behavior", "Isolated");
  split.set("invert", false);
  Json byte_level = Json::object();
  byte_level.set("type", "ByteLevel");
  byte_level.set("add_prefix_space", false);
  byte_level.set("use_regex", false);
  Json steps = Json::array();
  steps.push_back(split);
  steps.push_back(byte_level);
  Json pre = Json::object();
  pre.set("type", "Sequence");
  pre.set("pretokenizers", steps);
  Json normalizer = Json::object();
  normalizer.set("type", "NFC");
  Json root = Json::object();
  root.set("added_tokens", added_list);
  root.set("normalizer", normalizer);
  root.set("pre_tokenizer", pre);
  root.set("decoder", byte_level);
  root.set("model", model);
  return root.dump();
}

Json pair(const char* a, const char* b) {
  Json p = Json::array();
  p.push_back(a);
  p.push_back(b);
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// NFC

TEST(Ch01_TokenizerNfc, ComposesKnownPairs) {
  EXPECT_EQ(nfc_normalize("e" + cp(0x301)), cp(0xE9));       // e + acute -> é
  EXPECT_EQ(nfc_normalize("A" + cp(0x30A)), cp(0xC5));       // A + ring -> Å
  EXPECT_EQ(nfc_normalize(cp(0x212B)), cp(0xC5));            // ANGSTROM SIGN: singleton -> Å
  EXPECT_EQ(nfc_normalize(cp(0x2126)), cp(0x3A9));           // OHM SIGN -> Greek capital omega
  EXPECT_EQ(nfc_normalize("caf" + cp(0xE9)), "caf" + cp(0xE9));  // already composed: unchanged
}

TEST(Ch01_TokenizerNfc, ReordersCombiningMarksByClass) {
  // dot below (class 220) sorts before circumflex (230); then a + dot below -> ạ (U+1EA1), and
  // ạ + circumflex -> ậ (U+1EAD), whichever order the marks came in.
  EXPECT_EQ(nfc_normalize("a" + cp(0x302) + cp(0x323)), cp(0x1EAD));
  EXPECT_EQ(nfc_normalize("a" + cp(0x323) + cp(0x302)), cp(0x1EAD));
  // No composite for x: the marks are only put in order.
  EXPECT_EQ(nfc_normalize("x" + cp(0x301) + cp(0x323)), "x" + cp(0x323) + cp(0x301));
  // Blocking: a second mark of the same class cannot reach the starter...
  EXPECT_EQ(nfc_normalize("e" + cp(0x300) + cp(0x301)), cp(0xE8) + cp(0x301));
  EXPECT_EQ(nfc_normalize("e" + cp(0x305) + cp(0x301)), "e" + cp(0x305) + cp(0x301));  // overline blocks é
  // ...but one of a higher class can, past a mark of a lower class: e + (220) + acute -> é + (220).
  EXPECT_EQ(nfc_normalize("e" + cp(0x316) + cp(0x301)), cp(0xE9) + cp(0x316));
}

TEST(Ch01_TokenizerNfc, HangulIsComposedAlgorithmically) {
  EXPECT_EQ(nfc_normalize(cp(0x1100) + cp(0x1161)), cp(0xAC00));                 // ᄀ + ᅡ -> 가
  EXPECT_EQ(nfc_normalize(cp(0x1100) + cp(0x1161) + cp(0x11A8)), cp(0xAC01));    // ᄀ + ᅡ + ᆨ -> 각
  EXPECT_EQ(nfc_normalize(cp(0xAC00) + cp(0x11A8)), cp(0xAC01));                 // 가 + ᆨ -> 각
  EXPECT_EQ(nfc_normalize(cp(0x1112) + cp(0x1161) + cp(0x11AB)), cp(0xD55C));    // -> 한
  EXPECT_EQ(nfc_normalize(cp(0xD55C)), cp(0xD55C));
}

TEST(Ch01_TokenizerNfc, ExclusionsStayDecomposed) {
  // U+0958 DEVANAGARI QA is in CompositionExclusions.txt: it decomposes and is never recomposed.
  EXPECT_EQ(nfc_normalize(cp(0x958)), cp(0x915) + cp(0x93C));
  EXPECT_EQ(nfc_normalize(cp(0x915) + cp(0x93C)), cp(0x915) + cp(0x93C));
  // U+0344 decomposes to two non-starters (a "non-starter decomposition"), also excluded.
  EXPECT_EQ(nfc_normalize(cp(0x344)), cp(0x308) + cp(0x301));
}

TEST(Ch01_TokenizerNfc, UsesUnicode9NormalizationDataLikeHuggingFace) {
  // U+1DF6 (added in Unicode 10, class 232 since) has class 0 in tokenizers' Unicode 9.0 tables, so
  // it is a starter there and the grave accent after it is not moved in front of it.
  EXPECT_EQ(nfc_normalize("x" + cp(0x1DF6) + cp(0x300)), "x" + cp(0x1DF6) + cp(0x300));
  EXPECT_EQ(combining_class(0x1DF6), 0);
  EXPECT_EQ(combining_class(0x301), 230);
  EXPECT_EQ(combining_class(0x323), 220);
}

TEST(Ch01_TokenizerNfc, QuickCheck) {
  EXPECT_TRUE(is_nfc_quick("plain ASCII"));
  EXPECT_TRUE(is_nfc_quick("caf" + cp(0xE9) + " " + cp(0x4E16) + cp(0x754C)));
  EXPECT_FALSE(is_nfc_quick("e" + cp(0x301)));
  EXPECT_FALSE(is_nfc_quick(cp(0x212B)));
}

// ---------------------------------------------------------------------------------------------------
// Pre-tokenizer: one test per alternative of the regex.

TEST(Ch01_TokenizerPieces, Contractions) {
  EXPECT_EQ(pieces("I'm"), (std::vector<std::string>{"I", "'m"}));
  EXPECT_EQ(pieces("don't"), (std::vector<std::string>{"don", "'t"}));
  EXPECT_EQ(pieces("we'RE here"), (std::vector<std::string>{"we", "'RE", " here"}));  // (?i:...)
  EXPECT_EQ(pieces("x'Ll"), (std::vector<std::string>{"x", "'Ll"}));
  EXPECT_EQ(pieces("they've"), (std::vector<std::string>{"they", "'ve"}));
  // U+017F LATIN SMALL LETTER LONG S case-folds to 's': "'ſ" is a contraction, so "x" is cut off
  // (as a plain letter, ſ would have joined "x" in one run: "'ſx").
  EXPECT_EQ(pieces("'" + cp(0x17F) + "x"), (std::vector<std::string>{"'" + cp(0x17F), "x"}));
  // The contraction alternative comes first, so "'d" is cut off even when letters follow it (Python's
  // `regex` on the same pattern: "'dog" -> "'d", "og"; "I'dn't" -> "I", "'d", "n", "'t").
  EXPECT_EQ(pieces("'dog"), (std::vector<std::string>{"'d", "og"}));
  EXPECT_EQ(pieces("I'dn't"), (std::vector<std::string>{"I", "'d", "n", "'t"}));
  EXPECT_EQ(pieces("'Dx"), (std::vector<std::string>{"'D", "x"}));
  // Not contractions: the apostrophe leads a letter run, or stands alone.
  EXPECT_EQ(pieces("'v"), (std::vector<std::string>{"'v"}));
  EXPECT_EQ(pieces("'"), (std::vector<std::string>{"'"}));
}

TEST(Ch01_TokenizerPieces, LettersWithOptionalLeadingCharacter) {
  EXPECT_EQ(pieces("Hello world"), (std::vector<std::string>{"Hello", " world"}));
  EXPECT_EQ(pieces("\tx"), (std::vector<std::string>{"\tx"}));
  EXPECT_EQ(pieces("$abc"), (std::vector<std::string>{"$abc"}));
  EXPECT_EQ(pieces("$$abc"), (std::vector<std::string>{"$$", "abc"}));       // one leading char at most
  EXPECT_EQ(pieces("\nabc"), (std::vector<std::string>{"\n", "abc"}));      // a newline never leads
  EXPECT_EQ(pieces("ab12c"), (std::vector<std::string>{"ab", "1", "2", "c"}));
  EXPECT_EQ(pieces(cp(0x4F60) + cp(0x597D) + "!"), (std::vector<std::string>{cp(0x4F60) + cp(0x597D), "!"}));
  EXPECT_EQ(pieces("x" + cp(0x301)), (std::vector<std::string>{"x", cp(0x301)}));  // a mark is not \p{L}
}

TEST(Ch01_TokenizerPieces, NumbersOneAtATime) {
  EXPECT_EQ(pieces("2024"), (std::vector<std::string>{"2", "0", "2", "4"}));
  EXPECT_EQ(pieces(cp(0xBD) + cp(0x216B)), (std::vector<std::string>{cp(0xBD), cp(0x216B)}));  // ½ Ⅻ are \p{N}
}

TEST(Ch01_TokenizerPieces, PunctuationRunsTakeTrailingNewlines) {
  EXPECT_EQ(pieces("?!\n\n x"), (std::vector<std::string>{"?!\n\n", " x"}));
  EXPECT_EQ(pieces(" ?!"), (std::vector<std::string>{" ?!"}));
  EXPECT_EQ(pieces("...\r\n"), (std::vector<std::string>{"...\r\n"}));
  EXPECT_EQ(pieces("a\x1c\x1c" "b"), (std::vector<std::string>{"a", "\x1c\x1c", "b"}));  // U+001C is not \s
  // Only a space may lead the run (" ?"): a tab before punctuation is white space of its own (Python's `regex`
  // on the same pattern: "\t!" -> "\t", "!"; "x \t!\n" -> "x", " ", "\t", "!\n").
  EXPECT_EQ(pieces("\t!"), (std::vector<std::string>{"\t", "!"}));
  EXPECT_EQ(pieces("x \t!\n"), (std::vector<std::string>{"x", " ", "\t", "!\n"}));
}

TEST(Ch01_TokenizerPieces, NewlineRuns) {
  // \s*[\r\n]+ ends at the last newline of a white-space run.
  EXPECT_EQ(pieces("a  \n  b"), (std::vector<std::string>{"a", "  \n", " ", " b"}));
  EXPECT_EQ(pieces("a \n \n  b"), (std::vector<std::string>{"a", " \n \n", " ", " b"}));
  EXPECT_EQ(pieces(" \r\n\t x"), (std::vector<std::string>{" \r\n", "\t", " x"}));
  EXPECT_EQ(pieces("a\r\rb"), (std::vector<std::string>{"a", "\r\r", "b"}));
}

TEST(Ch01_TokenizerPieces, TrailingWhitespaceLookahead) {
  // \s+(?!\S): a run before a word gives its last space to the word; at the end it stays whole.
  EXPECT_EQ(pieces("a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a "), (std::vector<std::string>{"a", " "}));
  EXPECT_EQ(pieces("  "), (std::vector<std::string>{"  "}));
  // A single space before a digit: neither letters nor the lookahead take it; \s+ does.
  EXPECT_EQ(pieces("x \t1"), (std::vector<std::string>{"x", " ", "\t", "1"}));
  // \s is Unicode White_Space: U+3000, U+00A0, U+2028 and U+000B are, U+200B is not.
  EXPECT_EQ(pieces(cp(0x3000) + cp(0x3000)), (std::vector<std::string>{cp(0x3000) + cp(0x3000)}));
  EXPECT_EQ(pieces("a" + cp(0xA0) + cp(0xA0) + "b"), (std::vector<std::string>{"a", cp(0xA0), cp(0xA0) + "b"}));
  EXPECT_EQ(pieces("a" + cp(0x2028) + cp(0x2028) + "b"), (std::vector<std::string>{"a", cp(0x2028), cp(0x2028) + "b"}));
  EXPECT_EQ(pieces("a\v\vb"), (std::vector<std::string>{"a", "\v", "\vb"}));
  EXPECT_EQ(pieces("a" + cp(0x200B) + "b"), (std::vector<std::string>{"a", cp(0x200B) + "b"}));
}

TEST(Ch01_TokenizerPieces, PiecesTileTheText) {
  std::mt19937 rng(1);
  const std::vector<std::string> alphabet = {" ", "\t", "\n", "\r", "a", "Z", "7", "!", "'", "s", "re",
                                             cp(0xA0), cp(0x3000), cp(0x4E2D), cp(0x301), cp(0x1F600)};
  for (int trial = 0; trial < 2000; trial++) {
    std::string text;
    int n = int(rng() % 16);
    for (int i = 0; i < n; i++) text += alphabet[rng() % alphabet.size()];
    std::string joined;
    for (std::string_view p : pretokenize(text)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, text);
  }
}

// ---------------------------------------------------------------------------------------------------
// Byte map and BPE

TEST(Ch01_TokenizerBytes, AllBytesRoundTrip) {
  std::vector<bool> seen(0x144, false);
  for (int b = 0; b < 256; b++) {
    uint32_t u = byte_to_unicode(uint8_t(b));
    ASSERT_LT(u, 0x144u);
    EXPECT_FALSE(seen[u]) << "two bytes map to U+" << std::hex << u;
    seen[u] = true;
    EXPECT_EQ(unicode_to_byte(u), b);
  }
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_unicode('A'), uint32_t('A'));
  EXPECT_EQ(byte_to_unicode(0xAD), 0x143u);  // the last one moved
  EXPECT_EQ(unicode_to_byte(0x144), -1);
  EXPECT_EQ(unicode_to_byte(0x20), -1);      // a plain space stands for no byte
  // In the real vocabulary each byte's token decodes back to that byte.
  for (int b = 0; b < 256; b++) EXPECT_EQ(qwen3().token_bytes(byte_token(uint8_t(b))), std::string(1, char(b)));
}

TEST(Ch01_TokenizerBpe, LowestRankMergesFirst) {
  // "abc": pairs (a,b) and (b,c). Whichever merge ranks first wins, and decides what is left.
  Tokenizer bc_first = Tokenizer::from_json(tiny_tokenizer_json({"bc", "ab"}, {pair("b", "c"), pair("a", "b")}), "t.json");
  EXPECT_EQ(bc_first.encode("abc"), (std::vector<int32_t>{'a', 256}));
  Tokenizer ab_first = Tokenizer::from_json(tiny_tokenizer_json({"bc", "ab"}, {pair("a", "b"), pair("b", "c")}), "t.json");
  EXPECT_EQ(ab_first.encode("abc"), (std::vector<int32_t>{257, 'c'}));
}

TEST(Ch01_TokenizerBpe, MergesChainAndTiesGoLeftmost) {
  Tokenizer tok = Tokenizer::from_json(
      tiny_tokenizer_json({"aa", "aaaa", "Ġa"}, {pair("a", "a"), pair("aa", "aa"), Json("Ġ a")}), "t.json");
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{256, 'a'}));     // (a,a) at 0 before (a,a) at 1
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{257}));         // aa + aa -> aaaa
  EXPECT_EQ(tok.encode("aaaaa"), (std::vector<int32_t>{257, 'a'}));
  EXPECT_EQ(tok.encode(" a"), (std::vector<int32_t>{258}));           // the "a b" string form of a merge
  EXPECT_EQ(tok.decode({257, 258}), "aaaa a");
}

TEST(Ch01_TokenizerBpe, Qwen3Words) {
  EXPECT_EQ(qwen3().encode("Hello"), (std::vector<int32_t>{9707}));
  EXPECT_EQ(qwen3().encode(" world"), (std::vector<int32_t>{1879}));
  EXPECT_EQ(qwen3().id_to_token(1879), "\xC4\xA0world");  // "Ġworld"
  EXPECT_EQ(qwen3().token_to_id("\xC4\xA0world"), 1879);
  EXPECT_EQ(qwen3().token_to_id("no such token"), std::nullopt);
}

// ---------------------------------------------------------------------------------------------------
// Added tokens

TEST(Ch01_TokenizerAddedTokens, SplitBeforeEverythingElse) {
  EXPECT_EQ(qwen3().encode("<|im_start|>user"), (std::vector<int32_t>{151644, 872}));
  EXPECT_EQ(qwen3().encode("a<think>b"), (std::vector<int32_t>{64, 151667, 65}));
  // The spaces around stay in their own segments: " " at a segment's end is a piece of its own.
  EXPECT_EQ(qwen3().encode(" <|im_end|> "), (std::vector<int32_t>{220, 151645, 220}));
  EXPECT_EQ(qwen3().encode("<<|im_end|>"), (std::vector<int32_t>{27, 151645}));
  // An incomplete marker is ordinary text.
  std::vector<int32_t> partial = qwen3().encode("<|im_start");
  EXPECT_EQ(std::count(partial.begin(), partial.end(), 151644), 0);
  EXPECT_EQ(qwen3().decode(partial), "<|im_start");
  EXPECT_TRUE(qwen3().is_special(151644));
  EXPECT_FALSE(qwen3().is_special(151667));  // <think> is added but not special
}

TEST(Ch01_TokenizerAddedTokens, LongestMatchWins) {
  Tokenizer tok = Tokenizer::from_json(tiny_tokenizer_json({}, {}, {{"<a>", 300}, {"<a>b", 301}}), "t.json");
  EXPECT_EQ(tok.encode("<a>bc"), (std::vector<int32_t>{301, 'c'}));
  EXPECT_EQ(tok.encode("<a>c"), (std::vector<int32_t>{300, 'c'}));
  EXPECT_EQ(tok.vocab_size(), 302);
  EXPECT_EQ(tok.decode({301, 300}), "<a>b<a>");
}

// ---------------------------------------------------------------------------------------------------
// Decoding

TEST(Ch01_TokenizerDecode, LossyLikeRust) {
  // The Unicode Standard's Table 3-8 example: one U+FFFD per maximal ill-formed subpart.
  const std::string fffd = cp(0xFFFD);
  EXPECT_EQ(utf8_lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + fffd + fffd + fffd + "b" + fffd + "c" + fffd + fffd + "d");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), fffd + fffd + fffd);  // an encoded surrogate: three bad bytes
  EXPECT_EQ(utf8_lossy("\xC0\x80"), fffd + fffd);             // overlong
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
  EXPECT_EQ(utf8_lossy("\xE4\xBD"), fffd);                    // truncated at the end: one
  // Table 3-7's other second-byte limits: after E0 only A0..BF (below: an overlong 3-byte form), after F0 only
  // 90..BF (below: an overlong 4-byte form), and F5..FF start nothing. Each byte of such a sequence is then a
  // maximal subpart of its own, as in Python's bytes.decode("utf-8", "replace"); the smallest characters of
  // each length beside them are well-formed.
  EXPECT_EQ(utf8_lossy("\xE0\x80\xAF"), fffd + fffd + fffd);            // '/' as an overlong 3 bytes
  EXPECT_EQ(utf8_lossy("\xE0\xA0\x80"), cp(0x800));
  EXPECT_EQ(utf8_lossy("\xF0\x8F\xBF\xBF"), fffd + fffd + fffd + fffd);  // U+FFFF as an overlong 4 bytes
  EXPECT_EQ(utf8_lossy("\xF0\x90\x80\x80"), cp(0x10000));
  EXPECT_EQ(utf8_lossy("\xF5\x80\x80\x80"), fffd + fffd + fffd + fffd);
  EXPECT_EQ(utf8_lossy("\xF7\xBF\xBF\xBF"), fffd + fffd + fffd + fffd);
  EXPECT_EQ(utf8_lossy("ok " + cp(0x4F60)), "ok " + cp(0x4F60));
  // Through the tokenizer: the byte tokens of a truncated character, then a space.
  EXPECT_EQ(qwen3().decode({byte_token(0xE4), byte_token(0xBD), byte_token(' ')}), fffd + " ");
  EXPECT_EQ(qwen3().decode({byte_token(0xFF)}), fffd);
}

TEST(Ch01_TokenizerDecode, SkipUnknownDropsIdsTheTokenizerLacks) {
  // Hugging Face's decode drops ids it has no token for; the engine needs that for the ids of Qwen3's
  // padded embedding (151669..151935). Without skip_unknown they stay an error. A byte-level character
  // split around a dropped id still joins up: é = C3 A9.
  const int32_t hello = 9707, comma = 11;
  EXPECT_EQ(qwen3().decode({hello, 151832, comma, 151935, -1}, true), qwen3().decode({hello, comma}));
  EXPECT_EQ(qwen3().decode({byte_token(0xC3), 151700, byte_token(0xA9)}, true), cp(0xE9));
  EXPECT_EQ(qwen3().decode({151669}, true), "");
  EXPECT_EQ(qwen3().decode({151645}, true), "<|im_end|>");  // added tokens still decode
  EXPECT_THROW(qwen3().decode({hello, 151832}), Error);
  // An id below vocab_size() may have no token either: with an added token at 300 after the 256 byte tokens,
  // ids 256..299 are a gap (Qwen3 has none, so only a tokenizer of our own shows it).
  const Tokenizer gaps = Tokenizer::from_json(tiny_tokenizer_json({}, {}, {{"<end>", 300}}), "t.json");
  ASSERT_EQ(gaps.vocab_size(), 301);
  EXPECT_EQ(gaps.decode({'a', 299, 'b', 256, 300}, true), "ab<end>");
  EXPECT_NE(error_of([&] { gaps.decode({'a', 299}); }).find("unknown token id 299"), std::string::npos);
}

TEST(Ch01_TokenizerDecode, ATokenWithACharacterOutsideTheByteMapIsItsOwnUtf8) {
  // Hugging Face's ByteLevel decoder maps a token's characters back to bytes only when every one of them stands
  // for a byte; if one does not, the whole token is its own UTF-8 (tokenizers' byte_level.rs, decode_chain:
  // chars().try_fold(...).unwrap_or_else(|| t.as_bytes())). "\u0120 x" mixes the two: U+0120 'Ġ' stands for a
  // space, but a plain space stands for no byte, so the token decodes to "\u0120 x" itself, not to "  x".
  const std::string mixed = cp(0x120) + " x";
  const Tokenizer tok = Tokenizer::from_json(tiny_tokenizer_json({cp(0x120) + "x"}, {}, {{mixed, 300}}), "t.json");
  EXPECT_EQ(tok.token_bytes(300), mixed);
  EXPECT_EQ(tok.token_bytes(256), " x");  // every character in the map: bytes
  EXPECT_EQ(tok.decode({'a', 300, 256}), "a" + mixed + " x");
}

TEST(Ch01_TokenizerDecode, StreamingHoldsBackSplitCharacters) {
  StreamDecoder stream(qwen3());
  EXPECT_EQ(stream.push(byte_token(0xC3)), "");        // first byte of é
  EXPECT_EQ(stream.push(byte_token(0xA9)), cp(0xE9));  // ... and its last
  // 😀 = F0 9F 98 80, one byte token at a time: nothing until the fourth.
  EXPECT_EQ(stream.push(byte_token(0xF0)), "");
  EXPECT_EQ(stream.push(byte_token(0x9F)), "");
  EXPECT_EQ(stream.push(byte_token(0x98)), "");
  EXPECT_EQ(stream.push(byte_token(0x80)), cp(0x1F600));
  EXPECT_EQ(stream.push(9707), "Hello");
  // A byte that can never be valid comes out at once; so does a lead byte cut short by ASCII.
  EXPECT_EQ(stream.push(byte_token(0xFF)), cp(0xFFFD));
  EXPECT_EQ(stream.push(byte_token(0xE4)), "");
  EXPECT_EQ(stream.push(byte_token('a')), cp(0xFFFD) + "a");
  // An unfinished character at the end becomes one U+FFFD.
  EXPECT_EQ(stream.push(byte_token(0xE4)), "");
  EXPECT_EQ(stream.push(byte_token(0xBD)), "");
  EXPECT_EQ(stream.finish(), cp(0xFFFD));
  EXPECT_EQ(stream.finish(), "");
}

TEST(Ch01_TokenizerDecode, StreamingEqualsOneShotDecode) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; trial++) {
    std::vector<int32_t> ids;
    int n = int(rng() % 20);
    for (int i = 0; i < n; i++) {
      // Mostly single bytes (to split characters), some whole tokens, some added tokens.
      uint32_t r = rng() % 10;
      ids.push_back(r < 6 ? byte_token(uint8_t(rng() % 256)) : r < 9 ? int32_t(rng() % 151643) : 151643 + int32_t(rng() % 26));
    }
    StreamDecoder stream(qwen3());
    std::string streamed;
    for (int32_t id : ids) {
      std::string part = stream.push(id);
      ASSERT_TRUE(utf8_is_valid(part));
      streamed += part;
    }
    streamed += stream.finish();
    ASSERT_EQ(streamed, qwen3().decode(ids));
  }
}

TEST(Ch01_TokenizerRoundTrip, DecodeOfEncodeIsNfcOfText) {
  // Random valid UTF-8 over a mix of scripts, marks, spaces and emoji (no added-token markers).
  std::mt19937 rng(42);
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x17F}, {0x300, 0x36F}, {0x370, 0x3FF}, {0x400, 0x4FF},
      {0x900, 0x97F}, {0x1100, 0x11FF}, {0x2000, 0x206F}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF},
      {0xAC00, 0xD7A3}, {0x1F300, 0x1F6FF}, {0x10000, 0x10FFFF}};
  for (int trial = 0; trial < 1000; trial++) {
    std::string text;
    int n = int(rng() % 30);
    for (int i = 0; i < n; i++) {
      auto [lo, hi] = ranges[rng() % ranges.size()];
      uint32_t c = lo + rng() % (hi - lo + 1);
      if (c >= 0xD800 && c <= 0xDFFF) c = 'x';
      utf8_append(text, c);
    }
    if (text.find("<|") != std::string::npos || text.find("think>") != std::string::npos ||
        text.find("tool_") != std::string::npos)
      continue;
    ASSERT_EQ(qwen3().decode(qwen3().encode(text)), nfc_normalize(text)) << Json(text).dump();
  }
}

TEST(Ch01_TokenizerRoundTrip, ConcurrentEncodesAgreeWithSerialOnes) {
  // encode() is const and shares the word cache: two threads at once must get the serial answers.
  Tokenizer tok = Tokenizer::load(data_dir() + "/qwen3-tokenizer");  // a fresh, empty cache
  std::vector<std::string> texts;
  for (int i = 0; i < 200; i++) texts.push_back("word" + std::to_string(i % 37) + " and " + cp(0x4E00 + uint32_t(i)) + "!");
  std::vector<std::vector<int32_t>> serial;
  for (const std::string& t : texts) serial.push_back(qwen3().encode(t));
  std::vector<std::vector<int32_t>> results[2];
  std::thread workers[2];
  for (int w = 0; w < 2; w++)
    workers[w] = std::thread([&, w] {
      for (const std::string& t : texts) results[w].push_back(tok.encode(t));
    });
  for (std::thread& w : workers) w.join();
  EXPECT_EQ(results[0], serial);
  EXPECT_EQ(results[1], serial);
}

TEST(Ch01_TokenizerLoad, EosTokenFromConfig) {
  std::string json = tiny_tokenizer_json({}, {}, {{"<end>", 300}});
  EXPECT_EQ(Tokenizer::from_json(json, "t.json", R"({"eos_token": "<end>"})", "c.json").eos_token_id(), 300);
  EXPECT_EQ(Tokenizer::from_json(json, "t.json", R"({"eos_token": {"content": "<end>"}})", "c.json").eos_token_id(), 300);
  EXPECT_EQ(Tokenizer::from_json(json, "t.json", R"({"eos_token": null})", "c.json").eos_token_id(), std::nullopt);
  EXPECT_EQ(Tokenizer::from_json(json, "t.json").eos_token_id(), std::nullopt);
}

// ---------------------------------------------------------------------------------------------------
// Errors

TEST(Ch01_TokenizerErrors, InvalidUtf8InputNamesTheOffset) {
  EXPECT_NE(error_of([] { qwen3().encode("ab\xFF" "cd"); }).find("byte offset 2"), std::string::npos);
  EXPECT_NE(error_of([] { qwen3().encode("ok\xE4\xBD"); }).find("byte offset 2"), std::string::npos);
  EXPECT_NE(error_of([] { qwen3().encode("\xED\xA0\x80"); }).find("byte offset 0"), std::string::npos);
  EXPECT_EQ(error_of([] { qwen3().encode(""); }), "");
}

TEST(Ch01_TokenizerErrors, UnknownIdNamesTheId) {
  EXPECT_NE(error_of([] { qwen3().decode({1, 151669}); }).find("151669"), std::string::npos);
  EXPECT_NE(error_of([] { qwen3().decode({-1}); }).find("-1"), std::string::npos);
  EXPECT_NE(error_of([] { qwen3().id_to_token(1 << 30); }).find("unknown token id"), std::string::npos);
  StreamDecoder stream(qwen3());
  EXPECT_NE(error_of([&] { stream.push(999999); }).find("999999"), std::string::npos);
}

TEST(Ch01_TokenizerErrors, MalformedTokenizerJson) {
  std::string good = tiny_tokenizer_json({"ab"}, {pair("a", "b")});
  ASSERT_EQ(error_of([&] { Tokenizer::from_json(good, "t.json"); }), "");
  // Each variant edits the good file; the message must name the file and the field at fault.
  struct Case {
    std::string from, to, expected;
  };
  const std::vector<Case> cases = {
      {"{", "[", "t.json"},                                            // not a JSON object
      {"\"model\":", "\"modell\":", "missing field 'model'"},
      {"\"vocab\":", "\"vocabulary\":", "model: missing field 'vocab'"},
      {"\"merges\":", "\"merged\":", "model: missing field 'merges'"},
      {"[\"a\",\"b\"]", "[\"a\",\"zz\"]", "model.merges[0]: unknown token 'zz'"},
      {"\"ab\":256", "\"ba\":256", "model.merges[0]: the merged token 'ab' is not in the vocabulary"},
      {"\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "model: unsupported type 'WordPiece'"},
      {"\"type\":\"NFC\"", "\"type\":\"NFKC\"", "normalizer: unsupported type 'NFKC'"},
      {"\\s+(?!\\\\S)", "\\s+(?!\\\\s)", "pre_tokenizer: only Qwen2/Qwen3's"},
      {"\"ab\":256", "\"ab\":-5", "model.vocab['ab']: id -5 is out of range"},
      {"\"a\":97", "\"a\":\"x\"", "model.vocab['a']: expected an integer"},
      {"\"added_tokens\":[]", "\"added_tokens\":[{\"id\":300,\"content\":\"<x>\",\"lstrip\":true}]",
       "added_tokens[0]: 'lstrip': true is not supported"},
      {"\"added_tokens\":[]", "\"added_tokens\":[{\"id\":97,\"content\":\"<x>\"}]",
       "token id 97 is given to both 'a' and '<x>'"},
      // Found by hostile input (2026-12-05): each was accepted, and each would tokenize or decode
      // otherwise than Hugging Face with exit 0.
      {"\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}", "\"decoder\":null",
       "decoder: none given (only ByteLevel is implemented)"},
      {"\"model\":", "\"post_processor\":{\"type\":\"TemplateProcessing\"},\"model\":",
       "post_processor: unsupported type 'TemplateProcessing'"},
      {"[[\"a\",\"b\"]]", "[[\"a\",\"b\"],\"a b\"]", "model.merges[1]: 'a b' is listed twice (also at 0)"},
      {"\"added_tokens\":[]", "\"added_tokens\":[{\"id\":300,\"content\":\"<x>\"},{\"id\":301,\"content\":\"<x>\"}]",
       "added_tokens[1]: '<x>' is also added as id 300"},
      // Found by the fourth round (2026-12-05). A token twice in the vocabulary (Hugging Face keeps the
      // last id, and the first then decodes to nothing); an id whose dense tables would take a GB.
      {"\"ab\":256", "\"ab\":256,\"b\":300", "model.vocab['b']: the token appears twice (ids 98 and 300)"},
      {"\"added_tokens\":[]", "\"added_tokens\":[{\"id\":16777215,\"content\":\"<x>\"}]",
       "added_tokens[0]: id 16777215 is out of range [0, 2097151]"},
      {"\"ab\":256", "\"ab\":2097152", "model.vocab['ab']: id 2097152 is out of range [0, 2097151]"},
      // Found by hostile input (2026-12-07): encode() would cut or fill the ids in Hugging Face's.
      {"\"model\":", "\"truncation\":{\"max_length\":5},\"model\":", "truncation: {\"max_length\":5} is not implemented (only null)"},
      {"\"model\":", "\"padding\":{\"length\":5},\"model\":", "padding: {\"length\":5} is not implemented (only null)"},
  };
  for (const Case& c : cases) {
    std::string bad = good;
    size_t at = bad.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    bad.replace(at, c.from.size(), c.to);
    std::string message = error_of([&] { Tokenizer::from_json(bad, "t.json"); });
    EXPECT_NE(message.find("t.json"), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in: " << message;
  }
  // Qwen3's own file has both null.
  std::string nulls = good;
  nulls.replace(nulls.find("\"model\":"), 8, "\"truncation\":null,\"padding\":null,\"model\":");
  EXPECT_EQ(error_of([&] { Tokenizer::from_json(nulls, "t.json"); }), "");
  // A vocabulary without all 256 byte tokens cannot encode every text.
  std::string no_byte = good;
  no_byte.replace(no_byte.find("\"a\":97,"), 7, "");
  EXPECT_NE(error_of([&] { Tokenizer::from_json(no_byte, "t.json"); }).find("no token for byte 0x61"), std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::load("/nonexistent/dir"); }).find("/nonexistent/dir/tokenizer.json: cannot read"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tokenizer::from_json(good, "t.json", "{\"eos_token\": \"<nope>\"}", "c.json"); })
                .find("c.json: eos_token: not a token: '<nope>'"),
            std::string::npos);
}

TEST(Ch01_TokenizerLoad, AddedTokensOfTheConfigMustBeTokenizerJsons) {
  // transformers adds a token of tokenizer_config.json's added_tokens_decoder that tokenizer.json lacks; this
  // tokenizer reads tokenizer.json alone, so "a<new>b" would be text here and one id there (accepted until
  // the fourth round of hostile input, 2026-12-05).
  const std::string json = tiny_tokenizer_json({}, {}, {{"<end>", 300}});
  auto error_with = [&](const std::string& decoder) {
    return error_of([&] { Tokenizer::from_json(json, "t.json", "{\"added_tokens_decoder\": " + decoder + "}", "c.json"); });
  };
  EXPECT_EQ(error_with(R"({"300": {"content": "<end>", "special": true}})"), "");
  EXPECT_EQ(error_with(R"({"97": {"content": "a"}})"), "");  // a token of the vocabulary, listed: as tokenizer.json
  EXPECT_EQ(error_with("null"), "");
  EXPECT_EQ(error_with(R"({"301": {"content": "<new>", "special": true}})"),
            "c.json: added_tokens_decoder['301']: '<new>' is not a token of t.json (only its tokens are read)");
  EXPECT_EQ(error_with(R"({"301": {"content": "<end>"}})"), "c.json: added_tokens_decoder['301']: '<end>' is id 300 in t.json");
  EXPECT_EQ(error_with(R"({"300": {"special": true}})"), "c.json: added_tokens_decoder['300']: missing field 'content'");
  // The real Qwen3 files agree with each other.
  EXPECT_EQ(error_of([] { Tokenizer::load(data_dir() + "/qwen3-tokenizer"); }), "");
}

TEST(Ch01_TokenizerLoad, ConfigOptionsThatChangeTheOutputAreRefusedWhenOn) {
  const std::string json = tiny_tokenizer_json({}, {});
  for (const char* option : {"clean_up_tokenization_spaces", "split_special_tokens", "add_bos_token", "add_eos_token",
                             "add_prefix_space"}) {
    const std::string off = std::string("{\"") + option + "\": false}", on = std::string("{\"") + option + "\": true}";
    EXPECT_EQ(error_of([&] { Tokenizer::from_json(json, "t.json", off, "c.json"); }), "") << option;
    EXPECT_EQ(error_of([&] { Tokenizer::from_json(json, "t.json", on, "c.json"); }),
              std::string("c.json: ") + option + ": true is not implemented (only false)");
    // A string is not a boolean, even one that reads "true" (found by hostile input, 2026-12-07).
    const std::string text = std::string("{\"") + option + "\": \"true\"}";
    EXPECT_EQ(error_of([&] { Tokenizer::from_json(json, "t.json", text, "c.json"); }),
              std::string("c.json: ") + option + ": \"true\" is not implemented (only false)");
  }
}

TEST(Ch01_TokenizerLoad, NoNormalizerTakesTheTextAsItIs) {
  // "normalizer": null was NFC all the same: e + U+0301 came out as the ids of the composed é.
  std::string json = tiny_tokenizer_json({}, {});
  const std::string nfc = "\"normalizer\":{\"type\":\"NFC\"}";
  ASSERT_NE(json.find(nfc), std::string::npos);
  json.replace(json.find(nfc), nfc.size(), "\"normalizer\":null");
  const Tokenizer none = Tokenizer::from_json(json, "t.json");
  const Tokenizer with_nfc = Tokenizer::from_json(tiny_tokenizer_json({}, {}), "t.json");
  const std::string decomposed = "e" + cp(0x301), composed = cp(0xE9);
  EXPECT_EQ(none.decode(none.encode(decomposed)), decomposed);
  EXPECT_EQ(with_nfc.decode(with_nfc.encode(decomposed)), composed);
  EXPECT_EQ(none.encode(composed), with_nfc.encode(composed));  // already NFC: the same either way
}

TEST(Ch01_TokenizerLoad, AnEngineTakesATokenizerAsLargeAsItsVocabulary) {
  // Every id of the tokenizer must be a row of the model's embedding: with tiny-qwen3-a (512 ids), a
  // tokenizer of exactly 512 ids (the 256 byte tokens and 256 more) fits, one of 513 does not.
  std::vector<std::string> extra;
  for (int id = 256; id < 512; id++) extra.push_back("<t" + std::to_string(id) + ">");
  test::TempDir exact, one_more;
  write_file(exact / "tokenizer.json", tiny_tokenizer_json(extra, {}));
  extra.push_back("<t512>");
  write_file(one_more / "tokenizer.json", tiny_tokenizer_json(extra, {}));
  EngineConfig config;
  config.model = test::golden_dir("tiny-qwen3-a");
  config.device = "cpu";
  config.num_kvcache_blocks = 4;
  config.tokenizer = exact.path();
  EXPECT_EQ(error_of([&] { EXPECT_EQ(LLMEngine(config).tokenizer()->vocab_size(), 512); }), "");
  config.tokenizer = one_more.path();
  EXPECT_EQ(error_of([&] { LLMEngine engine(config); }),
            "the tokenizer in " + one_more.path() + " has 513 tokens but the model's vocabulary only 512");
}
