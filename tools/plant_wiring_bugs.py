"""Known wiring bugs, planted one at a time in a scratch copy of the repository: each must fail at
least one of its mapped tests. Bugs 1-4 are the first wiring bugs found; 5-14 and 15-20 are
behaviours that no test pinned until an audit planted each one and saw every relevant test pass. Prints one line per
bug (exit code, seconds, the first failing test) and exits 1 if any bug passed its tests. The
working tree is never changed.

    .venv/bin/python tools/plant_wiring_bugs.py              # all
    .venv/bin/python tools/plant_wiring_bugs.py 5 nll        # bug 5 and the bugs whose name contains "nll"

A plant's `old` text must occur exactly once in its file; after a refactor of that file, update the
plant (the module.py ones are single short lines on purpose).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent
BUGS = [
    (
        "1 critic values one column late",
        "vapo_lit/passes.py",
        "    return critic(input_ids, attention_mask)[:, prompt_width - 1:]\n",
        "    v = critic(input_ids, attention_mask)\n    return torch.cat([v[:, prompt_width:], v[:, -1:]], 1)\n",
        ["tests/test_stages.py", "tests/test_components.py"],
    ),
    (
        "2 critic targets with lambda_policy",
        "vapo_lit/experience.py",
        "    lam_critic = lam_policy if s.lam_critic is None else s.lam_critic\n",
        "    lam_critic = lam_policy\n",
        ["tests/test_stages.py", "tests/test_components.py"],
    ),
    (
        "3 clip_higher's hook sets eps_high = eps",
        "vapo_lit/components/clip_higher.py",
        '        return replace(s, eps_high=self.values["eps_high"])\n',
        "        return replace(s, eps_high=s.eps_low)\n",
        [
            "tests/test_components.py::test_each_component_changes_what_its_hooks_declare_and_nothing_else",
            "tests/test_updates.py::test_clip_higher_is_set_up_by_the_trainer_and_changes_the_run",
        ],
    ),
    (
        "4 claim UPDATE without state = WAITING",
        "vapo_lit/ablate/store.py",
        "                     .filter(cols.trial_id == trial_id, cols.state == frm)\n",
        "                     .filter(cols.trial_id == trial_id)\n",
        ["tests/test_claim.py"],
    ),
    # ---- the audit's ten behaviours
    (
        "5 data-parallel gather drops the bootstrap values",
        "vapo_lit/distributed.py",
        '    for name in ("lengths", "truncated", "scores", "bootstrap"):\n',
        '    for name in ("lengths", "truncated", "scores"):\n',
        ["tests/test_data_parallel.py::test_two_ranks_keep_the_bootstrap_values_of_truncated_responses"],
    ),
    (
        "6 no-grad chunked log-probs ignore the temperature",
        "vapo_lit/passes.py",
        "            lp = _chunk_logprobs(head, hs, ys, temperature)\n",
        "            lp = _chunk_logprobs(head, hs, ys, 1.0)\n",
        [
            "tests/test_one_gpu.py::test_chunked_logprob_pass_equals_the_plain_one",
            "tests/test_updates.py::test_recomputed_behaviour_logprobs_are_the_training_pass",
        ],
    ),
    (
        "7 critic warm-up carries on after value pretraining",
        "vapo_lit/module.py",
        "        sch.last_epoch = 0\n",
        "",
        ["tests/test_components.py::test_after_value_pretraining_a_long_warmup_starts_over"],
    ),
    (
        "8 gamma left out of the pretrained-critic cache key",
        "vapo_lit/pretrain.py",
        '    "ppo.actor_lr", "ppo.lam", "ppo.eps",',
        '    "ppo.actor_lr", "ppo.lam", "ppo.gamma", "ppo.eps",',
        ["tests/test_module.py::test_the_pretrained_critic_cache_key_changes_with_what_changes_its_training"],
    ),
    (
        "9 value pretraining on lambda_critic when decoupled",
        "vapo_lit/module.py",
        'replace(s, lam_critic=1.0, values="critic") if pretraining',
        'replace(s, values="critic") if pretraining',
        [
            "tests/test_components.py::test_value_pretraining_targets_are_monte_carlo_whatever_decoupled_gae_says"
        ],
    ),
    (
        "10 positive NLL over the whole rollout's positive tokens",
        "vapo_lit/module.py",
        "pos_den = (m * exp.positive[idx, None]).sum()",
        "pos_den = (exp.mask * exp.positive[:, None]).sum()",
        ["tests/test_updates.py::test_each_minibatch_step_is_normalised_by_its_own_minibatch"],
    ),
    (
        "11 only the first generation-config EOS id stops",
        "vapo_lit/rollout.py",
        "        ids.update(int(i) for i in extra)\n",
        "        ids.add(int(extra[0]))\n",
        ["tests/test_engines.py::test_every_eos_id_of_the_generation_config_ends_a_response"],
    ),
    (
        "12 strict_peak counts the base eval",
        "vapo_lit/report/collect.py",
        '"strict_peak": max(strict_trained) if strict_trained else NAN,',
        '"strict_peak": max(strict) if strict else NAN,',
        ["tests/test_report.py::test_strict_peak_is_the_best_strict_eval_of_the_trained_policy"],
    ),
    (
        "13 heartbeat notices only a completed trial",
        "vapo_lit/ablate/store.py",
        'if self.store.trial_state(self.trial_id).name != "RUNNING":',
        'if self.store.trial_state(self.trial_id).name == "COMPLETE":',
        [
            "tests/test_ablate.py::test_a_paused_worker_whose_cell_was_taken_over_stops_training_into_its_folder"
        ],
    ),
    (
        "14 resume restarts the generated-token counter",
        "vapo_lit/module.py",
        's.get("generated_tokens", 0.0)',
        "0.0",
        ["tests/test_module.py::test_resume_reproduces_metric_history[5-2-1]"],
    ),
    # ---- issue 37
    (
        "15 a final answer on the last allowed turn is cut as the turn limit",
        "vapo_lit/tasks/env.py",
        "            if final:\n"
        "                return EnvStep(done=True, reward=float(self.verify(problem, transcript).reward))\n"
        "            if turns_done >= self.max_turns:\n"
        "                return EnvStep(done=True, reward=0.0, truncated=True)\n",
        "            if turns_done >= self.max_turns:\n"
        "                return EnvStep(done=True, reward=0.0, truncated=True)\n"
        "            if final:\n"
        "                return EnvStep(done=True, reward=float(self.verify(problem, transcript).reward))\n",
        [
            "tests/test_multiturn.py::test_a_final_answer_on_the_last_allowed_turn_is_scored_by_the_verifier",
            "tests/test_multiturn.py::test_an_episode_answering_on_its_last_allowed_turn_terminates",
        ],
    ),
    (
        "16 the module's advantage stage drops the observations setting",
        "vapo_lit/module.py",
        "whiten=p.whiten_advantages, observations=self.cfg.observations,",
        "whiten=p.whiten_advantages,",
        ["tests/test_multiturn.py::test_the_configured_observation_setting_reaches_the_runs_advantages"],
    ),
    (
        "17 length diagnostics against the critic's targets",
        "vapo_lit/experience.py",
        "advantage_by_length(lam_policy, advantages, exp.mc_returns - exp.values, exp.mask)",
        "advantage_by_length(lam_policy, advantages, returns - exp.values, exp.mask)",
        ["tests/test_stages.py::test_length_diagnostics_measure_against_monte_carlo_not_the_critic_targets"],
    ),
    (
        "18 strict chain without the right final answer",
        "vapo_lit/tasks/chain.py",
        "strict = ok and values == self.values(x0, n)",
        "strict = values == self.values(x0, n)",
        ["tests/test_long_task.py::test_every_step_right_but_a_wrong_final_answer_earns_nothing"],
    ),
    (
        "19 identical nonzero paired differences get p = 0",
        "vapo_lit/seed_stats.py",
        '"p": 1.0 if s["mean"] == 0.0 else NAN}',
        '"p": 1.0 if s["mean"] == 0.0 else 0.0}',
        [
            "tests/test_report_stats.py::test_identical_nonzero_differences_have_no_p_value",
            "tests/test_report.py::test_identical_nonzero_paired_differences_show_no_p_value_and_say_why",
        ],
    ),
    (
        "20 loss share averages in mini-batches without weight",
        "vapo_lit/update_stats.py",
        "mean(s[k] for s in shares if math.isfinite(s[k]))",
        "mean(s[k] for s in shares)",
        ["tests/test_updates.py::test_the_loss_share_skips_a_minibatch_without_policy_gradient_weight"],
    ),
]
words = sys.argv[1:]  # a number picks that bug, another word the bugs whose name contains it
chosen = [
    b for b in BUGS if not words or any(w == b[0].split()[0] if w.isdigit() else w in b[0] for w in words)
]
if not chosen:
    sys.exit(f"no bug matches {' '.join(words)}; the bugs are: {'; '.join(b[0] for b in BUGS)}")
survived = []
for name, path, old, new, tests in chosen:
    tmp = Path(tempfile.mkdtemp()) / "p"
    shutil.copytree(
        SRC, tmp, ignore=shutil.ignore_patterns(".venv", ".venv-*", "runs", ".git", "__pycache__")
    )
    f = tmp / path
    s = f.read_text()
    assert s.count(old) == 1, (name, s.count(old))
    f.write_text(s.replace(old, new))
    where = subprocess.run(
        [sys.executable, "-c", "import vapo_lit; print(vapo_lit.__file__)"],
        cwd=tmp,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp)},
    ).stdout.strip()
    assert where.startswith(str(tmp)), where
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
        cwd=tmp,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp)},
    )
    failed = [l for l in r.stdout.splitlines() if l.startswith("FAILED")]
    print(
        f"bug {name}: exit {r.returncode} in {time.time() - t0:.0f}s; {failed[:2] or r.stdout.strip().splitlines()[-1]}",
        flush=True,
    )
    shutil.rmtree(tmp.parent)
    if r.returncode == 0:
        survived.append(name)
if survived:
    print(f"not caught: {', '.join(survived)}")
sys.exit(1 if survived else 0)
