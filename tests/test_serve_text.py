"""Incremental detokenization and stop strings (serve.text), with the byte tokenizer; a
checkpoint's chat template that refuses the messages."""

from __future__ import annotations

import random

import pytest

from paged_bench.model.tokenizers import ByteTokenizer
from paged_bench.serve.protocol import RequestError, ServingContext, parse_chat
from paged_bench.serve.text import TextStream, chat_renderer, simple_chat_template

TOK = ByteTokenizer()


def deltas(text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], TextStream]:
    stream, out = TextStream(TOK.decode, stop), []
    for t in TOK.encode(text):
        out.append(stream.add(t))
        if stream.stopped:  # the server ends the request here
            break
    return out, stream


def test_one_delta_per_token_and_the_text_adds_up():
    out, stream = deltas("héllo ✓")
    assert len(out) == len("héllo ✓".encode())
    assert "".join(out) + stream.flush() == "héllo ✓"


def test_incomplete_utf8_is_held_back_until_complete():
    out, _ = deltas("é✓")  # 2 + 3 bytes
    assert out == ["", "é", "", "", "✓"]


def test_stop_string_cuts_the_text_before_it():
    out, stream = deltas("one two STOP three", stop=("STOP",))
    assert stream.stopped
    assert "".join(out) == "one two "
    assert len(out) == len("one two STOP")  # stops at the token that completes the string
    assert stream.flush() == ""


def test_a_possible_stop_prefix_is_held_back_then_released():
    out, stream = deltas("aST b", stop=("STOP",))
    assert out[:3] == ["a", "", ""]  # "S", "ST" could start "STOP"
    assert out[3] == "ST "  # no: released with the next character
    assert not stream.stopped and "".join(out) + stream.flush() == "aST b"


def test_earliest_of_several_stop_strings_wins():
    out, stream = deltas("xx<end>yy", stop=("yy", "<end>"))
    assert stream.stopped and "".join(out) == "xx"


def test_simple_chat_template_for_tokenizers_without_one():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert simple_chat_template(messages) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert chat_renderer(TOK)(messages) == TOK.encode(simple_chat_template(messages))


def test_work_per_token_is_bounded_whatever_the_output_length():
    """Each token decodes only the few tokens since the last emitted text (vLLM's incremental
    detokenization), not the whole output: a 6,000-token output costs no more per token than a
    short one (the stop-string scan is bounded by the server's limits on stop strings)."""
    decoded_lengths = []

    def decode(ids: list[int]) -> str:
        decoded_lengths.append(len(ids))
        return TOK.decode(ids)

    text = "abc ✓ " * 750
    stream = TextStream(decode, stop=tuple("x" * 255 + str(i) for i in range(10)))
    out = [stream.add(t) for t in TOK.encode(text)]
    assert "".join(out) + stream.flush() == text
    assert len(out) == len(text.encode()) == 6000
    assert max(decoded_lengths) <= 4  # a 3-byte character is the longest pending run


def test_a_stop_string_ending_in_an_incomplete_character_stops_the_flush():
    """A request that ends on half a UTF-8 character shows it as U+FFFD at the flush; a stop
    string that ends there must still cut the text (it was missed: the flush checked none)."""
    stream = TextStream(TOK.decode, stop=("b\ufffd",))
    out = [stream.add(t) for t in [*b"ab", 0xE2, 0x9C]]  # "ab" then two of the three bytes of "✓"
    assert not stream.stopped and "".join(out) == "a"  # "b" is held back: it may start the stop
    assert stream.flush() == "" and stream.stopped
    assert stream.text == "a"


def test_a_chat_template_that_refuses_the_messages_is_a_400_naming_why():
    # raise_exception in a template (Mistral's, Gemma's: no system role) was a 500 and a traceback
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<unk>", "hi", "be", "brief"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    hf.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                        "{% endif %}{% for m in messages %}{{ m['content'] }} {% endfor %}")  # fmt: skip
    render = chat_renderer(hf)
    assert render([{"role": "user", "content": "hi"}]) == [1]
    ctx = ServingContext(model_name="m", max_model_len=64, vocab_size=len(words), encode=hf.encode, render_chat=render)
    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 2}
    with pytest.raises(RequestError) as raised:
        parse_chat(body, ctx)
    assert (raised.value.status, raised.value.param) == (400, "messages")
    assert raised.value.message == "the model's chat template refused the messages: System role not supported"


def test_the_held_back_tail_is_the_longest_that_begins_a_stop_string():
    """Only places where a stop string's first character stands are tried (it was every tail
    length against every stop string: 1 ms a token at 16 x 256 characters); the answer is the
    tail-by-tail definition's, on random text and stop strings over a small alphabet."""
    rng = random.Random(7)
    stream = TextStream(ByteTokenizer().decode, ("x",))
    checked = 0
    for _ in range(5000):
        stops = tuple("".join(rng.choice("abc") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4)))
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        if any(s in text for s in stops):  # a whole stop string has stopped the stream before this
            continue
        stream._stop, stream._max_stop = stops, max(map(len, stops))
        by_tails = next((k for k in range(min(stream._max_stop - 1, len(text)), 0, -1)
                         if any(s.startswith(text[-k:]) for s in stops)), 0)  # fmt: skip
        assert stream._stop_prefix_len(text) == by_tails, (text, stops)
        checked += 1
    assert checked > 2000
