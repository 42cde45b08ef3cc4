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

from vapo_lit.models.quiet import quiet_transformers
from vapo_lit.models.value import ValueModel

BUILTIN = "builtin"


def _builtin_kwargs(task, kwargs):
    from vapo_lit.tasks.chain import ChainTask

    if not isinstance(task, ChainTask):
        raise ValueError(
            f"the built-in policy exists only for the built-in tasks (chain, longchain, toolchain), not {getattr(task, 'name', task)!r};"
            " pass a local HF model directory instead"
        )
    allowed = {"model_config", "sft_config", "rm_config", "log"}
    bad = set(kwargs) - allowed
    if bad:
        raise TypeError(f"unexpected arguments {sorted(bad)}")
    return kwargs


def _check_model_dir(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(
            f"{what} {str(path)!r} does not exist (expected 'builtin' or a local HF model directory)"
        )
    if not p.is_dir() or not (p / "config.json").is_file():
        raise ValueError(f"{what} {str(path)!r} is not a model directory (no config.json)")
    return p


DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "auto": "auto",
}


def resolve_critic_init(init: str, policy_spec: str) -> str:
    """'auto': the built-in reward model for the built-in policy, else the actor's backbone."""
    if init != "auto":
        return init
    return "reward_model" if policy_spec == BUILTIN else "actor"


@quiet_transformers()
def load_policy(spec: str, task, *, seed: int = 0, cache_dir=None, dtype: str = "float32", **builtin_options):
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
        model, tok = _load_policy_dir(builtin_policy_dir(task, seed=seed, cache_dir=cache_dir, **opts))
        return _cast(model, dtype), tok
    if builtin_options:
        raise TypeError(f"{sorted(builtin_options)} only apply to the built-in policy")
    path = _check_model_dir(spec, "policy")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=DTYPES[dtype])
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load a causal LM + tokenizer from {str(path)!r}: {e}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok


def load_critic(
    init: str,
    task,
    *,
    policy_spec: str = BUILTIN,
    seed: int = 0,
    cache_dir=None,
    dtype: str = "float32",
    **builtin_options,
) -> ValueModel:
    """Return a fresh :class:`ValueModel` (eval mode) for ``critic_init`` = `init`.

    * ``"reward_model"``: a copy of the cached outcome reward model trained on samples of the
      built-in base policy scored by the verifier (only with ``policy_spec="builtin"``);
    * ``"actor"``: the policy's backbone (``load_policy(policy_spec, ...)``) with a fresh head
      (initialised from `seed`);
    * a local path: a saved ValueModel directory, or an HF causal-LM directory (its backbone +
      a fresh head).
    """
    init = resolve_critic_init(init, policy_spec)
    if init == "reward_model":
        if policy_spec != BUILTIN:
            raise ValueError(
                "critic_init='reward_model' is only built for the built-in policy; "
                "pass a local reward/value model directory as the critic instead"
            )
        from vapo_lit.models.builtin import builtin_reward_model_dir

        opts = _builtin_kwargs(task, builtin_options)
        critic = ValueModel.from_pretrained(
            builtin_reward_model_dir(task, seed=seed, cache_dir=cache_dir, **opts)
        )
    elif init == "actor":
        policy, _ = load_policy(
            policy_spec,
            task,
            seed=seed,
            cache_dir=cache_dir,
            dtype=dtype,
            **(
                {k: v for k, v in builtin_options.items() if k != "rm_config"}
                if policy_spec == BUILTIN
                else builtin_options
            ),
        )
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
                critic = ValueModel.from_pretrained(path, dtype=DTYPES[dtype])
            except (OSError, ValueError, KeyError) as e:
                raise ValueError(f"cannot load a value model from {str(path)!r}: {e}") from e
    critic.eval()
    return _cast(critic, dtype)


def _cast(model, dtype: str):
    """`model` in `dtype` ('auto': as loaded)."""
    return model if dtype == "auto" else model.to(DTYPES[dtype])


def enable_gradient_checkpointing(model) -> None:
    """transformers' gradient checkpointing on `model` (a causal LM or a ValueModel's backbone).

    transformers checkpoints only in training mode, while vapo-lit keeps its models in eval mode
    (no dropout: the PPO ratio compares the policy with itself). So the model is put in training
    mode with every dropout probability set to 0; sampling switches to eval mode by itself
    (the KV cache needs it)."""
    target = model.backbone if isinstance(model, ValueModel) else model
    if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5.2x
        target.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    if getattr(target, "config", None) is not None:
        for key in (
            "attention_dropout",
            "hidden_dropout",
            "dropout",
            "resid_pdrop",
            "embd_pdrop",
            "attn_pdrop",
        ):
            if isinstance(getattr(target.config, key, None), float):
                setattr(target.config, key, 0.0)
    model.train()


@quiet_transformers()
def export(model, directory, tokenizer=None, state_dict: dict | None = None) -> None:
    """`model` (a causal LM or a ValueModel) as a loadable HF directory, with the tokenizer,
    written to a temporary sibling and renamed into place (a reader never sees half of it).
    `state_dict`: the model's full weights to write instead of the live ones (a sharded model)."""
    import os
    import shutil
    import tempfile

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        if state_dict is None:
            model.save_pretrained(tmp)
        else:
            model.save_pretrained(tmp, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        old = None
        if directory.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=directory.parent))
            os.replace(directory, old / "x")
        os.replace(tmp, directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


__all__ = [
    "ValueModel",
    "load_policy",
    "load_critic",
    "resolve_critic_init",
    "enable_gradient_checkpointing",
    "export",
    "BUILTIN",
    "DTYPES",
]
