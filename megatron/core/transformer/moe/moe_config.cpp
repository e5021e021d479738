#include "megatron/core/transformer/moe/moe_config.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "megatron/core/transformer/transformer_config.h"
#include "megatron/core/utils/errors.h"

namespace megatron::transformer::moe {
namespace {

// expr   := term ('+' term)*
// term   := factor ('*' INT)* | INT '*' factor
// factor := '[' [INT (',' INT)* [',']] ']' | '(' expr ')' | INT   (an INT alone is a scalar)
// A value is a list or a scalar; list * int repeats, int * list too, list + list concatenates,
// int op int is arithmetic (Python semantics on the allowed subset).
struct Value {
  bool is_list = false;
  int64_t scalar = 0;
  std::vector<int64_t> list;
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  Value parse() {
    Value v = expr();
    skip();
    if (pos_ != s_.size()) fail("unexpected '" + std::string(1, s_[pos_]) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    user_error("--moe-layer-freq '", s_, "': ", why, " at character ", pos_ + 1,
               " (use an integer or a list expression such as ([0]*3+[1]*29))");
  }
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  int64_t integer() {
    skip();
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      v = v * 10 + (s_[pos_] - '0');
      if (v > (int64_t{1} << 31)) fail("number too large");
      ++pos_;
    }
    if (pos_ == start) fail("expected a number");
    return v;
  }
  Value expr() {
    Value v = term();
    while (eat('+')) {
      Value r = term();
      if (v.is_list != r.is_list) fail("cannot add a list and a number");
      if (v.is_list) {
        v.list.insert(v.list.end(), r.list.begin(), r.list.end());
      } else {
        v.scalar += r.scalar;
      }
    }
    return v;
  }
  Value term() {
    Value v = factor();
    while (eat('*')) {
      Value r = factor();
      if (v.is_list && r.is_list) fail("cannot multiply two lists");
      if (!v.is_list && !r.is_list) {
        v.scalar *= r.scalar;
        if (v.scalar > (int64_t{1} << 31)) fail("number too large");
        continue;
      }
      const Value& l = v.is_list ? v : r;
      const int64_t n = v.is_list ? r.scalar : v.scalar;
      if (static_cast<double>(l.list.size()) * static_cast<double>(n) > 1e7) fail("pattern too long");
      Value out;
      out.is_list = true;
      for (int64_t i = 0; i < n; ++i) out.list.insert(out.list.end(), l.list.begin(), l.list.end());
      v = std::move(out);
    }
    return v;
  }
  Value factor() {
    skip();
    if (eat('(')) {
      Value v = expr();
      if (!eat(')')) fail("expected ')'");
      return v;
    }
    if (eat('[')) {
      Value v;
      v.is_list = true;
      if (eat(']')) return v;
      for (;;) {
        Value e = expr();
        if (e.is_list) fail("nested lists are not a layer pattern");
        v.list.push_back(e.scalar);
        if (eat(']')) break;
        if (!eat(',')) fail("expected ',' or ']'");
        if (eat(']')) break;  // trailing comma
      }
      return v;
    }
    Value v;
    v.scalar = integer();
    return v;
  }
  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<int64_t> eval_moe_layer_freq(const std::string& text, bool* is_int) {
  // Megatron's _eval_pattern character filter, then (no '[') int(x).
  for (char c : text)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || std::isspace(static_cast<unsigned char>(c)) ||
          std::string_view(",[]()+*").find(c) != std::string_view::npos))
      user_error("--moe-layer-freq '", text, "': invalid pattern (only digits, ',', '[', ']', '(', ')', '+' and '*' "
                 "are allowed)");
  if (text.find('[') == std::string::npos) {  // Megatron: int(x)
    size_t b = text.find_first_not_of(" \t"), e = text.find_last_not_of(" \t");
    const std::string t = b == std::string::npos ? "" : text.substr(b, e - b + 1);
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos)
      user_error("--moe-layer-freq '", text, "': expected an integer or a list expression such as ([0]*3+[1]*29)");
    *is_int = true;
    return {std::stoll(t)};
  }
  Value v = Parser(text).parse();
  if (!v.is_list) user_error("--moe-layer-freq '", text, "': the expression is not a list");
  *is_int = false;
  return v.list;
}

std::vector<int> parse_moe_layer_freq(const std::string& text, int64_t num_layers) {
  bool is_int = false;
  const std::vector<int64_t> v = eval_moe_layer_freq(text, &is_int);
  std::vector<int> out;
  if (is_int) {
    if (v[0] < 1) user_error("--moe-layer-freq ", text, ": an integer frequency must be >= 1");
    for (int64_t i = 0; i < num_layers; ++i) out.push_back(i % v[0] == 0 ? 1 : 0);
    return out;
  }
  if (static_cast<int64_t>(v.size()) != num_layers)
    user_error("--moe-layer-freq '", text, "': invalid length of the layer pattern: ", v.size(), ", expected ",
               num_layers, " (--num-layers)");
  for (int64_t x : v) {
    if (x != 0 && x != 1)
      user_error("--moe-layer-freq '", text, "': invalid layer pattern entry ", x, " (1 = MoE layer, 0 = dense)");
    out.push_back(static_cast<int>(x));
  }
  return out;
}

}  // namespace megatron::transformer::moe

