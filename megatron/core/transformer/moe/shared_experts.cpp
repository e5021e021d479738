#include "megatron/core/transformer/moe/shared_experts.h"

namespace megatron::transformer::moe {

SharedExpertMLP::SharedExpertMLP(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                                 const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8)
    : config_(std::make_unique<TransformerConfig>(config)) {
  config_->ffn_hidden_size = config.moe_shared_expert_intermediate_size;
  mlp_ = std::make_unique<MLP>(reg, prefix, *config_, tp, std::move(fp8));
}

}  // namespace megatron::transformer::moe
