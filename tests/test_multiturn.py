"""Multi-turn episodes: the environment contract, the episode engine, the action mask
through the Experience, and the rule that observation tokens never receive gradient.

A scripted stand-in for the policy (`Scripted`) writes exactly the action tokens a test gives it,
so each test knows the episode it must get; the real tiny Llama checks what needs real numerics
(the static-cache loop against transformers' forward, behaviour log-probs against the training
forward, batch independence)."""

from __future__ import annotations


import pytest
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from vapo_lit import passes
from vapo_lit.build import random_tiny_policy
from vapo_lit.engines import SamplingParams, make_engine
from vapo_lit.engines.episodes import generate_episodes
from vapo_lit.experience import (
    AdvantageSettings,
    Experience,
    action_lengths,
    fill_advantages,
    fill_values,
    score,
    turn_index,
)
from vapo_lit.tasks import get_task
from vapo_lit.tasks.base import Problem
from vapo_lit.tasks.env import EnvStep, Tool
from vapo_lit.tasks.toolchain import addend


@pytest.fixture(scope="module")
def task():
    return get_task("toolchain")


@pytest.fixture(scope="module")
def problem(task):
    return task.make_problem(4, 3, "519")


# ----------------------------------------------------------------------------- the environment
def test_a_tool_call_gets_the_tool_answer(task, problem):
    step = task.respond(problem, "call look 3: ?", "call look 3: ?", turns_done=1, final=False)
    assert step.observation == f"= {addend('519', 3)}" and not step.done


@pytest.mark.parametrize(
    "turn, expect",
    [
        ("3: 1 ?", "error malformed call"),  # no 'call'
        ("call ?", "error malformed call"),  # no tool name
        ("call key 3: ?", "error unknown tool"),  # a word that is no tool
        ("call from ?", "error unknown tool"),
        ("call look ?", "error bad args"),  # the tool refuses its arguments
        ("call look 9: ?", "error bad args"),  # a step outside the chain
        ("call look 2: 1: ?", "error bad args"),
    ],
)
def test_a_bad_call_is_an_observation_never_an_exception(task, problem, turn, expect):
    step = task.respond(problem, turn, turn, turns_done=1, final=False)
    assert step.observation == expect and not step.done and step.reward is None


def test_a_tool_that_raises_is_an_observation(task, problem):
    class Broken(type(task)):
        def __init__(self):
            super().__init__()
            self.tools = {**self.tools, "boom": Tool("boom", lambda p, a: 1 / 0)}

    env = Broken()
    assert (
        env.respond(problem, "call boom ?", "call boom ?", turns_done=1, final=False).observation
        == "error tool failed"
    )


def test_the_turn_limit_ends_the_episode_with_reward_zero(task, problem):
    step = task.respond(problem, "x", "call look 3: ?", turns_done=task.max_turns, final=False)
    assert step.done and step.reward == 0.0 and step.truncated and step.observation is None


def test_a_final_answer_is_scored_by_the_verifier(task, problem):
    right = task.solution(problem)
    assert task.respond(problem, right, "1: x", turns_done=4, final=True).reward == 1.0
    wrong = right[:-1] + str((int(problem.answer) + 1) % 10)
    assert task.respond(problem, wrong, "1: x", turns_done=4, final=True).reward == 0.0


def test_a_final_answer_on_the_last_allowed_turn_is_scored_by_the_verifier(task, problem):
    """EOS on turn max_turns is the final answer, not a turn-limit cut: the verifier scores it and
    the episode is not truncated; only a tool call on that turn ends the episode with reward 0."""
    right = task.solution(problem)
    step = task.respond(problem, right, "1: x => 1", turns_done=task.max_turns, final=True)
    assert step.done and step.reward == 1.0 and not step.truncated
    wrong = right[:-1] + str((int(problem.answer) + 1) % 10)
    step = task.respond(problem, wrong, "1: x => 1", turns_done=task.max_turns, final=True)
    assert step.done and step.reward == 0.0 and not step.truncated


def test_an_environment_bug_ends_the_episode_instead_of_raising(task, problem):
    class Buggy(type(task)):
        def verify(self, problem, response):
            raise RuntimeError("bug")

    step = Buggy().respond(problem, "=> 1", "=> 1", turns_done=1, final=True)
    assert step.done and step.reward == 0.0


