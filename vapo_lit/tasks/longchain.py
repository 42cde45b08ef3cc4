"""The built-in long chain-of-thought task "longchain": the countdown chain of `chain`, stretched
to the response lengths VAPO is about (the `long` preset's task).

The same prompt, rule, verifier and imperfect demonstrator as `chain` (see vapo_lit.tasks.chain),
with a different shape:

* n = 10 .. 1000 chain steps, so a correct response is 23 .. 2,003 tokens (2n + 3, EOS included);
* n drawn log-uniformly for training (as many prompts of 10-100 steps as of 100-1000), so one
  batch holds responses from tens to two thousand tokens: the heterogeneous lengths that
  length-adaptive GAE and the token-level loss are for, at a mean of about 433 tokens;
* four length buckets of equal ratio for evaluation (23-65, 67-201, 203-633, 635-2,003 tokens);
* reward 1 only when every step of the chain is right (`reward="chain"`), not only the final
  answer: each wrong value the demonstrator writes is +1 mod 10, so on a long chain ten of them
  cancel, and a policy that errs on 40% of the hard steps lands on the right answer by luck about one
  time in ten (the base policy's share: docs/results/table1-long/index.md, "The testbed").

Why the base policy starts low and can climb for a long time: the demonstrator writes a wrong
value with probability 0.4 on every tenth step, and the chain continues from the wrong value, so a
response of n steps is right with probability about 0.6^(n/10) (0.6 at n = 10, 0.006 at n = 100):
the errors compound with length. Averaged over the log-uniform n that is about 15%; the long
bucket needs the error rate per hard step driven from 0.4 to below 1% before it scores at all.
The step rule is the same at every position, so what the policy learns on the short responses it
can carry to the long ones; and an error, once written, is visible in the prefix, so a critic can
locate it (V drops to about 0 after it). Evaluation samples at top-p 1.0 (the `long` preset), not
the paper's 0.7: a nucleus of 0.7 would cut every error below 30% per step out of the samples and
hide exactly the compounding this task is built to show.
"""

from __future__ import annotations

from vapo_lit.tasks import register
from vapo_lit.tasks.chain import ChainTask, ChainTaskConfig

LONG_SHAPE = {
    "min_n": 10,
    "max_n": 1000,
    "n_sampling": "log",
    "bucket_spacing": "log",
    "n_buckets": 4,
    "eval_per_bucket": 8,
    "reward": "chain",
}
"""`chain`'s settings that make it long (any of them can still be overridden, as for `chain`)."""


@register("longchain")
class LongChainTask(ChainTask):
    name = "longchain"
    version = "1"
    sft_overrides = {"steps": 1500, "micro_batches": 8}
    """The built-in base policy's SFT (vapo_lit.models.builtin): 1,500 steps (fewer leave the loss
    far above the demonstrations' entropy) in length-sorted micro-batches without a mask (the same
    loss, several times faster); the measurements: docs/results/table1-long/index.md, "The testbed"."""
    rm_overrides = {"micro_batches": 8}
    """The reward model's training likewise (vapo_lit.models.builtin.RewardModelConfig)."""

    def __init__(self, config: ChainTaskConfig | None = None, **overrides):
        super().__init__(config or ChainTaskConfig(**LONG_SHAPE), **overrides)
