// Helpers shared by the argument-parsing tests (arguments_test, arguments_argparse_test,
// arguments_print_test, checkpoint_args_test).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"
#include "test_utils/tiny_model.h"

namespace megatron::training::test {

/// The smallest valid pretrain_gpt command line (test_utils/tiny_model.h).
using megatron::testing::tiny_gpt_flags;

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