def test_prompts_round_trip_and_bad_prompts_are_refused(task):
    for p in task.train_problems(20, 0) + task.eval_problems()[:10]:
        assert task.problem_from_prompt(p.prompt) == p
    for bad in ("chain 4 from 3:", "chain 4 from 99: key 1 2 3", "hello"):
        with pytest.raises(ValueError, match="not a toolchain prompt"):
            task.problem_from_prompt(bad)


def test_train_and_eval_prompts_are_disjoint(task):
    ev = {p.prompt for p in task.eval_problems()}
    assert len(ev) == len(task.eval_problems())
    assert not ev & {p.prompt for s in range(5) for p in task.train_problems(200, s)}


def test_the_solution_needs_the_tool(task):
    """The hidden addends make the tool necessary: two keys differ in their answers."""
    answers = {task.make_problem(4, 6, k).answer for k in ("000", "123", "999", "517", "250")}
    assert len(answers) > 1
    p = task.make_problem(4, 3, "519")
    assert task.verify(p, task.solution(p)).strict


# ----------------------------------------------------------------------------- a scripted policy
class Scripted(torch.nn.Module):
    """Writes, for each row, the next token of its script (greedy: one huge logit). It advances
    when the token it proposed is fed back (sampled); an observation token fed instead leaves it
    where it is. Scripts must not propose a word that the environment's reply could contain."""

    def __init__(self, tokenizer, scripts: list[str]):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        vocab = tokenizer.get_vocab()
        self.scripts = [[vocab[w] for w in s.split()] + [tokenizer.eos_token_id] for s in scripts]
        self.pos = [0] * len(scripts)
        self.V = len(vocab)

    def _logits(self, columns: int):
        out = torch.full((len(self.scripts), columns, self.V), -30.0)
        for i, s in enumerate(self.scripts):
            out[i, :, s[min(self.pos[i], len(s) - 1)]] = 30.0
        return out

    def forward(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        use_cache=True,
        logits_to_keep=None,
        past_key_values=None,
    ):
        columns = input_ids.shape[1]
        if past_key_values is not None:  # a decode step: the tokens fed back (an action and its observation)
            fed = attention_mask[:, -columns:].bool()
            for i, row in enumerate(input_ids.tolist()):
                s = self.scripts[i]
                for t in (t for t, real in zip(row, fed[i].tolist()) if real):
                    if self.pos[i] < len(s) and t == s[self.pos[i]]:
                        self.pos[i] += 1
            return CausalLMOutputWithPast(logits=self._logits(columns), past_key_values=("cache",))
        return CausalLMOutputWithPast(logits=self._logits(1), past_key_values=("cache",))


def run_script(task, problems, scripts, max_new_tokens=None):
    model = Scripted(task.tokenizer, scripts)
    return generate_episodes(
        model,
        task.tokenizer,
        task,
        [p.prompt for p in problems],
        temperature=0.0,
        max_new_tokens=max_new_tokens or task.max_new_tokens,
        seeds=0,
    )


def words_and_masks(task, ro, i):
    ids = ro.response_ids[i, : int(ro.lengths[i])].tolist()
    inv = {v: k for k, v in task.tokenizer.get_vocab().items()}
    return [inv[t] for t in ids], ro.action_mask[i, : len(ids)].tolist()


def test_a_correct_episode_interleaves_actions_and_observations_exactly(task, problem):
    spans = task.solution_spans(problem)
    actions = " ".join(t for t, is_action in spans if is_action)
    ro = run_script(task, [problem], [actions])
    words, amask = words_and_masks(task, ro, 0)
    expect_words = [w for t, _ in spans for w in t.split()] + ["<eos>"]
    expect_mask = [float(a) for t, a in spans for _ in t.split()] + [1.0]
    assert words == expect_words and amask == expect_mask
    assert ro.texts[0] == task.solution(problem) and task.verify(problem, ro.texts[0]).reward == 1.0
    assert int(ro.turns[0]) == 4 and bool(ro.terminated[0]) and not bool(ro.truncated[0])
    obs = (ro.response_mask[0] - ro.action_mask[0]) > 0
    assert (ro.logprobs[0][obs] == 0).all() and obs.sum() == 6  # three observations of two tokens


def test_malformed_and_unknown_calls_continue_the_episode(task, problem):
    script = "3: 1 ? 3: 1 call key ? call look 3: ? 3: 1 => 1"
    ro = run_script(task, [problem], [script])
    words, amask = words_and_masks(task, ro, 0)
    text = " ".join(words)
    assert text.startswith("3: 1 ? error malformed call 3: 1 call key ? error unknown tool call look 3: ? = ")
    assert words[-1] == "<eos>" and int(ro.turns[0]) == 4 and bool(ro.terminated[0])
    # the environment's words are observations, the policy's are actions
    obs_words = [w for w, a in zip(words, amask) if a == 0]
    assert obs_words == ["error", "malformed", "call", "error", "unknown", "tool", "=", str(addend("519", 3))]


