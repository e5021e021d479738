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

/// Debug dump of the FP8 delayed-scaling state, for the FP8 amax-reduction test
/// (tests/functional_tests/dist_fp8_amax.sh): with MEGATRON_DUMP_FP8_STATE=<dir> set, every rank
/// appends, after each step's amax reduction and scale update, one line per FP8 role of every model
/// chunk to <dir>/fp8_state_rank<global_rank>.txt:
///   "step <n> <linear> <role 0..2> amax_history <H hex floats> scale <hex> scale_inv <hex>"
/// (C99 %a hex floats: exact, so ranks can be compared bitwise). Local, not collective. Throws
/// UserError when the file cannot be written (naming it and MEGATRON_DUMP_FP8_STATE).
void dump_fp8_state(const std::string& dir, int global_rank, const std::vector<models::gpt::GPTModel*>& chunks);

}  // namespace megatron::training
