"""`EpisodeEngine`: multi-turn rollouts with an environment in the loop (vapo_lit.tasks.env).

One batched token loop (vapo_lit.engines.hf.TokenLoop) over every episode of the batch, with ONE
KV cache kept across turns: at each column a row either samples its next token (an action:
behaviour log-prob recorded) or takes the next token of the observation the environment just
wrote (appended through the same cache, no log-prob, action mask 0), so no turn re-encodes the
history. A row leaves the batch when its episode ends (final answer, turn limit, token budget).
Llama-family models step the static cache of vapo_lit.engines.fast_decode (rows dropped as they
finish); others step transformers' forward with its own cache. Observation tokens go through the
cache one per step, beside the other rows' sampled tokens (a multi-token prefill per observation
would be faster for long tool outputs; the built-in task's observations are two tokens).

Returns one `Rollout` per episode: `response_ids` the interleaved actions and observations,
`response_mask` 1 on all of them, `action_mask` 1 on the sampled ones, `logprobs` 0 on
observations, `turns` the policy turns taken; `terminated` when the episode ended by the
environment (a final answer), `truncated` at the turn limit or the token budget. Sampling is
seeded per row and column exactly as `HFEngine` (vapo_lit.rng), so row i depends only on its own
prompt, seed and the weights.
"""
from __future__ import annotations

import torch

from vapo_lit.engines.hf import eval_mode, prefill
from vapo_lit.rollout import Rollout, eos_ids_of


class EpisodeEngine:
    """Samples episodes of `env` with the actor itself (weights shared in place, like HFEngine)."""

    name = "hf"

    def __init__(self, actor, tokenizer, env):
        self.model, self.tokenizer, self.env = actor, tokenizer, env
        self._stops = StopStrings(tokenizer, env.stop_sequences)  # a bad stop list fails here, before sampling

    def load_weights(self, actor) -> None:
        self.model = actor

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling, seeds) -> Rollout:
        return generate_episodes(self.model, self.tokenizer, self.env, prompts, max_new_tokens=sampling.max_new_tokens,
                                 temperature=sampling.temperature, top_p=sampling.top_p, seeds=seeds,
                                 stops=self._stops)


class StopStrings:
    """An environment's stop sequences, matched on the decoded text of a turn: a turn ends at the
    token that completes one of them however the model tokenized it (one token, several, or inside a
    token that carries more text), as transformers' and vLLM's stop strings do."""

    def __init__(self, tokenizer, stops):
        stops = tuple(stops)
        if not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop sequences must be non-empty strings, got {stops!r}")
        self.tokenizer, self.stops = tokenizer, stops
        # a character is at most 4 bytes, a token at least one: this many tokens hold any stop string
        self.window = 4 * max(map(len, stops), default=0) + 4

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def completed(self, turn: list[int]) -> bool:
        """Whether the turn's last token completes a stop string (absent before it)."""
        if not self.stops:
            return False
        tail = turn[-self.window:]
        text = self._text(tail)
        return any(s in text for s in self.stops) and not any(s in self._text(tail[:-1]) for s in self.stops)

    def cut(self, text: str) -> str:
        """`text` up to the end of the first stop string in it (the text a model wrote after it in
        the same token is not part of the call)."""
        ends = [text.find(s) + len(s) for s in self.stops if s in text]
        return text[: min(ends)] if ends else text


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
    stops = stops if stops is not None else StopStrings(tokenizer, env.stop_sequences)
    episodes = [_Episode(env.problem_from_prompt(p)) for p in prompts]  # ValueError before any compute
    with eval_mode(model):
        loop = prefill(model, tokenizer, prompts, seeds, max_new_tokens=max_new_tokens, fast=fast,
                       temperature=temperature, top_p=top_p)
        eos = set(eos_ids_of(model, tokenizer))
        batch = _Transcripts(env, tokenizer, episodes, max_new_tokens, pad=loop.pad, eos=eos, stops=stops)
        for step in range(max_new_tokens):
            tok, lp = loop.sample(step)
            fed = batch.write(step, loop.active.tolist(), tok.cpu().tolist(), lp.double().cpu().tolist())
            if batch.over or step == max_new_tokens - 1:
                break
            loop.feed(torch.tensor(fed, dtype=torch.long, device=loop.device), batch.done_rows(loop.device))
        return batch.rollout(loop, steps=step + 1)