def test_the_turn_limit_ends_an_endless_caller(task, problem):
    script = " ".join(["call look 1: ?"] * (task.max_turns + 5))
    ro = run_script(task, [problem], [script], max_new_tokens=200)
    words, amask = words_and_masks(task, ro, 0)
    assert int(ro.turns[0]) == task.max_turns and bool(ro.truncated[0])
    assert words[-1] == "?" and amask[-1] == 1.0  # ended on the call, no observation after it
    assert task.verify(problem, ro.texts[0]).reward == 0.0


def test_an_episode_answering_on_its_last_allowed_turn_terminates(problem):
    """Through the engine: a task whose turn limit is exactly the correct episode's turns (three
    tool calls and the answer: 4) ends that episode by its answer, terminated, not truncated."""
    from vapo_lit.tasks.toolchain import ToolChainTask

    tight = ToolChainTask(max_turns=4)
    actions = " ".join(t for t, is_action in tight.solution_spans(problem) if is_action)
    ro = run_script(tight, [problem], [actions])
    assert int(ro.turns[0]) == tight.max_turns == 4
    assert bool(ro.terminated[0]) and not bool(ro.truncated[0])
    assert ro.texts[0] == tight.solution(problem) and tight.verify(problem, ro.texts[0]).reward == 1.0


def test_the_token_budget_can_cut_inside_an_observation(task, problem):
    ro = run_script(task, [problem], ["call look 3: ? 3: 1 => 1"], max_new_tokens=5)
    words, amask = words_and_masks(task, ro, 0)
    assert words == ["call", "look", "3:", "?", "="] and amask == [1, 1, 1, 1, 0]
    assert bool(ro.truncated[0]) and not bool(ro.terminated[0])


def test_rows_end_independently(task):
    probs = [task.make_problem(4, 3, "519"), task.make_problem(1, 2, "000")]
    ro = run_script(
        task, probs, ["3: 1 2: 1 1: 1 => 1", " ".join(t for t, a in task.solution_spans(probs[1]) if a)]
    )
    assert ro.texts[1] == task.solution(probs[1]) and ro.texts[0] == "3: 1 2: 1 1: 1 => 1"
    assert int(ro.turns[0]) == 1 and int(ro.turns[1]) == 3


# ----------------------------------------------------------------------------- real numerics
@pytest.fixture(scope="module")
def tiny(task):
    model, tok = random_tiny_policy(task, 0)
    return model.eval(), tok


def test_static_cache_loop_equals_transformers_forward(task, tiny):
    model, tok = tiny
    prompts = [p.prompt for p in task.train_problems(12, 1)]
    a = generate_episodes(model, tok, task, prompts, max_new_tokens=task.max_new_tokens, seeds=7, fast=True)
    b = generate_episodes(model, tok, task, prompts, max_new_tokens=task.max_new_tokens, seeds=7, fast=False)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.action_mask, b.action_mask)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert (a.response_mask - a.action_mask).sum() > 0  # the random policy did call the tool somewhere


def test_an_episode_depends_only_on_its_own_prompt_and_seed(task, tiny):
    model, tok = tiny
    prompts = [p.prompt for p in task.train_problems(6, 2)]
    seeds = [11, 12, 13, 14, 15, 16]
    full = generate_episodes(model, tok, task, prompts, max_new_tokens=task.max_new_tokens, seeds=seeds)
    for i in (0, 3, 5):
        one = generate_episodes(
            model, tok, task, prompts[i : i + 1], max_new_tokens=task.max_new_tokens, seeds=seeds[i : i + 1]
        )
        n = int(one.lengths[0])
        assert int(full.lengths[i]) == n and torch.equal(full.response_ids[i, :n], one.response_ids[0, :n])
        assert full.texts[i] == one.texts[0]


def test_behaviour_logprobs_equal_the_training_forward_on_action_tokens(task, tiny):
    model, tok = tiny
    probs = task.train_problems(10, 3)
    ro = make_engine("hf", model, tok, task=task).generate(
        [p.prompt for p in probs], SamplingParams(max_new_tokens=task.max_new_tokens), 5
    )
    exp = Experience.from_rollout(ro, probs)
    lp = passes.sequence_logprobs(model, exp.input_ids, exp.attention_mask)[:, exp.prompt_width - 1 :]
    assert float(((lp.detach() - exp.behaviour_logprobs) * exp.mask).abs().max()) < 1e-4
    assert (exp.behaviour_logprobs[exp.obs_mask > 0] == 0).all()


