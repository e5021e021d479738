"""Oracle fixtures for multi-token prediction: Megatron-LM's own GPTModel with its MTP block
(megatron/core/transformer/multi_token_prediction.py, local spec, no Transformer Engine/apex),
fp32 on one GPU, forward + backward of a tiny model on fixed tokens.

Read by tests/unit_tests/models/gpt_mtp_test.cpp (GPTMtpOracle.*), which loads the same weights
into our GPTModel and must reproduce the lm loss, every MTP module's logged loss and every
parameter gradient within 1e-5 relative. Until the fixtures are committed that test skips.

Each fixture tests/reference/mtp/data/<name>.{json,bin} (format of tests/reference/model/
fixture_io.py) holds
  tokens, labels [b, s] int64, loss_mask [b, s] float32, position_ids [b, s] int64,
  lm_loss [1]        = sum(loss * loss_mask) / sum(loss_mask) of the main model,
  mtp_loss [D]       = MTPLossLoggingHelper's per-module value of this forward
                       (sum(loss_k * rolled_mask_k) / sum(rolled_mask_k)),
  moe.<name> [L + D] = (MoE variants) the MoE metrics tracker's per-layer values of this forward
                       (load_balancing_loss, z_loss: loss / coefficient, MTP layers at L + k + 1),
  param.<name>       = the weights (ours = Megatron's names, with the MTP inner layer under
                       Megatron's checkpoint key 'transformer_layer' instead of its module
                       attribute 'mtp_model_layer'),
  grad.<name>        = d(lm_loss)/d(param) as Megatron's autograd computes it, i.e. with the MTP
                       losses entering through MTPLossAutoScaler (main-loss backward scale 1:
                       one micro-batch, no loss scaling),
and <name>.meta.json the configuration used.

Weights are Megatron's module layout filled from a fixed torch generator (norm weights 1 + 0.1 N,
everything else 0.02 N) so every term is exercised; the loss mask has zeros inside and at the
end of the sequences so the rolled masks differ from the original.

Run on the GPU machine (torch 2.11 with CUDA, numpy), from the repository root, with Megatron-LM
at .oracle/Megatron-LM (git -C .oracle clone or `git --git-dir=<mirror> archive HEAD | tar -x -C
.oracle/Megatron-LM`):
    python3 tests/reference/mtp/generate_mtp_fixture.py
Megatron's core needs a few pure-Python packages (einops, packaging; pip install them if the
import fails). Prints the Megatron-LM commit it used (from .oracle/Megatron-LM/.git, or
MEGATRON_LM_COMMIT for an exported tree); put it in tests/reference/mtp/README.md.

Without Transformer Engine (no-TE shim, `shim_inference_linear_check`): Megatron replaces the
missing `transformer_engine` module by a MagicMock, so its inference-optimized linears
(tensor_parallel/inference_layers.py: `class InferenceColumnParallelLinear(TEColumnParallelLinear)`
and `InferenceLayerNormColumnParallelLinear`) become MagicMock instances instead of classes, and
`is_inference_column_parallel_linear`'s `isinstance(module, (those two))`, which
MultiTokenPredictionLayer.__init__ calls on eh_proj and on the inner layer's modules, raises
TypeError. The shim rebinds those two module-level names to empty classes, so the isinstance is
well-defined and False for every module, which is what Megatron with TE answers for the local
spec's ColumnParallelLinear. The True branch would only call set_barrier_before_all_gather(True)
on an inference linear (a symmetric-memory all-gather flag; those classes assert TE in their
constructors), so no number of this forward/backward changes; no Megatron file is edited.
"""
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
MEGATRON = os.environ.get("MEGATRON_LM", os.path.join(REPO, ".oracle", "Megatron-LM"))
sys.path.insert(0, MEGATRON)
sys.path.insert(0, os.path.join(REPO, "tests", "reference", "model"))

import fixture_io  # noqa: E402

fixture_io.DATA_DIR = os.path.join(HERE, "data")

from megatron.core import parallel_state, tensor_parallel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: E402
    get_gpt_decoder_block_spec,
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.tensor_parallel import inference_layers  # noqa: E402
from megatron.core.transformer.multi_token_prediction import (  # noqa: E402
    MTPLossAutoScaler,
    MTPLossLoggingHelper,
)
from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker  # noqa: E402
from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

