// `generate --requests FILE`: nano-vllm's generate(prompts, sampling_params) with a SamplingParams of its own for
// each prompt, one JSON object a line. Each request must come out as it would alone with the same settings
// as flags (greedy), independent of its place in the file (a seed of its own), rendered as Hugging Face renders
// Qwen3's chat template (messages), and every mistake must be one error line naming the line.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "01_sequence/base/json.h"
#include "tests/test_util.h"

using namespace nanovllm;
using test::run_nanovllm;

namespace {

const std::string kCpuA = " --device cpu --model " + test::data_path("golden/tiny-qwen3-a");

// The --json lines of a run, each parsed.
std::vector<Json> json_lines(const std::string& out) {
  std::vector<Json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(Json::parse(line, "stdout"));
  return lines;
}

std::vector<int64_t> token_ids(const Json& line) {
  std::vector<int64_t> ids;
  for (const Json& id : line.at("token_ids").as_array()) ids.push_back(id.as_int64());
  return ids;
}

}  // namespace

TEST(E2E_Requests, EachRequestTakesItsOwnSamplingParams) {
  // Golden model a's first prompts as ids. The flags give --max-tokens 4 --temperature 0 to any field left out.
  Json golden = test::read_json(test::data_path("golden/tiny-qwen3-a.golden.json"));
  std::vector<std::string> prompts;
  for (const Json& c : golden.at("cases").as_array()) prompts.push_back(c.at("prompt_ids").dump());
  ASSERT_GE(prompts.size(), 3u);
  const std::string greedy5 = "{\"prompt_token_ids\": " + prompts[0] + ", \"max_tokens\": 5}";
  const std::string sampled = "{\"prompt_token_ids\": " + prompts[1] + ", \"temperature\": 1.0, \"seed\": 7, \"max_tokens\": 8}";
  const std::string defaults = "{\"prompt_token_ids\": " + prompts[2] + "}";
  const std::string flags = "generate" + kCpuA + " --max-tokens 4 --temperature 0 --ignore-eos --json --requests -";
  auto r = run_nanovllm(flags, greedy5 + "\n\n" + sampled + "\n" + defaults + "\n");  // a blank line is no request
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<Json> out = json_lines(r.out);
  ASSERT_EQ(out.size(), 3u) << r.out;
  for (size_t i = 0; i < out.size(); i++) EXPECT_EQ(out[i].at("index").as_int64(), int64_t(i));

  // Greedy requests: each as the same request alone, given by flags.
  auto alone = [&](const std::string& prompt, int max_tokens) {
    std::string ids = prompt.substr(1, prompt.size() - 2);  // "[1,2,3]" -> "1,2,3"
    auto a = run_nanovllm("generate" + kCpuA + " --temperature 0 --ignore-eos --json --max-tokens " +
                          std::to_string(max_tokens) + " --prompt-ids " + ids);
    EXPECT_EQ(a.exit_code, 0) << a.err;
    return token_ids(json_lines(a.out).at(0));
  };
  EXPECT_EQ(token_ids(out[0]), alone(prompts[0], 5));
  EXPECT_EQ(token_ids(out[2]), alone(prompts[2], 4));  // the flags' --max-tokens

  // The sampled request: 8 tokens drawn with its own seed, so the same wherever it stands in the file and
  // whatever the engine's --seed; another seed draws others.
  ASSERT_EQ(token_ids(out[1]).size(), 8u);
  auto moved = run_nanovllm(flags + " --seed 99", defaults + "\n" + greedy5 + "\n" + sampled + "\n");
  ASSERT_EQ(moved.exit_code, 0) << moved.err;
  EXPECT_EQ(token_ids(json_lines(moved.out).at(2)), token_ids(out[1]));
  std::string reseeded = sampled;
  reseeded.replace(reseeded.find("\"seed\": 7"), 9, "\"seed\": 8");
  auto other = run_nanovllm(flags, reseeded + "\n");
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_NE(token_ids(json_lines(other.out).at(0)), token_ids(out[1]));

  // A file on disk reads as stdin does, and its requests follow the flags' in command-line order.
  test::TempDir dir;
  const std::string path = dir.path() + "/requests.jsonl";
  std::ofstream(path) << greedy5 << "\n";
  auto mixed = run_nanovllm("generate" + kCpuA + " --max-tokens 4 --temperature 0 --ignore-eos --json --prompt-ids " +
                            prompts[2].substr(1, prompts[2].size() - 2) + " --requests " + path);
  ASSERT_EQ(mixed.exit_code, 0) << mixed.err;
  std::vector<Json> mixed_out = json_lines(mixed.out);
  ASSERT_EQ(mixed_out.size(), 2u);
  EXPECT_EQ(token_ids(mixed_out[0]), token_ids(out[2]));
  EXPECT_EQ(token_ids(mixed_out[1]), token_ids(out[0]));
}