def test_cb_engine_refuses_a_multi_turn_task(task, tiny):
    with pytest.raises(ValueError, match="cannot run the multi-turn task 'toolchain'"):
        make_engine("cb", tiny[0], tiny[1], task=task)


# ----------------------------------------------------------------------------- the Experience
def scripted_experience(task, scripts_by_problem, seed=0):
    probs = [p for p, _ in scripts_by_problem]
    ro = run_script(task, probs, [s for _, s in scripts_by_problem])
    exp = Experience.from_rollout(ro, probs)
    score(exp, task.verify_batch(exp.problems, exp.texts))
    return exp


def test_reward_sits_on_the_last_action_token_even_when_an_observation_ends_the_row(task, problem):
    ro = run_script(task, [problem], ["call look 3: ?"], max_new_tokens=6)  # ends inside the observation
    ro.texts[0] = task.solution(problem)  # pretend the verifier says 1, to see where the reward goes
    exp = Experience.from_rollout(ro, [problem])
    score(exp, task.verify_batch(exp.problems, exp.texts))
    assert exp.obs_mask[0, -1] == 1 and exp.rewards[0, 3] == 1.0 and exp.rewards.sum() == 1.0


def test_experience_masks_and_counts(task, problem):
    spans = task.solution_spans(problem)
    exp = scripted_experience(task, [(problem, " ".join(t for t, a in spans if a))])
    n_obs = sum(len(t.split()) for t, a in spans if not a)
    assert int(exp.obs_mask.sum()) == n_obs and int(exp.lengths[0]) == int(exp.mask.sum()) + n_obs
    assert int(action_lengths(exp)[0]) == int(exp.mask.sum())
    assert torch.equal(exp.attention_mask[:, exp.prompt_width :], (exp.mask + exp.obs_mask).long())
    last = int((exp.mask[0] > 0).nonzero().max())
    assert exp.rewards[0, last] == 1.0
    assert turn_index(exp)[0, last] == 3


@pytest.mark.parametrize("mode", ["skip", "step", "zero"])
def test_values_and_advantages_through_the_stages(task, mode):
    """fill_values reads V on observations too; fill_advantages crosses them as `mode` says and leaves
    0 on every observation token; the length of length-adaptive GAE counts action tokens."""
    probs = [task.make_problem(4, 3, "519"), task.make_problem(2, 2, "007")]
    scripts = [" ".join(t for t, a in task.solution_spans(p) if a) for p in probs]
    exp = scripted_experience(task, list(zip(probs, scripts)))
    g = torch.Generator().manual_seed(0)

    def critic(ids, attn):
        return torch.randn(ids.shape, generator=g)

    fill_values(exp, critic)
    assert (exp.values[exp.obs_mask > 0] != 0).all()
    fill_advantages(exp, AdvantageSettings(alpha=0.2, lam_critic=1.0, observations=mode, whiten=False))
    assert (exp.advantages[exp.obs_mask > 0] == 0).all() and (exp.returns[exp.obs_mask > 0] == 0).all()
    lam = 1 - 1 / (0.2 * exp.mask.sum(1))
    assert torch.allclose(exp.lam_policy, lam.clamp(0, 1))
    # lambda_critic = 1, gamma = 1: critic targets are the outcome, whatever the setting
    assert torch.allclose(exp.returns, exp.scores[:, None] * exp.mask, atol=1e-6)


