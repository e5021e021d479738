// Helpers shared by the argument-parsing tests (arguments_test, arguments_argparse_test,
// arguments_print_test, checkpoint_args_test).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"

namespace megatron::training::test {

/// The smallest valid pretrain_gpt command line: a 2-layer GPT (hidden 64, 4 heads, seq 32, mbs 2,
/// gbs 8, vocab 128), 10 iterations on mock data, learning rate `lr`.
inline std::vector<std::string> tiny_gpt_flags(const char* lr) {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
          "--train-iters", "10", "--lr", lr, "--mock-data", "--tokenizer-type", "NullTokenizer",
          "--vocab-size", "128"};
}

/// `v` followed by `extra`.
inline std::vector<std::string> with(std::vector<std::string> v, std::initializer_list<std::string> extra) {
  v.insert(v.end(), extra);
  return v;
}

/// The UserError message of parse_args(flags) (then validate_args when `validate`); "" if accepted.
inline std::string args_error(const std::vector<std::string>& flags, bool validate) {
  try {
    Arguments a = parse_args(flags);
    if (validate) validate_args(a);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace megatron::training::test
