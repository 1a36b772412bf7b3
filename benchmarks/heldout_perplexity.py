"""The held-out perplexity of a saved transformers checkpoint on the standard-library corpus of
train_stdlib_hybrid.py (its validation tokens, the training script's own measure), e.g. to re-measure
weights kept by a run whose log did not come back:

    python -m benchmarks.heldout_perplexity --model .trained/mamba1/trained --corpus .corpus [--device cpu]
"""
import argparse
import sys
from pathlib import Path

import torch

from benchmarks.train_stdlib_hybrid import perplexity


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--corpus", required=True, type=Path)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    for what, path in (("--model", a.model / "config.json"), ("--corpus", a.corpus / "tokens.pt")):
        if not path.is_file():
            print(f"heldout_perplexity: {what}: no {path.name} in {path.parent}", file=sys.stderr)
            sys.exit(2)
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(a.device)
    with torch.no_grad():
        print(f"{a.model}: held-out perplexity {perplexity(model, torch.load(a.corpus / 'tokens.pt')['val'], a.device):.3f}")


if __name__ == "__main__":
    main()
