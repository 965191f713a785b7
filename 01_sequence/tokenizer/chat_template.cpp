// chat_template.cpp: Qwen3's chat template, statement by statement. The Jinja source is in
// tokenizer_config.json; each block below says which part of it it renders.
#include "01_sequence/tokenizer/chat_template.h"

#include "01_sequence/base/common.h"
#include "01_sequence/base/files.h"
#include "01_sequence/base/json.h"

namespace nanovllm {

namespace {

// Python's str.lstrip('\n'), str.rstrip('\n') and str.strip('\n'): only '\n' is stripped.
std::string lstrip_newlines(const std::string& s) {
  size_t start = s.find_first_not_of('\n');
  return start == std::string::npos ? "" : s.substr(start);
}
std::string rstrip_newlines(const std::string& s) {
  size_t end = s.find_last_not_of('\n');
  return end == std::string::npos ? "" : s.substr(0, end + 1);
}
std::string strip_newlines(const std::string& s) { return lstrip_newlines(rstrip_newlines(s)); }

// Python's s.split(sep)[-1] and s.split(sep)[0].
std::string after_last(const std::string& s, const std::string& sep) {
  size_t at = s.rfind(sep);
  return at == std::string::npos ? s : s.substr(at + sep.size());
}
std::string before_first(const std::string& s, const std::string& sep) { return s.substr(0, s.find(sep)); }

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                bool enable_thinking) {
  if (messages.empty()) fail("messages: empty (a conversation needs at least one message)");
  for (size_t i = 0; i < messages.size(); i++) {
    const std::string& role = messages[i].role;
    if (role == "tool") fail("messages[", i, "].role: 'tool' messages are not supported");
    if (role != "system" && role != "user" && role != "assistant")
      fail("messages[", i, "].role: expected 'system', 'user' or 'assistant', got '", role, "'");
  }
  std::string out;

  // {%- if messages[0].role == 'system' %} ... {%- endif %}   (the template's no-tools branch)
  if (messages[0].role == "system") out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";

  // ns.last_query_index: the last user message that is a real query, not a wrapped tool response.
  // Assistant turns after it form the answer in progress and keep their reasoning. When there is no
  // such message it stays at the last index, so that no turn keeps its reasoning.
  size_t last_query_index = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& content = messages[i].content;
    if (messages[i].role == "user" &&
        !(starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>"))) {
      last_query_index = i;
      break;
    }
  }

  // {%- for message in messages %}
  for (size_t i = 0; i < messages.size(); i++) {
    const ChatMessage& message = messages[i];
    bool last = i + 1 == messages.size();
    if (message.role == "user" || (message.role == "system" && i != 0)) {
      out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
      continue;
    }
    if (message.role != "assistant") continue;  // the first system message, rendered above

    // Split the reasoning from the answer: reasoning_content if given, else an inline
    // "<think>reasoning</think>answer" (text after the last </think> is the answer).
    std::string content = message.content;
    std::string reasoning;
    if (message.reasoning_content) {
      reasoning = *message.reasoning_content;
    } else if (content.find("</think>") != std::string::npos) {
      content = lstrip_newlines(after_last(message.content, "</think>"));
      reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(message.content, "</think>")), "<think>"));
    }

    if (i > last_query_index && (last || !reasoning.empty())) {
      out += "<|im_start|>assistant\n<think>\n" + strip_newlines(reasoning) + "\n</think>\n\n" +
             lstrip_newlines(content);
    } else {
      out += "<|im_start|>assistant\n" + content;
    }
    out += "<|im_end|>\n";
  }

  // {%- if add_generation_prompt %}
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::vector<ChatMessage> parse_chat_messages(const Json& messages) {
  std::vector<ChatMessage> result;
  std::string where = "messages";
  try {
    for (size_t i = 0; i < messages.as_array().size(); i++) {  // "messages: expected an array, got ..."
      const Json& m = messages.as_array()[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      where = at;
      if (!m.is_object()) fail("expected an object with 'role' and 'content', got ", Json::type_name(m.type()));
      check_fields(m, {"role", "content", "reasoning_content", "tool_calls"}, "a message");
      ChatMessage message;
      const Json& role = m.at("role");  // "messages[i]: missing field 'role'"
      const Json& content = m.at("content");
      where = at + ".role";
      message.role = role.as_string();
      where = at + ".content";
      message.content = content.as_string();
      where = at + ".reasoning_content";
      if (const Json* r = m.find("reasoning_content"); r && !r->is_null()) message.reasoning_content = r->as_string();
      where = at + ".tool_calls";
      // An array (a number or a string is a mistake, not "none"), and empty: tool calls are not supported.
      if (const Json* t = m.find("tool_calls"); t && !t->is_null() && !t->as_array().empty())
        fail("tool calls are not supported");
      result.push_back(std::move(message));
    }
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return result;
}

ChatRequest parse_chat_request(const Json& request) {
  if (!request.is_object()) fail("expected a request object {\"messages\": [...]}, got ", Json::type_name(request.type()));
  check_fields(request, {"messages", "add_generation_prompt", "enable_thinking", "tools"}, "a chat-template request");
  ChatRequest result;
  const Json* messages = request.find("messages");
  if (!messages) fail("messages: missing field 'messages'");
  result.messages = parse_chat_messages(*messages);
  std::string where;
  try {
    where = "tools";
    if (const Json* t = request.find("tools"); t && !t->is_null() && !t->as_array().empty()) fail("tools are not supported");
    where = "add_generation_prompt";
    if (const Json* v = request.find("add_generation_prompt"); v && !v->is_null()) result.add_generation_prompt = v->as_bool();
    where = "enable_thinking";
    if (const Json* v = request.find("enable_thinking"); v && !v->is_null()) result.enable_thinking = v->as_bool();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return result;
}

void check_chat_template(const std::string& dir) {
  std::string source = dir + "/chat_template.jinja", text;
  if (optional_file_exists(source)) {  // transformers 5 saves the template apart, and reads it first
    text = read_file(source, kConfigFile);
  } else {
    source = dir + "/tokenizer_config.json";
    if (!optional_file_exists(source))
      fail(dir, ": no chat template (neither chat_template.jinja nor tokenizer_config.json); --chat and "
                "chat-template render Qwen3's");
    const Json config = Json::parse(read_file(source, kConfigFile), source);
    if (!config.is_object()) fail(source, ": expected a JSON object");  // as the tokenizer says it
    const Json* found = config.find("chat_template");
    if (!found || found->is_null()) fail(source, ": no chat_template (--chat and chat-template render Qwen3's)");
    bool named_default = false;
    if (found->is_array())  // named templates: [{"name": "default", "template": "..."}, ...]
      for (const Json& named : found->as_array())
        if (named.is_object() && named.find("name") && named.at("name").is_string() &&
            named.at("name").as_string() == "default" && named.find("template") && named.at("template").is_string())
          text = named.at("template").as_string(), named_default = true;
    if (found->is_string()) text = found->as_string();
    else if (!named_default)
      fail(source, ": chat_template: expected a string, or a list with a \"default\" entry, got ", found->dump());
  }
  if (text.find("<|im_start|>") == std::string::npos)
    fail(source, ": the chat template is not in Qwen's ChatML layout (no <|im_start|>); only Qwen3's is implemented");
  // ChatML alone is not enough: Qwen2.5's template, for one, adds a default system prompt. What
  // apply_chat_template implements is Qwen3's hybrid-thinking template, which splits an answer's reasoning
  // at </think> and reads enable_thinking.
  for (const char* mark : {"</think>", "enable_thinking"})
    if (text.find(mark) == std::string::npos)
      fail(source, ": the chat template is ChatML but not Qwen3's (no ", mark,
           "); only Qwen3's hybrid-thinking template is implemented");
}

}  // namespace nanovllm
