#!/usr/bin/env python3
"""What Megatron-LM's own GPT dataset code feeds the model, one line per sample, in the format of
our MEGATRON_DUMP_SAMPLES=1 (megatron/core/datasets sample_digest, docs/environment.md), so that
the two lists can be diffed. Run on the GPU machine (torch + numpy), Megatron-LM on PYTHONPATH.

  megatron_samples.py dataset [--seq-length 64] [--seed 1234] [--vocab-size 127] [--num-samples 40]
                              [--cache DIR]
      Builds the --mock-data train dataset as pretrain_gpt.py does for the torch_dist oracle's
      flags (BlendedMegatronDatasetBuilder(MockGPTDataset, [num_samples, 0, 0], ...), NullTokenizer,
      no --reset-*/--eod-mask-loss, --data-cache-path DIR) and prints samples 0..num_samples-1 and
      the dataset's description hash (the cache files' name prefix, for a check against the cache
      a training run wrote).

  megatron_samples.py run PRETRAIN_GPT_PY [ARGS...]
      Runs PRETRAIN_GPT_PY as __main__ with ARGS (under torchrun, as pretrain_gpt.py itself),
      GPTDataset.__getitem__ wrapped to print the line of every sample the data loader fetches
      (stderr, one write per line; DataLoader workers are forked and inherit the wrapper). The
      samples are returned unchanged. Also installs shim_distopt_load_without_apex_or_te (below):
      test harness only, no Megatron-LM file is changed.

  megatron_samples.py self-test
      Checks shim_distopt_load_without_apex_or_te on stand-ins of Megatron-LM's module (CPU, no
      torch): a no-op with Transformer Engine / Apex, the load template on an empty state, refused
      on an inconsistent one, Megatron's own state_dict() on a non-empty state.

Line: SAMPLE <split> <idx> tokens=<...> labels=<...> loss_mask_zero=<positions|-> position_ids=<arange|...>
"""
import argparse
import os
import runpy
import sys


def digest(split, idx, s):
    """The line for sample `s` (a GPTDataset.__getitem__ dict) at dataset index idx."""
    t = [int(v) for v in s["tokens"].tolist()]
    lab = [int(v) for v in s["labels"].tolist()]
    zero = [i for i, v in enumerate(s["loss_mask"].tolist()) if float(v) == 0.0]
    pos = [int(v) for v in s["position_ids"].tolist()]
    j = lambda v: ",".join(str(x) for x in v)  # noqa: E731
    return (f"SAMPLE {split} {idx} tokens={j(t)} labels={j(lab)} loss_mask_zero={j(zero) if zero else '-'} "
            f"position_ids={'arange' if pos == list(range(len(pos))) else j(pos)}")


def wrap_getitem():
    from megatron.core.datasets.gpt_dataset import GPTDataset

    orig = GPTDataset.__getitem__

    def getitem(self, idx):
        s = orig(self, idx)
        os.write(2, (digest(self.index_split.name, idx, s) + "\n").encode())
        return s

    GPTDataset.__getitem__ = getitem


def shim_distopt_load_without_apex_or_te():
    """Lets Megatron-LM's DistributedOptimizer load a checkpoint when neither Transformer Engine
    nor Apex is installed (the oracle's machine). Test harness only, a no-op when
    distrib_optimizer.HAVE_APEX_OR_TE is True.

    Why: at load time, sharded_state_dict(is_loading=True) calls state_dict() before any step,
    and its non-Apex/TE branch reads the step from the torch optimizer's per-param state, which
    is still empty then (`steps = [s["step"] ... for s in state.values()]`, `assert len(steps) ==
    1` fails). The TE/Apex branch handles an empty state (no step found). This wrapper returns,
    for an empty state only, what state_dict() builds there, with step 0.0 in every param group
    (what torch's fresh Adam counts, and what the non-Apex load_state_dict() needs: it reads
    g["step"] of every group into a float tensor; None would fail there). That state dict is only
    the template of the load: dist_checkpointing.load returns the checkpoint's common state
    merged with the loaded tensors (serialization.py load: merge(common_state_dict, ...)), and
    checkpointing.py load_checkpoint then calls optimizer.load_state_dict(state_dict['optimizer'])
    with the checkpoint's param groups, whose "step" (written by every saver: Megatron's own
    non-Apex state_dict() and megatron.cpp's writer) becomes each param's torch "step" in
    DistributedOptimizer.load_state_dict. With a non-empty state (every save) Megatron's own
    state_dict() runs unchanged."""
    from megatron.core.optimizer import distrib_optimizer as do

    if do.HAVE_APEX_OR_TE:
        return
    orig = do.DistributedOptimizer.state_dict

    def state_dict(self):
        if len(self.optimizer.state) > 0:
            return orig(self)
        inner = self.optimizer.state_dict()
        assert not inner["state"], "shim_distopt_load_without_apex_or_te: acts on an empty optimizer state only"
        out = {"optimizer": {k: v for k, v in inner.items() if k != "state"}}
        for group in out["optimizer"]["param_groups"]:
            del group["params"]
            group["step"] = 0.0
        if self.grad_scaler:
            out["grad_scaler"] = self.grad_scaler.state_dict()
        os.write(2, b"megatron_samples.py: DistributedOptimizer.state_dict() of an empty state (load template, "
                    b"step 0.0; the checkpoint's step replaces it)\n")
        return out

    do.DistributedOptimizer.state_dict = state_dict


