"""Policies and critics: the built-in tiny models and any local HF causal LM.

* :func:`load_policy` -- ``"builtin"`` (the cached tiny SFT'd base policy of the chain task) or a
  local HF causal-LM directory (never fetched from a hub).
* :func:`load_critic` -- ``"reward_model"`` (the cached outcome reward model, a
  :class:`ValueModel`), ``"actor"`` (the policy's backbone with a fresh head) or a local path (a
  saved ValueModel or an HF causal-LM directory).
"""
from __future__ import annotations

from pathlib import Path

import torch

from vapo_lit.models.value import ValueModel

BUILTIN = "builtin"


def _builtin_kwargs(task, kwargs):
    from vapo_lit.tasks.chain import ChainTask

    if not isinstance(task, ChainTask):
        raise ValueError(f"the built-in policy exists only for the 'chain' task, not {getattr(task, 'name', task)!r};"
                         " pass a local HF model directory instead")
    allowed = {"model_config", "sft_config", "rm_config", "log"}
    bad = set(kwargs) - allowed
    if bad:
        raise TypeError(f"unexpected arguments {sorted(bad)}")
    return kwargs


def _check_model_dir(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"{what} {str(path)!r} does not exist (expected 'builtin' or a local HF model directory)")
    if not p.is_dir() or not (p / "config.json").is_file():
        raise ValueError(f"{what} {str(path)!r} is not a model directory (no config.json)")
    return p


def load_policy(spec: str, task, *, seed: int = 0, cache_dir=None, **builtin_options):
    """Return ``(model, tokenizer)`` in eval mode.

    ``spec == "builtin"``: the tiny base policy of the chain task, built on first use (SFT on
    imperfect demonstrations) and cached under a key of its full config + `seed`;
    `builtin_options` may override ``model_config`` / ``sft_config`` (tests use tiny ones).
    Otherwise `spec` is a local HF causal-LM directory (``local_files_only=True``); a tokenizer
    without a pad token gets its EOS as pad.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec == BUILTIN:
        from vapo_lit.models.builtin import _load_policy_dir, builtin_policy_dir

        opts = _builtin_kwargs(task, builtin_options)
        opts.pop("rm_config", None)
        return _load_policy_dir(builtin_policy_dir(task, seed=seed, cache_dir=cache_dir, **opts))
    if builtin_options:
        raise TypeError(f"{sorted(builtin_options)} only apply to the built-in policy")
    path = _check_model_dir(spec, "policy")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load a causal LM + tokenizer from {str(path)!r}: {e}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok


def load_critic(init: str, task, *, policy_spec: str = BUILTIN, seed: int = 0, cache_dir=None,
                **builtin_options) -> ValueModel:
    """Return a fresh :class:`ValueModel` (eval mode) for ``critic_init`` = `init`.

    * ``"reward_model"``: a copy of the cached outcome reward model trained on samples of the
      built-in base policy scored by the verifier (only with ``policy_spec="builtin"``);
    * ``"actor"``: the policy's backbone (``load_policy(policy_spec, ...)``) with a fresh head
      (initialised from `seed`);
    * a local path: a saved ValueModel directory, or an HF causal-LM directory (its backbone +
      a fresh head).
    """
    if init == "reward_model":
        if policy_spec != BUILTIN:
            raise ValueError("critic_init='reward_model' is only built for the built-in policy; "
                             "pass a local reward/value model directory as the critic instead")
        from vapo_lit.models.builtin import builtin_reward_model_dir

        opts = _builtin_kwargs(task, builtin_options)
        critic = ValueModel.from_pretrained(builtin_reward_model_dir(task, seed=seed, cache_dir=cache_dir, **opts))
    elif init == "actor":
        policy, _ = load_policy(policy_spec, task, seed=seed, cache_dir=cache_dir, **(
            {k: v for k, v in builtin_options.items() if k != "rm_config"} if policy_spec == BUILTIN else builtin_options))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            critic = ValueModel.from_causal_lm(policy)
    else:
        if builtin_options:
            raise TypeError(f"{sorted(builtin_options)} only apply to built-in critics")
        path = _check_model_dir(init, "critic")
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            try:
                critic = ValueModel.from_pretrained(path)
            except (OSError, ValueError, KeyError) as e:
                raise ValueError(f"cannot load a value model from {str(path)!r}: {e}") from e
    critic.eval()
    return critic


__all__ = ["ValueModel", "load_policy", "load_critic", "BUILTIN"]
