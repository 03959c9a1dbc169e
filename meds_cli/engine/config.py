"""Typed run configuration: dataclasses, YAML files, `--set key=value` overrides.

Precedence, lowest first: dataclass defaults, each `--config FILE` in order, CLI shortcuts
(`--algo`, `--model`, ...), then each `--set section.key=value`. Unknown keys and values of the
wrong type are rejected with one line naming the key and the nearest valid one.

Every algorithm owns a config section named after it (`grpo:`, `dapo:`, `meds:` ...); those
sections come from the algorithm registry, so this module never lists algorithms itself.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from algorithms import ALGORITHMS
from algorithms.meds_features import check_layer_spec
from benchmarks.dataset_source import check_columns
from benchmarks.reasoning_gym_task import TASK_NAME as REASONING_GYM
from benchmarks.reasoning_gym_task import check_settings as check_reasoning_gym
from benchmarks.tasks import OPERATIONS, PROMPT_STYLES
from meds_cli.core.errors import UserError, nearest
from meds_cli.core.fields import Check, at_least, choice, doc, greater_than, require, validate_section
from meds_cli.core.files import read_user_text, replace_text
from meds_cli.engine.rollout.engines import check_engine_settings, engine_sections
from meds_cli.engine.rollout.tools.settings import ToolSettings
from meds_cli.engine.run_folders.trackers import parse_report_to
from meds_cli.engine.training.importance import IS_CORRECTIONS, truncation_of_sampler
from meds_cli.engine.training.packing import PADDING_FREE_SETTINGS
from meds_cli.engine.training.precision import MIXED_PRECISION
from meds_cli.engine.training.scoring import SCORING_SETTINGS
from meds_cli.engine.training.sharding import SHARDINGS
from meds_cli.engine.training.user_rewards import planned_channels

FINITE = Check(math.isfinite, "a finite number")
FINITE_POSITIVE = Check(lambda v: math.isfinite(v) and v > 0, "a finite number greater than 0")
FINITE_NON_NEGATIVE = Check(lambda v: math.isfinite(v) and v >= 0, "a finite number at least 0")
UNIT_INTERVAL = Check(lambda v: 0 < v <= 1, "in (0, 1]")
MAX_SEED = 2**32 - 1  # numpy's seed range; torch and random take any of these
SEED = Check(lambda v: 0 <= v <= MAX_SEED, f"between 0 and {MAX_SEED}")


@dataclass
class LoraConfig:
    enabled: bool = doc(True, "train a LoRA adapter; false trains all weights")
    rank: int = doc(16, "LoRA rank r (at most the model's hidden size)", at_least(1))
    alpha: int = doc(32, "LoRA alpha (scaling = alpha / rank)", greater_than(0))
    dropout: float = doc(0.0, "dropout on the LoRA input", Check(lambda v: 0 <= v < 1, "in [0, 1)"))
    target_modules: list[str] = doc(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "module names that get an adapter",
        Check(bool, "a non-empty list of module names"),
    )


@dataclass
class ModelConfig:
    name: str = doc("smollm2-135m", "hub id, alias from configs/models.yaml, local dir, .gguf file, or smollm2-135m")
    dtype: str = choice("float32", ["float32", "bfloat16", "float16", "auto"], "weight dtype")
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class TaskConfig:
    name: str = doc("arithmetic", "training task (see `meds list`)")
    path: str = doc("", "math task: JSON/JSONL/Parquet file or hub dataset name; code tasks: a data folder with "
                    "<benchmark>/test.jsonl (empty: the hub)")
    subset: str = doc("", "math task from the hub: the dataset's subset (its config name)")
    split: str = doc("train", "math task from the hub: the split to train on")
    revision: str = doc("", "math task from the hub: the commit, tag or branch the data is pinned to")
    columns: dict = doc({}, "math task: the dataset column of each task field, e.g. "
                        "{problem: question, answer: final_answer}")
    system_prompt: str = doc("", "a system message before every prompt (chat style; in boxed style, a line before "
                             "the prompt)")
    chat_template_kwargs: dict = doc({}, "extra arguments of the chat template, e.g. {enable_thinking: false} "
                                     "for Qwen3")
    max_prompt_tokens: int = doc(0, "leave out problems whose prompt has more tokens than this (0: keep all)",
                                 at_least(0))
    prompt_style: str = choice("chat", list(PROMPT_STYLES), "boxed: Qwen-Math boxed prompt as plain text; "
                               "chat: the same inside the model's chat template; plain: the problem text exactly as "
                               "written, no instruction, no template (models trained from scratch); chat_plain: the "
                               "problem text alone inside the chat template, after task.system_prompt (Qwen2.5-Math's "
                               "TIR prompt)")
    operations: list[str] = doc(["mul"], "arithmetic: operations to draw from (add, sub, mul)")
    digits: int = doc(1, "arithmetic: digits per operand (difficulty)", at_least(1))
    dataset: str = doc("", "reasoning-gym: the generator, any name of reasoning-gym's registry (chain_sum, "
                       "basic_arithmetic, countdown, ...)")
    config: dict = doc({}, "reasoning-gym: the generator's own settings, e.g. {min_terms: 2, max_terms: 4, "
                       "max_digits: 2} for chain_sum (the seed and size come from the run)")
    partial_credit: bool = doc(False, "reasoning-gym: a score below 1 from the generator's score_answer is partial "
                               "credit in the reward (wrong + score x (correct - wrong)); false: only a score of 1 "
                               "earns reward.correct")
    train_size: int = doc(2000, "arithmetic, reasoning-gym: number of training problems", at_least(1))
    eval_size: int = doc(64, "held-out problems for evaluation (0: every problem is trained on)", at_least(0))
    answer_format: str = choice("boxed_or_last_integer", ["boxed", "boxed_or_last_integer", "answer_tags"],
                                "where the final answer is read from: the last \\boxed{}, else (boxed_or_last_integer) "
                                "the last number; answer_tags (reasoning-gym only): the last <answer>...</answer>")
    code_reward: str = choice("all_pass", ["all_pass", "pass_rate"], "code tasks: 1 only when every test passes, "
                              "or the share of tests passed")

    def validate(self, prefix: str) -> None:
        unknown = [op for op in self.operations if op not in OPERATIONS]
        require(not unknown and bool(self.operations),
                f"{prefix}operations {unknown or self.operations} not accepted; choose from {', '.join(OPERATIONS)}")
        check_columns(self.columns, f"{prefix}columns")
        require(all(isinstance(k, str) for k in self.chat_template_kwargs),
                f"{prefix}chat_template_kwargs must map argument names to values, got {self.chat_template_kwargs!r}")
        if self.name == REASONING_GYM:
            check_reasoning_gym(self.dataset, self.config, prefix)
        else:
            require(self.answer_format != "answer_tags", f"{prefix}answer_format=answer_tags is reasoning-gym's format "
                                                         f"(task.name={REASONING_GYM}); accepted for task "
                                                         f"'{self.name}': boxed, boxed_or_last_integer")


@dataclass
class RewardConfig:
    correct: float = doc(1.0, "reward of a correct response", FINITE)
    wrong: float = doc(0.0, "reward of a wrong response (algorithms.md allows -1)", FINITE)
    functions: str | list[str] = doc([], "your own reward functions, path/to/file.py:name or a list of them; "
                                     "each is a reward channel")
    function_weights: list[float] = doc([], "the weight of each reward function (default: 1 each)")
    function_timeout_s: float = doc(1800.0, "seconds one call of a reward function may take before the run stops with "
                                             "a line naming it (0: no limit)", FINITE_NON_NEGATIVE)

    def validate(self, prefix: str) -> None:
        require(self.correct > self.wrong, f"{prefix}correct ({self.correct}) must be greater than {prefix}wrong "
                                           f"({self.wrong}): the reward must favour correct responses")
        planned_channels(self.functions, self.function_weights)  # the form of each entry, one weight each


@dataclass
class RolloutSettings(ToolSettings):
    """The rollout section's own settings, the tool settings (rollout.tools, rollout.max_tool_calls, ...:
    tools/settings.py, docs/tools.md) among them; RolloutConfig adds one section per engine settings class."""

    prompts_per_step: int = doc(4, "groups (prompts) per optimizer batch, across all processes", at_least(1))
    group_size: int = doc(8, "G: responses sampled per prompt", at_least(1))
    temperature: float = doc(1.0, "sampling temperature",
                             greater_than(0, "training samples; greedy decoding gives a group no spread"))
    top_p: float = doc(1.0, "nucleus sampling threshold", UNIT_INTERVAL)
    max_new_tokens: int = doc(64, "response length limit; longer responses are truncated", at_least(1))
    min_new_tokens: int = doc(0, "stop tokens are held back before this many tokens (min = max forces equal lengths, "
                                 "for benchmarks)", at_least(0))
    engine: str = doc("hf", "rollout engine: hf (the training model itself), hf-worker (the hf engine in a worker "
                      "process of its own), vllm (colocated vLLM; needs the vllm package, `make setup-vllm` on CPU), "
                      "vllm-server (a `vllm serve` on devices of its own: rollout.server), auto (vllm where it is "
                      "installed and a GPU is present); the names are those of the engine registry "
                      "(meds_cli/engine/rollout/engines.py)")
    max_staleness: int = doc(0, "k: with an engine that runs apart from the trainer (hf-worker, vllm-server), the "
                                "next k steps' rollouts are sampled while this step trains, from weights at most k "
                                "steps old (0: synchronous)", at_least(0))
    is_correction: str = choice("none", list(IS_CORRECTIONS), "importance-sampling correction against the engine's "
                                "own log-probs: tis weights each token's loss by min(pi_old / pi_sampler, tis_cap); "
                                "decoupled (AReaL's objective for stale rollouts, rollout.max_staleness) by "
                                "pi_old / pi_sampler, leaving out tokens where that exceeds tis_cap")
    tis_cap: float = doc(2.0, "cap of the importance weight pi_old / pi_sampler (tis: truncated at it; decoupled: "
                              "tokens above it left out)", FINITE_POSITIVE)
    def validate(self, prefix: str) -> None:
        ToolSettings.validate(self, prefix)
        require(not self.enabled or self.min_new_tokens == 0,
                f"{prefix}min_new_tokens={self.min_new_tokens} forces lengths, which a response sampled turn by turn "
                f"with {prefix}tools cannot keep; use min_new_tokens=0 with tools")
        require(self.min_new_tokens <= self.max_new_tokens,
                f"{prefix}min_new_tokens={self.min_new_tokens} must not exceed max_new_tokens={self.max_new_tokens}")
        truncation = truncation_of_sampler(self.top_p, self.min_new_tokens)
        require(self.is_correction == "none" or truncation is None,
                f"{prefix}is_correction={self.is_correction} compares the sampler's log-probs with the full softmax, "
                f"but {prefix}{truncation}; use is_correction=none, or top_p=1 and min_new_tokens=0")



def with_engine_sections(base: type) -> type:
    """`base` plus a section per registered engine settings class (engines.py: rollout.hf,
    rollout.worker, rollout.vllm, rollout.server), so that an engine's settings are declared
    beside the engine and the YAML paths stay rollout.<section>.<key>."""
    cls = dataclasses.make_dataclass("RolloutConfig", [(name, section, field(default_factory=section))
                                                       for name, section in engine_sections().items()], bases=(base,))
    cls.__module__ = __name__
    return cls


RolloutConfig = with_engine_sections(RolloutSettings)

# keys that moved: old path -> new path, still read (a note says where they went)
MOVED_KEYS = {("rollout", "generation_batch_size"): ("rollout", "hf", "generation_batch_size")}


def read_moved_keys(data: dict, say=None) -> dict:
    """`data` with keys that moved (MOVED_KEYS) at their new place, a note said for each; the new
    place wins where both are given."""
    import sys

    say = say or (lambda text: print(text, file=sys.stderr))
    for old, new in MOVED_KEYS.items():
        parent = data.get(old[0])
        if not isinstance(parent, dict) or old[1] not in parent:
            continue
        parent = dict(parent)
        value = parent.pop(old[1])
        target = parent.setdefault(new[1], {})
        if isinstance(target, dict):
            parent[new[1]] = {new[2]: value, **target}
        data = {**data, old[0]: parent}
        say(f"note: {'.'.join(old)} is now {'.'.join(new)} (read as such)")
    return data

@dataclass
class OptimConfig:
    lr: float = doc(1e-5, "peak learning rate (paper: 1e-6 for full models)", FINITE_POSITIVE)
    weight_decay: float = doc(0.1, "AdamW weight decay", FINITE_NON_NEGATIVE)
    betas: list[float] = doc([0.9, 0.999], "AdamW betas",
                             Check(lambda b: len(b) == 2 and all(0 <= x < 1 for x in b), "two numbers in [0, 1)"))
    grad_clip: float = doc(1.0, "max gradient norm (0 disables)", FINITE_NON_NEGATIVE)
    warmup_steps: int = doc(10, "linear warm-up, in optimizer steps", at_least(0))
    schedule: str = choice("constant", ["constant", "cosine", "linear"], "decay after warm-up")


@dataclass
class TrainConfig:
    steps: int = doc(20, "training steps (rollout batches); 0 only in `meds ablate`'s base-model arm: a run "
                         "folder of 0 steps is its base model, as `meds eval RUN` evaluates it", at_least(0))
    seed: int = doc(0, "seed for data order, sampling and initialization", SEED)
    ppo_epochs: int = doc(1, "passes over each rollout batch", at_least(1))
    mini_batch_size: int = doc(0, "sequences per optimizer step (0: the whole batch)", at_least(0))
    micro_batch_size: int = doc(8, "sequences per forward/backward (gradient accumulation)", at_least(1))
    micro_batch_tokens: int = doc(0, "tokens (prompt + response) per forward/backward: rows of similar length "
                                  "grouped; counted as they run, so real tokens when padding_free is on, else as "
                                  "padded to the micro-batch's own longest prompt and response; a row longer than "
                                  "this runs alone (0: micro_batch_size rows at the batch's width)",
                                  at_least(0))
    mixed_precision: str = choice("auto", MIXED_PRECISION, "autocast: auto = the `accelerate launch` value, else "
                                  "bf16 on a GPU, on a CPU bf16 where it has bf16 units and measured faster (a "
                                  "calibration cached per CPU model), else no; weights stay in model.dtype")
    gradient_checkpointing: bool = doc(False, "recompute each decoder layer in the backward pass: activation memory "
                                       "of one layer instead of all, about a third more compute (works with LoRA)")
    sharding: str = choice("none", SHARDINGS, "none: DDP over several processes; fsdp2: parameters, gradients and "
                           "optimizer state split over processes (torch fully_shard)")
    logprob_chunk_tokens: int = doc(1024, "tokens whose logits [n, vocab] exist at once when log-probs are taken",
                                    at_least(1))
    share_prompts: bool = doc(True, "update and scoring forwards run each distinct prompt of a micro-batch once, "
                              "the same numbers up to rounding: packed, under a prefix-sharing mask (sdpa, eager; "
                              "also with gradient_checkpointing and fsdp2; flash attention repeats the prompt); "
                              "padded, its keys and values copied to the rows of its group (not with "
                              "gradient_checkpointing or fsdp2)")
    padding_free: str = choice("auto", PADDING_FREE_SETTINGS, "update and scoring forwards run real tokens only: the "
                               "rows of a micro-batch laid end to end, position ids restarting per sequence "
                               "(micro_batch_tokens then counts real tokens); auto: on where the model's attention "
                               "takes packed rows (sdpa, eager, flex_attention, flash_attention_2/3)")
    scoring_pass: str = choice("auto", SCORING_SETTINGS, "auto: skip the no-grad scoring forward when the update's "
                               "own forward gives the same old log-probs; always: run it")
    diversity_layers: str | list[int] = doc("last_half", "logit-lens layers of the diversity probe behind "
                                            "diversity/eigen_ratio_top1, the same for every algorithm (forms of "
                                            "meds.layers: last_half, last:K or a list; none = no probe); recorded "
                                            "by the hf engine while it samples, shared with MEDS's own probe "
                                            "when the layers match")
    checkpoint_every: int = doc(10, "write a checkpoint every N steps (and at the end; 0: only at the end)",
                                at_least(0))
    keep_checkpoints: int = doc(3, "complete checkpoints kept, the newest ones (0: all); the newest is never deleted",
                                at_least(0))
    output_dir: str = doc("", "the run folder; empty: runs/<time>-<algo>-<tag>")
    runs_root: str = doc("runs", "where new run folders are created")
    tag: str = doc("", "suffix of the run folder name")
    report_to: str | list[str] = doc("none", "experiment trackers: none, tensorboard, wandb, trackio, mlflow, "
                                     "or a list of them")
    log_samples_every: int = doc(0, "write a few prompts with their responses to RUN/samples/step_N.jsonl "
                                 "every N steps (0: never)", at_least(0))
    log_samples_prompts: int = doc(2, "prompts (groups of responses) in each samples log", at_least(1))
    dist_timeout_s: int = doc(1800, "seconds a collective waits for every process before the run fails (the "
                              "process group's timeout; NCCL's 600 s default is shorter than a 7B checkpoint or a "
                              "vLLM start)", at_least(1))

    def validate(self, prefix: str) -> None:
        parse_report_to(self.report_to)
        if self.diversity_layers != "none":
            check_layer_spec(self.diversity_layers, f"{prefix}diversity_layers")


@dataclass
class AlgoConfig:
    name: str = doc("meds", "algorithm (see `meds list`)")
    base: str = doc("", "base algorithm under a shaping method (meds, edas, ...); empty: the method's own default "
                        "(dapo; grpo for outcome-ucb, as its paper)")


@dataclass
class EvalConfig:
    every: int = doc(0, "run a quick held-out eval every N steps (0: never)", at_least(0))
    problems: int = doc(32, "held-out problems in the quick eval", at_least(1))
    temperature: float = doc(0.0, "0: greedy decoding in the quick eval", FINITE_NON_NEGATIVE)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # One section per registered algorithm, keyed by its name.
    algorithms: dict[str, Any] = field(default_factory=dict)

    def section(self, algo_name: str):
        return self.algorithms[algo_name]


def algorithm_sections() -> dict[str, type]:
    return {entry.name: entry.obj.config_class for entry in ALGORITHMS.entries()}


FIXED_SECTIONS = [f.name for f in dataclasses.fields(RunConfig) if f.name != "algorithms"]


# ---------------------------------------------------------------- building from plain data


def _type_name(tp) -> str:
    """A type in words: 'int', 'a list of int', 'str or a list of int'."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(option) for option in typing.get_args(tp) if option is not type(None))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce(value: Any, tp, key: str):
    """Check `value` against the annotation `tp`; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except UserError:
                pass
        lists = [typing.get_args(option)[0] for option in options if typing.get_origin(option) is list]
        if isinstance(value, list) and lists:  # a list was meant: say which item is wrong
            bad = next(i for i, item in enumerate(value) if not _fits(item, lists[0], key))
            raise UserError(f"config key '{key}' has value {value!r}: item {bad} ({value[bad]!r}) is not "
                            f"{_type_name(lists[0])}; expected {_type_name(tp)}")
        raise UserError(f"config key '{key}' has value {value!r}; expected {_type_name(tp)}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise UserError(f"config key '{key}' has value {value!r}; expected a list of {_type_name(item_tp)}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads 1e-6 (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if tp is Any:
        return value
    if tp is str and isinstance(value, bool):  # YAML 1.1 reads a bare no / yes as a boolean
        return "yes" if value else "no"
    if isinstance(tp, type) and isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    raise UserError(f"config key '{key}' has value {value!r}; expected {_type_name(tp)}")


def _fits(value: Any, tp, key: str) -> bool:
    try:
        _coerce(value, tp, key)
    except UserError:
        return False
    return True


def build(cls, data: dict | None, prefix: str = ""):
    """Instantiate dataclass `cls` from nested dicts, rejecting unknown keys and wrong types."""
    if data is None:  # an empty section (`train:` with nothing under it)
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"config section '{prefix.rstrip('.') or 'root'}' must be a mapping of keys to values, "
                        f"got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise UserError(f"unknown config key '{prefix}{key}'{nearest(key, fields)}; valid: {', '.join(fields)}")
    kwargs = {}
    for name, value in data.items():
        tp, key = hints[name], prefix + name
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, value, key + ".")
            continue
        options = fields[name].metadata.get("choices")
        if options and isinstance(value, bool) and "true" in options:  # a choice spelled true / false
            value = "true" if value else "false"
        try:
            value = _coerce(value, tp, key)
        except UserError as error:  # what the key means says which values make sense
            meaning = fields[name].metadata.get("help")
            if not meaning:
                raise
            raise UserError(f"{error}; {key}: {meaning}") from None
        if options and value not in options:
            raise UserError(f"config key '{key}' has value {value!r}{nearest(value, options)}; "
                            f"accepted: {', '.join(options)}")
        kwargs[name] = value
    return cls(**kwargs)


def build_run_config(data: dict) -> RunConfig:
    data = read_moved_keys(data)
    sections = algorithm_sections()
    fixed = {k: v for k, v in data.items() if k in FIXED_SECTIONS}
    for key in data:
        if key not in FIXED_SECTIONS and key not in sections:
            valid = FIXED_SECTIONS + sorted(sections)
            raise UserError(f"unknown config section '{key}'{nearest(key, valid)}; valid: {', '.join(valid)}")
    cfg = build(RunConfig, fixed)
    cfg.algorithms = {name: build(cls, data.get(name), name + ".") for name, cls in sections.items()}
    validate(cfg)
    return cfg


def validate(cfg: RunConfig) -> None:
    """Every section's checks (meds_cli/core/fields.py), before any model loads or folder is made."""

    def walk(section, prefix: str):
        validate_section(section, prefix)
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")

    for name in FIXED_SECTIONS:
        walk(getattr(cfg, name), name + ".")
    for name, section in cfg.algorithms.items():
        walk(section, name + ".")
    chosen = ALGORITHMS.get(cfg.algo.name)
    cfg.algo.base = cfg.algo.base or chosen.default_base  # written resolved into config.yaml
    check_group_size(cfg)
    chosen.check_settings(cfg.algorithms, cfg.algo.base, cfg.rollout.group_size)
    check_engine_settings(cfg)