def self_test():
    """shim_distopt_load_without_apex_or_te on stand-ins of megatron.core.optimizer.distrib_optimizer
    (the attributes it uses: HAVE_APEX_OR_TE, DistributedOptimizer.state_dict, .optimizer with
    torch's .state / .state_dict(), .grad_scaler)."""
    import types

    names = ["megatron", "megatron.core", "megatron.core.optimizer", "megatron.core.optimizer.distrib_optimizer"]
    saved = {n: sys.modules.get(n) for n in names}
    for n in names:
        sys.modules[n] = types.ModuleType(n)
    for parent, child in zip(names, names[1:]):
        setattr(sys.modules[parent], child.rsplit(".", 1)[1], sys.modules[child])
    do = sys.modules[names[-1]]
    try:
        class Torch:  # torch.optim.AdamW's state / state_dict() of two groups over params 0, 1, 2
            def __init__(self, state, listed=None):
                self.state, self.listed = state, state if listed is None else listed

            def state_dict(self):
                return {"state": dict(self.listed), "param_groups": [{"lr": 1e-3, "params": [0, 1]},
                                                                      {"lr": 1e-3, "params": [2]}]}

        class Scaler:
            def state_dict(self):
                return {"scale": 1.0}

        class DistributedOptimizer:
            grad_scaler = None

            def state_dict(self):
                return "megatron"

        do.DistributedOptimizer, do.HAVE_APEX_OR_TE = DistributedOptimizer, True
        shim_distopt_load_without_apex_or_te()
        o = DistributedOptimizer()
        o.optimizer = Torch({})
        assert o.state_dict() == "megatron", "must be a no-op with TE / Apex"
        do.HAVE_APEX_OR_TE = False
        shim_distopt_load_without_apex_or_te()
        assert o.state_dict() == {"optimizer": {"param_groups": [{"lr": 1e-3, "step": 0.0}, {"lr": 1e-3, "step": 0.0}]}}
        o.grad_scaler = Scaler()
        assert o.state_dict()["grad_scaler"] == {"scale": 1.0}
        o.optimizer = Torch({0: {"step": 5.0}})
        assert o.state_dict() == "megatron", "a non-empty state must reach Megatron's own state_dict()"
        o.optimizer = Torch({}, listed={0: {"step": 5.0}})
        try:
            o.state_dict()
            raise SystemExit("FAIL: an inconsistent state was accepted")
        except AssertionError:
            pass
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    print("OK: shim_distopt_load_without_apex_or_te (no-op with TE/Apex, load template, Megatron's own otherwise)")


def dataset(a):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
    from megatron.core.tokenizers import MegatronTokenizer

    # pretrain_gpt.py's build_tokenizer for --tokenizer-type NullTokenizer --vocab-size V
    # (null_tokenizer_pad_id default -1, eod = V - 1).
    tok = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=a.vocab_size,
                                            pad_id=-1)
    # core_gpt_dataset_config_from_args with the oracle's flags (argument defaults elsewhere).
    cfg = GPTDatasetConfig(random_seed=a.seed, sequence_length=a.seq_length, blend=None, blend_per_split=None,
                           split=None, path_to_cache=a.cache, tokenizer=tok, reset_position_ids=False,
                           reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=True,
                           mid_level_dataset_surplus=0.005, allow_ambiguous_pad_tokens=False)
    train, _, _ = BlendedMegatronDatasetBuilder(MockGPTDataset, [a.num_samples, 0, 0], lambda: True, cfg).build()
    print(f"description hash {train.unique_description_hash} (len {len(train)}, pad id {train._pad_token_id}, "
          f"eod {tok.eod}, vocab {tok.vocab_size})")
    for i in range(a.num_samples):
        print(digest("train", i, train[i]))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        script = os.path.abspath(sys.argv[2])
        sys.argv = [script] + sys.argv[3:]
        sys.path.insert(0, os.path.dirname(script))
        wrap_getitem()
        shim_distopt_load_without_apex_or_te()
        runpy.run_path(script, run_name="__main__")
        return
    if sys.argv[1:] == ["self-test"]:
        self_test()
        return
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["dataset"])
    p.add_argument("--seq-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--vocab-size", type=int, default=127)
    p.add_argument("--num-samples", type=int, default=40)
    p.add_argument("--cache", default=None)
    dataset(p.parse_args())


if __name__ == "__main__":
    main()
