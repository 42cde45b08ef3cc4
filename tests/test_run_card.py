"""The run card's values follow the settings the run uses (token denominator, lambdas, the warmup's
lambda, where the behaviour log-probs come from, the clip range, the NLL weight), and every field
its `definitions` names exists and links to a heading of docs/ that exists."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest

from vapo_lit.build import build_module
from vapo_lit.components import build_callbacks
from vapo_lit.config import COMPONENTS, RunConfig, Switches, merge
from vapo_lit.presets import PRESETS
from vapo_lit.run_card import run_card

ROOT = Path(__file__).resolve().parents[1]
ALL = list(COMPONENTS)


def _built(tmp_path_factory, **delta):
    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {"model": "random", "wandb": "disabled", "cache_dir": str(tmp_path_factory.mktemp("cache")), **delta},
    )
    mod = build_module(cfg)
    mod.base_cfg = mod.cfg  # what card_for changes
    return mod


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    """One random tiny module (seconds to build); each card below sets its config and switches."""
    return _built(tmp_path_factory)


def card_for(module, components=ALL, **delta) -> dict:
    """The card of `module` run with `components` and the config changed by `delta`, the switches
    set by the component callbacks as train() sets them."""
    module.cfg = cfg = merge(module.base_cfg, {"components": list(components), **delta})
    module.switches, module.components = Switches(), []
    for cb in build_callbacks(cfg.components, cfg.vapo):
        cb.attach(module)
    return run_card(cfg, module)


def without(*names) -> list[str]:
    return [c for c in ALL if c not in names]


def test_dropping_token_level_loss_flips_the_token_denominator(module):
    assert card_for(module)["token_denominator"] == "token"
    assert card_for(module, without("token_level_loss"))["token_denominator"] == "sample"


def test_the_lambdas_follow_the_config(module):
    lam = card_for(module, vapo={"alpha": 0.7, "lambda_critic": 0.9}, ppo={"gamma": 0.99})["lambdas"]
    assert lam == {
        "estimator": "gae",
        "lambda_policy": "length_adaptive",
        "alpha": 0.7,
        "lambda_critic": 0.9,
        "gamma": 0.99,
        "state_values": "critic",
    }
    lam = card_for(module, without("length_adaptive_gae"), ppo={"lam": 0.8})["lambdas"]
    assert lam["lambda_policy"] == 0.8 and lam["alpha"] is None and lam["lambda_critic"] == 1.0
    lam = card_for(module, without("length_adaptive_gae", "decoupled_gae"), ppo={"lam": 0.8})["lambdas"]
    assert lam["lambda_policy"] == 0.8 and lam["lambda_critic"] == "lambda_policy"  # one lambda for both


def test_the_warmup_records_its_lambda_only_with_value_pretraining(module):
    warm = card_for(module, vapo={"value_pretrain_steps": 7})["value_initialisation_and_warmup"]
    assert warm["value_pretraining"] and warm["warmup_steps_max"] == 7 and warm["warmup_lambda_critic"] == 1.0
    warm = card_for(module, without("value_pretraining"))["value_initialisation_and_warmup"]
    assert (
        not warm["value_pretraining"]
        and warm["warmup_steps_max"] == 0
        and warm["warmup_lambda_critic"] is None
    )
    assert warm["warmup_critic_lr_epochs"] is None


def test_the_warmup_records_the_critics_rate_in_value_pretraining(module):
    warm = card_for(
        module,
        ppo={"critic_lr": 6e-5, "critic_epochs": 1},
        vapo={"value_pretrain_critic_lr": 3e-4, "value_pretrain_critic_epochs": 4},
    )
    assert warm["value_initialisation_and_warmup"]["warmup_critic_lr_epochs"] == [3e-4, 4]
    same = card_for(module, ppo={"critic_lr": 6e-5, "critic_epochs": 2})["value_initialisation_and_warmup"]
    assert same["warmup_critic_lr_epochs"] == [6e-5, 2]  # None: the ppo ones


@pytest.mark.parametrize("recompute, source", [(True, "recomputed"), (False, "sampler")])
def test_the_behaviour_logprobs_source_follows_recompute_logprobs(module, recompute, source):
    sampling = card_for(module, ppo={"recompute_logprobs": recompute})["sampling"]
    assert sampling["recompute_logprobs"] is recompute and sampling["behaviour_logprobs"] == source
    assert sampling["rollout_engine"] == "hf"


def test_clip_nll_and_whitening_follow_the_config(module):
    card = card_for(module, vapo={"eps_high": 0.3, "mu": 0.2}, ppo={"eps": 0.1, "whiten_advantages": True})
    assert (
        card["eps"] == {"eps_low": 0.1, "eps_high": 0.3}
        and card["positive_samples"]["nll_coefficient"] == 0.2
    )
    assert card["advantage_normalisation"] == "whitened"
    card = card_for(
        module, without("clip_higher", "positive_lm_loss"), ppo={"eps": 0.1, "whiten_advantages": False}
    )
    assert (
        card["eps"] == {"eps_low": 0.1, "eps_high": 0.1}
        and card["positive_samples"]["nll_coefficient"] == 0.0
    )
    assert card["advantage_normalisation"] == "none"


def test_a_single_turn_card_has_no_multi_turn_section(module):
    card = card_for(module)
    assert "multi_turn" not in card and not any(f.startswith("multi_turn") for f in card["definitions"])
    json.dumps(card, default=str)  # as RunCardWriter writes it


def test_a_multi_turn_card_records_the_environment(tmp_path_factory):
    mod = _built(tmp_path_factory, task="toolchain", task_options={}, observations="step")
    card = card_for(mod)
    assert card["multi_turn"]["observations"] == "step" and card["multi_turn"]["tools"] == sorted(
        mod.task.tools
    )
    assert card["multi_turn"]["token_budget"] == mod.max_new_tokens
    assert {"multi_turn", "multi_turn.max_turns"} <= set(card["definitions"])
    check_definitions(card)


# ----------------------------------------------------------------------------- definitions
def slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc extension (MkDocs) makes it."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (fenced code blocks skipped)."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            out.add(slug(m.group(1)))
    return out


def test_slug_matches_the_links_the_docs_already_use():
    assert (
        slug('What the paper leaves open, and a run must record (its "run card")')
        == "what-the-paper-leaves-open-and-a-run-must-record-its-run-card"
    )
    assert slug("Report columns (`table.csv`, `seeds.csv`)") == "report-columns-tablecsv-seedscsv"


def check_definitions(card: dict) -> None:
    for field, link in card["definitions"].items():
        node = card
        for key in field.split("."):
            assert isinstance(node, dict) and key in node, (
                f"definitions names {field!r}, not a field of the card"
            )
            node = node[key]
        page, _, anchor = link.partition("#")
        assert page.startswith("docs/") and (ROOT / page).is_file(), link
        assert anchor in anchors(ROOT / page), f"{field}: {link} is no heading of {page}"


def test_every_definition_links_to_a_docs_heading_and_every_section_has_one(module):
    card = card_for(module, ALL + ["dynamic_sampling"])
    check_definitions(card)
    defined = {f.split(".")[0] for f in card["definitions"]}
    assert set(card) - defined == {"software", "definitions"}, set(card) - defined


def test_the_card_records_the_cpu_instruction_set_torch_dispatches_to(module):
    """Float32 kernels (and the built-in models trained with them) differ in their last bits between
    AVX2 and AVX-512: the card says which one a run had."""
    import torch

    card = card_for(module, ALL)
    assert card["software"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert card["software"]["torch_cpu_capability"]  # e.g. AVX2, AVX512, DEFAULT


def test_the_card_names_the_built_in_weights_the_run_started_from(module, tmp_path, monkeypatch):
    """Runs paired by seed must start from the same built-in models: the card records each cache
    entry and the SHA-256 of its weights as the cache's manifest lists them. Models built by the
    caller and handed to the module (a benchmark's, a task without built-in models) are named as
    such, with no cache looked up."""
    from vapo_lit.build import builtin_cache_dirs
    from vapo_lit.run_card import _base_models

    assert card_for(module, ALL)["base_models"] == {"policy": {"model": "random"}}
    cfg = merge(module.base_cfg, {"model": "builtin", "cache_dir": str(tmp_path), "components": ALL})
    handed_in = _base_models(cfg, module)
    assert handed_in["policy"]["model"] == "builtin" and set(handed_in) == {"policy"}
    dirs = builtin_cache_dirs(cfg, module.task)
    monkeypatch.setattr(
        module.actor.config, "name_or_path", str(dirs["policy"])
    )  # as from_pretrained sets it
    assert set(dirs) == {"policy", "critic's base policy", "reward model"}
    digests = {d: f"{i:064x}" for i, d in enumerate(dict.fromkeys(dirs.values()))}  # the critic's base
    for d, digest in digests.items():  # policy is the policy's entry unless critic_model reshapes it
        d.mkdir(parents=True, exist_ok=True)
        (d / "manifest.json").write_text(json.dumps({"config": {}, "files": {"model.safetensors": digest}}))
    assert _base_models(cfg, module) == {
        what: {"cache": d.name, "weights_sha256": digests[d]} for what, d in dirs.items()
    }
    (dirs["reward model"] / "manifest.json").unlink()  # not built (yet): recorded as unknown
    assert _base_models(cfg, module)["reward model"]["weights_sha256"] is None
