"""Logit-lens values recorded inside the `hf` decode loop (SamplingSettings.lens, a LensProbe).

The forward that samples token t has already computed, at the position that predicts it, every
hidden state the logit lens reads. Forward hooks keep the last position's state at the probe's
layers (a few [rows, H] tensors per step, never a whole sequence), and after the token is chosen
`values` turns them into that token's logit at each layer: L dot products per row. This is what
the scoring pass's `hidden_states` gave MEDS (algorithms/meds_features.py), without running the
model over the responses a second time.

Layer n is read where transformers' `hidden_states[n]` comes from: 0 = the input of the first
decoder layer (the embeddings, scaled as the model scales them), 1..N-1 = the output of decoder
layer n, N = the output of the final norm (transformers returns it normalised).
"""

from __future__ import annotations

import torch

from meds_cli.core.forward import LensProbe, decoder_layers, lens_token_logits, output_head


def can_record_lens(model) -> bool:
    """Whether the model is laid out as the hooks expect (decoder layers and a final norm)."""
    norm, head = output_head(model)
    return decoder_layers(model) is not None and norm is not None and head is not None


def _layer_output(output):
    return output[0] if isinstance(output, tuple) else output  # older transformers return tuples


class LensRecorder:
    """Context manager: while active, every forward of `model` leaves the last position's hidden
    state at each probe layer in `self.latest`; `values(tokens)` projects them."""

    def __init__(self, model, probe: LensProbe):
        self.norm, self.head = output_head(model)
        layers = decoder_layers(model)
        count = len(layers)
        self.probe, self.latest = probe, [None] * len(probe.layers)
        self._sites = []  # (module, hook kind, slot)
        for slot, n in enumerate(probe.layers):
            if not 0 <= n <= count:
                raise ValueError(f"lens layer {n} is outside 0..{count}")
            if n == 0:
                self._sites.append((layers[0], "pre", slot))
            elif n == count:
                self._sites.append((self.norm, "post", slot))
            else:
                self._sites.append((layers[n - 1], "post", slot))
        self._last = count
        self._handles = []
        self._paused = False  # values() runs the final norm itself: that call must not be recorded
        weight = getattr(self.head, "weight", None)  # values() keep fp64 for an fp64 model, else fp32
        self.dtype = torch.float64 if weight is not None and weight.dtype == torch.float64 else torch.float32

    def __enter__(self):
        for module, kind, slot in self._sites:
            if kind == "pre":
                hook = module.register_forward_pre_hook(self._keep_input(slot), with_kwargs=True)
            else:
                hook = module.register_forward_hook(self._keep_output(slot))
            self._handles.append(hook)
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False

    def _keep_input(self, slot):
        def hook(module, args, kwargs):
            if self._paused:
                return
            self._store(slot, args[0] if args else kwargs["hidden_states"])

        return hook

    def _keep_output(self, slot):
        def hook(module, args, output):
            if self._paused:
                return
            self._store(slot, _layer_output(output))

        return hook

    @property
    def hook_ids(self) -> set[int]:
        """The ids of the hooks this recorder registered (a decode step that calls `keep` itself
        may run where only these hooks are present)."""
        return {handle.id for handle in self._handles}

    def keep(self, layer: int, states: torch.Tensor) -> None:
        """Record `states` [rows, positions, H], transformers' `hidden_states[layer]` of a forward
        run without the modules' hooks (engine/rollout/decoder_step.py), as the hooks would."""
        for slot, n in enumerate(self.probe.layers):
            if n == layer:
                self._store(slot, states)

    def _store(self, slot: int, states: torch.Tensor) -> None:
        """Keep the last position's state [rows, H] of `states` [rows, positions, H] in `slot`."""
        self.latest[slot] = states[:, -1].detach()

    def select(self, rows: torch.Tensor) -> None:
        """Keep the states of `rows` (the prefill ran once per prompt; its samples are rows)."""
        self.latest = [state[rows] for state in self.latest]

    def values(self, tokens: torch.Tensor) -> torch.Tensor:
        """[rows, len(layers)] logit (self.dtype) of `tokens` at each probe layer, from the last forward."""
        self._paused = True
        try:
            return lens_token_logits(self.latest, list(self.probe.layers), self._last, tokens, self.head,
                                     self.norm if self.probe.final_norm else None)
        finally:
            self._paused = False
