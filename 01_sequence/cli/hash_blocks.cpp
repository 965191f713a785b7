// hash_blocks.cpp: `nanovllm hash-blocks [--block-size N]`, the prefix-cache hashes of chapter 03
// (nano-vllm: engine/block_manager.py, compute_hash).
//
// stdin: JSON Lines, each an array of token ids. stdout: for each line, a JSON array with the chained
// prefix-cache hash of every *full* block of block_size tokens, as decimal unsigned 64-bit numbers, the
// same numbers nano-vllm's BlockManager computes. A partial last block is not hashed.
//
//   $ echo '[1,2,3,4]' | nanovllm hash-blocks --block-size 2
//   [<hash of [1,2]>,<hash of [3,4] chained on it>]
#include <iostream>
#include <string>
#include <vector>

#include "01_sequence/cli/flags.h"
#include "01_sequence/base/json.h"
#include "03_block_manager/block_manager.h"

namespace nanovllm {

int cmd_hash_blocks(const Flags& flags) {
  const int block_size = int(flags.get_int("block-size", 256, 1, 1 << 20));
  std::string line;
  LineReader lines;
  while (lines.next(line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {  // a blank line for a blank line: aligned
      write_stdout("\n");
      flush_stdout();
      continue;
    }
    std::string source = "stdin line " + std::to_string(lines.line_number());
    Json value = Json::parse_line(line, source);
    if (!value.is_array()) fail(source, ": expected an array of token ids");
    std::vector<int32_t> token_ids;
    for (const Json& id : value.as_array()) {
      if (!id.is_integer() || id.as_int64() < 0 || id.as_int64() > INT32_MAX)
        fail(source, ": token ids must be integers in [0, 2^31), got ", id.dump());
      token_ids.push_back(int32_t(id.as_int64()));
    }
    std::string out = "[";
    uint64_t h = 0;
    for (size_t i = 0; i + block_size <= token_ids.size(); i += block_size) {
      h = BlockManager::compute_hash(&token_ids[i], block_size, i > 0, h);
      if (i) out += ',';
      out += std::to_string(h);
    }
    out += "]\n";
    write_stdout(out);
    flush_stdout();
  }
  return 0;
}

}  // namespace nanovllm
