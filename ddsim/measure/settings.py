"""What an audit is asked to do, checked before any work starts: one typed definition the command
line fills, the audit runs and report.json records (its ``config``).

Every bound below is stated so that a bad option is refused up front with one line naming it,
instead of growing memory until the process is killed or meaning something else than asked.
No torch here: the gate and the report loader import this without loading a model stack.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ddsim.errors import InputError

MAX_BUDGET = 1024  # DDTree's published speedup peaked at a budget of 512
MAX_STEPS = 4096
MAX_DEPTH = 64
MAX_PROMPTS = 4096
MAX_PROMPT_LEN = 1 << 20
MAX_TEMPERATURE = 100.0

# the command-line option behind each field, for error lines
OPTION = {"preset": "--preset", "model_path": "--model", "budgets": "--budget", "topk_cap": "--topk-cap",
          "steps": "--steps", "n_prompts": "--prompts", "prompt_len": "--prompts", "prompts_file": "--prompts",
          "temperature": "--temperature", "seed": "--seed", "device": "--device", "depth": "--depth",
          "trace": "--trace", "drafter_model": "--drafter-model", "cost_file": "--cost", "fast_path": "--fast-path",
          "convention": "--convention", "devices": "--devices", "sampler": "--sampler",
          "sampler_params": "--sampler-param", "measure_steps": "--measure-steps"}
# the rules an audit can sample with (ddsim.sampling.rules; those with an exact law on a fixed tree) and
# each one's parameters with their allowed range
SAMPLERS = {"gumbel": {}, "sglang": {"threshold_single": (0.0, 1.0), "threshold_acc": (0.0, 1.0)}, "eagle": {},
            "ddtree": {}, "typical": {"posterior_threshold": (0.0, 1.0), "posterior_alpha": (0.0, 10.0)}}


class AuditConfig(BaseModel):
    """The audit's options. Constructing one validates every field (see ``OPTION`` for the flags)."""
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    preset: str = "tiny"
    model_path: str | None = None  # a Hugging Face checkpoint directory instead of a preset
    budgets: list[Annotated[int, Field(ge=1, le=MAX_BUDGET)]] = Field(default_factory=lambda: [16, 32, 64], min_length=1)
    topk_cap: Annotated[int, Field(ge=1)] | None = None
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 8  # speculative steps per generation
    n_prompts: Annotated[int, Field(ge=1, le=MAX_PROMPTS)] = 3
    prompt_len: Annotated[int, Field(ge=1, le=MAX_PROMPT_LEN)] = 16
    prompts_file: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)] = 0.0
    seed: Annotated[int, Field(ge=0, lt=1 << 63)] = 0
    device: str = "auto"  # cuda where there is one, else cpu
    devices: str | None = None  # a layer placement over several GPUs (ddsim.model.placement), e.g. "cuda:0,cuda:1"
    depth: Annotated[int, Field(ge=1, le=MAX_DEPTH)] = 8  # drafter depth
    trace: str | None = None
    drafter_model: str | None = None  # a draft checkpoint run autoregressively (ddsim.sim.drafters.ModelDrafter)
    cost_file: str | None = None
    fast_path: str = "ddsim"  # ddsim, fla or MODULE:FUNCTION: the GDN kernel the fast path runs
    convention: Literal["ddsim", "sglang", "vllm", "fla"] | None = None  # a MODULE:FUNCTION fast path's calling convention
    # temperature > 0: the acceptance rule (None: ddsim's coupled Gumbel walk) and its parameters
    sampler: Literal["gumbel", "sglang", "eagle", "ddtree", "typical"] | None = None
    sampler_params: dict[str, float] = Field(default_factory=dict)
    # time each mode's decoding step as the serving model runs it (ddsim.measure.step_timing): auto = on CUDA
    measure_steps: Literal["auto", "on", "off"] = "auto"

    @model_validator(mode="after")
    def _sampler(self):
        if self.sampler is not None and self.temperature == 0:
            raise ValueError(f"--sampler {self.sampler}: a sampler decides at temperature > 0 only (--temperature 0 "
                             "accepts greedily)")
        if self.sampler_params and self.temperature == 0:
            raise ValueError(f"--sampler-param {next(iter(self.sampler_params))}: a sampler decides at temperature > 0 "
                             "only (--temperature 0 accepts greedily)")
        known = SAMPLERS[self.sampler or "gumbel"]
        for k, v in self.sampler_params.items():
            if k not in known:
                raise ValueError(f"--sampler-param {k}: not a parameter of the {self.sampler or 'gumbel'} sampler "
                                 f"({', '.join(known) or 'it takes none'})")
            lo, hi = known[k]
            if not (lo < v <= hi):
                raise ValueError(f"--sampler-param {k}={v:g}: expected a value in ({lo:g}, {hi:g}]")
        return self

    @model_validator(mode="before")
    @classmethod
    def _placement(cls, d):
        """With --devices and --device left at its default, the audit's device is the first listed."""
        if isinstance(d, dict) and d.get("devices") and d.get("device", "cpu") in ("cpu", "auto", "cuda"):
            d = {**d, "device": str(d["devices"]).split(",")[0].strip()}
        return d

    @field_validator("budgets")
    @classmethod
    def _distinct(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"budgets repeat ({v}); each budget is audited once")
        return v

    @classmethod
    def build(cls, **kw) -> "AuditConfig":
        """Like the constructor, but a bad value is an InputError naming the command-line option."""
        try:
            return cls(**kw)
        except ValidationError as e:
            err = e.errors()[0]
            if not err["loc"]:  # a rule across fields: its message names the options
                raise InputError(err["msg"].removeprefix("Value error, ")) from None
            field = str(err["loc"][0])
            value = kw.get(field)
            if isinstance(value, float) and not math.isfinite(value):
                why = "expected a finite number"
            else:
                why = err["msg"].removeprefix("Value error, ")
            raise InputError(f"{OPTION.get(field, field)}: {why}, got {value!r}") from None
