"""Chat environments: observations go into the conversation as chat messages rendered by the
tokenizer's own chat template, so an episode's token ids are the template's rendering of its
messages. Two template families (ChatML/Qwen style with a tool-response wrapper, Llama-3 style with
header tokens and an ipython role), each on a byte-level BPE tokenizer built here (no hub)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from test_multiturn import Scripted

from vapo_lit.engines.episodes import ChatRenderer, generate_episodes
from vapo_lit.tasks.base import Problem, Verdict
from vapo_lit.tasks.env import Environment, Tool

CHATML = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for t in tools %}{{ '\\n' + (t | tojson) }}"
    "{%- endfor %}{{ '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3 = (
    "{{- '<|begin_of_text|>' }}"
    "{%- if tools %}{{ '<|start_header_id|>system<|end_header_id|>\\n\\nTools:' }}{%- for t in tools %}"
    "{{ '\\n' + (t | tojson) }}{%- endfor %}{{ '<|eot_id|>' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- set role = 'ipython' if m.role == 'tool' else m.role %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + (m.content | trim) + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
PLAIN = (  # ChatML with no tools block: tools= changes nothing
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
STRICT = (  # a template with no tool role: it refuses one
    "{%- for m in messages %}{%- if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role') }}{%- endif %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
FAMILIES = {
    "chatml": (CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", None),
    "llama3": (
        LLAMA3,
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|eot_id|>",
        "<|begin_of_text|>",
    ),
    "strict": (STRICT, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", None),
    "plain": (PLAIN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", None),
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def chat_tokenizer(family: str):
    """A byte-level BPE tokenizer trained here on chat-like text, with the family's special tokens
    and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    template, specials, eot, bos = FAMILIES[family]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    corpus = [
        CALL,
        "What is 1 + 2? The answer is 3.",
        "system user assistant ipython tool Tools",
        '{"type": "function"}',
        "<tool_response>\n3\n</tool_response>",
        "add a b integer object properties required name description",
    ]
    tk.train_from_iterator(
        corpus * 20,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eot, pad_token=specials[0], bos_token=bos)
    tok.chat_template = template
    return tok


class ChatCalc(Environment):
    name, version, max_new_tokens, max_turns = "chatcalc", "1", 120, 4
    chat, tool_format, stop_sequences = True, "json", ()

    def __init__(self, tokenizer, tools_prompt="auto"):
        self.tools = {"add": Tool("add", lambda problem, args: str(args["a"] + args["b"]), "a + b", ADD)}
        self._tok, self.tools_prompt = tokenizer, tools_prompt
        messages = [{"role": "user", "content": "What is 1 + 2?"}]
        self.problem = Problem(self.render_chat(messages), "3", {"messages": messages})

    @property
    def tokenizer(self):
        return self._tok

    def problem_from_prompt(self, prompt):
        if prompt != self.problem.prompt:
            raise ValueError("not this task's prompt")
        return self.problem

    def verify(self, problem, response):
        return Verdict(float(response.rstrip().endswith("The answer is 3.")))


class IdScripted(Scripted):
    """Scripted on token ids (the scripts are already tokenized)."""

    def __init__(self, scripts: list[list[int]], vocab_size: int):
        torch.nn.Module.__init__(self)
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.scripts, self.pos, self.V = scripts, [0] * len(scripts), vocab_size


@pytest.mark.filterwarnings("ignore:task 'chatcalc'. the tokenizer's chat template has no tools block")
@pytest.mark.parametrize("family", ["chatml", "llama3", "plain"])
def test_episode_ids_are_the_chat_templates_rendering_of_its_messages(family):
    tok = chat_tokenizer(family)
    env = ChatCalc(tok)
    eot = tok.convert_tokens_to_ids(FAMILIES[family][2])
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    script = enc(CALL) + [eot] + enc("The answer is 3.") + [eot]
    ro = generate_episodes(
        IdScripted([script], len(tok)),
        tok,
        env,
        [env.problem.prompt],
        temperature=0.0,
        max_new_tokens=env.max_new_tokens,
        seeds=0,
    )
    n = int(ro.lengths[0])
    episode = ro.prompt_ids[0][ro.prompt_mask[0].bool()].tolist() + ro.response_ids[0, :n].tolist()
    messages = [
        *env.problem.meta["messages"],
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": "The answer is 3."},
    ]
    rendered = env.render_chat(
        messages, add_generation_prompt=False
    )  # (plain: the tools in a system message)
    expected = tok(rendered, add_special_tokens=False)["input_ids"]
    assert episode == expected[: len(episode)] and tok.decode(expected[len(episode) :]).strip() == ""
    assert int(ro.turns[0]) == 2 and bool(ro.terminated[0])
    assert env.verify(env.problem, ro.texts[0]).reward == 1.0
    action = ro.action_mask[0, :n].bool()
    assert action.sum() == len(script)  # exactly the model's tokens are actions
    assert (ro.logprobs[0, :n][~action] == 0).all() and (~action).any()
    assert "3" in tok.decode(ro.response_ids[0, :n][~action].tolist())  # the observation, rendered


