"""`EpisodeEngine`: multi-turn rollouts with an environment in the loop (vapo_lit.tasks.env).

One batched token loop (vapo_lit.engines.hf.TokenLoop) over every episode of the batch, with ONE
KV cache kept across turns: at each step every live row samples its next token (an action:
behaviour log-prob recorded, at the row's own response column); a row whose action ends a turn
feeds that token and the whole observation the environment wrote back in the same forward pass
(one block per row, no log-probs, action mask 0), so neither a turn nor an observation costs a
step per token and no turn re-encodes the history. `obs_chunk` caps the tokens a row feeds per
pass (1: the observation one token per step, beside the other rows' sampled tokens). A row leaves
the batch when its episode ends (final answer, turn limit, token budget). Llama-family models
step the static cache of vapo_lit.engines.fast_decode (rows dropped as they finish); others step
transformers' forward with its own cache.

Returns one `Rollout` per episode: `response_ids` the interleaved actions and observations,
`response_mask` 1 on all of them, `action_mask` 1 on the sampled ones, `logprobs` 0 on
observations, `turns` the policy turns taken; `terminated` when the episode ended by the
environment (a final answer), `truncated` at the turn limit or the token budget. Sampling is
seeded per row and response column exactly as `HFEngine` (vapo_lit.rng), so row i depends only on
its own prompt, seed and the weights, not on how its observations were fed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vapo_lit.engines.hf import eval_mode, prefill
from vapo_lit.rollout import Rollout, eos_ids_of


class EpisodeEngine:
    """Samples episodes of `env` with the actor itself (weights shared in place, like HFEngine)."""

    name = "hf"

    def __init__(self, actor, tokenizer, env, *, obs_chunk: int | None = None):
        self.model, self.tokenizer, self.env, self.obs_chunk = actor, tokenizer, env, obs_chunk
        self._rules = Rules.of(env, tokenizer)  # a bad stop list or a missing chat template fails here

    def load_weights(self, actor) -> None:
        self.model = actor

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling, seeds) -> Rollout:
        return generate_episodes(
            self.model,
            self.tokenizer,
            self.env,
            prompts,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seeds=seeds,
            rules=self._rules,
            obs_chunk=self.obs_chunk,
        )


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
        tail = turn[-self.window :]
        text = self._text(tail)
        return any(s in text for s in self.stops) and not any(s in self._text(tail[:-1]) for s in self.stops)

    def cut(self, text: str) -> str:
        """`text` up to the end of the first stop string in it (the text a model wrote after it in
        the same token is not part of the call)."""
        ends = [text.find(s) + len(s) for s in self.stops if s in text]
        return text[: min(ends)] if ends else text


class ChatRenderer:
    """Observations as chat messages: the text appended after a turn is what the tokenizer's chat
    template writes between the assistant's content and the next assistant turn (the end of the
    assistant message, the observation message of role `role`, the generation prompt), so an
    episode's tokens are the template's rendering of its messages. The suffix is read off a
    rendering with a placeholder as the assistant's content, so a template that rewrites content
    (trims it, drops earlier reasoning) does not change what the model already wrote. Conversations
    are rendered as the environment renders its prompts (`render_chat`: the tools through the
    template's tools block or in a system message), else with the template's ``tools=``."""

    _TURN = "\u2063vapo-lit-turn\u2063"

    def __init__(self, tokenizer, env):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"task {env.name!r} renders observations with the tokenizer's chat template, but the "
                f"tokenizer has none (set tokenizer.chat_template, or chat = False)"
            )
        self.tokenizer, self.tools = tokenizer, env.tool_schemas() or None
        self._render_chat = getattr(env, "render_chat", None)
        self.role = self._supported(env.observation_role)

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        if self._render_chat is not None:
            return self._render_chat(
                messages, tokenizer=self.tokenizer, add_generation_prompt=generation_prompt
            )
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _supported(self, role: str) -> str:
        """`role` if the template renders a message of that role after an assistant turn, else user."""
        probe = "\u2063probe\u2063"
        try:
            text = self.render(
                [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": role, "content": probe},
                ],
                True,
            )
        except Exception:  # noqa: BLE001 - templates refuse unknown roles by raising
            return "user"
        return role if probe in text else "user"

    def after_turn(
        self, messages: list[dict], turn: str, observation: str, eot: str | None
    ) -> tuple[str, list]:
        """(the text that follows the model's turn, the conversation with the turn and the
        observation); `eot` is the end-of-turn text the model already wrote (None after a stop string)."""
        obs = {"role": self.role, "content": observation}
        text = self.render([*messages, {"role": "assistant", "content": self._TURN}, obs], True)
        suffix = text[text.index(self._TURN) + len(self._TURN) :]
        if eot and suffix.startswith(eot):
            suffix = suffix[len(eot) :]
        return suffix, [*messages, {"role": "assistant", "content": turn}, obs]


@dataclass
class Rules:
    """What every engine's episode loop shares: the environment, the tokenizer, the stop strings
    and, in a chat environment, the renderer of its observations."""

    env: object
    tokenizer: object
    stops: StopStrings
    chat: ChatRenderer | None = None

    @classmethod
    def of(cls, env, tokenizer) -> "Rules":
        return cls(
            env,
            tokenizer,
            StopStrings(tokenizer, env.stop_sequences),
            ChatRenderer(tokenizer, env) if getattr(env, "chat", False) else None,
        )

    def episodes(self, prompts: list[str]) -> list["Episode"]:
        """One fresh episode per prompt (ValueError, before any compute, for a prompt the task never writes)."""
        problems = [self.env.problem_from_prompt(p) for p in prompts]
        return [Episode(q, self.env.prompt_messages(q) if self.chat else None) for q in problems]


class Episode:
    """One row's bookkeeping: the current turn's tokens, queued observation tokens, turns taken, and
    in a chat environment the conversation so far."""

    def __init__(self, problem, messages=None):
        self.problem, self.turn, self.queue, self.turns, self.done, self.cut = (
            problem,
            [],
            [],
            0,
            False,
            False,
        )
        self.messages = messages

    def end_turn(self, rules: Rules, response: list, *, final: bool) -> None:
        """Hand the finished turn (the tokens since the last observation, in `turn`) to the
        environment: queue its observation (as the chat template renders it, in a chat environment)
        or end the episode. `response` is the whole response so far; `final`: the turn ended at EOS."""
        tokenizer = rules.tokenizer
        self.turns += 1
        turn_text = tokenizer.decode(self.turn, skip_special_tokens=True)
        turn_text = turn_text if final else rules.stops.cut(turn_text)
        eot = tokenizer.decode(self.turn[-1:], skip_special_tokens=False) if final else None
        transcript = tokenizer.decode(response, skip_special_tokens=True)
        self.turn = []
        reply = rules.env.respond(self.problem, transcript, turn_text, turns_done=self.turns, final=final)
        if reply.done or reply.observation is None:
            self.done, self.cut = True, bool(reply.truncated)
            return
        text = reply.observation
        if rules.chat is not None:
            text, self.messages = rules.chat.after_turn(self.messages, turn_text, text, eot)
        self.queue = list(tokenizer(text, add_special_tokens=False)["input_ids"])  # empty: it speaks again


@torch.no_grad()
def generate_episodes(
    model,
    tokenizer,
    env,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seeds=0,
    rules: Rules | None = None,
    fast: bool = True,
    obs_chunk: int | None = None,
) -> Rollout:
    """Episodes of `env` from `prompts`, `max_new_tokens` the budget of actions + observations;
    `obs_chunk`: the most tokens a row feeds in one forward pass (None: a whole observation)."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if obs_chunk is not None and obs_chunk < 1:
        raise ValueError(f"obs_chunk must be None or >= 1; got {obs_chunk}")
    rules = rules or Rules.of(env, tokenizer)
    episodes = rules.episodes(prompts)
    with eval_mode(model):
        loop = prefill(
            model,
            tokenizer,
            prompts,
            seeds,
            max_new_tokens=max_new_tokens,
            fast=fast,
            temperature=temperature,
            top_p=top_p,
        )
        eos = set(eos_ids_of(model, tokenizer))
        batch = _Transcripts(rules, episodes, max_new_tokens, pad=loop.pad, eos=eos, chunk=obs_chunk)
        for _ in range(max_new_tokens):  # every live row takes at least one column per step
            rows = loop.active.tolist()
            tok, lp = loop.sample(batch.lengths[rows].to(loop.device))
            blocks = batch.write(rows, tok.cpu().tolist(), lp.double().cpu().tolist())
            if batch.over:
                break
            tokens, counts = _padded(blocks, loop.pad, loop.device)
            loop.feed(tokens, batch.done_rows(loop.device), counts=counts)
        return batch.rollout(loop)


def _padded(blocks: list[list[int]], pad: int, device) -> tuple:
    """(tokens (rows,), None) when every row feeds one token, else (block (rows, K), counts)."""
    width = max(len(b) for b in blocks)
    if width == 1:
        return torch.tensor([b[0] for b in blocks], dtype=torch.long, device=device), None
    tokens = torch.tensor([b + [pad] * (width - len(b)) for b in blocks], dtype=torch.long, device=device)
    return tokens, torch.tensor([len(b) for b in blocks], dtype=torch.long, device=device)


class _Transcripts:
    """The batch's responses so far, each row's at its own length, on the CPU (the environment reads
    them between tokens): tokens, action flags, behaviour log-probs (float64) and lengths per row."""

    def __init__(
        self,
        rules: Rules,
        episodes: list[Episode],
        width: int,
        *,
        pad: int,
        eos: set,
        chunk: int | None = None,
    ):
        self.rules, self.episodes, self.width = rules, episodes, width
        self.pad, self.eos, self.chunk = pad, eos, chunk or width
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

    def write(self, rows: list[int], sampled: list[int], logps: list[float]) -> list[list[int]]:
        """One step of the held `rows`: a live row with no observation queued takes its sampled
        token (an action, at its own next column), then as much of the observation queued (by that
        action's turn, or left from before) as the chunk and the token budget allow. Returns the
        tokens each row feeds (the pad for an ended row)."""
        return [self._write_row(row, t, lp) for row, t, lp in zip(rows, sampled, logps)]

    def _write_row(self, row: int, t: int, lp: float) -> list[int]:
        ep = self.episodes[row]
        if ep.done:
            return [self.pad]
        block = []
        if not ep.queue:  # an action
            col = int(self.lengths[row])
            self.action[row, col], self.logps[row, col], self.tokens[row, col] = 1.0, lp, t
            self.lengths[row] += 1
            ep.turn.append(t)
            block.append(t)
            if t in self.eos or self.rules.stops.completed(ep.turn):
                ep.end_turn(self.rules, self.tokens[row, : col + 1].tolist(), final=t in self.eos)
        room = min(self.chunk - len(block), self.width - int(self.lengths[row]))
        observed, ep.queue = ep.queue[:room], ep.queue[room:]
        if observed:
            col = int(self.lengths[row])
            self.tokens[row, col : col + len(observed)] = torch.tensor(observed, dtype=torch.long)
            self.lengths[row] += len(observed)
        if not ep.done and int(self.lengths[row]) == self.width:
            ep.done = ep.cut = True  # token budget spent (possibly inside an observation)
        return block + observed

    def rollout(self, loop) -> Rollout:
        """The episodes' Rollout, as wide as the longest (see the module docstring)."""
        steps = int(self.lengths.max())
        truncated = torch.tensor([ep.cut for ep in self.episodes], dtype=torch.bool)
        turns = torch.tensor([ep.turns for ep in self.episodes], dtype=torch.long, device=loop.device)
        return loop.rollout(
            self.rules.tokenizer,
            self.tokens[:, :steps],
            self.logps[:, :steps],
            self.lengths,
            truncated=truncated,
            action=self.action[:, :steps],
            turns=turns,
        )


def scripted_episodes(env, tokenizer, prompts: list[str], scripts: list[list[str]], *, max_new_tokens: int):
    """Episodes whose policy turns are given, played through `env` exactly as `generate_episodes`
    plays sampled ones (the same chat rendering, tool answers and tokens): `scripts[i]` holds the
    texts of row i's turns, each ended by EOS as a model ends a turn. Returns per row (response token
    ids, action flags, the response text as `Rollout.texts` decodes it). ValueError when a row's
    episode ends before its script, or its script before its episode. For demonstrations
    (vapo_lit.warmup)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id: a scripted turn cannot end")
    if len(scripts) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(scripts)} scripts")
    rules = Rules.of(env, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    batch = _Transcripts(rules, rules.episodes(prompts), max_new_tokens, pad=pad, eos={eos})
    queued = [
        [t for text in turns for t in [*tokenizer(text, add_special_tokens=False)["input_ids"], eos]]
        for turns in scripts
    ]
    for _ in range(max_new_tokens):
        rows = [i for i, ep in enumerate(batch.episodes) if not ep.done]
        if not rows:
            break
        for i in rows:
            if not batch.episodes[i].queue and not queued[i]:
                raise ValueError(f"row {i}: the script ended before the episode did ({scripts[i]!r})")
        batch.write(
            rows, [pad if batch.episodes[i].queue else queued[i].pop(0) for i in rows], [0.0] * len(rows)
        )
    out = []
    for i, ep in enumerate(batch.episodes):
        if queued[i] or not ep.done or ep.cut:
            raise ValueError(
                f"row {i}: the episode ended before its script (turn limit or the {max_new_tokens}-token "
                f"budget) ({scripts[i]!r})"
            )
        n = int(batch.lengths[i])
        ids = batch.tokens[i, :n].tolist()
        out.append((ids, batch.action[i, :n].tolist(), tokenizer.decode(ids, skip_special_tokens=True)))
    return out
