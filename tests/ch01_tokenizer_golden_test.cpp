// Golden tests for the tokenizer and the chat template: our output must equal, id for id and byte for
// byte, what Hugging Face tokenizers / transformers produced on the same Qwen3 tokenizer
// (tests/data/golden/README.md says how the files were made).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "01_sequence/tokenizer/chat_template.h"
#include "01_sequence/base/common.h"
#include "01_sequence/base/json.h"
#include "01_sequence/tokenizer/tokenizer.h"

using namespace nanovllm;

namespace {

Json read_golden(const std::string& name) {
  std::string path = "tests/data/golden/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) in.open("../" + path, std::ios::binary);  // when run from build/
  EXPECT_TRUE(in.good()) << "cannot open " << path << " (run from the repository root)";
  std::ostringstream text;
  text << in.rdbuf();
  return Json::parse(text.str(), path);
}

const Tokenizer& qwen3() {
  static const Tokenizer tokenizer = Tokenizer::load(data_dir() + "/qwen3-tokenizer");
  return tokenizer;
}

std::vector<int32_t> ids_of(const Json& array) {
  std::vector<int32_t> ids;
  for (const Json& id : array.as_array()) ids.push_back(int32_t(id.as_int64()));
  return ids;
}

}  // namespace

TEST(Ch01_TokenizerGolden, EncodesAndDecodesLikeHuggingFace) {
  Json cases = read_golden("tokenizer_public.json");
  ASSERT_GE(cases.size(), 90u);
  for (const Json& c : cases.as_array()) {
    const std::string& text = c.at("text").as_string();
    std::vector<int32_t> expected = ids_of(c.at("ids"));
    EXPECT_EQ(qwen3().encode(text), expected) << "text: " << Json(text).dump();
    EXPECT_EQ(qwen3().decode(expected), c.at("decoded").as_string()) << "text: " << Json(text).dump();
  }
}

TEST(Ch01_TokenizerGolden, VocabularyShape) {
  EXPECT_EQ(qwen3().vocab_size(), 151669);  // 151643 BPE tokens + 26 added tokens
  EXPECT_EQ(qwen3().token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(qwen3().token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(qwen3().eos_token_id(), 151645);  // tokenizer_config.json: eos_token <|im_end|>
  EXPECT_EQ(qwen3().id_to_token(151667), "<think>");
}

TEST(Ch01_ChatTemplateGolden, RendersAndEncodesLikeTransformers) {
  Json cases = read_golden("chat_public.json");
  ASSERT_GE(cases.size(), 4u);
  for (const Json& c : cases.as_array()) {
    Json fields = Json::object();  // the case's request, as the CLI reads it (its "text" and "ids" are the answer)
    for (const char* name : {"messages", "add_generation_prompt", "enable_thinking"}) fields.set(name, c.at(name));
    ChatRequest request = parse_chat_request(fields);
    std::string text = apply_chat_template(request.messages, request.add_generation_prompt, request.enable_thinking);
    EXPECT_EQ(text, c.at("text").as_string());
    EXPECT_EQ(qwen3().encode(text), ids_of(c.at("ids"))) << "text: " << Json(text).dump();
  }
}
