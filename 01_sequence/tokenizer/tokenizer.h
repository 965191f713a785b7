// tokenizer.h: Qwen3's byte-level BPE tokenizer, read from the tokenizer.json that Hugging Face ships.
//
// encode(text), stage by stage (the same stages, in the same order, as Hugging Face `tokenizers`):
//   1. added tokens    "<|im_start|>", "<think>", ... are cut out of the raw text first (leftmost, then
//                      longest match) and become their ids directly; only the text between them goes on;
//   2. normalizer      NFC (unicode.h);
//   3. pre-tokenizer   a hand-written matcher for Qwen's split regex cuts the text into pieces
//                      ("Hello", ",", " world", "\n\n", ...): BPE never merges across two pieces;
//   4. byte level      each piece is a string of bytes; GPT-2 gave each byte a printable stand-in
//                      character (space -> 'Ġ', newline -> 'Ċ'), which is how vocab and merges spell them;
//   5. BPE             start from one token per byte, repeatedly merge the adjacent pair with the lowest
//                      merge rank, until no pair has a merge; the tokens left are the ids.
// decode(ids) runs it backwards: ids -> token strings -> bytes -> UTF-8 (invalid bytes become U+FFFD).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace nanovllm {

class Json;

// ---------------------------------------------------------------------------------------------------
// The stages, exposed for tests and for readers who want to watch one at work.

// Pre-tokenizer: the end (byte offset) of the piece that starts at byte `pos` of `text` (valid UTF-8,
// pos < text.size()). The piece is what Qwen's split regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// matches there. Its alternatives cover every character, so the pieces tile the text.
size_t pretokenize_next(std::string_view text, size_t pos);

// All pieces of `text` (valid UTF-8), in order.
std::vector<std::string_view> pretokenize(std::string_view text);

// GPT-2's byte-to-unicode map: the code point that stands for byte b in vocab and merges. Printable
// Latin-1 bytes stand for themselves; the other 68 get U+0100 onwards, in byte order.
uint32_t byte_to_unicode(uint8_t b);
// The inverse: the byte that code point cp stands for, or -1 when cp stands for none.
int unicode_to_byte(uint32_t cp);

// Bytes -> valid UTF-8, replacing each maximal ill-formed subsequence by one U+FFFD, exactly as Rust's
// String::from_utf8_lossy (and so Hugging Face's decoder) does.
std::string utf8_lossy(std::string_view bytes);

// ---------------------------------------------------------------------------------------------------

// Loaded once, then read-only: encode() and decode() may be called from several threads at once (the
// word cache inside is locked).
class Tokenizer {
 public:
  // Reads dir/tokenizer.json and, when present, dir/tokenizer_config.json (for eos_token). Throws Error
  // naming the file and field on anything malformed or unsupported.
  static Tokenizer load(const std::string& dir);
  // The same from the files' text; `source` names tokenizer.json in messages. `config_json` may be "".
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view source,
                             std::string_view config_json = {}, std::string_view config_source = {});

  // Text (UTF-8) -> token ids. Throws Error naming the byte offset of the first invalid UTF-8 byte.
  std::vector<int32_t> encode(std::string_view text) const;
  // Token ids -> text, special tokens kept, invalid UTF-8 replaced by U+FFFD. Throws Error on an id that
  // is not in the vocabulary, unless skip_unknown: then it decodes to nothing, as in Hugging Face's
  // decode (the engine's case: Qwen3's embedding has 151,936 rows, its tokenizer 151,669 ids).
  std::string decode(const std::vector<int32_t>& ids, bool skip_unknown = false) const;

  // Max id + 1, added tokens included (151669 for Qwen3).
  int32_t vocab_size() const { return int32_t(tokens_.size()); }
  // The id of a token spelt as in tokenizer.json ("Ġworld", "<|im_end|>").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token of an id, spelt as in tokenizer.json. Throws Error on an unknown id.
  const std::string& id_to_token(int32_t id) const;
  // The raw bytes id decodes to (a token may be part of a UTF-8 character): its characters mapped back
  // through the byte map, or, for a token with a character outside the map, its own UTF-8 (so added
  // tokens such as "<|im_end|>" decode to themselves). Throws on an unknown id.
  const std::string& token_bytes(int32_t id) const;
  // True for tokens listed in added_tokens with "special": true (<|im_start|>, <|endoftext|>, ...).
  bool is_special(int32_t id) const;
  // tokenizer_config.json's eos_token (<|im_end|> for Qwen3), if there was one.
  std::optional<int32_t> eos_token_id() const { return eos_token_id_; }

 private:
  // One merge rule "left right" -> merged token, with its priority (lower rank merges first).
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  struct AddedToken {
    std::string content;
    int32_t id;
  };
  struct WordCache;  // piece -> ids, filled by const encode() calls under a lock (tokenizer.cpp); copies
                     // of a Tokenizer share it, as they share the vocabulary it was computed from

  Tokenizer();
  void load_model(const Json& model, std::string_view source);
  void load_added_tokens(const Json& added, std::string_view source);
  void check_pipeline(const Json& root, std::string_view source);  // sets nfc_
  void set_token(int32_t id, std::string token, bool added);

  void encode_segment(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  void bpe(std::string_view piece, std::vector<int32_t>& ids) const;
  // The first added token at or after `pos` (leftmost, then longest): its start, and its index.
  size_t find_added_token(std::string_view text, size_t pos, size_t* which) const;

  static uint64_t pair_key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }

  std::vector<std::string> tokens_;       // [vocab_size] token as spelt in tokenizer.json ("" = no token)
  std::vector<std::string> bytes_;        // [vocab_size] what each token decodes to
  enum class Kind : uint8_t { kNone, kVocab, kAdded, kSpecial };  // kSpecial: added, "special": true
  std::vector<Kind> kind_;                // [vocab_size] where each id comes from (ids may have gaps)
  std::unordered_map<std::string, int32_t> token_ids_;  // token spelling -> id
  std::unordered_map<uint64_t, Merge> merges_;          // pair_key(left id, right id) -> merge
  int32_t byte_ids_[256];                               // id of the one-byte token of each byte
  std::vector<AddedToken> added_;                       // sorted longest first
  bool added_first_byte_[256] = {};                     // can an added token start with this byte?
  std::optional<int32_t> eos_token_id_;
  bool nfc_ = true;                        // the normalizer: NFC, or none (tokenizer.json's "normalizer": null)
  std::shared_ptr<WordCache> cache_;
};

// Incremental detokenization for streaming output: feed ids one at a time, get back the text they
// complete. A UTF-8 character split across tokens (common for CJK and emoji) is held back until its last
// byte arrives; bytes that can never become a valid character come out as U+FFFD, as in decode(). So
// the concatenation of every push() and the final finish() equals decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  // The text completed by this id (maybe ""). Throws Error on an unknown id.
  std::string push(int32_t id);
  // The end of the stream: held-back bytes of an unfinished character, as U+FFFD.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes of an unfinished UTF-8 character (at most 3)
};

}  // namespace nanovllm
