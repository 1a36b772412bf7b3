"""Train ddsim's default audit model: a small Qwen3.5-architecture hybrid (3 Gated DeltaNet layers to 1
attention layer, conv, gates, gated norm, GQA, partial RoPE) and a smaller drafter of the same
architecture (one GDN and one attention layer), on real text every machine with CPython has without a download: the Python standard
library's own top-level modules (Lib/*.py), with a byte-level BPE tokenizer trained on that corpus.

Two steps, both deterministic (fixed seeds, sorted files, one data order):

    # CPU: the corpus (every 20th file held out), the tokenizer, the token ids
    python benchmarks/train_stdlib_hybrid.py corpus --lib /usr/lib/python3.11 --out .corpus
    # one GPU (or the CPU, slowly): both models, saved as Hugging Face checkpoint directories
    python benchmarks/train_stdlib_hybrid.py train --corpus .corpus --out ddsim/models --device cuda

The train step prints the loss curve and the held-out perplexity every 200 steps, keeps the weights
with the best held-out perplexity (the corpus is small: both models overfit it if trained on),
compares them against a unigram baseline and against the same architecture with random weights, and
writes train-log.json beside the models.
transformers builds and trains the models (a test/benchmark dependency; ddsim reads the checkpoints
itself).
"""
import argparse
import hashlib
import json
import math
import time
from pathlib import Path

import torch

VOCAB = 2048
SEQ = 256
EOT = "<|endoftext|>"

TARGET = dict(hidden_size=192, num_hidden_layers=4, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
              head_dim=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
              linear_value_head_dim=32)
DRAFTER = dict(hidden_size=128, num_hidden_layers=2, intermediate_size=320, num_attention_heads=2, num_key_value_heads=1,
               head_dim=64, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
               linear_value_head_dim=32)


