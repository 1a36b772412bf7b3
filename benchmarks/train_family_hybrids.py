"""Train one small hybrid per recurrent family beyond Gated DeltaNet on the standard-library corpus of
train_stdlib_hybrid.py, to set each family's leak on trained weights beside the same model with random weights
(benchmarks/trained_vs_random_families.py). Each model: the target's width (d 192, 4 heads of 48, MLP 512), three
recurrent layers to one attention layer, dense MLPs; transformers builds and trains it (its PyTorch paths), ddsim
reads the checkpoint. Families and their architectures: kda (kimi_linear: KDA + MLA), lightning (minimax), mamba1
(jamba), conv (lfm2: gated short convolutions).

    python benchmarks/train_stdlib_hybrid.py corpus --lib /usr/lib/python3.11 --out .corpus
    python benchmarks/train_family_hybrids.py --corpus .corpus --out .trained [--families kda,lightning,mamba1,conv]
        [--device cpu] [--steps 600] [--batch 16] [--max-minutes 8]

Each model is saved twice under OUT/<family>: trained/ (the weights with the best held-out perplexity) and
random/ (the same config at transformers' initialisation, seed 0), with the corpus's tokenizer, and
OUT/train-log.json records steps, seconds and held-out perplexities.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.train_stdlib_hybrid import SEQ, VOCAB, perplexity, train_one

D = dict(vocab_size=VOCAB, hidden_size=192, num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=4096,
         tie_word_embeddings=False, use_cache=False)
TYPES = ["linear_attention"] * 3 + ["full_attention"]


def config(family: str):
    import transformers
    if family == "kda":
        return transformers.KimiLinearConfig(**D, num_key_value_heads=4, intermediate_size=512, layer_types=TYPES,
                                             mlp_layer_types=["dense"] * 4, linear_num_heads=4, linear_head_dim=32,
                                             kv_lora_rank=64, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                             v_head_dim=48, num_local_experts=1, num_experts_per_tok=1, pad_token_id=0,
                                             bos_token_id=1, eos_token_id=2)
    if family == "lightning":
        return transformers.MiniMaxConfig(**D, num_key_value_heads=2, head_dim=48, intermediate_size=512,
                                          layer_types=TYPES, num_local_experts=1, num_experts_per_tok=1, block_size=64)
    if family == "mamba1":
        return transformers.JambaConfig(**D, num_key_value_heads=2, intermediate_size=512, attn_layer_period=4,
                                        attn_layer_offset=3, num_experts=1, mamba_d_state=16, mamba_d_conv=4,
                                        mamba_expand=2, mamba_dt_rank=12, use_mamba_kernels=False)
    if family == "conv":
        return transformers.Lfm2Config(**D, num_key_value_heads=2, intermediate_size=512, block_auto_adjust_ff_dim=False,
                                       layer_types=["conv"] * 3 + ["full_attention"], conv_L_cache=3)
    raise ValueError(f"--families: unknown family {family!r} (kda, lightning, mamba1, conv)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--families", default="kda,lightning,mamba1,conv")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-minutes", type=float, default=8.0)
    a = ap.parse_args()
    families = a.families.split(",")
    try:
        for f in families:
            config(f)  # every name checked before any training
        if not (a.corpus / "tokens.pt").is_file():
            raise ValueError(f"--corpus: no tokens.pt in {a.corpus} (run train_stdlib_hybrid.py corpus first)")
    except ValueError as e:
        print(f"train_family_hybrids: {e}", file=sys.stderr)
        sys.exit(2)
    import transformers
    torch.use_deterministic_algorithms(True, warn_only=True)
    tokens = torch.load(a.corpus / "tokens.pt")
    log_path = a.out / "train-log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    log.update(device=a.device, torch=torch.__version__, transformers=transformers.__version__,
               date=time.strftime("%Y-%m-%d"), seq=SEQ)
    for f in families:
        cfg = config(f)

        def build(arch, seed, _cfg=cfg):
            torch.manual_seed(seed)
            return transformers.AutoModelForCausalLM.from_config(_cfg)
        rand = build(None, 0)
        rand_ppl = perplexity(rand.to(a.device), tokens["val"], a.device)
        d = a.out / f
        rand.float().cpu().save_pretrained(d / "random", safe_serialization=True)
        import benchmarks.train_stdlib_hybrid as tsh
        real_model, tsh._model = tsh._model, build
        try:
            model = train_one(f, None, 0, tokens, a.device, steps=a.steps, batch=a.batch, lr=3e-3, log=log,
                              max_minutes=a.max_minutes)
        finally:
            tsh._model = real_model
        model.float().cpu().save_pretrained(d / "trained", safe_serialization=True)
        for sub in ("random", "trained"):
            (d / sub / "tokenizer.json").write_bytes((a.corpus / "tokenizer.json").read_bytes())
        log[f].update(model_type=cfg.model_type, device=a.device, torch=torch.__version__,
                      transformers=transformers.__version__, date=time.strftime("%Y-%m-%d"))
        log[f]["random_val_perplexity_seed0"] = round(rand_ppl, 3)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(json.dumps(log, indent=1) + "\n")


if __name__ == "__main__":
    main()
