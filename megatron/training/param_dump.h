// Debug dump of the trained parameters, for the parallel-equivalence tests: with
// MEGATRON_DUMP_PARAMS=<dir> set, pretrain_gpt writes every parameter of the model, gathered over
// tensor parallelism into its global shape, after training. Each pipeline rank (on tensor- and
// data-parallel rank 0) writes <dir>/params_pp<rank>.bin; the union over files is the model.
// The last stage's copy of a tied embedding (`shared`) is left out (it equals the embedding).
// Format, per parameter: a text line "<name> <numel>\n" then numel float32 values (little endian).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/models/gpt/gpt_model.h"

namespace megatron::training {

/// Collective over `tp_group` (the TP all-gathers). Writes only when write == true (callers pass
/// TP rank 0 and DP rank 0). The file is written to a temporary name and renamed. Throws
/// UserError when the file cannot be written (naming it and MEGATRON_DUMP_PARAMS).
void dump_parameters(const std::string& dir, int pp_rank, const std::vector<models::gpt::GPTModel*>& chunks,
                     comm::ProcessGroup& tp_group, bool write);

}  // namespace megatron::training
