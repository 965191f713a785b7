// Tests for Qwen3's chat template. The expected prompts follow the Jinja template in
// tokenizer_config.json statement by statement (and were checked by rendering it with Jinja2); the
// golden file tests/data/golden/chat_public.json covers the simple cases through transformers itself.
#include "01_sequence/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

#include "01_sequence/base/common.h"
#include "01_sequence/base/files.h"
#include "01_sequence/base/json.h"

using namespace nanovllm;

namespace {

std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = false,
                   bool enable_thinking = true) {
  return apply_chat_template(messages, add_generation_prompt, enable_thinking);
}

using test::error_of;

}  // namespace

TEST(Ch01_ChatTemplate, GenerationPromptAndThinkingSwitch) {
  std::vector<ChatMessage> chat = {{"user", "hi"}};
  EXPECT_EQ(render(chat), "<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(render(chat, true), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(chat, true, false),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(render(chat, false, false), "<|im_start|>user\nhi<|im_end|>\n");  // only with the prompt
}

TEST(Ch01_ChatTemplate, SystemMessages) {
  // The first system message goes first; a later one is rendered where it stands.
  EXPECT_EQ(render({{"system", "S"}, {"user", "Q"}, {"system", "S2"}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>system\nS2<|im_end|>\n");
}

TEST(Ch01_ChatTemplate, HistoryDropsReasoningBeforeTheLastQuery) {
  // The assistant turn before the last user message loses its <think> block.
  EXPECT_EQ(render({{"user", "Q1"}, {"assistant", "<think>\nR1\n</think>\n\nA1"}, {"user", "Q2"}}, true),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Ch01_ChatTemplate, TurnsAfterTheLastQueryKeepReasoning) {
  // The last message is an assistant turn after the last query: its reasoning is kept (re-wrapped with
  // exactly one newline inside each tag), and even an empty one gets the <think> block.
  EXPECT_EQ(render({{"user", "Q"}, {"assistant", "<think>\n\nR\n\n</think>\n\nA\n"}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA\n<|im_end|>\n");
  EXPECT_EQ(render({{"user", "Q"}, {"assistant", "A"}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
  // reasoning_content given apart takes precedence over the inline form.
  ChatMessage answer{"assistant", "A", std::string("\nR\n")};
  EXPECT_EQ(render({{"user", "Q"}, answer}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n");
}

TEST(Ch01_ChatTemplate, ToolResponsesAreNotQueries) {
  // A user message that is a wrapped tool response does not move the last query: both assistant turns
  // after the real query belong to the current answer. A middle turn keeps its reasoning only if it
  // has some.
  std::vector<ChatMessage> chat = {{"user", "Q"},
                                   {"assistant", "<think>r1</think>a1"},
                                   {"user", "<tool_response>x</tool_response>"},
                                   {"assistant", "a2"},
                                   {"user", "<tool_response>y</tool_response>"},
                                   {"assistant", "<think>r3</think>a3"}};
  EXPECT_EQ(render(chat),
            "<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n"
            "<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n"
            "<|im_start|>assistant\na2<|im_end|>\n"
            "<|im_start|>user\n<tool_response>y</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr3\n</think>\n\na3<|im_end|>\n");
}

TEST(Ch01_ChatTemplate, InlineReasoningSplitsAtTheOuterTags) {
  // Answer: after the last </think>. Reasoning: before the first </think>, after the last <think>.
  EXPECT_EQ(render({{"user", "Q"}, {"assistant", "<think>a<think>b</think>c</think>\n\nd"}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nb\n</think>\n\nd<|im_end|>\n");
  // Without any query, nothing is "after the last query": the turn is shown as its answer alone.
  EXPECT_EQ(render({{"system", "S"}, {"assistant", "<think>r</think>a"}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");
}

TEST(Ch01_ChatTemplate, OnlyAMessageWrappedWholeInToolResponseTagsIsNotAQuery) {
  // The template skips a user message as the last query only when it starts with <tool_response> and ends
  // with </tool_response>; one tag alone, or the opening tag alone (shorter than the closing one), is a
  // real query, and the assistant turn before it loses its reasoning. Expected prompts rendered with Jinja2.
  for (const std::string query : {"<tool_response>x", "x</tool_response>", "<tool_response>"}) {
    SCOPED_TRACE(query);
    EXPECT_EQ(render({{"user", "Q"}, {"assistant", "<think>r1</think>a1"}, {"user", query}}),
              "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
              "<|im_start|>user\n" + query + "<|im_end|>\n");
  }
}

TEST(Ch01_ChatTemplate, AnAnswerOfNewlinesAloneIsEmpty) {
  // Python's lstrip('\n') of a string of newlines is "": an answer of only newlines after </think> renders
  // as nothing. Expected prompt rendered with Jinja2.
  EXPECT_EQ(render({{"user", "Q"}, {"assistant", "<think>r</think>\n\n"}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n<|im_end|>\n");
}

TEST(Ch01_ChatTemplate, ReasoningContentLeavesTheAnswerUnsplit) {
  // With reasoning_content given, the template does not look for </think> in the content: an inline block
  // stays in the answer as text. The answer still loses its leading newlines when the reasoning is shown.
  // Expected prompts rendered with Jinja2.
  EXPECT_EQ(render({{"user", "Q"}, {"assistant", "<think>x</think>A", std::string("R")}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\n<think>x</think>A<|im_end|>\n");
  EXPECT_EQ(render({{"user", "Q"}, {"assistant", "\n\nA", std::string("R")}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n");
}

TEST(Ch01_ChatTemplate, ParsesRequests) {
  ChatRequest r = parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"hi"}]})", "t"));
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "hi");
  EXPECT_FALSE(r.add_generation_prompt);  // transformers' defaults
  EXPECT_TRUE(r.enable_thinking);
  r = parse_chat_request(Json::parse(
      R"({"messages":[{"role":"assistant","content":"a","reasoning_content":"r"}],"add_generation_prompt":true,
          "enable_thinking":false,"tools":[]})", "t"));
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(r.enable_thinking);
  EXPECT_EQ(r.messages[0].reasoning_content, "r");
  // A null reasoning_content is none given (the template's "is not none"): the inline form is read instead.
  r = parse_chat_request(Json::parse(R"({"messages":[{"role":"assistant","content":"<think>r</think>a","reasoning_content":null}]})", "t"));
  EXPECT_FALSE(r.messages[0].reasoning_content.has_value());
}

TEST(Ch01_ChatTemplate, Errors) {
  auto parse_error = [](const char* json) {
    return error_of([&] { parse_chat_request(Json::parse(json, "t")); });
  };
  EXPECT_NE(parse_error("[]").find("expected a request object"), std::string::npos);
  EXPECT_NE(parse_error("{}").find("messages: missing field 'messages'"), std::string::npos);
  EXPECT_NE(parse_error(R"({"messages":[{"role":"user"}]})").find("messages[0]: missing field 'content'"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})")
                .find("messages[0].content: expected a string, got an array"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"messages":[],"add_generation_prompt":"yes"})")
                .find("add_generation_prompt: expected a boolean"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"messages":[],"tools":[{"name":"f"}]})").find("tools: tools are not supported"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"messages":[{"role":"assistant","content":"","tool_calls":[{}]}]})")
                .find("messages[0].tool_calls"),
            std::string::npos);
  // Not an array is a mistake, not "no tools" (5 and "x" were taken as empty).
  EXPECT_NE(parse_error(R"({"messages":[],"tools":5})").find("tools: expected an array, got a number"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"messages":[{"role":"user","content":"","tool_calls":"x"}]})")
                .find("messages[0].tool_calls: expected an array, got a string"),
            std::string::npos);
  EXPECT_NO_THROW(parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"","tool_calls":null}],
                                                     "tools":[],"enable_thinking":null})", "t")));
  // A misspelt or repeated field would change the prompt without a word: refused, at both levels.
  EXPECT_EQ(parse_error(R"({"messages":[],"enable_thinkin":false})"),
            "unknown field \"enable_thinkin\" (a chat-template request has messages, add_generation_prompt, "
            "enable_thinking, tools)");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"assistant","content":"a","reasoning_contnet":"r"}]})"),
            "messages[0]: unknown field \"reasoning_contnet\" (a message has role, content, reasoning_content, "
            "tool_calls)");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"user","content":"x","role":"system"}]})"),
            "messages[0]: field \"role\" given twice");
  EXPECT_EQ(parse_error(R"({"messages":[],"add_generation_prompt":true,"add_generation_prompt":false})"),
            "field \"add_generation_prompt\" given twice");
  EXPECT_EQ(parse_error(R"({"messages":{"role":"user"}})"), "messages: expected an array, got an object");
  EXPECT_NE(error_of([] { render({}); }).find("messages: empty"), std::string::npos);
  EXPECT_NE(error_of([] { render({{"user", "Q"}, {"tool", "42"}}); }).find("messages[1].role: 'tool'"),
            std::string::npos);
  EXPECT_NE(error_of([] { render({{"developer", "x"}}); }).find("messages[0].role: expected 'system', 'user'"),
            std::string::npos);
}

TEST(Ch01_ChatTemplate, ATokenizerMustHoldQwensChatMlLayout) {
  // Qwen3's template was rendered whatever the tokenizer folder held, or without any template; then for any
  // template with <|im_start|> in it (until 2026-12-05). Now it must also have what Qwen3's hybrid template
  // reads and writes of the thinking, </think> and enable_thinking.
  test::TempDir dir;
  const std::string qwen3_like = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}{# </think> enable_thinking #}";
  auto error_with = [&](const std::string& config) {
    write_file(dir / "tokenizer_config.json", config);
    return test::error_of([&] { check_chat_template(dir.path()); });
  };
  const std::string config_path = dir / "tokenizer_config.json";
  auto config_with = [](const std::string& chat_template) {
    Json config = Json::object();
    config.set("chat_template", chat_template);
    return config.dump();
  };
  EXPECT_EQ(error_with(config_with(qwen3_like)), "");
  EXPECT_EQ(error_with(R"({"chat_template": [{"name": "tool_use", "template": "x"},
                                             {"name": "default", "template": "<|im_start|></think>enable_thinking"}]})"), "");
  // ChatML, but not Qwen3's: Qwen2.5's has no </think>; a template without the switch is not the hybrid one.
  EXPECT_EQ(error_with(config_with("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}")),
            config_path + ": the chat template is ChatML but not Qwen3's (no </think>); only Qwen3's hybrid-thinking "
                          "template is implemented");
  EXPECT_EQ(error_with(config_with("<|im_start|>{% if '</think>' in content %}{% endif %}")),
            config_path + ": the chat template is ChatML but not Qwen3's (no enable_thinking); only Qwen3's "
                          "hybrid-thinking template is implemented");
  EXPECT_EQ(error_with("{}"), config_path + ": no chat_template (--chat and chat-template render Qwen3's)");
  EXPECT_EQ(error_with("[]"), config_path + ": expected a JSON object");  // it said "no chat_template"
  EXPECT_EQ(error_with(R"({"chat_template": "{% for m in messages %}[INST] {{ m.content }}{% endfor %}"})"),
            config_path + ": the chat template is not in Qwen's ChatML layout (no <|im_start|>); only Qwen3's is "
                          "implemented");
  EXPECT_EQ(error_with(R"({"chat_template": ""})"),  // a string, but not ChatML
            config_path + ": the chat template is not in Qwen's ChatML layout (no <|im_start|>); only Qwen3's is "
                          "implemented");
  EXPECT_EQ(error_with(R"({"chat_template": [{"name": "tool_use", "template": "<|im_start|>"}]})"),
            config_path + ": chat_template: expected a string, or a list with a \"default\" entry, got "
                          "[{\"name\":\"tool_use\",\"template\":\"<|im_start|>\"}]");
  EXPECT_EQ(error_with(R"({"chat_template": 5})"),
            config_path + ": chat_template: expected a string, or a list with a \"default\" entry, got 5");
  // transformers 5 saves the template as chat_template.jinja, which it reads first.
  write_file(dir / "chat_template.jinja", qwen3_like);
  EXPECT_EQ(error_with("{}"), "");
  write_file(dir / "chat_template.jinja", "[INST]");
  EXPECT_EQ(error_with("{}"), dir / "chat_template.jinja" +
                                  ": the chat template is not in Qwen's ChatML layout (no <|im_start|>); only "
                                  "Qwen3's is implemented");
  std::remove((dir / "chat_template.jinja").c_str());
  std::remove(config_path.c_str());
  EXPECT_EQ(test::error_of([&] { check_chat_template(dir.path()); }),
            dir.path() + ": no chat template (neither chat_template.jinja nor tokenizer_config.json); --chat and "
                         "chat-template render Qwen3's");
  EXPECT_EQ(test::error_of([&] { check_chat_template(data_dir() + "/qwen3-tokenizer"); }), "");  // the real one
}