def build_corpus(lib: Path, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    files = sorted(p for p in lib.glob("*.py") if p.is_file())
    texts = [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in files]
    val = [t for i, t in enumerate(texts) if i % 20 == 7]
    train = [t for i, t in enumerate(texts) if i % 20 != 7]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([t for _, t in train], trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    eot = tok.token_to_id(EOT)

    def ids(part):
        seq = []
        for _, text in part:
            seq += tok.encode(text).ids + [eot]
        return torch.tensor(seq, dtype=torch.int16)
    torch.save({"train": ids(train), "val": ids(val)}, out / "tokens.pt")
    digest = hashlib.sha256("".join(f"{n}\0{t}\0" for n, t in texts).encode()).hexdigest()
    meta = {"lib": str(lib), "files": len(texts), "train_files": [n for n, _ in train], "val_files": [n for n, _ in val],
            "bytes": sum(len(t.encode()) for _, t in texts), "sha256": digest, "vocab_size": tok.get_vocab_size()}
    (out / "corpus.json").write_text(json.dumps(meta, indent=1))
    print(f"corpus: {len(texts)} files, {meta['bytes']} bytes, sha256 {digest[:16]}; tokens train "
          f"{len(torch.load(out / 'tokens.pt')['train'])}, val {len(torch.load(out / 'tokens.pt')['val'])}")


def _model(arch: dict, seed: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    torch.manual_seed(seed)
    n = arch["num_hidden_layers"]
    types = ["full_attention" if (i + 1) % 4 == 0 or (n < 4 and i == n - 1) else "linear_attention" for i in range(n)]
    cfg = Qwen3_5TextConfig(vocab_size=VOCAB, max_position_embeddings=4096, tie_word_embeddings=False, layer_types=types,
                            use_cache=False,
                            rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
                            **arch)
    return Qwen3_5ForCausalLM(cfg)


@torch.no_grad()
def perplexity(model, val: torch.Tensor, device) -> float:
    model.eval()
    n = (len(val) - 1) // SEQ
    x = val[: n * SEQ + 1].long()
    tot, cnt = 0.0, 0
    for i in range(0, n, 32):
        rows = torch.stack([x[j * SEQ: j * SEQ + SEQ + 1] for j in range(i, min(n, i + 32))]).to(device)
        out = model(input_ids=rows[:, :-1], use_cache=False)
        loss = torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, VOCAB), rows[:, 1:].reshape(-1),
                                                 reduction="sum")
        tot, cnt = tot + float(loss), cnt + rows[:, 1:].numel()
    model.train()
    return math.exp(tot / cnt)


def unigram_perplexity(train: torch.Tensor, val: torch.Tensor) -> float:
    counts = torch.bincount(train.long(), minlength=VOCAB).double() + 1.0
    lp = (counts / counts.sum()).log()
    return math.exp(-float(lp[val.long()].mean()))


def train_one(name, arch, seed, tokens, device, *, steps, batch, lr, log, max_minutes):
    model = _model(arch, seed).to(device)
    params = sum(p.numel() for p in model.parameters())
    random_ppl = perplexity(model, tokens["val"], device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    data = tokens["train"].long()
    gen = torch.Generator().manual_seed(seed)
    curve, t0 = [], time.time()
    best = (math.inf, -1, None)
    for step in range(steps):
        if time.time() - t0 > 60 * max_minutes:  # the time cap: recorded, and the run is then not step-exact
            log.setdefault("stopped_early", {})[name] = step
            break
        frac = step / max(1, steps - 1)
        for g in opt.param_groups:  # warm-up, then cosine
            g["lr"] = lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        start = torch.randint(0, len(data) - SEQ - 1, (batch,), generator=gen)
        rows = torch.stack([data[s: s + SEQ + 1] for s in start.tolist()]).to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=str(device).startswith("cuda")):
            out = model(input_ids=rows[:, :-1], use_cache=False)
        loss = torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, VOCAB), rows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            point = {"step": step, "loss": round(float(loss), 4), "seconds": round(time.time() - t0, 1)}
            if step % 200 == 0 or step == steps - 1:  # held-out perplexity; the best weights are kept
                point["val_perplexity"] = round(perplexity(model, tokens["val"], device), 3)
                if point["val_perplexity"] < best[0]:
                    best = (point["val_perplexity"], step, {k: v.detach().clone() for k, v in model.state_dict().items()})
            curve.append(point)
            print(f"{name} step {step} loss {float(loss):.4f} val ppl {point.get('val_perplexity', '-')} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    model.load_state_dict(best[2])  # early stopping on the held-out files: the small corpus overfits
    ppl = perplexity(model, tokens["val"], device)
    log[name] = {"params": params, "steps": step + 1, "batch": batch, "seq": SEQ, "lr": lr, "seed": seed,
                 "train_seconds": round(time.time() - t0, 1), "val_perplexity": round(ppl, 3), "kept_step": best[1],
                 "random_init_val_perplexity": round(random_ppl, 3), "curve": curve}
    print(f"{name}: {params} parameters, held-out perplexity {ppl:.2f} (random init {random_ppl:.1f})", flush=True)
    return model


def train(corpus: Path, out: Path, device: str, steps: int, drafter_steps: int, max_minutes: float,
          only: str | None = None) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    tokens = torch.load(corpus / "tokens.pt")
    log = {"corpus": json.loads((corpus / "corpus.json").read_text()) | {"train_files": None, "val_files": None},
           "unigram_val_perplexity": round(unigram_perplexity(tokens["train"], tokens["val"]), 3),
           "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d")}
    print(f"unigram baseline: held-out perplexity {log['unigram_val_perplexity']:.2f}")
    for name, arch, seed, n, lr in (("hybrid-stdlib", TARGET, 0, steps, 3e-3),
                                    ("drafter-stdlib", DRAFTER, 1, drafter_steps, 3e-3)):
        if only and name != only:
            continue
        model = train_one(name, arch, seed, tokens, device, steps=n, batch=64, lr=lr, log=log, max_minutes=max_minutes)
        d = out / name
        model.float().cpu().save_pretrained(d, safe_serialization=True)
        (d / "tokenizer.json").write_bytes((corpus / "tokenizer.json").read_bytes())
    (out / f"train-log{'-' + only if only else ''}.json").write_text(json.dumps(log, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--lib", required=True, type=Path)
    c.add_argument("--out", required=True, type=Path)
    t = sub.add_parser("train")
    t.add_argument("--corpus", required=True, type=Path)
    t.add_argument("--out", required=True, type=Path)
    t.add_argument("--device", default="cuda")
    t.add_argument("--steps", type=int, default=3000)
    t.add_argument("--drafter-steps", type=int, default=2000)
    t.add_argument("--max-minutes", type=float, default=6.0, help="per model; a run that hits it says so in the log")
    t.add_argument("--only", choices=["hybrid-stdlib", "drafter-stdlib"], help="train one of the two")
    a = ap.parse_args()
    if a.cmd == "corpus":
        build_corpus(a.lib, a.out)
    else:
        train(a.corpus, a.out, a.device, a.steps, a.drafter_steps, a.max_minutes, a.only)


if __name__ == "__main__":
    main()