def test_a_template_without_a_tool_role_gets_the_observation_as_a_user_message():
    tok = chat_tokenizer("strict")
    env = ChatCalc.__new__(ChatCalc)
    env.tools, env._tok = {}, tok
    assert ChatRenderer(tok, env).role == "user"
    assert ChatRenderer(chat_tokenizer("chatml"), env).role == "tool"


def test_a_chat_environment_needs_a_chat_template():
    tok = chat_tokenizer("chatml")
    tok.chat_template = None
    env = ChatCalc.__new__(ChatCalc)
    env.tools = {}
    with pytest.raises(
        ValueError, match="renders observations with the tokenizer's chat template, but the tokenizer"
    ):
        ChatRenderer(tok, env)


# ----------------------------------------------------------------------------- tools for any chat template
def test_a_template_without_a_tools_block_gets_the_tools_in_a_system_message():
    """tools_prompt auto: a template that renders tools= keeps its own tools block; one that renders
    the same text with tools= as without gets them as JSON schemas in a system message (the Hermes /
    Qwen format), with one warning; template and system force either."""
    plain = chat_tokenizer("plain")
    assert plain.apply_chat_template(
        [{"role": "user", "content": "q"}], tools=[ADD], tokenize=False
    ) == plain.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False)
    with pytest.warns(
        UserWarning,
        match=r"^task 'chatcalc': the tokenizer's chat template has no tools block, so "
        r"the tools are described in a system message",
    ):
        prompt = ChatCalc(plain).problem.prompt
    schema = json.dumps(ADD_TOOL)
    assert prompt.startswith("<|im_start|>system\n# Tools\n") and f"<tools>\n{schema}\n</tools>" in prompt
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in prompt
    assert prompt.endswith("<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n")
    assert "<tools>" not in ChatCalc(plain, tools_prompt="template").problem.prompt
    chatml = chat_tokenizer("chatml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a template with a tools block: no warning
        own = ChatCalc(chatml).problem.prompt
    assert own == chatml.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 2?"}],
        tools=[ADD_TOOL],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ChatCalc(chatml, tools_prompt="system").problem.prompt.startswith("<|im_start|>system\n# Tools\n")
    with pytest.raises(
        ValueError, match="tools_prompt='json' is not valid; choose one of: auto, template, system"
    ):
        ChatCalc(chatml, tools_prompt="json")


def test_a_template_that_refuses_a_system_message_gets_the_tools_in_the_first_user_message():
    prompt = ChatCalc(chat_tokenizer("strict"), tools_prompt="system").problem.prompt
    assert prompt.startswith("<|im_start|>user\n# Tools\n") and prompt.count("<|im_start|>") == 2
    assert "<tools>" in prompt and "What is 1 + 2?<|im_end|>" in prompt


@pytest.mark.parametrize("family", ["chatml", "llama3"])
def test_the_final_turn_is_the_models_own_last_turn(family):
    """A tool's answer is never part of what `final_turn` returns: after an observation only the text
    the model wrote after it; a last turn that holds a call (truncated, turn limit) is no final turn."""
    tok = chat_tokenizer(family)
    env = ChatCalc(tok)
    eot = tok.convert_tokens_to_ids(FAMILIES[family][2])
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    script = enc(CALL) + [eot] + enc("True") + [eot]
    ro = generate_episodes(
        IdScripted([script], len(tok)),
        tok,
        env,
        [env.problem.prompt],
        temperature=0.0,
        max_new_tokens=env.max_new_tokens,
        seeds=0,
    )
    transcript = ro.texts[0]
    assert "3" in transcript and transcript.rstrip().endswith(
        "True"
    )  # the tool's answer is in the transcript
    assert env.final_turn(transcript) == "True"
    assert env.final_turn("The answer is 3.") == "The answer is 3."  # no observation: the whole response
    assert env.final_turn(transcript.rsplit("True", 1)[0] + CALL) == ""  # ended on a call
