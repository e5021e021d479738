#include "megatron/training/gpt_pipeline.h"

#include <algorithm>

#include "megatron/core/parallel_state.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/utils/errors.h"

namespace megatron::training {

std::vector<PipelineChunk> pipeline_chunks(int64_t num_layers, int pp, int pp_rank, int vp,
                                           std::optional<int64_t> first, std::optional<int64_t> last) {
  MEGATRON_CHECK(pp >= 1 && vp >= 1 && pp_rank >= 0 && pp_rank < pp) << "pp " << pp << " rank " << pp_rank << " vp " << vp;
  const int64_t stages = static_cast<int64_t>(pp) * vp;
  std::vector<PipelineChunk> out;
  auto add = [&](int c, int64_t offset, int64_t n) {
    PipelineChunk ch;
    ch.layer_offset = offset;
    ch.num_layers = n;
    ch.pre_process = c == 0 && pp_rank == 0;
    ch.post_process = c == vp - 1 && pp_rank == pp - 1;
    out.push_back(ch);
  };
  if (!first && !last) {
    if (num_layers % stages != 0)
      user_error("--num-layers (", num_layers, ") must be divisible by --pipeline-model-parallel-size (", pp,
                 ") x virtual stages per rank (", vp, "), or give --decoder-first/last-pipeline-num-layers");
    const int64_t per = num_layers / stages;
    for (int c = 0; c < vp; ++c) add(c, (static_cast<int64_t>(c) * pp + pp_rank) * per, per);
    return out;
  }
  const char* flags = "--decoder-first-pipeline-num-layers/--decoder-last-pipeline-num-layers";
  if (pp < 2) user_error(flags, " need --pipeline-model-parallel-size > 1");
  const int64_t f = first.value_or(0), l = last.value_or(0);
  if (f < 0 || l < 0 || f + l > num_layers)
    user_error(flags, " (", f, ", ", l, ") must be >= 0 and sum to at most --num-layers (", num_layers, ")");
  const int64_t middle_stages = pp - (first ? 1 : 0) - (last ? 1 : 0);
  const int64_t middle = num_layers - f - l;
  if (middle_stages == 0 && middle != 0)
    user_error(flags, " (", f, " + ", l, ") must add up to --num-layers (", num_layers, ") with 2 pipeline stages");
  if (middle_stages > 0 && middle % (middle_stages * vp) != 0)
    user_error("the ", middle, " layers left by ", flags, " must divide evenly over the ", middle_stages,
               " other pipeline stages x ", vp, " virtual stages");
  if (f % vp != 0 || l % vp != 0)
    user_error(flags, " (", f, ", ", l, ") must be divisible by the virtual stages per rank (", vp, ")");
  const int64_t per_middle = middle_stages > 0 ? middle / middle_stages : 0;  // per rank
  const bool is_first = pp_rank == 0, is_last = pp_rank == pp - 1;
  const int64_t rank_layers = (first && is_first) ? f : (last && is_last) ? l : per_middle;
  const int64_t middle_rank = first ? pp_rank - 1 : pp_rank;
  const int64_t total_per_chunk = (f + middle + l) / vp;  // Megatron's total_virtual_chunks
  for (int c = 0; c < vp; ++c) {
    int64_t offset = static_cast<int64_t>(c) * total_per_chunk;
    if (!is_first) offset += f / vp + middle_rank * (per_middle / vp);
    add(c, offset, rank_layers / vp);
  }
  return out;
}

struct GPTPipeline::Impl final : pipeline_parallel::PipelineStage, pipeline_parallel::VirtualPipelineStage {
  std::vector<models::gpt::GPTModel*> chunks;
  std::vector<models::gpt::GPTModel::GradReadyHook> grad_ready;
  std::shared_ptr<comm::ProcessGroup> pp;
  Shape shape;
  DType dtype;
  Device device;
  int64_t M;
  bool per_token;
  std::unique_ptr<pipeline_parallel::P2PCommunicator> p2p;
  std::unique_ptr<pipeline_parallel::InterleavedPipeline> interleaved;
  int group_size = 0;  // microbatch_group_size_per_vp_stage
  // Per global batch.
  std::vector<datasets::GPTBatch> batches;
  std::vector<LossReport> reports;
  std::vector<Tensor> deferred_losses;  // per micro-batch: the device loss whose sum is pending
  std::vector<double> seed_tokens;  // per micro-batch: the backward seed's token count
  std::function<double(double)> loss_tokens;
  bool forward_only = false;
  double loss_scale = 1.0;