VARIANTS = {
    # GPT-style (LayerNorm, erf GeLU, biases, tied output layer) with RoPE: Megatron refuses MTP
    # with learned absolute positions.
    "gpt_d1": dict(normalization="LayerNorm", swiglu=False, bias=True, tied=True, groups=4, mtp=1, factor=0.3),
    "gpt_d2": dict(normalization="LayerNorm", swiglu=False, bias=True, tied=True, groups=4, mtp=2, factor=0.3),
    # LLaMA-style: RMSNorm, SwiGLU, no biases, untied, grouped-query attention.
    "llama_d2": dict(normalization="RMSNorm", swiglu=True, bias=False, tied=False, groups=2, mtp=2, factor=0.1),
    # LLaMA-style with MoE (4 SwiGLU experts of 64, top-2, aux loss + z-loss, a dense first layer by
    # moe_layer_freq [0, 1]): the MTP layers take the last (MoE) decoder layer's spec
    # (get_gpt_mtp_block_spec), so their routers and experts get gradients, and the aux / z losses of
    # the MTP layers are tracked at layers L + 1 .. L + D.
    "llama_moe_d2": dict(normalization="RMSNorm", swiglu=True, bias=False, tied=False, groups=2, mtp=2, factor=0.1,
                         moe=dict(num_moe_experts=4, moe_ffn_hidden_size=64, moe_router_topk=2,
                                  moe_layer_freq=[0, 1], moe_aux_loss_coeff=0.05, moe_z_loss_coeff=0.01,
                                  moe_token_dispatcher_type="allgather")),
}
L, H, HEADS, FFN, V, S, B = 2, 64, 4, 128, 128, 16, 2
SHIMMED = []  # names rebound by shim_inference_linear_check (recorded in each meta.json)


def megatron_commit():
    if os.environ.get("MEGATRON_LM_COMMIT"):  # an exported tree (git archive) has no .git
        return os.environ["MEGATRON_LM_COMMIT"]
    if not os.path.exists(os.path.join(MEGATRON, ".git")):
        return "unknown"
    try:
        return subprocess.check_output(["git", "-C", MEGATRON, "rev-parse", "HEAD"], text=True).strip()
    except Exception:
        return "unknown"


# Names in megatron/core/tensor_parallel/inference_layers.py that is_inference_column_parallel_linear
# passes to isinstance (module docstring: no-TE shim).
_INFERENCE_LINEARS = ("InferenceColumnParallelLinear", "InferenceLayerNormColumnParallelLinear")


def shim_inference_linear_check():
    """Makes Megatron's is_inference_column_parallel_linear well-defined without Transformer Engine.

    Rebinds each name of _INFERENCE_LINEARS in megatron.core.tensor_parallel.inference_layers that
    is not a class (without TE it is a MagicMock instance: its base TEColumnParallelLinear /
    TELayerNormColumnParallelLinear subclasses the MagicMock standing in for transformer_engine)
    to an empty class of the same name, so isinstance against it is False. A no-op where TE is
    installed. Returns the rebound names; raises RuntimeError if the check still fails (Megatron
    changed what it tests), so the fixtures are never written by a half-patched Megatron.
    """
    rebound = []
    for name in _INFERENCE_LINEARS:
        if not isinstance(getattr(inference_layers, name), type):
            setattr(inference_layers, name, type(name, (), {"__doc__": "no-TE stand-in: never instantiated"}))
            rebound.append(name)
    try:
        probe = inference_layers.is_inference_column_parallel_linear(torch.nn.Linear(1, 1))
    except TypeError as e:
        raise RuntimeError(f"Megatron's is_inference_column_parallel_linear still fails after the no-TE shim: {e}")
    if probe:
        raise RuntimeError("is_inference_column_parallel_linear(torch.nn.Linear) is True after the no-TE shim")
    return rebound


def init_distributed():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)


def build(v):
    cfg = TransformerConfig(
        num_layers=L,
        hidden_size=H,
        num_attention_heads=HEADS,
        num_query_groups=v["groups"],
        ffn_hidden_size=FFN,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        normalization=v["normalization"],
        layernorm_epsilon=1e-5,
        add_bias_linear=v["bias"],
        gated_linear_unit=v["swiglu"],
        activation_func=F.silu if v["swiglu"] else F.gelu,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        cross_entropy_loss_fusion=False,
        attention_softmax_in_fp32=True,
        init_method_std=0.02,
        params_dtype=torch.float32,
        use_cpu_initialization=True,
        mtp_num_layers=v["mtp"],
        mtp_loss_scaling_factor=v["factor"],
        **v.get("moe", {}),
    )
    if "moe" in v:  # per-layer dense / MoE specs, as pretrain_gpt builds them for --num-experts
        layer_spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=v["normalization"])
    else:
        layer_spec = get_gpt_layer_local_spec(normalization=v["normalization"])
    mtp_spec = get_gpt_mtp_block_spec(cfg, layer_spec, use_transformer_engine=False)
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=layer_spec,
        vocab_size=V,
        max_sequence_length=S,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=v["tied"],
        position_embedding_type="rope",
        mtp_block_spec=mtp_spec,
    )
    return model.cuda()