// A request's integers are checked as written, before they become 32-bit ints: 2^32 + 1 would wrap to 1 (a valid
// max_tokens and token id) and 2^32 to 0 (top_k off). Each is refused, named with its field's range.
TEST(E2E_Requests, IntegersPastTheirRangeAreNamedNotWrapped) {
  const std::pair<std::string, std::string> cases[] = {
      {"{\"prompt_token_ids\": [1], \"max_tokens\": 4294967297}\n",
       "error: stdin line 1: max_tokens: expected an integer in [1, 2147483647], got 4294967297"},
      {"{\"prompt_token_ids\": [4294967297]}\n",
       "error: stdin line 1: prompt_token_ids[0]: expected an integer in [0, 2147483647], got 4294967297"},
      {"{\"prompt_token_ids\": [1], \"top_k\": 4294967296}\n",
       "error: stdin line 1: top_k: expected an integer in [0, 2147483647], got 4294967296"},
  };
  for (const auto& [input, error] : cases) {
    auto r = run_nanovllm("generate" + kCpuA + " --max-tokens 1 --requests -", input);
    EXPECT_EQ(r.exit_code, 1) << input;
    EXPECT_EQ(r.out, "") << input;
    EXPECT_EQ(test::last_error_line(r.err), error + "\n") << input << r.err;
  }
}