  bool loss_chunk(int c) const {
    return pp->rank() == pp->size() - 1 && c == static_cast<int>(chunks.size()) - 1;
  }

  Tensor forward_step(int c, int mb, const Tensor& input) override {
    models::gpt::GPTModel& m = *chunks[static_cast<size_t>(c)];
    const datasets::GPTBatch& b = batches[static_cast<size_t>(mb)];
    if (input.defined()) m.set_input_tensor(input);
    Tensor out = m.forward(b, /*training=*/!forward_only);
    if (!forward_only) m.stash_activations(mb);
    if (!loss_chunk(c)) return out;
    // A device loss with a host mask: Σ(mask) now (the backward seed needs it), Σ(loss·mask)
    // after the schedule (forward_backward), so no device-to-host copy drains the GPU between
    // a micro-batch's forward and the next launches.
    const bool defer = !out.is_cpu() && b.loss_mask.is_cpu();
    LossReport r;
    if (defer) {
      r.num_tokens = mask_token_count(b.loss_mask);
      deferred_losses[static_cast<size_t>(mb)] = out;
    } else {
      r = masked_loss_report(out, b.loss_mask);
    }
    reports[static_cast<size_t>(mb)] = r;
    if (!forward_only && !per_token)
      seed_tokens[static_cast<size_t>(mb)] = loss_tokens ? loss_tokens(r.num_tokens) : std::max(r.num_tokens, 1.0);
    // Megatron's loss_func output, divided by the number of micro-batches (reporting only; the
    // schedule's returned losses are not read by forward_backward, so a deferred loss returns 0).
    if (defer) return Tensor::from_vector({0.0f}, {1});
    const double v = per_token ? r.loss_sum : r.loss_sum / std::max(r.num_tokens, 1.0) / static_cast<double>(M);
    return Tensor::from_vector({static_cast<float>(v)}, {1});
  }

  Tensor backward_step(int c, int mb, const Tensor& output_grad) override {
    models::gpt::GPTModel& m = *chunks[static_cast<size_t>(c)];
    m.restore_activations(mb);
    // Gradients are final in the last micro-batch's backward (Megatron's no_sync for the others).
    const auto& hook = grad_ready[static_cast<size_t>(c)];
    m.set_grad_ready_hook(hook && mb == M - 1 ? hook : nullptr);
    if (loss_chunk(c)) {
      const datasets::GPTBatch& b = batches[static_cast<size_t>(mb)];
      // docs/megatron-reference.md#loss-normalisation: the backward seed of Σ(loss·mask)·k is mask·k.
      double k = loss_scale;
      if (!per_token) k /= seed_tokens[static_cast<size_t>(mb)] * static_cast<double>(M);
      Tensor dloss = b.loss_mask.is_cpu() ? b.loss_mask.clone() : b.loss_mask.to(Device::cpu());
      float* d = dloss.data<float>();
      const float kf = static_cast<float>(k);
      for (int64_t i = 0; i < dloss.numel(); ++i) d[i] *= kf;
      m.set_mtp_loss_scale(per_token ? loss_scale : loss_scale / static_cast<double>(M));  // MTPLossAutoScaler
      m.backward(dloss);
    } else {
      MEGATRON_CHECK(output_grad.defined()) << "chunk " << c << " micro-batch " << mb << ": no output gradient";
      m.backward(output_grad);
    }
    m.set_grad_ready_hook(nullptr);
    return m.input_tensor_grad();
  }

