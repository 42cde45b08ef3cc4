"""`EpisodeEngine`: multi-turn rollouts with an environment in the loop (vapo_lit.tasks.env).

One batched token loop over every episode of the batch, with ONE KV cache kept across turns: at
each column a row either samples its next token (an action: behaviour log-prob recorded) or takes
the next token of the observation the environment just wrote (appended through the same cache, no
log-prob, action mask 0), so no turn re-encodes the history. A row leaves the batch when its
episode ends (final answer, turn limit, token budget). Llama-family models step the static cache
of vapo_lit.engines.fast_decode (rows dropped as they finish); others step transformers' forward
with its own cache. Observation tokens go through the cache one per step, beside the other rows'
sampled tokens (a multi-token prefill per observation would be faster for long tool outputs; the
built-in task's observations are two tokens).

Returns one `Rollout` per episode: `response_ids` the interleaved actions and observations,
`response_mask` 1 on all of them, `action_mask` 1 on the sampled ones, `logprobs` 0 on
observations, `turns` the policy turns taken; `terminated` when the episode ended by the
environment (a final answer), `truncated` at the turn limit or the token budget. Sampling is
seeded per row and column exactly as `HFEngine` (vapo_lit.rng), so row i depends only on its own
prompt, seed and the weights.
"""
from __future__ import annotations

import torch

from vapo_lit.engines.hf import _cache_of, prefill
from vapo_lit.engines.sampling import sample_next
from vapo_lit.rng import uniforms
from vapo_lit.rollout import Rollout, eos_ids_of


class EpisodeEngine:
    """Samples episodes of `env` with the actor itself (weights shared in place, like HFEngine)."""

    name = "hf"

    def __init__(self, actor, tokenizer, env):
        self.model, self.tokenizer, self.env = actor, tokenizer, env
        self._stops = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in env.stop_sequences]
        if not all(self._stops):
            raise ValueError(f"a stop sequence of {env.name!r} encodes to no tokens: {env.stop_sequences}")

    def load_weights(self, actor) -> None:
        self.model = actor

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling, seeds) -> Rollout:
        return generate_episodes(self.model, self.tokenizer, self.env, prompts, max_new_tokens=sampling.max_new_tokens,
                                 temperature=sampling.temperature, top_p=sampling.top_p, seeds=seeds,
                                 stops=self._stops)


class _Episode:
    """One row's bookkeeping: the current turn's tokens, queued observation tokens, turns taken."""

    def __init__(self, problem):
        self.problem, self.turn, self.queue, self.turns, self.done, self.cut = problem, [], [], 0, False, False


@torch.no_grad()
def generate_episodes(model, tokenizer, env, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
                      top_p: float = 1.0, seeds=0, stops=None, fast: bool = True) -> Rollout:
    """Episodes of `env` from `prompts`, `max_new_tokens` the budget of actions + observations."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    stops = stops if stops is not None else [tokenizer(s, add_special_tokens=False)["input_ids"]
                                             for s in env.stop_sequences]
    episodes = [_Episode(env.problem_from_prompt(p)) for p in prompts]  # ValueError before any compute
    was_training = model.training
    model.eval()
    try:
        pf = prefill(model, tokenizer, prompts, seeds, max_new_tokens=max_new_tokens, fast=fast)
        device, ids, prompt_mask, mask, n, row_seeds = pf.device, pf.ids, pf.prompt_mask, pf.mask, pf.n, pf.row_seeds
        pad, past, logits, next_pos, static, cache_kw = pf.pad, pf.past, pf.logits, pf.next_pos, pf.static, pf.cache_kw
        eos = set(eos_ids_of(model, tokenizer))

        tokens = torch.full((n, max_new_tokens), pad, dtype=torch.long)
        logps = torch.zeros((n, max_new_tokens), dtype=torch.float64)
        action = torch.zeros((n, max_new_tokens))
        lengths = torch.zeros(n, dtype=torch.long)
        active = torch.arange(n, device=device)  # rows whose logits we hold
        steps = 0
        for step in range(max_new_tokens):
            tok, lp = sample_next(logits, temperature=temperature, top_p=top_p, u=uniforms(row_seeds[active], step))
            tok, lp = tok.cpu().tolist(), lp.double().cpu().tolist()
            fed = []
            for j, row in enumerate(active.tolist()):
                ep = episodes[row]
                if ep.done:
                    fed.append(pad)
                    continue
                sampled = not ep.queue
                if sampled:
                    t = tok[j]
                    action[row, step], logps[row, step] = 1.0, lp[j]
                    ep.turn.append(t)
                else:  # the environment's observation, one token per step
                    t = ep.queue.pop(0)
                tokens[row, step] = t
                lengths[row] += 1
                fed.append(t)
                if sampled and (t in eos or any(ep.turn[-len(s):] == s for s in stops)):
                    _end_turn(env, tokenizer, ep, tokens[row, :step + 1].tolist(), final=t in eos)
                if not ep.done and step == max_new_tokens - 1:
                    ep.done = ep.cut = True  # token budget spent (possibly inside an observation)
            steps = step + 1
            if all(ep.done for ep in episodes) or step == max_new_tokens - 1:
                break
            fed_t = torch.tensor(fed, dtype=torch.long, device=device)
            if static is not None:
                finished = torch.tensor([episodes[r].done for r in static.rows.tolist()], device=device)
                if bool(finished.any()):
                    static.keep(~finished)
                    fed_t = fed_t[~finished]
                active = static.rows
                logits = static.step(fed_t, next_pos[active])
            else:
                mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
                out = model(input_ids=fed_t[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                            use_cache=True, **{cache_kw: past})
                past, logits = _cache_of(out), out.logits[:, -1, :]
            next_pos = next_pos + 1

        response_ids = tokens[:, :steps]
        response_mask = (torch.arange(steps)[None, :] < lengths[:, None]).float()
        action_mask = action[:, :steps] * response_mask
        texts = tokenizer.batch_decode([response_ids[i, : int(lengths[i])].tolist() for i in range(n)],
                                       skip_special_tokens=True)
        truncated = torch.tensor([ep.cut for ep in episodes], dtype=torch.bool)
        lp_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return Rollout(prompt_ids=ids, prompt_mask=prompt_mask.to(device), response_ids=response_ids.to(device),
                       response_mask=response_mask.to(device),
                       logprobs=(logps[:, :steps] * action_mask).to(device=device, dtype=lp_dtype),
                       lengths=lengths.to(device), terminated=(~truncated).to(device), truncated=truncated.to(device),
                       texts=list(texts), action_mask=action_mask.to(device),
                       turns=torch.tensor([ep.turns for ep in episodes], dtype=torch.long, device=device))
    finally:
        model.train(was_training)


def _end_turn(env, tokenizer, ep: _Episode, response: list, *, final: bool) -> None:
    """Hand the finished turn to the environment: queue its observation or end the episode."""
    ep.turns += 1
    turn_text = tokenizer.decode(ep.turn, skip_special_tokens=True)
    transcript = tokenizer.decode(response, skip_special_tokens=True)
    ep.turn = []
    reply = env.respond(ep.problem, transcript, turn_text, turns_done=ep.turns, final=final)
    if reply.done or reply.observation is None:
        ep.done, ep.cut = True, bool(reply.truncated)
        return
    ep.queue = list(tokenizer(reply.observation, add_special_tokens=False)["input_ids"])  # empty: it speaks again