def ours(name):
    """Megatron's named_parameters() name -> ours (= its MTP checkpoint key)."""
    return name.replace(".mtp_model_layer.", ".transformer_layer.")


def fill_weights(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            is_norm = name.endswith("norm.weight")
            p.copy_(1.0 + 0.1 * r if is_norm else 0.02 * r)


def batch(seed):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (B, S), generator=gen)
    labels = torch.randint(0, V, (B, S), generator=gen)
    mask = (torch.rand((B, S), generator=gen) > 0.2).float()
    mask[0, -1] = 0.0  # a masked last position ...
    mask[1, 5] = 0.0   # ... and one inside
    position_ids = torch.arange(S).unsqueeze(0).expand(B, S).contiguous()
    return tokens, labels, mask, position_ids


def run(name, v, seed):
    model = build(v)
    model.train()
    fill_weights(model, seed)
    tokens, labels, mask, pos = batch(seed + 1)
    # A fresh tracker: save_metrics_to_tracker sizes loss_values [D] on first use only, and D
    # changes between variants (clean_metrics_in_tracker zeroes but keeps the old size).
    MTPLossLoggingHelper.tracker.clear()
    # Main-loss backward scale 1 (one micro-batch, no loss scaling): each MTP module's
    # factor / D * sum(loss_k * mask_k) / sum(mask_k) enters the gradient with weight 1.
    MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0, device="cuda"))
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0, device="cuda"))
    get_moe_metrics_tracker().metrics.clear()
    losses = model(
        tokens.cuda(), pos.cuda(), None, labels=labels.cuda(), loss_mask=mask.cuda()
    )  # [b, s] per-token loss of the main model
    m = mask.cuda()
    lm_loss = (losses.float() * m).sum() / m.sum()
    lm_loss.backward()
    mtp_loss = MTPLossLoggingHelper.tracker["loss_values"].detach().cpu().clone()
    MTPLossLoggingHelper.clean_metrics_in_tracker()

    out = {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": mask,
        "position_ids": pos,
        "lm_loss": lm_loss.detach().cpu().reshape(1),
        "mtp_loss": mtp_loss,
    }
    # MoE variants: the tracked per-layer values (loss / coeff) of this forward, [L + D].
    for mname, entry in get_moe_metrics_tracker().metrics.items():
        out["moe." + mname] = entry.values.detach().cpu().float().clone()
    for pname, p in model.named_parameters():
        out["param." + ours(pname)] = p.detach().cpu()
        assert p.grad is not None, f"{pname} got no gradient"
        out["grad." + ours(pname)] = p.grad.detach().cpu()
    fixture_io.write_fixture(name, out)
    meta = dict(v, num_layers=L, hidden_size=H, num_attention_heads=HEADS, ffn_hidden_size=FFN, vocab_size=V,
                seq_length=S, micro_batch_size=B, seed=seed, megatron_lm_commit=megatron_commit(),
                torch=torch.__version__, lm_loss=lm_loss.item(), mtp_loss=mtp_loss.tolist(),
                no_te_shim=SHIMMED)
    with open(os.path.join(fixture_io.DATA_DIR, name + ".meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    print(name, "lm loss", lm_loss.item(), "mtp losses", mtp_loss.tolist())


def main():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (before any GEMM)
    assert torch.cuda.is_available(), "Megatron's MTP logging helper allocates on the current CUDA device"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    global SHIMMED
    start = time.time()
    SHIMMED = shim_inference_linear_check()
    init_distributed()
    print("Megatron-LM", megatron_commit(), "torch", torch.__version__,
          "no-TE shim:", ", ".join(SHIMMED) if SHIMMED else "not needed")
    for i, (name, v) in enumerate(VARIANTS.items()):
        run(name, v, 1000 + 10 * i)
    torch.distributed.destroy_process_group()
    print(f"wrote {len(VARIANTS)} fixtures to {fixture_io.DATA_DIR} in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
