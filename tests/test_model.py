"""Model loading: aliases, local folders, GGUF caching, LoRA and the reference policy."""


import pytest
import torch

from meds_cli.core.errors import UserError
from meds_cli.core.forward import output_head
from meds_cli.engine.config import LoraConfig
from meds_cli.engine.model_io import model as model_module
from meds_cli.engine.model_io.model import (
    apply_lora,
    load_model_and_tokenizer,
    model_aliases,
    reference_context,
    resolve_model,
)
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from tests.conftest import needs_embedded


def test_alias_resolves_to_hub_id():
    assert model_aliases()["Qwen2.5-Math-1.5B"] == "Qwen/Qwen2.5-Math-1.5B"
    assert resolve_model("Qwen2.5-Math-1.5B") == "Qwen/Qwen2.5-Math-1.5B"
    assert resolve_model("some/hub-id") == "some/hub-id"


def test_offline_alias_fails_with_one_clear_line():
    with pytest.raises(UserError) as err:
        load_model_and_tokenizer("Qwen2.5-Math-1.5B")
    message = str(err.value)
    assert "Qwen/Qwen2.5-Math-1.5B" in message and "--model /path/to/model" in message and "\n" not in message


def test_missing_paths_are_named():
    with pytest.raises(UserError, match="does not exist"):
        resolve_model("./no/such/dir")
    with pytest.raises(UserError, match="does not exist"):
        resolve_model("/tmp/none.gguf")


def test_local_directory_round_trip(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, tok = load_model_and_tokenizer(str(tmp_path))
    ids = torch.tensor([[3, 4, 5]])
    assert torch.allclose(loaded(ids).logits, model(ids).logits)
    assert tok.padding_side == "left"


def test_lora_adapter_and_reference_policy_share_weights():
    model, _ = tiny_model_and_tokenizer()
    wrapped = apply_lora(model, LoraConfig(rank=4, alpha=8))
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)  # make the adapter change the output
        adapted = wrapped(ids).logits
        with reference_context(wrapped)():
            reference = wrapped(ids).logits
    base, _ = tiny_model_and_tokenizer()
    assert not torch.allclose(adapted, reference)
    assert torch.allclose(reference, base(ids).logits, atol=1e-6)  # reference = base weights, no second copy


def test_lora_off_trains_everything_and_bad_targets_are_named():
    model, _ = tiny_model_and_tokenizer()
    same = apply_lora(model, LoraConfig(enabled=False))
    assert all(p.requires_grad for p in same.parameters())
    with pytest.raises(UserError, match="target_modules"):
        apply_lora(tiny_model_and_tokenizer()[0], LoraConfig(target_modules=["nope_proj"]))
    with pytest.raises(UserError, match="needs LoRA"):
        reference_context(same)


def test_output_head_through_peft():
    model, _ = tiny_model_and_tokenizer()
    norm, head = output_head(apply_lora(model, LoraConfig(rank=2)))
    assert head.weight.shape[0] == model.config.vocab_size and norm is not None


@needs_embedded
@pytest.mark.slow
def test_embedded_default_loads_from_cache_fast(monkeypatch):
    load_model_and_tokenizer("smollm2-135m")  # the first call may dequantize the GGUF into the cache
    # The second load reads the cached copy: it never parses the GGUF again (asserted by making
    # that step fail), which is what makes it fast; no wall-clock bound, the machine may be busy.
    monkeypatch.setattr(model_module, "check_gguf", lambda path: pytest.fail("the GGUF was parsed again"))
    model, tokenizer = load_model_and_tokenizer("smollm2-135m")
    assert model.config.num_hidden_layers == 30
