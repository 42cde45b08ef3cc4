"""Built-in policy / reward model: cache key, atomic cache, corruption recovery, loaders."""

import json
import time
import warnings
from pathlib import Path

import pytest
import torch

from vapo_lit import cache as vcache
from vapo_lit.models import ValueModel, load_critic, load_policy
from vapo_lit.models import builtin
from vapo_lit.models.builtin import RewardModelConfig, SFTConfig, TinyModelConfig
from vapo_lit.tasks import get_task

TINY = dict(
    model_config=TinyModelConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    ),
    sft_config=SFTConfig(steps=3, batch_size=4, warmup_steps=1),
    rm_config=RewardModelConfig(samples=8, steps=2, batch_size=4, warmup_steps=1),
)
POLICY_OPTS = {k: v for k, v in TINY.items() if k != "rm_config"}


@pytest.fixture(scope="module")
def task():
    return get_task("chain", max_n=12, n_buckets=2)


@pytest.fixture()
def cache_dir(tmp_path):
    return tmp_path / "cache"


def entry(cache_dir, name):
    dirs = [p for p in Path(cache_dir).iterdir() if p.name.startswith(name + "-")]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_builtin_policy_cached(task, cache_dir, monkeypatch):
    model, tok = load_policy("builtin", task, cache_dir=cache_dir, **POLICY_OPTS)
    assert model.config.vocab_size == len(task.tokenizer)
    d = entry(cache_dir, "policy")
    files = {p.name for p in d.iterdir()}
    assert {"manifest.json", "model.safetensors", "config.json"} <= files
    assert not any(f.endswith((".bin", ".pt", ".pkl", ".pickle")) for f in files)
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["config"]["seed"] == 0 and manifest["config"]["code_version"] == builtin.CODE_VERSION
    assert "model.safetensors" in manifest["files"]
    assert not [p for p in Path(cache_dir).iterdir() if p.name.startswith(".")]  # no temp dirs left
    # second load: from the cache, no training
    monkeypatch.setattr(builtin, "train_sft", lambda *a, **k: pytest.fail("rebuilt a valid cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t0 = time.time()
        again, tok2 = load_policy("builtin", task, cache_dir=cache_dir, **POLICY_OPTS)
        assert time.time() - t0 < 10
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    assert tok2("chain 1 from 7:")["input_ids"] == task.tokenizer("chain 1 from 7:")["input_ids"]


def test_cache_key_depends_on_config_and_seed(task):
    a = builtin.policy_build_config(task, TinyModelConfig(), SFTConfig(), 0)
    assert vcache.config_key(a) == vcache.config_key(
        builtin.policy_build_config(task, TinyModelConfig(), SFTConfig(), 0)
    )
    assert vcache.config_key(a) != vcache.config_key(
        builtin.policy_build_config(task, TinyModelConfig(), SFTConfig(), 1)
    )
    assert vcache.config_key(a) != vcache.config_key(
        builtin.policy_build_config(task, TinyModelConfig(), SFTConfig(steps=7), 0)
    )
    assert vcache.config_key(a) != vcache.config_key(
        builtin.policy_build_config(get_task("chain", max_n=13), TinyModelConfig(), SFTConfig(), 0)
    )


@pytest.mark.parametrize("damage", ["truncate", "no_manifest", "bad_manifest", "flip_byte", "delete_weights"])
def test_corrupted_cache_rebuilt_with_warning(task, cache_dir, damage):
    load_policy("builtin", task, cache_dir=cache_dir, **POLICY_OPTS)
    d = entry(cache_dir, "policy")
    w = d / "model.safetensors"
    if damage == "truncate":
        data = w.read_bytes()
        w.write_bytes(data[: len(data) // 2])
    elif damage == "no_manifest":
        (d / "manifest.json").unlink()
    elif damage == "bad_manifest":
        (d / "manifest.json").write_text("{not json")
    elif damage == "flip_byte":
        data = bytearray(w.read_bytes())
        data[-1] ^= 0xFF
        w.write_bytes(bytes(data))
    else:
        w.unlink()
    with pytest.warns(RuntimeWarning, match="rebuilding"):
        model, _ = load_policy("builtin", task, cache_dir=cache_dir, **POLICY_OPTS)
    assert vcache.verify_dir(entry(cache_dir, "policy")) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_policy("builtin", task, cache_dir=cache_dir, **POLICY_OPTS)


def test_partial_temp_dir_ignored(task, cache_dir):
    cache_dir.mkdir(parents=True)
    key = vcache.config_key(builtin.policy_build_config(task, TINY["model_config"], TINY["sft_config"], 0))
    (cache_dir / f".policy-{key}.tmp-crashed").mkdir()  # a build that died midway
    load_policy("builtin", task, cache_dir=cache_dir, **POLICY_OPTS)
    assert vcache.verify_dir(entry(cache_dir, "policy")) is None


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("VAPO_LIT_CACHE", str(tmp_path / "x"))
    assert vcache.cache_root() == tmp_path / "x"
    monkeypatch.delenv("VAPO_LIT_CACHE")
    assert vcache.cache_root() == Path.home() / ".cache" / "vapo-lit"


def test_reward_model_and_critics(task, cache_dir, tmp_path):
    rm = load_critic("reward_model", task, cache_dir=cache_dir, **TINY)
    assert isinstance(rm, ValueModel)
    d = entry(cache_dir, "reward_model")
    assert vcache.verify_dir(d) is None and ValueModel.is_value_dir(d)
    rm2 = load_critic("reward_model", task, cache_dir=cache_dir, **TINY)
    assert rm2 is not rm
    ids = task.tokenizer(["chain 1 from 7: 7: 0 6: 3"], return_tensors="pt")["input_ids"]
    assert torch.equal(rm(ids), rm2(ids))
    assert rm(ids).shape == ids.shape and rm(ids).dtype == torch.float32

    policy, _ = load_policy("builtin", task, cache_dir=cache_dir, **POLICY_OPTS)
    actor = load_critic("actor", task, cache_dir=cache_dir, **POLICY_OPTS)
    for (n, a), (_, b) in zip(actor.backbone.state_dict().items(), policy.base_model.state_dict().items()):
        assert torch.equal(a, b), n
    # a copy: training the critic does not touch the policy
    with torch.no_grad():
        next(actor.backbone.parameters()).add_(1.0)
    assert not torch.equal(next(actor.backbone.parameters()), next(policy.base_model.parameters()))

    # local paths: a saved ValueModel round-trips; an HF causal LM gives backbone + fresh head
    rm.save_pretrained(tmp_path / "vm")
    back = load_critic(str(tmp_path / "vm"), task)
    assert torch.equal(back(ids), rm(ids))
    policy.save_pretrained(tmp_path / "lm")
    fresh = load_critic(str(tmp_path / "lm"), task, seed=3)
    assert torch.equal(fresh.backbone.embed_tokens.weight, policy.base_model.embed_tokens.weight)
    assert fresh(ids).shape == ids.shape
    with pytest.raises(ValueError):
        load_critic("reward_model", task, policy_spec=str(tmp_path / "lm"))
    with pytest.raises(ValueError):
        load_critic(str(tmp_path / "missing"), task)


def test_value_model_left_padding_invariant(task):
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    vm = ValueModel(
        LlamaModel(
            LlamaConfig(
                vocab_size=len(task.tokenizer),
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
            )
        )
    ).eval()
    ids = torch.tensor([[1, 4, 8, 5, 23, 15]])
    padded = torch.tensor([[0, 0, 1, 4, 8, 5, 23, 15]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        assert torch.allclose(vm(ids), vm(padded, mask)[:, 2:], atol=1e-5)


def test_load_policy_local_dirs(task, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    with pytest.raises(ValueError, match="does not exist"):
        load_policy(str(tmp_path / "nope"), task)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a model directory"):
        load_policy(str(tmp_path / "empty"), task)
    tok = task.tokenizer
    m = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    )
    m.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    model, tok2 = load_policy(str(tmp_path / "hf"), task)
    assert not model.training and tok2.pad_token_id is not None
    with pytest.raises(
        ValueError, match=r"only for the built-in tasks \(chain, longchain, toolchain\), not 'other'"
    ):

        class Other:
            name = "other"

        load_policy("builtin", Other())


def test_builds_loads_and_exports_draw_no_transformers_progress_bars(task, cache_dir, tmp_path, capfd):
    """The built-in cache and the exports print none of transformers' "Loading weights" / "Writing model
    shards" bars (they would land between the demo's lines), and leave the user's setting as it was."""
    from transformers.utils import logging as hf_logging

    from vapo_lit.models import export

    hf_logging.enable_progress_bar()
    try:
        policy, tok = load_policy("builtin", task, cache_dir=cache_dir, **POLICY_OPTS)  # build, save, load
        rm = load_critic("reward_model", task, cache_dir=cache_dir, **TINY)
        export(policy, tmp_path / "policy", tok)
        export(rm, tmp_path / "critic", tok)
        load_policy(str(tmp_path / "policy"), task)
        load_critic(str(tmp_path / "critic"), task)
        assert hf_logging.is_progress_bar_enabled()  # turned off around our calls only
    finally:
        hf_logging.enable_progress_bar()
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err and "%|" not in err, err[-2000:]


@pytest.mark.slow
def test_real_default_build_meets_targets(tmp_path):
    """The default base policy + reward model from an empty cache: build time and eval targets."""
    from vapo_lit.evaluation import evaluate, format_table

    task = get_task("chain")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    t0 = time.time()
    policy, _ = load_policy("builtin", task, cache_dir=tmp_path)
    load_critic("reward_model", task, cache_dir=tmp_path)
    build_s = time.time() - t0
    t1 = time.time()
    policy, _ = load_policy("builtin", task, cache_dir=tmp_path)
    load_critic("reward_model", task, cache_dir=tmp_path)
    assert time.time() - t1 < 10
    m = evaluate(policy, task, task.eval_problems(), k=8, temperature=1.0, top_p=0.7)
    print(f"\nbuild {build_s:.1f}s\n" + format_table(m, task))
    names = task.bucket_names()
    assert 0.05 <= m["eval/avg@8"] <= 0.40
    assert m[f"eval/avg@8/{names[-1]}"] <= 0.05
    assert m[f"eval/avg@8/{names[0]}"] > m["eval/avg@8"] + 0.1
    assert m["eval/correct_len_min"] < 20
    # correct answers of >= 200 tokens exist but are rare (~0.3% at top-p 0.7): look for them in a
    # larger sample (20 problems x 128)
    longest = [p for p in task.eval_problems() if 2 * p.meta["n"] + 3 >= 200]
    assert evaluate(policy, task, longest, k=128, seed=1)["eval/correct_len_max"] >= 200
    assert m["eval/verifier_errors"] == 0
    # generous bound: the 3-minute target is for an otherwise idle 2-core machine
    assert build_s < 600


@pytest.mark.parametrize(
    "engine,shape,head",
    [
        ("hf", "auto", 16),
        ("vllm", "auto", 64),
        ("hf", "vllm", 64),
        ("cb", "vllm", 64),
        ("vllm", "vllm", 64),
        ("vllm", "default", 16),
    ],
)
def test_builtin_shape_picks_the_models_a_run_builds(engine, shape, head):
    """builtin_shape: auto gives the vLLM variant (one head of 64) exactly with rollout_engine=vllm;
    vllm gives it to any engine (engines compared on one model); default keeps the heads of 16 (which
    vLLM's preflight then refuses). `model: random` follows the same choice (head 32 vs 16)."""
    from vapo_lit.build import policy_config
    from vapo_lit.config import RunConfig, merge

    cfg = merge(RunConfig(), {"rollout_engine": engine, "builtin_shape": shape})
    c = policy_config(cfg, get_task("chain"))
    assert c.hidden_size // c.num_attention_heads == head
    r = policy_config(merge(cfg, {"model": "random"}), get_task("chain"))
    assert r.hidden_size // r.num_attention_heads == (32 if head == 64 else 16)