// The chat-template command renders each request as transformers renders Qwen3's template, with its own
// add_generation_prompt and enable_thinking: chat_public.json holds transformers' text for each case.
TEST(E2E_Requests, ChatTemplateCommandRendersAsTransformers) {
  Json cases = test::read_json(test::data_path("golden/chat_public.json"));
  std::string input;
  for (const Json& c : cases.as_array()) {
    Json line = Json::object();
    line.set("messages", c.at("messages"));
    line.set("add_generation_prompt", c.at("add_generation_prompt"));
    line.set("enable_thinking", c.at("enable_thinking"));
    input += line.dump() + "\n";
  }
  auto r = run_nanovllm("chat-template", input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<Json> out = json_lines(r.out);
  ASSERT_EQ(out.size(), cases.size());
  for (size_t i = 0; i < out.size(); i++) EXPECT_EQ(out[i].as_string(), cases.as_array()[i].at("text").as_string()) << i;
}

// A prompt for the chat template on a model folder without tokenizer.json is the missing tokenizer's mistake, named
// with its fix (generate.cpp checks the template only where a tokenizer.json is), as it is without --chat.
TEST(E2E_Requests, ChatOnAModelWithoutATokenizerNamesTheMissingTokenizer) {
  const std::string model = test::data_path("golden/tiny-qwen3-a");
  auto chat = run_nanovllm("generate" + kCpuA + " --chat --prompt hi");
  EXPECT_EQ(chat.exit_code, 1);
  EXPECT_EQ(chat.err, "error: --prompt TEXT needs a tokenizer: " + model + " has no tokenizer.json (give --tokenizer DIR)\n");
  auto messages = run_nanovllm("generate" + kCpuA + " --requests -", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
  EXPECT_EQ(messages.exit_code, 1);
  EXPECT_EQ(messages.err, "error: stdin line 1: a text prompt needs a tokenizer: " + model +
                              " has no tokenizer.json (give --tokenizer DIR)\n");
}

// --no-thinking reaches a --requests line's "prompt" under --chat as it reaches --prompt (generate.cpp): one user turn
// with the template's empty thought, the ids transformers gives for that turn with enable_thinking false.
TEST(E2E_Requests, NoThinkingReachesARequestsPromptUnderChat) {
  Json cases = test::read_json(test::data_path("golden/chat_public.json"));
  const Json& unthinking = cases.as_array()[1];
  ASSERT_FALSE(unthinking.at("enable_thinking").as_bool());
  ASSERT_TRUE(unthinking.at("add_generation_prompt").as_bool());
  ASSERT_EQ(unthinking.at("messages").size(), 1u);
  const std::string content = unthinking.at("messages").as_array()[0].at("content").dump();
  auto r = run_nanovllm("generate --device cpu --max-tokens 1 --json --chat --no-thinking --requests -",
                        "{\"prompt\": " + content + "}\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json_lines(r.out).at(0).at("prompt_token_ids").dump(), unthinking.at("ids").dump());
}

// Blank lines separate requests (generate.cpp), in a file of CRLF lines too: "\r" alone is a blank line, not a request
// to parse. Two requests, in order.
TEST(E2E_Requests, CrlfBlankLinesSeparateRequests) {
  auto r = run_nanovllm("generate" + kCpuA + " --max-tokens 1 --json --requests -",
                        "{\"prompt_token_ids\": [1]}\r\n\r\n{\"prompt_token_ids\": [2, 3]}\r\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<Json> out = json_lines(r.out);
  ASSERT_EQ(out.size(), 2u) << r.out;
  EXPECT_EQ(out[0].at("prompt_token_ids").dump(), "[1]");
  EXPECT_EQ(out[1].at("prompt_token_ids").dump(), "[2,3]");
}

TEST(E2E_Requests, MessagesAreRenderedAsTransformersRendersQwen3sTemplate) {
  // chat_public.json: conversations rendered and tokenized by transformers. On the embedded default (the real
  // tokenizer), a request's prompt ids must be those, with or without thinking.
  Json cases = test::read_json(test::data_path("golden/chat_public.json"));
  std::string input;
  std::vector<Json> expected;
  for (const Json& c : cases.as_array()) {
    if (!c.at("add_generation_prompt").as_bool()) continue;  // a request always asks for the reply
    Json line = Json::object();
    line.set("messages", c.at("messages"));
    line.set("enable_thinking", c.at("enable_thinking"));
    input += line.dump() + "\n";
    expected.push_back(c.at("ids"));
  }
  ASSERT_GE(expected.size(), 2u);
  auto r = run_nanovllm("generate --device cpu --max-tokens 1 --json --requests -", input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<Json> out = json_lines(r.out);
  ASSERT_EQ(out.size(), expected.size());
  for (size_t i = 0; i < out.size(); i++) EXPECT_EQ(out[i].at("prompt_token_ids").dump(), expected[i].dump()) << i;

  // A text prompt under --chat is one user turn, thinking on, as --prompt is.
  Json first = cases.as_array()[0];
  ASSERT_TRUE(first.at("enable_thinking").as_bool());
  const std::string content = first.at("messages").as_array()[0].at("content").dump();
  auto chat = run_nanovllm("generate --device cpu --max-tokens 1 --json --chat --requests -",
                           "{\"prompt\": " + content + "}\n");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_EQ(json_lines(chat.out).at(0).at("prompt_token_ids").dump(), first.at("ids").dump());

  // --no-thinking: the same turn with the template's empty thought, for --prompt under --chat and for messages
  // without an enable_thinking of their own; a request's own enable_thinking wins.
  const Json& unthinking = cases.as_array()[1];
  ASSERT_FALSE(unthinking.at("enable_thinking").as_bool());
  ASSERT_EQ(unthinking.at("messages").dump(), first.at("messages").dump());
  auto flag = run_nanovllm("generate --device cpu --max-tokens 1 --json --chat --no-thinking --prompt " + content);
  ASSERT_EQ(flag.exit_code, 0) << flag.err;
  EXPECT_EQ(json_lines(flag.out).at(0).at("prompt_token_ids").dump(), unthinking.at("ids").dump());
  const std::string messages = "{\"messages\": " + first.at("messages").dump();
  auto both = run_nanovllm("generate --device cpu --max-tokens 1 --json --no-thinking --requests -",
                           messages + "}\n" + messages + ", \"enable_thinking\": true}\n");
  ASSERT_EQ(both.exit_code, 0) << both.err;
  ASSERT_EQ(json_lines(both.out).size(), 2u);
  EXPECT_EQ(json_lines(both.out)[0].at("prompt_token_ids").dump(), unthinking.at("ids").dump());
  EXPECT_EQ(json_lines(both.out)[1].at("prompt_token_ids").dump(), first.at("ids").dump());
  // Where no prompt goes through the template, the switch would change nothing: a usage error.
  auto alone = run_nanovllm("generate --device cpu --no-thinking --prompt hi");
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_TRUE(test::is_one_error_line(alone.err)) << alone.err;
  EXPECT_NE(alone.err.find("--no-thinking applies to prompts rendered by the chat template"), std::string::npos);
}

TEST(E2E_Requests, MistakesAreNamedByTheirLine) {
  struct Case {
    std::string input, error;
  };
  const std::vector<Case> cases = {
      {"{\"prompt_token_ids\": [1], \"max_token\": 3}\n",
       "error: stdin line 1: unknown field \"max_token\" (a request has prompt, prompt_token_ids, messages, "
       "enable_thinking, max_tokens, temperature, top_k, top_p, ignore_eos, seed)"},
      {"{\"prompt_token_ids\": [1]}\n\n{\"prompt_token_ids\": [1], \"temperature\": -1}\n",
       "error: stdin line 3: temperature: expected a number in [0, 1e+30], got -1"},
      {"{\"prompt_token_ids\": [1], \"top_p\": 0}\n", "error: stdin line 1: top_p: expected a number in (0, 1], got 0"},
      // The flags' ranges, on the number as written: not "inf", not 0, not rounded into the range.
      {"{\"prompt_token_ids\": [1], \"temperature\": 1e308}\n",
       "error: stdin line 1: temperature: expected a number in [0, 1e+30], got 1e+308"},
      {"{\"prompt_token_ids\": [1], \"temperature\": -1e-300}\n",
       "error: stdin line 1: temperature: expected a number in [0, 1e+30], got -1e-300"},
      {"{\"prompt_token_ids\": [1], \"top_p\": 1.00000001}\n",
       "error: stdin line 1: top_p: expected a number in (0, 1], got 1.00000001"},
      {"{\"prompt_token_ids\": [1], \"top_p\": 1e-320}\n",
       "error: stdin line 1: top_p: 1e-320 is 0 as a 32-bit float, outside (0, 1]"},
      {"{\"prompt_token_ids\": [1], \"max_tokens\": 0}\n",
       "error: stdin line 1: max_tokens: expected an integer in [1, 2147483647], got 0"},
      {"{\"prompt_token_ids\": [1], \"top_k\": \"5\"}\n",
       "error: stdin line 1: top_k: expected an integer in [0, 2147483647], got \"5\""},
      {"{\"prompt_token_ids\": [1], \"temperature\": \"hot\"}\n",
       "error: stdin line 1: temperature: expected a number in [0, 1e+30], got \"hot\""},
      {"{\"prompt_token_ids\": [1], \"ignore_eos\": 1}\n", "error: stdin line 1: ignore_eos: expected true or false, got 1"},
      {"{\"prompt_token_ids\": [1], \"seed\": -1}\n", "error: stdin line 1: seed: expected an integer in [0, 2^64), got -1"},
      {"{\"prompt_token_ids\": [1], \"seed\": 18446744073709551616}\n",
       "error: stdin line 1: seed: expected an integer in [0, 2^64), got 18446744073709551616"},
      {"{\"prompt_token_ids\": []}\n", "error: stdin line 1: prompt_token_ids: expected a non-empty array of token ids, got []"},
      {"{\"prompt_token_ids\": [1, -2]}\n",
       "error: stdin line 1: prompt_token_ids[1]: expected an integer in [0, 2147483647], got -2"},
      {"{\"prompt_token_ids\": [1], \"prompt\": \"a\"}\n",
       "error: stdin line 1: give exactly one of \"prompt\", \"prompt_token_ids\" and \"messages\", got 2"},
      {"{\"max_tokens\": 3}\n", "error: stdin line 1: give exactly one of \"prompt\", \"prompt_token_ids\" and \"messages\", got 0"},
      {"{\"prompt_token_ids\": [1], \"max_tokens\": 2, \"max_tokens\": 3}\n",
       "error: stdin line 1: field \"max_tokens\" given twice"},
      {"{\"prompt_token_ids\": [1], \"enable_thinking\": false}\n",
       "error: stdin line 1: \"enable_thinking\" applies to \"messages\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"reasoning_contnet\": \"r\"}]}\n",
       "error: stdin line 1: messages[0]: unknown field \"reasoning_contnet\" (a message has role, content, "
       "reasoning_content, tool_calls)"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"enable_thinking\": \"no\"}\n",
       "error: stdin line 1: enable_thinking: expected true or false, got \"no\""},
      {"[1, 2]\n", "error: stdin line 1: expected a request object {\"prompt\": ...}, got an array"},
      {"{\"prompt_token_ids\": [1],}\n", "error: stdin line 1, column 26: expected a string key in the object"},
      {"\n \n", "error: stdin: no requests (one JSON object a line, such as {\"prompt\": \"introduce yourself\"})"},
      // Found by the engine, after loading: named by the request's index and its line.
      {"{\"prompt_token_ids\": [1]}\n{\"prompt_token_ids\": [5000]}\n",
       "error: stdin line 2: request 1: token id 5000 is outside the vocabulary [0, 512)"},
      {"\n{\"prompt_token_ids\": [1, 2], \"max_tokens\": 4095}\n",
       "error: stdin line 2: request 0: prompt (2 tokens) + max_tokens (4095) exceeds max_model_len (4096, the "
       "model's max_position_embeddings)"},
      {"{\"prompt\": \"hi\"}\n", "error: stdin line 1: a text prompt needs a tokenizer: " +
                                      test::data_path("golden/tiny-qwen3-a") +
                                      " has no tokenizer.json (give --tokenizer DIR)"},
  };
  for (const Case& c : cases) {
    auto r = run_nanovllm("generate" + kCpuA + " --requests -", c.input);
    EXPECT_EQ(r.exit_code, 1) << c.input;
    EXPECT_EQ(r.out, "") << c.input;
    EXPECT_EQ(test::last_error_line(r.err), c.error + "\n") << c.input << r.err;
  }
  // --chat is for text prompts; a file that cannot be read is named.
  auto chat_ids = run_nanovllm("generate" + kCpuA + " --chat --requests -", "{\"prompt_token_ids\": [1]}\n");
  EXPECT_EQ(chat_ids.err, "error: stdin line 1: --chat applies to text prompts, not to \"prompt_token_ids\"\n");
  auto missing = run_nanovllm("generate" + kCpuA + " --requests /no/such/requests.jsonl");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "error: /no/such/requests.jsonl: cannot read: No such file or directory\n");
  // A missing model is told before stdin is read (here, before a stdin that is never closed would be).
  auto no_model = run_nanovllm("generate --device cpu --model /no/such/model --requests - < /dev/zero");
  EXPECT_EQ(no_model.exit_code, 1);
  EXPECT_EQ(no_model.err, "error: /no/such/model: no such model folder (No such file or directory)\n");
  // A FIFO would wait for a writer: only a regular file is read (stdin, "-", is the way to pipe).
  test::TempDir dir;
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);
  auto fifo = run_nanovllm("generate" + kCpuA + " --requests " + (dir / "fifo"));
  EXPECT_EQ(fifo.err, "error: " + (dir / "fifo") + ": cannot read: not a regular file\n");
  // A stream that never ends stops at 2^20 requests, named, rather than filling the memory.
  std::string many;
  for (int i = 0; i <= (1 << 20); i++) many += "{\"prompt_token_ids\": [1]}\n";
  auto endless = run_nanovllm("generate" + kCpuA + " --requests -", many);
  EXPECT_EQ(endless.exit_code, 1);
  EXPECT_EQ(endless.err, "error: stdin line 1048577: more than 1048576 requests in the run\n");
  // The limit is the run's, over every file (here the same one twice), and blank lines do not count.
  const std::string line = "{\"prompt_token_ids\": [1]}\n";
  std::ofstream(dir / "half.jsonl") << many.substr(0, line.size() << 19) << "\n  \n";  // 2^19 requests, 2 blank lines
  auto twice = run_nanovllm("generate" + kCpuA + " --requests " + (dir / "half.jsonl") + " --requests " +
                            (dir / "half.jsonl") + " --no-thinking");  // all read, then a usage error
  EXPECT_EQ(twice.exit_code, 2) << twice.err;
  std::ofstream(dir / "half.jsonl", std::ios::app) << line;  // 2^19 + 1 a file: the second's 2^19th is one too many
  auto over = run_nanovllm("generate" + kCpuA + " --requests " + (dir / "half.jsonl") + " --requests " +
                           (dir / "half.jsonl"));
  EXPECT_EQ(over.err, "error: " + (dir / "half.jsonl") + " line 524288: more than 1048576 requests in the run\n");
  // The flag itself: a value is needed, stdin is read once, and the other flags are checked before stdin is
  // read (a usage error, exit 2, however bad the requests).
  for (const char* args : {" --requests ''", " --requests - --requests -", " --requests - --max-num-seqs 0"}) {
    auto usage = run_nanovllm("generate" + kCpuA + args, "{\"bad\": 1}\n");
    EXPECT_EQ(usage.exit_code, 2) << args;
    EXPECT_TRUE(test::is_one_error_line(usage.err)) << args << ": " << usage.err;
  }
}

// The low end of each field's range is a value, as it is of the flag's (prompt_token_ids "as --prompt-ids", id 0
// included; max_tokens [1, ...]; top_k 0, no cut; temperature 0, greedy): the request runs as those flags run it.
TEST(E2E_Requests, TheLowEndOfEachFieldsRangeIsAccepted) {
  auto file = run_nanovllm("generate" + kCpuA + " --ignore-eos --json --requests -",
                           "{\"prompt_token_ids\": [0], \"max_tokens\": 1, \"top_k\": 0, \"temperature\": 0}\n");
  ASSERT_EQ(file.exit_code, 0) << file.err;
  auto flags = run_nanovllm("generate" + kCpuA + " --ignore-eos --json --prompt-ids 0 --max-tokens 1 --top-k 0 --temperature 0");
  ASSERT_EQ(flags.exit_code, 0) << flags.err;
  EXPECT_EQ(file.out, flags.out);
  EXPECT_EQ(token_ids(json_lines(file.out).at(0)).size(), 1u);
}

// A byte order mark is skipped where an editor writes one, at the start of the file; anywhere else it is a character
// that JSON does not allow, named by its line and column (line 2, column 1).
TEST(E2E_Requests, AByteOrderMarkPastTheFirstLineIsAnError) {
  const std::string line = "{\"prompt_token_ids\": [1]}\n";
  auto first = run_nanovllm("generate" + kCpuA + " --max-tokens 1 --requests -", "\xEF\xBB\xBF" + line + line);
  EXPECT_EQ(first.exit_code, 0) << first.err;
  auto second = run_nanovllm("generate" + kCpuA + " --max-tokens 1 --requests -", line + "\xEF\xBB\xBF" + line);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_EQ(second.out, "");
  EXPECT_EQ(test::last_error_line(second.err).rfind("error: stdin line 2, column 1: ", 0), 0u) << second.err;
}

TEST(E2E_Requests, FilesAreReadInCommandLineOrder) {
  // Two files, the second saved by an editor that writes a byte order mark first; each request as it is alone.
  test::TempDir dir;
  std::ofstream(dir / "a.jsonl") << "{\"prompt_token_ids\": [1, 2]}\n{\"prompt_token_ids\": [3]}";  // no last newline
  std::ofstream(dir / "b.jsonl") << "\xEF\xBB\xBF{\"prompt_token_ids\": [4, 5, 6]}\r\n";
  const std::string flags = "generate" + kCpuA + " --max-tokens 3 --temperature 0 --ignore-eos --json";
  auto r = run_nanovllm(flags + " --requests " + (dir / "b.jsonl") + " --prompt-ids 7 --requests " + (dir / "a.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<Json> out = json_lines(r.out);
  ASSERT_EQ(out.size(), 4u);
  const char* prompts[] = {"4,5,6", "7", "1,2", "3"};
  for (size_t i = 0; i < 4; i++) {
    auto alone = run_nanovllm(flags + " --prompt-ids " + prompts[i]);
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    const Json expected = json_lines(alone.out).at(0);
    EXPECT_EQ(out[i].at("prompt_token_ids").dump(), expected.at("prompt_token_ids").dump()) << i;
    EXPECT_EQ(token_ids(out[i]), token_ids(expected)) << i;
  }
}