class _Transcripts:
    """The batch's responses so far, column by column, on the CPU (the environment reads them
    between tokens): tokens, action flags, behaviour log-probs (float64) and lengths per row."""

    def __init__(self, env, tokenizer, episodes: list[_Episode], width: int, *, pad: int, eos: set,
                 stops: StopStrings):
        self.env, self.tokenizer, self.episodes, self.width = env, tokenizer, episodes, width
        self.pad, self.eos, self.stops = pad, eos, stops
        n = len(episodes)
        self.tokens = torch.full((n, width), pad, dtype=torch.long)
        self.logps = torch.zeros((n, width), dtype=torch.float64)
        self.action = torch.zeros((n, width))
        self.lengths = torch.zeros(n, dtype=torch.long)

    @property
    def over(self) -> bool:
        return all(ep.done for ep in self.episodes)

    def done_rows(self, device) -> torch.Tensor:
        return torch.tensor([ep.done for ep in self.episodes], device=device)

    def write(self, step: int, rows: list[int], sampled: list[int], logps: list[float]) -> list[int]:
        """Column `step` of the held `rows`: each live row takes its next observation token if the
        environment queued one, else its sampled token (an action). Returns the token each row
        feeds (the pad for an ended row)."""
        fed = []
        for row, t, lp in zip(rows, sampled, logps):
            ep = self.episodes[row]
            if ep.done:
                fed.append(self.pad)
                continue
            is_action = not ep.queue
            if is_action:
                self.action[row, step], self.logps[row, step] = 1.0, lp
                ep.turn.append(t)
            else:  # the environment's observation, one token per step
                t = ep.queue.pop(0)
            self.tokens[row, step] = t
            self.lengths[row] += 1
            fed.append(t)
            if is_action and (t in self.eos or self.stops.completed(ep.turn)):
                _end_turn(self.env, self.tokenizer, self.stops, ep, self.tokens[row, :step + 1].tolist(),
                          final=t in self.eos)
            if not ep.done and step == self.width - 1:
                ep.done = ep.cut = True  # token budget spent (possibly inside an observation)
        return fed

    def rollout(self, loop, steps: int) -> Rollout:
        """The episodes' Rollout, the first `steps` columns (see the module docstring)."""
        truncated = torch.tensor([ep.cut for ep in self.episodes], dtype=torch.bool)
        turns = torch.tensor([ep.turns for ep in self.episodes], dtype=torch.long, device=loop.device)
        return loop.rollout(self.tokenizer, self.tokens[:, :steps], self.logps[:, :steps], self.lengths,
                            truncated=truncated, action=self.action[:, :steps], turns=turns)


def _end_turn(env, tokenizer, stops: StopStrings, ep: _Episode, response: list, *, final: bool) -> None:
    """Hand the finished turn to the environment: queue its observation or end the episode."""
    ep.turns += 1
    turn_text = tokenizer.decode(ep.turn, skip_special_tokens=True)
    turn_text = turn_text if final else stops.cut(turn_text)
    transcript = tokenizer.decode(response, skip_special_tokens=True)
    ep.turn = []
    reply = env.respond(ep.problem, transcript, turn_text, turns_done=ep.turns, final=final)
    if reply.done or reply.observation is None:
        ep.done, ep.cut = True, bool(reply.truncated)
        return
    ep.queue = list(tokenizer(reply.observation, add_special_tokens=False)["input_ids"])  # empty: it speaks again