  // PipelineStage (one chunk).
  Tensor forward_step(int mb, const Tensor& input) override { return forward_step(0, mb, input); }
  Tensor backward_step(int mb, const Tensor& output_grad) override { return backward_step(0, mb, output_grad); }
};

GPTPipeline::GPTPipeline(std::vector<models::gpt::GPTModel*> chunks, std::shared_ptr<comm::ProcessGroup> pp_group,
                         Shape p2p_shape, DType dtype, Device device, int64_t num_microbatches,
                         bool calculate_per_token_loss, int64_t microbatch_group_size)
    : impl_(std::make_unique<Impl>()) {
  MEGATRON_CHECK(!chunks.empty() && pp_group) << "pipeline without chunks or group";
  Impl& d = *impl_;
  d.chunks = std::move(chunks);
  d.grad_ready.resize(d.chunks.size());
  d.pp = std::move(pp_group);
  d.shape = std::move(p2p_shape);
  d.dtype = dtype;
  d.device = device;
  d.M = num_microbatches;
  d.per_token = calculate_per_token_loss;
  if (d.chunks.size() > 1) {
    if (num_microbatches < d.pp->size())
      user_error("the interleaved pipeline schedule needs at least --pipeline-model-parallel-size (", d.pp->size(),
                 ") micro-batches per global batch (got ", num_microbatches,
                 "); raise --global-batch-size or drop the virtual pipeline flags");
    d.group_size = static_cast<int>(microbatch_group_size > 0 ? microbatch_group_size : d.pp->size());
    pipeline_parallel::check_microbatch_group_size(d.pp->size(), static_cast<int>(num_microbatches), d.group_size);
    d.interleaved = std::make_unique<pipeline_parallel::InterleavedPipeline>(d.pp, d.shape, dtype, device);
  } else {
    d.p2p = std::make_unique<pipeline_parallel::P2PCommunicator>(d.pp, d.shape, dtype, device);
  }
}

GPTPipeline::~GPTPipeline() = default;

void GPTPipeline::set_microbatch_loss_tokens(std::function<double(double)> fn) { impl_->loss_tokens = std::move(fn); }

void GPTPipeline::set_grad_ready(size_t chunk, models::gpt::GPTModel::GradReadyHook hook) {
  MEGATRON_CHECK(chunk < impl_->grad_ready.size()) << "chunk " << chunk;
  impl_->grad_ready[chunk] = std::move(hook);
}


std::optional<LossReport> GPTPipeline::forward_backward(BatchIterator& data, bool forward_only, double loss_scale) {
  Impl& d = *impl_;
  d.batches.clear();
  for (int64_t i = 0; i < d.M; ++i) {
    std::optional<datasets::GPTBatch> b = data();
    if (!b) return std::nullopt;
    d.batches.push_back(std::move(*b));
  }
  d.reports.assign(static_cast<size_t>(d.M), LossReport{});
  d.deferred_losses.assign(static_cast<size_t>(d.M), Tensor());
  d.seed_tokens.assign(static_cast<size_t>(d.M), 1.0);
  d.forward_only = forward_only;
  d.loss_scale = loss_scale;
  // Megatron's forward_step: MoEAuxLossAutoScaler.set_loss_scale(loss_scale x CP / num_microbatches)
  // (loss_scale alone with --calculate-per-token-loss), so the aux losses' gradients are scaled
  // like the main loss's.
  const int64_t cp = parallel_state::model_parallel_is_initialized() ? parallel_state::get_context_parallel_world_size() : 1;
  transformer::moe::MoEAuxLossAutoScaler::set_step_loss_scale(loss_scale, d.M, d.per_token, cp);
  const int M = static_cast<int>(d.M);
  if (d.interleaved) {
    d.interleaved->run(d, M, static_cast<int>(d.chunks.size()), d.group_size, forward_only);
  } else {
    pipeline_parallel::forward_backward_pipelining_without_interleaving(d, M, *d.p2p, forward_only);
  }
  for (auto* m : d.chunks)
    MEGATRON_CHECK(m->num_stashed_activations() == 0) << m->num_stashed_activations() << " micro-batches left in flight";
  for (size_t i = 0; i < d.deferred_losses.size(); ++i)
    if (d.deferred_losses[i].defined())
      d.reports[i].loss_sum = masked_loss_report(d.deferred_losses[i], d.batches[i].loss_mask).loss_sum;
  d.deferred_losses.clear();
  LossReport total;
  for (const auto& r : d.reports) {
    total.loss_sum += r.loss_sum;
    total.num_tokens += r.num_tokens;
  }
  d.batches.clear();
  return total;
}

}  // namespace megatron::training