def check_group_size(cfg: RunConfig) -> None:
    """rollout.group_size against what the algorithm (and its base) needs: algorithms that
    normalise rewards within a group need two responses per group for a baseline."""
    chosen = ALGORITHMS.get(cfg.algo.name)
    classes = [chosen, ALGORITHMS.get(cfg.algo.base)] if chosen.composes else [chosen]
    need = max(cls.min_group_size for cls in classes)
    size = cfg.rollout.group_size
    require(size >= need, f"rollout.group_size must be at least {need} for {cfg.algo.name} (it normalises rewards "
                          f"within each group of responses, and a group of one has no baseline), got {size}")


# ---------------------------------------------------------------- files and overrides


def deep_merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_yaml(path: str | Path, _seen: frozenset = frozenset()) -> dict:
    path = Path(path)
    if path.resolve() in _seen:
        raise UserError(f"config file '{path}' extends itself")
    if not path.is_file():
        raise UserError(f"config file '{path}' does not exist")
    try:
        data = yaml.safe_load(read_user_text(path, "a YAML file"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"config file '{path}' is not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file '{path}' must hold a mapping of sections, got {type(data).__name__}")
    # `extends: other.yaml` (path relative to this file) layers this file over another one, so a
    # paper setting and its baseline share one source instead of two copies.
    parents = data.pop("extends", None) or []
    merged: dict = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        merged = deep_merge(merged, read_yaml(path.parent / parent, _seen | {path.resolve()}))
    return deep_merge(merged, data)


def parse_override(text: str) -> dict:
    """'a.b.c=value' -> {'a': {'b': {'c': value}}}, the value read as YAML (so 3 is an int)."""
    if "=" not in text:
        raise UserError(f"--set expects section.key=value, got '{text}'")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if any(not part for part in key.strip().split(".")):
        raise UserError(f"--set key '{key}' has an empty part")
    return _nest(key.strip(), value)


def load_config(files: list[str] = (), overrides: list[str] = (), shortcuts: dict | None = None) -> RunConfig:
    data: dict = {}
    for path in files:
        data = deep_merge(data, read_yaml(path))
    for dotted, value in (shortcuts or {}).items():
        if value is not None:
            data = deep_merge(data, _nest(dotted, value))
    for text in overrides:
        data = deep_merge(data, parse_override(text))
    return build_run_config(data)


def _nest(dotted: str, value: Any) -> dict:
    nested: Any = value
    for part in reversed(dotted.split(".")):
        nested = {part: nested}
    return nested


def to_dict(cfg: RunConfig, sections: list[str] | None = None) -> dict:
    """Plain data for YAML; `sections` limits the algorithm sections written (all by default)."""
    data = {name: dataclasses.asdict(getattr(cfg, name)) for name in FIXED_SECTIONS}
    for name, section in cfg.algorithms.items():
        if sections is None or name in sections:
            data[name] = dataclasses.asdict(section)
    return data


def dump_yaml(cfg: RunConfig, path: Path, sections: list[str] | None = None) -> None:
    replace_text(path, yaml.safe_dump(to_dict(cfg, sections), sort_keys=False))  # a kill never leaves half of it
