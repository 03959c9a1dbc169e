"""The rollout-engine registry: one entry per engine, which training (`rollout.engine`) and
`meds eval --backend` both read, so adding an engine touches this file and the engine's own module.

An entry says whether the engine can run here, whether `auto` prefers it, which config settings
it refuses (checked when the config loads), and how it is built for training (the policy it
follows) and for eval (a fixed model, maybe with a checkpoint). `auto` is not an engine: it picks
the first registered engine that prefers this machine, else `hf`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from meds_cli.core.errors import UserError, nearest
from meds_cli.core.registry import Registry
from meds_cli.engine.rollout.eval_backends import HFBackend, ModelSpec, VLLMBackend, cuda_available, load_hf_policy
from meds_cli.engine.rollout.hf_sampler import HFConfig, HFEngine
from meds_cli.engine.rollout.hf_worker import (
    HFWorkerEngine,
    WorkerConfig,
    cores_of_process,
    parse_cores,
    trained_weights,
)
from meds_cli.engine.rollout.pipeline import RolloutPipeline
from meds_cli.engine.rollout.sampling_engine import RolloutEngine
from meds_cli.engine.rollout.training_processes import ONE_PROCESS, TrainingProcesses
from meds_cli.engine.rollout.vllm_engine import (
    VLLMConfig,
    VLLMEngine,
    check_vllm_settings,
    engine_dtype,
    sampler_precision_line,
    say_on_stderr,
    tensor_parallel_gather,
    trainer_compute_dtype,
    vllm_available,
)
from meds_cli.engine.rollout.vllm_server import ServerConfig, VLLMServerEngine

AUTO = "auto"
DEFAULT_ENGINE = "hf"


@dataclass(frozen=True)
class EngineKind:
    """How one rollout engine is checked and built.

    unavailable()  why it cannot run on this machine, or None when it can
    preferred()    `auto` picks it here
    check(cfg)     raises UserError for settings of the run config the engine would refuse
    for_training(settings, context) -> RolloutEngine, or, for an engine that runs apart, a
                   pipeline.SeparateEngine, which make_engine puts behind a RolloutPipeline;
                   `settings`: its sections of `rollout:` by name (those of `settings` below),
                   `context`: an EngineContext (the policy and the few facts of the run it reads)
    for_eval(spec: ModelSpec, settings: GenerationSettings) -> an eval Backend
    engine_class   the class for_training builds: it implements every member of
                   sampling_engine.RolloutEngine, or of pipeline.SeparateEngine where it runs apart
                   (tests/test_engine_protocol.py checks every registered engine)
    runs_apart     it samples in a process or server of its own, so rollout.max_staleness >= 1 can
                   overlap its sampling with the update (engine/rollout/pipeline.py)
    settings       the sections of `rollout:` it reads, by name (rollout.<name>), each a dataclass of
                   core.fields settings; the run config holds one of each registered section
                   (engine_sections), so an engine's settings live beside it
    """

    unavailable: Callable[[], str | None]
    preferred: Callable[[], bool]
    check: Callable[[object], None]
    for_training: Callable[..., RolloutEngine]
    for_eval: Callable[..., object]
    engine_class: type
    runs_apart: bool = False
    settings: dict[str, type] = field(default_factory=dict)


ROLLOUT_ENGINES: Registry[EngineKind] = Registry("rollout engine")


@dataclass(frozen=True)
class EngineContext:
    """What an engine builder is given beside its settings sections: the training model, and the
    facts of the run an engine reads, instead of the whole run config."""

    model: object  # the training model (unwrapped): sampled from, or sent
    tokenizer: object
    task: object  # the run's task, whose prompts size what an engine reserves
    model_name: str  # model.name, as the user gave it
    lora_rank: int | None  # None: full fine-tuning
    seed: int  # train.seed
    max_new_tokens: int  # rollout.max_new_tokens
    max_prompt_tokens: int  # task.max_prompt_tokens (0: no cap)
    scratch_dir: Path
    processes: int = 1
    rank: int = 0
    autocast: str = "no"  # the accelerator's mixed_precision
    training_processes: TrainingProcesses = ONE_PROCESS

    @classmethod
    def of(cls, cfg, model, tokenizer, *, task, scratch_dir: Path, processes: int = 1, rank: int = 0,
           autocast: str = "no", training_processes: TrainingProcesses = ONE_PROCESS) -> EngineContext:
        return cls(model, tokenizer, task, cfg.model.name, cfg.model.lora.rank if cfg.model.lora.enabled else None,
                   cfg.train.seed, cfg.rollout.max_new_tokens, cfg.task.max_prompt_tokens, Path(scratch_dir),
                   processes, rank, autocast, training_processes)


def engine_settings(cfg, name: str) -> dict:
    """The settings sections of `rollout:` that engine `name` registered, by name."""
    return {section: getattr(cfg.rollout, section) for section in ROLLOUT_ENGINES.get(name).settings}


def engine_sections() -> dict[str, type]:
    """Every registered engine's settings sections (rollout.<name>), by name; engines that share a
    section (hf and hf-worker: rollout.hf) register the same class."""
    sections: dict[str, type] = {}
    for entry in ROLLOUT_ENGINES.entries():
        for name, cls in entry.obj.settings.items():
            if sections.setdefault(name, cls) is not cls:
                raise ValueError(f"rollout.{name} is registered by two engines with different classes")
    return sections


def engine_names() -> list[str]:
    """What rollout.engine and --backend accept."""
    return [*ROLLOUT_ENGINES.names(), AUTO]


def check_engine_name(name: str, key: str = "rollout.engine") -> None:
    if name != AUTO and name not in ROLLOUT_ENGINES:
        accepted = engine_names()
        raise UserError(f"unknown {key} '{name}'{nearest(name, accepted)}; accepted: {', '.join(accepted)}")


def resolve_engine(name: str, *, key: str = "rollout.engine") -> str:
    """The registered engine `name` stands for, refused in one line where it cannot run."""
    check_engine_name(name, key)
    if name == AUTO:
        for entry in ROLLOUT_ENGINES.entries():
            if entry.obj.preferred() and entry.obj.unavailable() is None:
                return entry.name
        return DEFAULT_ENGINE
    reason = ROLLOUT_ENGINES.get(name).unavailable()
    if reason:
        raise UserError(f"{key}={name} {reason}; use hf")
    return name


def check_engine_settings(cfg) -> None:
    """Config-load check: the settings the chosen engine (for `auto`, the one it picks here) would
    refuse. Whether the engine can run at all is asked when it is built, not here."""
    name = cfg.rollout.engine
    check_engine_name(name)
    resolved = resolve_engine(AUTO) if name == AUTO else name
    kind = ROLLOUT_ENGINES.get(resolved)
    if cfg.rollout.max_staleness and not kind.runs_apart:
        apart = [n for n in ROLLOUT_ENGINES.names() if ROLLOUT_ENGINES.get(n).runs_apart]
        raise UserError(f"rollout.max_staleness={cfg.rollout.max_staleness} overlaps sampling with the update, which "
                        f"needs an engine that runs apart from the trainer; rollout.engine={resolved} runs in the "
                        f"trainer's process: use {' or '.join(apart)}, or max_staleness=0")
    kind.check(cfg)


def make_engine(cfg, model, tokenizer, *, task, scratch_dir: Path, processes: int = 1, rank: int = 0,
                autocast: str = "no", training_processes: TrainingProcesses = ONE_PROCESS) -> RolloutEngine:
    """The rollout engine of `rollout.engine` for the training model `model` (unwrapped); `task`:
    the run's task, whose prompts size what an engine reserves; `autocast`: the trainer's mixed
    precision. An engine that runs apart comes behind a RolloutPipeline (rollout.max_staleness),
    whose `training_processes` agree on its failures; with LoRA the pipeline keeps the adapters
    its in-flight jobs sample from, for a checkpoint."""
    name = resolve_engine(cfg.rollout.engine)
    kind = ROLLOUT_ENGINES.get(name)
    settings = engine_settings(cfg, name)
    context = EngineContext.of(cfg, model, tokenizer, task=task, scratch_dir=scratch_dir, processes=processes,
                               rank=rank, autocast=autocast, training_processes=training_processes)
    if not kind.runs_apart:
        return kind.for_training(settings, context)
    # the adapters of the versions in flight, for a checkpoint (small: whole models are not kept; an
    # engine that sends live weights only drops them, RolloutPipeline._use)
    pipeline = RolloutPipeline(None, cfg.rollout.max_staleness, processes=training_processes,
                               snapshot=(lambda: trained_weights(model)) if cfg.model.lora.enabled else None)
    # one agreement on a failure to start: a process whose engine never came up ends the others too
    pipeline.start(lambda: kind.for_training(settings, context))
    return pipeline


def resolve_backend(name: str) -> str:
    """The engine of --backend; 'auto' picks vLLM only where it can actually run."""
    return resolve_engine(name, key="--backend")


def make_backend(name: str, spec: ModelSpec, settings):
    """The eval backend of --backend, with the model loaded."""
    return ROLLOUT_ENGINES.get(resolve_backend(name)).for_eval(spec, settings)


# ---------------------------------------------------------------- hf


def _hf_for_training(settings: dict, context: EngineContext) -> RolloutEngine:
    return HFEngine(context.model, context.tokenizer.pad_token_id, settings["hf"].generation_batch_size,
                    tokenizer=context.tokenizer)


def _hf_for_eval(spec: ModelSpec, settings):
    model, tokenizer = load_hf_policy(spec)
    return HFBackend(model, tokenizer, settings)


ROLLOUT_ENGINES.register("hf", "a decode loop over the training model itself, in this process")(EngineKind(
    unavailable=lambda: None, preferred=lambda: False, check=lambda cfg: None,
    for_training=_hf_for_training, for_eval=_hf_for_eval, engine_class=HFEngine, settings={"hf": HFConfig}))


# ---------------------------------------------------------------- hf-worker


def _hf_worker_check(cfg) -> None:
    if cfg.train.sharding == "fsdp2":
        raise UserError("rollout.engine=hf-worker gives each training process a worker with the whole model, which "
                        "train.sharding=fsdp2 does not hold (not built); use train.sharding=none or rollout.engine=hf")


def _hf_worker_for_training(settings: dict, context: EngineContext):
    # each training process its own worker, on its share of rollout.worker.cores
    cores = cores_of_process(parse_cores(settings["worker"].cores), context.rank, context.processes)
    return HFWorkerEngine(context.model, context.tokenizer.pad_token_id, settings["hf"].generation_batch_size,
                          scratch_dir=context.scratch_dir, autocast=context.autocast, cores=cores,
                          tokenizer=context.tokenizer)


ROLLOUT_ENGINES.register("hf-worker", "the hf engine's decode loop in a worker process of its own, sent the "
                                      "trained weights after each step")(EngineKind(
    unavailable=lambda: None, preferred=lambda: False, check=_hf_worker_check,
    for_training=_hf_worker_for_training, for_eval=_hf_for_eval, engine_class=HFWorkerEngine, runs_apart=True,
    settings={"hf": HFConfig, "worker": WorkerConfig}))


# ---------------------------------------------------------------- vllm


def _vllm_unavailable() -> str | None:
    if not vllm_available():
        return ("needs the vllm package, which is not installed (GPU: pip install -e '.[vllm]'; "
                "CPU: make setup-vllm, then .venv-vllm)")
    return None


def _vllm_check(cfg) -> None:
    check_vllm_settings({"rollout.temperature": cfg.rollout.temperature, "eval.temperature": cfg.eval.temperature})


def longest_prompt_tokens(task, tokenizer, cap: int = 0) -> int:
    """Tokens of the task's longest prompt (training and held-out problems), as the engine
    receives them (no special tokens added); at most `cap` where it is set, since
    task.max_prompt_tokens leaves the longer ones out."""
    longest = task.longest_prompt_tokens(tokenizer)  # counted once: leaving out long prompts counted them
    return min(longest, cap) if cap > 0 else longest


def _vllm_model_len(vllm, context: EngineContext) -> int:
    """What vLLM reserves KV cache for where rollout.vllm.max_model_len is 0: the longest prompt
    plus the response limit (the quick eval samples with the rollout settings too), instead of
    the model's own limit (32k and more for Qwen2.5), which sizes the cache for sequences the run
    never makes."""
    if vllm.max_model_len:
        return vllm.max_model_len
    return longest_prompt_tokens(context.task, context.tokenizer, context.max_prompt_tokens) + context.max_new_tokens


def _sampler_dtype(vllm, model, autocast: str, engine: str, *, say: bool = True) -> str:
    """rollout.vllm.dtype as vLLM is given it (auto: what the trainer computes in), the start-up
    line said where sampler and trainer differ."""
    trainer_dtype = trainer_compute_dtype(autocast, next(model.parameters()).dtype)
    dtype = engine_dtype(vllm.dtype, trainer_dtype)
    line = sampler_precision_line(engine, dtype, trainer_dtype)
    if line and say:
        say_on_stderr(line)
    return dtype


def _vllm_for_training(settings: dict, context: EngineContext):
    from meds_cli.engine.model_io.model import TINY, resolve_model

    if context.model_name == TINY:
        raise UserError("rollout.engine=vllm cannot load 'tiny-llama' (it is built in memory); use rollout.engine=hf")
    vllm, rank = settings["vllm"], context.rank
    options = replace(vllm, dtype=_sampler_dtype(vllm, context.model, context.autocast, "vllm", say=rank == 0))
    tp = options.tensor_parallel_size
    context.scratch_dir.mkdir(parents=True, exist_ok=True)
    # The processes of one tensor-parallel group run one engine between them: one seed per group.
    return VLLMEngine(resolve_model(context.model_name), options=options, seed=context.seed + rank // tp,
                      policy=context.model, lora_rank=context.lora_rank, scratch_dir=context.scratch_dir,
                      processes=context.processes, tp_gather=tensor_parallel_gather(tp) if tp > 1 else None,
                      say=say_on_stderr if rank == 0 else (lambda text: None),
                      model_len=_vllm_model_len(vllm, context))


ROLLOUT_ENGINES.register("vllm", "vLLM colocated in each training process, sent the policy after each update")(
    EngineKind(unavailable=_vllm_unavailable, preferred=cuda_available, check=_vllm_check,
               for_training=_vllm_for_training, for_eval=VLLMBackend, engine_class=VLLMEngine,
               settings={"vllm": VLLMConfig}))


# ---------------------------------------------------------------- vllm-server


def _server_check(cfg) -> None:
    from meds_cli.engine.model_io.model import TINY
    from meds_cli.engine.rollout.server_placement import parse_server_gpus

    _vllm_check(cfg)
    server = cfg.rollout.server
    if server.start == bool(server.url):
        raise UserError("rollout.engine=vllm-server takes one of rollout.server.url (a server you started) and "
                        f"rollout.server.start=true (meds starts one); given: {'both' if server.start else 'neither'}")
    if server.gpus != "" and not server.start:
        raise UserError(f"rollout.server.gpus={server.gpus!r} places a server meds starts (rollout.server.start=true); "
                        "a server at rollout.server.url runs where you started it: drop rollout.server.gpus")
    parse_server_gpus(server.gpus)
    if server.start and cfg.model.name == TINY:
        raise UserError("rollout.server.start cannot serve 'tiny-llama' (it is built in memory); use a model folder "
                        "or rollout.engine=hf")


def sends_full_weights(cfg) -> bool:
    """Whether the policy reaches a server as full weights (no LoRA, or rollout.vllm.sync=merged)
    rather than as its LoRA adapter."""
    return full_weights_sent(cfg.model.lora.enabled, cfg.rollout.vllm)


def full_weights_sent(lora: bool, vllm) -> bool:
    """sends_full_weights from its two facts: LoRA on, and the rollout.vllm section."""
    return not lora or vllm.sync != "adapter"


def _server_sync(settings: dict, context: EngineContext, dtype: str, local: bool):
    """How the policy reaches the server(s) (server_sync.py): None for the engine's default, the
    LoRA adapter; else the full weights over vLLM's NCCL weight transfer, which needs GPUs, NCCL
    and vLLM here. `local`: the server is one meds started on this node."""
    import socket

    from meds_cli.engine.rollout import server_sync

    if not full_weights_sent(context.lora_rank is not None, settings["vllm"]):
        return None
    reason = server_sync.nccl_transfer_unavailable()
    if reason:
        raise UserError("rollout.engine=vllm-server sends full weights here (no LoRA, or rollout.vllm.sync=merged) "
                        f"through vLLM's NCCL weight transfer, which {reason}")
    server = settings["server"]
    address = server.nccl_address or ("127.0.0.1" if local else socket.gethostname())
    return server_sync.FullWeightSync(context.model, server_sync.torch_dtype(dtype), address=address,
                                      port=server.nccl_port)


def _start_server(settings: dict, context: EngineContext, dtype: str):
    """The server meds starts on this node (rank 0 of the node starts it; the node's other
    processes connect to it), on the GPUs rollout.server.gpus gives it (server_placement.py):
    (the started server or None, its url)."""
    from meds_cli.engine.model_io.model import resolve_model
    from meds_cli.engine.rollout.server_placement import (
        node_processes,
        node_rank,
        parse_server_gpus,
        placement_note,
        plan_placement,
        visible_devices,
    )
    from meds_cli.engine.rollout.vllm_server import HOST, StartedServer, serve_command, serve_environment

    server, vllm = settings["server"], settings["vllm"]
    url = f"http://{HOST}:{server.port}"
    reason = _vllm_unavailable()
    if reason:
        raise UserError(f"rollout.server.start {reason}")
    count = parse_server_gpus(server.gpus)
    placement = None if count is None else plan_placement(visible_devices(), count, node_processes())
    if node_rank() != 0:
        return None, url
    if placement is not None and (note := placement_note(placement, node_processes())):
        say_on_stderr(f"note: {note}")
    full = full_weights_sent(context.lora_rank is not None, vllm)
    argv = serve_command(resolve_model(context.model_name), port=server.port, options=vllm, dtype=dtype,
                         seed=context.seed, lora_rank=None if full else context.lora_rank,
                         model_len=_vllm_model_len(vllm, context), cores=parse_cores(server.cores),
                         full_weights=full)
    started = StartedServer(argv, url=url, log_path=context.scratch_dir.parent / "vllm-server.log",
                            env=serve_environment(placement.server_visible() if placement else ""))
    say_on_stderr(f"starting {started.describe()}")
    started.wait_healthy(server.health_timeout_s)
    return started, url


def _several_processes_check(full_weights: bool, start: bool, world: int, on_this_node: int) -> None:
    """What the server engine does not do with several training processes (one line each)."""
    if world > 1 and full_weights:
        raise UserError(f"rollout.engine=vllm-server sends full weights (no LoRA, or rollout.vllm.sync=merged) from "
                        f"one training process only (the NCCL group is the trainer and the server's workers); this "
                        f"launch has {world}: use LoRA with rollout.vllm.sync=adapter, or one training process")
    if start and world > on_this_node:
        raise UserError(f"rollout.server.start=true starts a server on this node, but the {world} training processes "
                        f"span several nodes ({on_this_node} on this one), whose servers process 0 could not reach: "
                        "start the servers yourself and give them all in rollout.server.url, or use "
                        "meds train --slurm --server-nodes 1")


def _server_for_training(settings: dict, context: EngineContext):
    from meds_cli.engine.rollout.server_placement import node_processes
    from meds_cli.engine.rollout.vllm_server import parse_urls, server_name, wait_healthy

    server, vllm, processes = settings["server"], settings["vllm"], context.training_processes
    _several_processes_check(full_weights_sent(context.lora_rank is not None, vllm), server.start, processes.world,
                             node_processes())
    dtype = _sampler_dtype(vllm, context.model, context.autocast, "vllm-server",
                           say=server.start and context.rank == 0)
    sync = _server_sync(settings, context, dtype, local=server.start)
    started = None
    if server.start:
        started, url = _start_server(settings, context, dtype)
        urls = [url]
    else:
        urls = parse_urls(server.url)
    if started is None:  # a server started by you, or by the first process of this node
        for url in urls:
            wait_healthy(url, server.health_timeout_s, server_name(url))
    return VLLMServerEngine(urls, policy=context.model, scratch_dir=context.scratch_dir, server=started,
                            request_timeout_s=server.request_timeout_s, concurrency=server.concurrency, sync=sync,
                            processes=processes, retries=server.retries,
                            vocab_size=context.model.get_input_embeddings().num_embeddings)


def _server_for_eval(spec: ModelSpec, settings):
    raise UserError("meds eval --backend vllm-server is not built yet; use --backend vllm or hf")


ROLLOUT_ENGINES.register("vllm-server", "a vLLM server (`vllm serve`) on devices of its own, sent the LoRA adapter "
                                        "(runtime LoRA routes) or the full weights (NCCL) after each step")(EngineKind(
    unavailable=lambda: None, preferred=lambda: False, check=_server_check,
    for_training=_server_for_training, for_eval=_server_for_eval, engine_class=VLLMServerEngine, runs_apart=True,
    settings={"vllm": VLLMConfig, "server": ServerConfig}))