namespace megatron::transformer {

bool TransformerConfig::is_moe_layer(int64_t layer) const {
  if (!num_moe_experts) return false;
  if (moe_layer_pattern.empty()) return true;
  return layer >= 0 && layer < static_cast<int64_t>(moe_layer_pattern.size()) &&
         moe_layer_pattern[static_cast<size_t>(layer)] == 1;
}

void TransformerConfig::validate_moe() {
  // Megatron's TransformerConfig.__post_init__ and validate_args checks, with the flag named.
  if (!num_moe_experts) {
    if (expert_model_parallel_size > 1)
      user_error("--expert-model-parallel-size ", expert_model_parallel_size, " needs --num-experts");
    return;
  }
  const int64_t E = *num_moe_experts;
  if (E <= 0) user_error("--num-experts must be positive, got ", E);
  if (moe_ffn_hidden_size == 0) moe_ffn_hidden_size = ffn_hidden_size;
  if (moe_ffn_hidden_size <= 0) user_error("--moe-ffn-hidden-size must be positive, got ", moe_ffn_hidden_size);
  if (!moe_layer_pattern.empty() && static_cast<int64_t>(moe_layer_pattern.size()) != num_layers)
    user_error("--moe-layer-freq: invalid length of the layer pattern: ", moe_layer_pattern.size(), ", expected ",
               num_layers, " (--num-layers)");
  if (moe_router_topk < 1) user_error("--moe-router-topk must be >= 1, got ", moe_router_topk);
  if (moe_router_topk > E)
    user_error("--moe-router-topk (", moe_router_topk, ") must not exceed --num-experts (", E, ")");
  if (expert_model_parallel_size < 1)
    user_error("--expert-model-parallel-size must be >= 1, got ", expert_model_parallel_size);
  if (E % expert_model_parallel_size != 0)
    user_error("--num-experts (", E, ") must be a multiple of --expert-model-parallel-size (",
               expert_model_parallel_size, ")");
  if (expert_tensor_parallel_size == 0) expert_tensor_parallel_size = tensor_model_parallel_size;
  if (expert_tensor_parallel_size < 1)
    user_error("--expert-tensor-parallel-size must be >= 1, got ", expert_tensor_parallel_size);
  if (moe_ffn_hidden_size % expert_tensor_parallel_size != 0)
    user_error("--moe-ffn-hidden-size (", moe_ffn_hidden_size, ") must be divisible by --expert-tensor-parallel-size (",
               expert_tensor_parallel_size, ")");
  if (add_bias_linear && expert_tensor_parallel_size != 1)
    user_error("bias in MoE experts is only supported with --expert-tensor-parallel-size 1 (Megatron's rule); "
               "add --disable-bias-linear");
  if (moe_shared_expert_intermediate_size < 0)
    user_error("--moe-shared-expert-intermediate-size must be positive, got ", moe_shared_expert_intermediate_size);
  // Megatron's SharedExpertMLP: assert config.add_bias_linear == False, "bias is not supported in
  // the shared experts, please set '--disable-bias-linear' instead."
  if (moe_shared_expert_intermediate_size > 0 && add_bias_linear)
    user_error("--moe-shared-expert-intermediate-size: bias is not supported in the shared experts (Megatron's "
               "SharedExpertMLP); add --disable-bias-linear");
  // The shared expert is a dense MLP on the tensor-parallel group (Megatron's SharedExpertMLP), its
  // fc1 split by TP like --ffn-hidden-size; without this line the error named the parameter only.
  if (moe_shared_expert_intermediate_size > 0 && moe_shared_expert_intermediate_size % tensor_model_parallel_size != 0)
    user_error("--moe-shared-expert-intermediate-size (", moe_shared_expert_intermediate_size,
               ") must be divisible by --tensor-model-parallel-size (", tensor_model_parallel_size, ")");
  if (moe_token_dispatcher_type != "allgather" && moe_token_dispatcher_type != "alltoall")
    user_error("--moe-token-dispatcher-type ", moe_token_dispatcher_type,
               " is not implemented in megatron.cpp (use allgather or alltoall)");
  if (moe_router_score_function != "softmax" && moe_router_score_function != "sigmoid" &&
      moe_router_score_function != "sqrtsoftplus")
    user_error("--moe-router-score-function: invalid choice '", moe_router_score_function,
               "' (choose from softmax, sigmoid, sqrtsoftplus)");
  if (moe_router_load_balancing_type.empty()) moe_router_load_balancing_type = {"aux_loss"};
  for (const auto& t : moe_router_load_balancing_type)
    if (t != "aux_loss" && t != "seq_aux_loss" && t != "global_aux_loss" && t != "none")
      user_error("--moe-router-load-balancing-type ", t,
                 " is not implemented in megatron.cpp (use aux_loss, seq_aux_loss, global_aux_loss or none)");
  if (moe_router_load_balancing_type.size() > 1 && moe_aux_loss_coeff.size() != moe_router_load_balancing_type.size())
    user_error("--moe-aux-loss-coeff must give one coefficient per --moe-router-load-balancing-type (",
               moe_router_load_balancing_type.size(), " types, ", moe_aux_loss_coeff.size(), " coefficients)");
  if (moe_router_load_balancing_type.size() == 1 && moe_aux_loss_coeff.size() != 1)
    user_error("--moe-aux-loss-coeff: ", moe_aux_loss_coeff.size(),
               " coefficients for one --moe-router-load-balancing-type");
  for (double c : moe_aux_loss_coeff)
    if (c < 0) user_error("--moe-aux-loss-coeff must be >= 0, got ", c);
  if (moe_expert_capacity_factor && *moe_expert_capacity_factor < 0)
    moe_expert_capacity_factor.reset();  // Megatron: a negative factor means dropless
  if (moe_expert_capacity_factor && *moe_expert_capacity_factor == 0)
    user_error("--moe-expert-capacity-factor must be > 0 (or negative for dropless), got 0");
  if (moe_pad_expert_input_to_capacity && !moe_expert_capacity_factor)
    user_error("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  if (moe_token_drop_policy != "probs" && moe_token_drop_policy != "position")
    user_error("--moe-token-drop-policy: invalid choice '", moe_token_drop_policy, "' (choose from probs, position)");
  if (moe_router_enable_expert_bias && moe_router_score_function == "softmax")
    user_error("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid or sqrtsoftplus "
               "(Megatron's rule for aux-loss-free routing)");
  if (moe_router_topk == 1 && moe_router_score_function == "softmax" && !moe_router_pre_softmax)
    user_error("--moe-router-topk 1 with the softmax score function needs --moe-router-pre-softmax "
               "(softmax over one score has a zero gradient)");
  if (moe_router_group_topk > 0) {
    if (moe_router_num_groups <= 0)
      user_error("--moe-router-group-topk needs --moe-router-num-groups (group-limited routing)");
    if (E % moe_router_num_groups != 0)
      user_error("--num-experts (", E, ") must be divisible by --moe-router-num-groups (", moe_router_num_groups, ")");
    if (moe_router_group_topk > moe_router_num_groups)
      user_error("--moe-router-group-topk (", moe_router_group_topk, ") must not exceed --moe-router-num-groups (",
                 moe_router_num_groups, ")");
    if (moe_router_topk % moe_router_group_topk != 0)
      user_error("--moe-router-topk (", moe_router_topk, ") must be divisible by --moe-router-group-topk (",
                 moe_router_group_topk, ")");
    if (moe_router_topk > moe_router_group_topk * (E / moe_router_num_groups))
      user_error("--moe-router-topk (", moe_router_topk, ") exceeds the experts of the --moe-router-group-topk groups");
  } else if (moe_router_num_groups > 0) {
    user_error("--moe-router-num-groups needs --moe-router-group-topk (group-limited routing)");
  }
  if (!moe_router_dtype.empty() && moe_router_dtype != "fp32" && moe_router_dtype != "fp64")
    user_error("--moe-router-dtype: invalid choice '", moe_router_dtype, "' (choose from fp32, fp64)");
  if (moe_input_jitter_eps && (*moe_input_jitter_eps < 0 || *moe_input_jitter_eps >= 1))
    user_error("--moe-input-jitter-eps must be in [0, 1), got ", *moe_input_jitter_eps);
  if (fp8 && fp8->param_gather)
    user_error("--fp8-param-gather with --num-experts is not implemented in megatron.cpp yet (FP8 expert weights "
               "are cast from the model dtype every step); drop --fp8-param-gather");
  if (fp8 && fp8->recipe == fp8::Fp8Recipe::kTensorwise &&
      (expert_tensor_parallel_size > 0 ? expert_tensor_parallel_size : tensor_model_parallel_size) > 1)
    user_error("--fp8-recipe tensorwise with --num-experts needs --expert-tensor-parallel-size 1 (Transformer "
               "Engine's GroupedLinear has no current scaling under expert tensor parallelism)");
}

}  // namespace megatron::transformer
