"""The audit of a preset with its MoE layers made dense (num_experts = 0: every layer runs the preset's dense MLP of
intermediate_size), everything else as the preset has it. An MoE router picks its experts by comparing scores, so a
bf16 fast path can pick other experts than the fp32 oracle for a few tokens, and each such pick moves that token's
hidden state by a whole expert's output: this separates that from the rest of the model's arithmetic when an
MoE preset's exact path sits far from the oracle. The dense variant is registered as "<preset>-dense" and audited
through the command line (every other argument passed on).

    python benchmarks/audit_dense_variant.py --preset kimi-linear-48b-a3b --device cuda --budget 16,64 --steps 3
"""
import sys

from ddsim import cli
from ddsim.errors import ConfigError
from ddsim.model import config

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--preset" not in argv or argv.index("--preset") + 1 >= len(argv):
        print("audit_dense_variant: --preset NAME is required", file=sys.stderr)
        sys.exit(2)
    i = argv.index("--preset") + 1
    try:
        base = config.get_preset(argv[i])
    except ConfigError as e:
        print(f"audit_dense_variant: {e}", file=sys.stderr)
        sys.exit(2)
    dense = base.replace(name=base.name + "-dense", num_experts=0, notes=base.notes + " (MoE layers made dense)")
    config.PRESETS[dense.name] = dense
    argv[i] = dense.name
    sys.exit(cli.main(["audit", *argv]))
