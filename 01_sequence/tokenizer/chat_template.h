// chat_template.h: Qwen3's chat template, rendered by hand.
//
// A chat model is trained on conversations laid out with control tokens; the layout is a Jinja template
// in tokenizer_config.json ("chat_template"), which transformers' apply_chat_template() renders. Qwen3's
// wraps each message as
//     <|im_start|>{role}\n{content}<|im_end|>\n
// and adds three twists, all reproduced here:
//   - add_generation_prompt appends "<|im_start|>assistant\n", the start of the reply to generate;
//     with enable_thinking = false it also appends an empty thought, "<think>\n\n</think>\n\n", which
//     tells the model to answer without reasoning;
//   - an assistant message may carry its reasoning, either in reasoning_content or inline as
//     "<think>...</think>answer". Reasoning is kept only for assistant turns after the last user query
//     (the turns of the current answer); older turns are shown with their answer alone;
//   - a first system message goes first; a later one is rendered in place like any other message.
// Tools (the template's `tools`, tool_calls and the "tool" role) are not supported: they are refused.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace nanovllm {

class Json;

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;  // the text, which may itself contain <think>...</think> (assistant)
  std::optional<std::string> reasoning_content = std::nullopt;  // assistant: its reasoning, given apart
};

// The prompt text (not yet tokenized) for `messages`, exactly as transformers renders Qwen3's template.
// Throws Error for an empty conversation or a role other than system/user/assistant.
std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                bool enable_thinking);

// One chat-template request, as the command line reads it:
//   {"messages": [{"role": "...", "content": "..."}, ...], "add_generation_prompt": bool,
//    "enable_thinking": bool}
// The flags are optional (defaults as in transformers: false and true; null means the default), and so is
// "tools", which must be empty: tools are not supported. A message has "role", "content", and optionally
// "reasoning_content" and an empty "tool_calls". Any other field, or one given twice, is refused, since a
// misspelt one ("enable_thinkin", "reasoning_contnet") would otherwise change the prompt without a word.
// Errors name the field ("messages[2].content: expected a string").
struct ChatRequest {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = false;
  bool enable_thinking = true;
};
ChatRequest parse_chat_request(const Json& request);
// The "messages" array alone, as parse_chat_request reads it (errors named "messages[i]...", or "messages: ...").
std::vector<ChatMessage> parse_chat_messages(const Json& messages);

// For --chat and chat-template, which render Qwen3's template: throws Error naming the file when the
// tokenizer folder `dir` has no chat template (chat_template.jinja, or else tokenizer_config.json's
// "chat_template", a string or a list with a "default" entry: where transformers looks), or one that is
// not Qwen3's hybrid-thinking template, since rendering Qwen3's would then give the model another prompt
// than transformers would: not ChatML (no <|im_start|>), or ChatML without what Qwen3's reads and writes
// of the thinking (no </think>, as Qwen2.5's, or no enable_thinking, the switch Qwen3's hybrid models
// have). A template that has all three is taken for Qwen3's, and rendered as it.
void check_chat_template(const std::string& dir);

}  // namespace nanovllm
