"""The critic / reward model: a causal-LM backbone (without its LM head) plus a scalar head."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vapo_lit.algos import at_least_float32
from vapo_lit.models.quiet import quiet_transformers
from vapo_lit.passes import position_ids_from_mask

VALUE_MARKER = "value_model.json"
HEAD_FILE = "value_head.safetensors"


class ValueModel(torch.nn.Module):
    """Backbone (e.g. `LlamaModel`) + ``Linear(hidden, 1)``.

    Value convention: ``ValueModel(input_ids, attention_mask)[:, t]`` is the value of the prefix
    ending at token t, i.e. of the state in which token t+1 is chosen. The value of the state
    *before* response token j (at absolute column P + j of prompt+response) is therefore read at
    column P + j - 1, the token just before it; the value after the last response token (EOS) is
    the terminal state's, which PPO treats as 0 and never reads from here.

    Positions are ``cumsum(attention_mask) - 1`` (as in :mod:`vapo_lit.passes`), so left-padded
    prompts are handled. The output is unbounded (no sigmoid), in float32 (float64 for a float64 head),
    also under autocast.
    """

    def __init__(self, backbone: torch.nn.Module, head: torch.nn.Linear | None = None):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        if head is None:
            head = torch.nn.Linear(hidden, 1)
            torch.nn.init.normal_(head.weight, std=1.0 / (hidden + 1) ** 0.5)
            torch.nn.init.zeros_(head.bias)
        self.head = head

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(n, L) values; no `attention_mask`: a causal pass over every column, positions 0, 1, ..."""
        if attention_mask is None:
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :].expand_as(input_ids)
            h = self.backbone(input_ids=input_ids, position_ids=pos).last_hidden_state
            return self.value_head(h)
        pos = position_ids_from_mask(attention_mask)
        h = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=pos
        ).last_hidden_state
        return self.value_head(h)

    def value_head(self, h: torch.Tensor) -> torch.Tensor:
        """(n, L, H) hidden states -> (n, L) values in the head's own dtype (float32 under bf16-mixed),
        outside any autocast region: values and targets are compared to ~1e-3 (value loss, GAE),
        which bf16's 8-bit mantissa would round away (0.002-0.004 near 0.5-1)."""
        with torch.autocast(h.device.type, enabled=False):
            return at_least_float32(self.head(h.to(self.head.weight.dtype)).squeeze(-1))

    # ----------------------------------------------------------------- persistence
    @quiet_transformers()
    def save_pretrained(self, directory: str | Path, state_dict: dict | None = None) -> None:
        """Backbone as an HF model dir (config.json + model.safetensors) + head + marker JSON.
        `state_dict`: this model's full weights to write instead of the live ones (a sharded model)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        sd = state_dict if state_dict is not None else self.state_dict()
        self.backbone.save_pretrained(
            directory,
            safe_serialization=True,
            state_dict={k[len("backbone.") :]: v for k, v in sd.items() if k.startswith("backbone.")},
        )
        save_file(
            {
                k[len("head.") :]: v.detach().contiguous().cpu()
                for k, v in sd.items()
                if k.startswith("head.")
            },
            str(directory / HEAD_FILE),
        )
        with open(directory / VALUE_MARKER, "w") as f:
            json.dump({"format": "vapo-lit ValueModel", "version": 1, "head": HEAD_FILE}, f)

    @classmethod
    @quiet_transformers()
    def from_pretrained(cls, directory: str | Path, dtype=torch.float32) -> "ValueModel":
        """Load a saved ValueModel dir, or an HF causal-LM dir (backbone + fresh head), in `dtype`
        ('auto': the checkpoint's)."""
        from safetensors.torch import load_file
        from transformers import AutoModel

        directory = Path(directory)
        backbone = AutoModel.from_pretrained(directory, local_files_only=True, dtype=dtype)
        model = cls(backbone)
        if isinstance(dtype, torch.dtype):
            model.head.to(
                dtype
            )  # the backbone was loaded in `dtype`; the head follows it (before loading it)
        if (directory / VALUE_MARKER).is_file():
            model.head.load_state_dict(load_file(str(directory / HEAD_FILE)))
        return model

    @classmethod
    def from_causal_lm(cls, lm) -> "ValueModel":
        """Copy of `lm`'s backbone with a fresh head."""
        import copy

        return cls(copy.deepcopy(lm.base_model))

    @staticmethod
    def is_value_dir(directory: str | Path) -> bool:
        return (Path(directory) / VALUE_MARKER).is_file()