@pytest.mark.parametrize("mode", ["step", "zero"])
def test_the_configured_observation_setting_reaches_the_runs_advantages(tmp_path, mode):
    """A real training iteration configured `observations=step` / `zero`: the module's advantage
    stage gives the critic targets of that setting (float64 loops of test_gae_observations on the
    recorded Experience), which differ from the default skip's on this batch; the actor's
    advantages are those of the setting, whitened."""
    from test_gae_observations import reference
    from wiring import probe_run, whiten

    run = probe_run(tmp_path, [], task="toolchain", task_options={"max_n": 3}, observations=mode)
    exp = run.probe.iterations[0].exp
    assert exp.obs_mask is not None and exp.obs_mask.sum() > 0 and exp.lam_policy.max() < 1
    action, obs = exp.mask.double(), exp.obs_mask.double()
    want = {
        m: reference(
            exp.rewards, exp.values, action, obs, exp.lam_policy, run.cfg.ppo.gamma, exp.bootstrap, m
        )
        for m in ("skip", mode)
    }
    torch.testing.assert_close(exp.returns.double(), want[mode][1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(want["skip"][1], want[mode][1], rtol=1e-5, atol=1e-5)
    adv = whiten(want[mode][0], exp.mask) if run.cfg.ppo.whiten_advantages else want[mode][0]
    torch.testing.assert_close(exp.advantages.double(), adv, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- no gradient on observations
def test_observation_tokens_never_receive_gradient(tmp_path):
    """The actor loss of a real multi-turn iteration (clipped policy loss, token-level denominator,
    positive NLL, KL penalty) differentiated with respect to the per-token log-probs: exactly 0 on
    every observation token, nonzero on action tokens. Fails if any loss term reads an observation."""
    from vapo_lit.build import build_module
    from vapo_lit.components import build_callbacks
    from vapo_lit.config import RunConfig, merge
    from vapo_lit.presets import PRESETS

    cfg = merge(
        merge(RunConfig(), PRESETS["smoke"]),
        {
            "task": "toolchain",
            "task_options": {"max_n": 3},
            "model": "random",
            "wandb": "disabled",
            "out_dir": str(tmp_path),
            "components": [
                "token_level_loss",
                "clip_higher",
                "positive_lm_loss",
                "group_sampling",
                "kl_penalty",
            ],
        },
    )
    module = build_module(cfg)
    for cb in build_callbacks(
        [c for c in cfg.components if c != "kl_penalty"], cfg.vapo
    ):  # their setup's part
        cb.attach(module)
    torch.manual_seed(0)
    probs = module.task.train_problems(4, 0)
    exp = module.rollout(probs)
    assert exp.obs_mask is not None and exp.obs_mask.sum() > 0
    verdicts = [
        v.__class__(float(i % 2)) for i, v in enumerate(module.task.verify_batch(exp.problems, exp.texts))
    ]
    score(exp, verdicts)  # half the episodes "correct", so the positive NLL has tokens
    fill_values(exp, module.critic)
    fill_advantages(exp, module.advantage_settings(pretraining=False))
    exp.advantages = exp.advantages + exp.mask  # nonzero everywhere on actions (whitening can leave zeros)
    exp.behaviour_logprobs = exp.behaviour_logprobs - 0.3 * exp.mask  # ratios off 1: both clip sides active

    import copy

    from vapo_lit.components.kl_penalty import KLPenalty
    from vapo_lit.distributed import ActorScorer

    ext = KLPenalty(kl_coef=0.1)  # what its setup does, without a Trainer
    ext.reference, ext.sharded = ActorScorer(copy.deepcopy(module.actor).eval().requires_grad_(False)), False
    with torch.no_grad():  # a reference that differs from the actor: the k3 term has a gradient
        for q in ext.reference.parameters():
            q.add_(0.05 * torch.randn_like(q))
    module.components.append(ext)
    ext.on_experience(module, exp)
    captured = {}
    real = module.policy

    def scorer(*args, **kw):
        logp, ent = real(*args, **kw)
        logp.retain_grad()
        captured["logp"] = logp
        return logp, ent

    from vapo_lit.module import Role

    module.data_parallel.wrappers = {Role.ACTOR: scorer}
    mb = exp.select(torch.arange(exp.n), trim=True)
    tokens = exp.mask.sum()
    loss, _ = module.actor_loss(
        mb, den=tokens, pos_den=(exp.mask * exp.positive[:, None]).sum(), tokens=tokens
    )
    loss.backward()
    grad = captured["logp"].grad
    obs = mb.obs_mask[:, : grad.shape[1]] > 0
    assert obs.any()
    assert (grad[obs] == 0).all(), grad[obs]
    assert (grad[mb.mask[:, : grad.shape[1]] > 0] != 0).float().mean() > 0.5


# ----------------------------------------------------------------------------- the docs' worked example
def test_the_docs_worked_example_runs_as_written():
    """docs/guides/multi-turn.md's "Adding a tool and a multi-turn task" block, executed: its tools
    answer, its bad calls are observations, and a scripted episode through the real engine is scored 1."""
    from pathlib import Path

    from vapo_lit.tasks import TASKS

    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "multi-turn.md").read_text()
    start = text.index("```python\n# mytasks.py") + len("```python\n")
    code = text[start : text.index("```", start)]
    before = dict(TASKS)
    scope: dict = {}
    try:
        exec(compile(code, "docs/guides/multi-turn.md", "exec"), scope)
        env = get_task("cellsum")
    finally:
        TASKS.clear()
        TASKS.update(before)
    p = env.problem_from_prompt("sum 3 1")
    assert env.respond(p, "", "call get 3 ?", turns_done=1, final=False).observation == "= 4"
    assert env.respond(p, "", "call add 4 9 ?", turns_done=1, final=False).observation == "= 3"
    assert env.respond(p, "", "call get 7 ?", turns_done=1, final=False).observation == "error bad args"
    assert env.respond(p, "", "call mul 1 2 ?", turns_done=1, final=False).observation == "error unknown tool"
    assert not {q.prompt for q in env.eval_problems()} & {q.prompt for q in env.train_problems(200, 0)}
    ro = run_script(env, [p], ["call get 3 ? call get 1 ? call add 4 0 ? => 4"])
    assert ro.texts[0] == "call get 3 ? = 4 call get 1 ? = 0 call add 4 0 ? = 4 => 4"
    assert env.verify(p, ro.texts[0]).reward == 1.0 and int(ro.turns[0]) == 4


def test_preflight_takes_toolchain_with_the_builtin_model_and_refuses_cb(tmp_path):
    from vapo_lit.config import RunConfig, merge
    from vapo_lit.preflight import preflight

    base = merge(RunConfig(), {"task": "toolchain", "out_dir": str(tmp_path / "runs")})
    preflight(base)
    with pytest.raises(ValueError, match="multi-turn .* runs on rollout_engine=hf or vllm, not 'cb'"):
        preflight(merge(base, {"rollout_engine": "cb"}))
    with pytest.raises(
        ValueError, match="observations=.carry. is not valid; choose one of: skip, step, zero"
    ):
        preflight(merge(base, {"observations": "carry"}))
    with pytest.raises(
        ValueError, match=r"exists only for the built-in tasks \(chain, longchain, toolchain\), not 'math'"
    ):
        preflight(merge(base, {"task": "math", "task_options": {}}))


# ----------------------------------------------------------------------------- stop strings on the decoded text
def fused_tokenizer(words: list[str]):
    """A word-level tokenizer whose decoder joins tokens without spaces (as byte-level BPE does), so a
    stop string can be one token, several, or part of a longer token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="<unk>"))
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.WhitespaceSplit(), decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


class Recorder:
    """An environment that records the turn texts it is handed and answers each tool call with '='."""

    multi_turn, name, max_turns, stop_sequences = True, "recorder", 4, ("</call>",)

    def __init__(self):
        self.tokenizer = fused_tokenizer(["a", "b", "c", "get", "</call>", "</", "call>", "get</call>x", "="])
        self.turns: dict[str, list[str]] = {}

    def problem_from_prompt(self, prompt):
        return Problem(prompt, "", {})

    def respond(self, problem, transcript, turn, *, turns_done, final):
        self.turns.setdefault(problem.prompt, []).append(turn)
        return EnvStep(done=True, reward=0.0) if final else EnvStep(observation="=")


def test_a_stop_string_ends_the_turn_however_it_is_tokenized():
    """One token, two tokens, or inside a token that carries more text: each ends the turn at the
    token that completes it; the environment is handed the text up to the stop string's end."""
    from vapo_lit.engines.episodes import StopStrings

    env = Recorder()
    tok = env.tokenizer
    stops = StopStrings(tok, env.stop_sequences)
    ids = lambda words: tok.convert_tokens_to_ids(words.split())  # noqa: E731
    assert [
        stops.completed(ids(w)) for w in ("a </call>", "a </ call>", "a get</call>x", "a </", "</call> a")
    ] == [True, True, True, False, False]
    prompts = ["a", "b", "c", "a b"]
    scripts = ["a </call> b", "a </ call> b", "a get</call>x b", "a b c"]
    ro = run_script(env, [env.problem_from_prompt(p) for p in prompts], scripts, max_new_tokens=12)
    assert env.turns == {
        "a": ["a</call>", "b"],
        "b": ["a</call>", "b"],
        "c": ["aget</call>", "b"],
        "a b": ["abc"],
    }
    assert ro.texts == ["a</call>=b", "a</call>=b", "aget</call>x=b", "abc"]
    assert ro.turns.tolist() == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="stop sequences must be non-empty strings"):
        StopStrings(tok, ["</call>", ""])
