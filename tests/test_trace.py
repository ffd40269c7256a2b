"""Trace replay: other tools' files read as they are, windows, rate rescaling, the shipped Azure trace."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from paged_bench.errors import ConfigError
from paged_bench.model.tokenizers import ByteTokenizer
from paged_bench.run.bench import build
from paged_bench.workloads.base import WorkloadContext
from paged_bench.workloads.trace import TraceWorkload, shipped_traces

CTX = WorkloadContext(vocab_size=1000, encode=ByteTokenizer().encode)

# the first rows of the Azure trace, byte for byte (its 7-digit fractions, no trailing newline)
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:51.3910170,91,16"""


def replay(tmp_path, text: str, name: str = "t.csv", **kw):
    path = tmp_path / name
    path.write_text(text)
    return TraceWorkload(path=str(path), **kw).requests(CTX)


def summary(rs):
    return [(r.request_id, round(r.arrival_time, 6), r.num_prompt_tokens, r.max_tokens) for r in rs]


def test_a_raw_azure_csv_replays_through_the_config_without_conversion(tmp_path, config):
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text(AZURE)
    rs = build(config("workload=trace", f"workload.path={path}")).requests
    assert summary(rs) == [(0, 0.0, 374, 44), (1, 4.314579, 396, 109), (2, 4.541877, 879, 55), (3, 4.710427, 91, 16)]


def test_a_trace_row_whose_prompt_cannot_fit_in_memory_is_refused_by_path(tmp_path):
    with pytest.raises(ConfigError, match=r"workload.path=.*t.csv' is not allowed: prompts that fit in memory"):
        replay(tmp_path, "arrival_time,prompt_len,output_len\n0.0,4,2\n1.0,2000000000,2\n")


def test_epoch_seconds_are_absolute_and_small_numbers_relative(tmp_path):
    epoch = replay(tmp_path, "timestamp,prompt_len,output_len\n1700158546.5,4,2\n1700158548.0,4,2\n")
    assert [r.arrival_time for r in epoch] == [0.0, 1.5]
    relative = replay(tmp_path, "arrival_time,prompt_len,output_len\n2.0,4,2\n3.5,4,2\n")
    assert [r.arrival_time for r in relative] == [2.0, 3.5]  # a lead-in before the first request is kept


def test_datetimes_with_zones_are_compared_in_utc(tmp_path):
    rs = replay(tmp_path, "time,prompt_len,output_len\n2024-01-01T10:00:00+01:00,4,2\n2024-01-01T09:00:03Z,4,2\n")
    assert [r.arrival_time for r in rs] == [0.0, 3.0]


@pytest.mark.parametrize(
    "header, row",
    [
        ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "{t},ChatGPT,{p},{o},0,Conversation log"),
        ("arrival_time,prompt_tokens_count,output_tokens_count", "{t},{p},{o}"),  # guidellm's names
        ("relative_timestamp,input_tokens_count,completion_tokens_count", "{t},{p},{o}"),  # guidellm's others
        ("time,input_tokens,completion_tokens", "{t},{p},{o}"),
    ],
)
def test_other_tools_column_names_are_recognised(tmp_path, header, row):
    lines = [header] + [row.format(t=t, p=p, o=o) for t, p, o in ((0.5, 7, 3), (1.25, 9, 4))]
    assert summary(replay(tmp_path, "\n".join(lines))) == [(0, 0.5, 7, 3), (1, 1.25, 9, 4)]


def test_a_jsonl_row_may_name_a_column_the_first_row_leaves_out(tmp_path):
    # the columns were the first row's: the second row's prompt text was skipped for random ids
    rows = [{"timestamp": 0, "prompt_len": 5, "output_len": 4},
            {"timestamp": 0.1, "prompt": "x" * 50, "prompt_len": 5, "output_len": 4}]  # fmt: skip
    text = "\n".join(json.dumps(r) for r in rows)
    assert summary(replay(tmp_path, text, "t.jsonl")) == [(0, 0.0, 5, 4), (1, 0.1, 50, 4)]
    backwards = "\n".join(json.dumps(r) for r in rows[::-1])  # request 0 is the file's first row
    assert summary(replay(tmp_path, backwards, "t.jsonl")) == [(1, 0.0, 5, 4), (0, 0.1, 50, 4)]


def test_mooncake_jsonl_counts_milliseconds(tmp_path):
    rows = [{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]},
            {"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]}]  # fmt: skip
    text = "\n".join(json.dumps(r) for r in rows)
    assert summary(replay(tmp_path, text, "m.jsonl")) == [(0, 0.0, 655, 52), (1, 10.535, 672, 26)]
    assert replay(tmp_path, text, "m.jsonl", time_unit="s")[1].arrival_time == 10535


def test_columns_map_any_names_and_gzip_is_read(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"when,n_in,n_out,other\n0.1,5,2,x\n0.2,6,3,y\n"))
    columns = {"arrival_time": "when", "prompt_len": "n_in", "output_len": "n_out"}
    rs = TraceWorkload(path=str(path), columns=columns).requests(CTX)
    assert summary(rs) == [(0, 0.1, 5, 2), (1, 0.2, 6, 3)]
    with pytest.raises(ConfigError, match=r"workload.columns.prompt_len='nope'.*a column of"):
        TraceWorkload(path=str(path), columns={"prompt_len": "nope"}).requests(CTX)


@pytest.mark.parametrize(
    "overrides",
    [
        ("workload.columns.arrival_time=ts", "workload.columns.prompt_len=n_in", "workload.columns.output_len=n_out"),
        ("workload.columns={arrival_time:ts,prompt_len:n_in,output_len:n_out}",),  # the form the docs show
    ],
)
def test_columns_are_mapped_from_the_command_line(tmp_path, config, overrides):
    path = tmp_path / "custom.csv"
    path.write_text("ts,n_in,n_out\n0.0,4,2\n1.5,5,3\n")
    rs = build(config("workload=trace", f"workload.path={path}", *overrides)).requests
    assert summary(rs) == [(0, 0.0, 4, 2), (1, 1.5, 5, 3)]


@pytest.mark.parametrize(
    "columns, key, allowed",
    [
        ({"arrival": "ts"}, "workload.columns.arrival", "a field among arrival_time, prompt_len, output_len, prompt"),
        (5, "workload.columns", "a mapping of field -> column name"),  # a TypeError before
        ({"prompt_len": 3}, "workload.columns.prompt_len", "a column name"),
    ],
)
def test_bad_columns_are_one_line_naming_the_fields(tmp_path, columns, key, allowed):
    with pytest.raises(ConfigError) as e:
        replay(tmp_path, "ts,n_in,n_out\n0.0,4,2\n", columns=columns)
    assert str(e.value).startswith(f"{key}=") and allowed in str(e.value)


def test_a_null_column_is_found_by_name(tmp_path):
    rs = replay(tmp_path, "time,n_in,output_len\n0.5,4,2\n", columns={"arrival_time": None, "prompt_len": "n_in"})
    assert summary(rs) == [(0, 0.5, 4, 2)]


def test_a_datetime_start_before_the_first_request_is_refused_as_a_negative_one_is(tmp_path):
    first = r"\(2023-11-16T18:15:46.680590\+00:00\)"
    with pytest.raises(ConfigError, match=rf"workload.start='2020-01-01T00:00:00'.*first request {first}"):
        replay(tmp_path, AZURE, start="2020-01-01T00:00:00")  # replayed 3 idle years before
    with pytest.raises(ConfigError, match="workload.start"):
        replay(tmp_path, AZURE, start=-1.0)


def test_an_empty_window_says_where_the_requests_are(tmp_path):
    with pytest.raises(ConfigError) as e:
        replay(tmp_path, "arrival_time,prompt_len,output_len\n0,4,2\n1,4,2\n", start=5.0)
    assert "the window is 5 to inf s" in str(e.value) and "requests arrive 0 to 1 s from 0" in str(e.value)
    assert "None" not in str(e.value)


def test_an_empty_prompt_without_a_length_column_names_the_prompt_column(tmp_path):
    with pytest.raises(ConfigError) as e:
        replay(tmp_path, "arrival_time,prompt,output_len\n0,hi,2\n1,,2\n")
    assert str(e.value) == (f"workload.path='{tmp_path / 't.csv'}:3' is not allowed: "
                            "a prompt in column 'prompt', as the file has no prompt_len column")  # fmt: skip


def test_offsets_mixed_with_epoch_seconds_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"t.csv:3'.*not both \(got 1700000001 s here, 0 s on line 2"):
        replay(tmp_path, "arrival_time,prompt_len,output_len\n0,4,2\n1700000001,4,2\n")
    # 12 days of millisecond offsets read as seconds reach 1e9 too: the message asks about time_unit
    with pytest.raises(ConfigError, match="workload.time_unit"):
        replay(tmp_path, "arrival_time,prompt_len,output_len\n0,4,2\n1036800000,4,2\n")
    rs = replay(tmp_path, "arrival_time,prompt_len,output_len\n0,4,2\n1036800000,4,2\n", time_unit="ms")
    assert [r.arrival_time for r in rs] == [0.0, 1036800.0]


@pytest.mark.parametrize(
    "name, text, columns, words",
    [
        ("t.csv", "timestamp,prompt_len,timestamp,output_len\n0,4,5,2\n", None, "one column for arrival_time, not 2"),
        ("t.csv", "Timestamp,prompt_len,timestamp,output_len\n0,4,5,2\n", None, "(Timestamp, timestamp)"),
        ("t.csv", "ts,ts,prompt_len,output_len\n0,5,4,2\n", {"arrival_time": "ts"}, "one column for arrival_time"),
        ("t.jsonl", '{"timestamp": 0, "timestamp": 5, "input_length": 4, "output_length": 2}', None, "twice"),
    ],
)
def test_a_column_named_twice_is_refused(tmp_path, name, text, columns, words):
    with pytest.raises(ConfigError) as e:  # the last one was read before, unnoticed
        replay(tmp_path, text, name, columns=columns)
    assert words in str(e.value)


@pytest.mark.parametrize("key", ["input_length", "output_length", "timestamp"])
def test_json_booleans_are_not_counts_or_times(tmp_path, key):
    row = {"timestamp": 0, "input_length": 4, "output_length": 2} | {key: True}  # true was 1 token
    with pytest.raises(ConfigError, match=r"t.jsonl:1'.*\(got True: a boolean"):
        replay(tmp_path, json.dumps(row), "t.jsonl")


def test_window_limit_and_start_as_a_datetime(tmp_path):
    rs = replay(tmp_path, AZURE, start=4.4, duration=0.5)
    assert summary(rs) == [(2, 0.141877, 879, 55), (3, 0.310427, 91, 16)]
    same = replay(tmp_path, AZURE, start="2023-11-16 18:15:51.0805900", duration=0.5)
    assert summary(same) == summary(rs)
    assert [r.request_id for r in replay(tmp_path, AZURE, limit=2)] == [0, 1]
    with pytest.raises(ConfigError, match="workload.start"):
        replay(tmp_path, AZURE, start=100.0)
    with pytest.raises(ConfigError, match="workload.start"):
        replay(tmp_path, "arrival_time,prompt_len,output_len\n0,4,2\n", start="2024-01-01")


def test_rate_rescales_arrivals_to_that_mean_rate(tmp_path):
    rs = replay(tmp_path, AZURE, rate=2.0)
    times = [r.arrival_time for r in rs]
    assert times[0] == 0.0 and (len(times) - 1) / times[-1] == pytest.approx(2.0)
    original = [r.arrival_time for r in replay(tmp_path, AZURE)]
    assert np.allclose(np.array(times) / times[-1], np.array(original) / original[-1])  # same shape
    assert {r.arrival_time for r in replay(tmp_path, AZURE, rate=math.inf)} == {0.0}
    with pytest.raises(ConfigError, match="workload.time_scale"):
        replay(tmp_path, AZURE, rate=2.0, time_scale=0.5)


def test_non_utf8_bytes_name_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("arrival_time,prompt,output_len\n0,hello,2\n1,caf\u00e9,2\n".encode("latin-1"))
    with pytest.raises(ConfigError) as e:
        TraceWorkload(path=str(path)).requests(CTX)
    assert str(e.value).startswith(f"workload.path='{path}:3'") and "UTF-8" in str(e.value)


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("arrival_time,prompt_len,output_len\n0,4,2\n1,4,2,9\n", 3, "columns"),
        ("arrival_time,prompt_len,output_len\n0,4,2\n0.5,four,2\n", 3, "prompt_len"),
        ("arrival_time,prompt_len,output_len\n0,4,2\nsoon,4,2\n", 3, "arrival_time"),
        ("arrival_time,prompt_len,output_len\n0,4,-1\n", 2, "holding output_len (got '-1': not a whole number from 0"),
        ("arrival_time,prompt_len,output_len\n0,0,2\n", 2, "holding prompt_len (got '0': not a whole number from 1"),
        ("arrival_time,prompt_len,output_len\n0,-5,2\n", 2, "holding prompt_len (got '-5'"),  # a numpy traceback before
        ("arrival_time,prompt_len,output_len\n0,4,1e30\n", 2, "holding output_len (got '1e30'"),  # an OverflowError
        ("arrival_time,prompt_len,output_len\n0,4,2\nnan,4,2\n", 3, "not a finite time"),  # dropped unnoticed
        ("arrival_time,prompt_len,output_len\ninf,4,2\n", 2, "not a finite time"),
        ("arrival_time,prompt_len,output_len\n-1,4,2\n", 2, "arrival times >= 0"),
        ('arrival_time,prompt_len,output_len\n0,4,2\n"1,4,2\n', 3, "CSV"),
    ],
)
def test_malformed_rows_name_the_file_and_line(tmp_path, text, line, words):
    with pytest.raises(ConfigError) as e:
        replay(tmp_path, text)
    message = str(e.value)
    assert f"t.csv:{line}'" in message and words in message and "\n" not in message


def test_a_file_without_the_needed_columns_says_what_it_found(tmp_path):
    with pytest.raises(ConfigError, match=r"columns for arrival_time, output_len, prompt_len or prompt \(found a, b;"):
        replay(tmp_path, "a,b\n1,2\n")


def test_the_azure_trace_ships_with_the_package_and_its_attribution():
    path = shipped_traces()["azure_llm_2023_conv"]
    assert "Splitwise" in (path.parent / "README.md").read_text()
    rs = TraceWorkload(path="azure_llm_2023_conv").requests(CTX)
    assert len(rs) == 19366


def test_the_azure_trace_figures_docs_quote():
    """docs/workloads.md's description of the trace (and the prompt tokens a second that the
    linear sim cannot keep up with) comes from here."""
    rs = TraceWorkload(path="azure_llm_2023_conv").requests(CTX)
    prompts, outputs = (np.array([getattr(r, n) for r in rs]) for n in ("num_prompt_tokens", "max_tokens"))
    seconds = rs[-1].arrival_time - rs[0].arrival_time
    assert round(seconds / 60) == 58 and round(len(rs) / seconds, 1) == 5.5
    assert [int(np.percentile(prompts, q)) for q in (50, 99, 100)] == [1020, 4142, 14050]
    assert [int(np.percentile(outputs, q)) for q in (50, 99, 100)] == [129, 601, 1000]
    assert round(prompts.sum() / 1e6) == 22 and round(prompts.sum() / seconds, -2) == 6400


def test_the_azure_preset_completes_2000_requests_on_the_simulator(tmp_path):
    from tests.test_cli import cli

    proc, run_dir = cli(tmp_path, "workload=azure_conv", "backend=sim", "workload.limit=2000")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] == 2000 and summary["failed"] == 0


# BurstGPT's own example rows: its request logs keep failed requests, with 0 response tokens
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,Conversation log"""


def test_rows_that_failed_when_recorded_are_left_out_and_said_so(tmp_path, capsys):
    """As vLLM's BurstGPT loader drops them (``Response tokens`` > 0): a request that failed
    in production has no output length to replay. A trace of nothing else is refused."""
    assert summary(replay(tmp_path, BURSTGPT)) == [(0, 5.0, 472, 18), (1, 118.0, 417, 276)]
    assert "note: 1 rows of" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="a trace with at least one request of 1 output token or more"):
        replay(tmp_path, BURSTGPT.split("\n")[0] + "\n45,ChatGPT,1087,0,1087,Conversation log\n")


def test_a_prompt_whose_stated_length_disagrees_is_sent_with_a_note(tmp_path, capsys):
    # the stated prompt_len was dropped without a word where the row's text read otherwise
    rows = [{"timestamp": 0, "prompt": "abc", "prompt_len": 3, "output_len": 2},
            {"timestamp": 1, "prompt": "abcdef", "prompt_len": 2, "output_len": 2},
            {"timestamp": 2, "prompt": [5, 6], "prompt_len": "n/a", "output_len": 2},  # no count: none stated
            {"timestamp": 3, "prompt_len": 4, "output_len": 2}]  # fmt: skip
    reqs = replay(tmp_path, "\n".join(json.dumps(r) for r in rows), "t.jsonl")
    assert [r.num_prompt_tokens for r in reqs] == [3, 6, 2, 4]  # bytes here; the prompt wins
    assert capsys.readouterr().err.strip() == (
        f"note: 1 of 4 rows of {tmp_path / 't.jsonl'} give a prompt whose length here is not the row's prompt "
        "length (line 2: 6 tokens, 2 stated): the prompt is sent, as long as it is here")


def test_a_rate_on_an_experiment_that_scales_time_says_how_to_combine_them(config):
    # +experiment=routing sets workload.time_scale; a rate added on the command line was refused
    # on a value the user never set, with no way out named
    with pytest.raises(ConfigError) as e:
        build(config("+experiment=routing", "workload.rate=60", "workload.limit=10"))
    assert e.value.key == "workload.time_scale" and "add workload.time_scale=1.0 beside workload.rate" in str(e.value)
    assert len(build(config("+experiment=routing", "workload.rate=60", "workload.time_scale=1.0",
                            "workload.limit=10")).requests) == 10  # fmt: skip


def test_a_rewritten_trace_is_read_again_and_each_build_owns_its_prompts(tmp_path):
    # a process keeps the parsed file and the drawn prompts (a plan's worker rebuilds them per run)
    first = replay(tmp_path, "arrival_time,prompt_len,output_len\n0.0,4,2\n1.0,4,2\n")
    again = replay(tmp_path, "arrival_time,prompt_len,output_len\n0.0,4,2\n1.0,4,2\n")
    assert [list(r.token_ids) for r in again] == [list(r.token_ids) for r in first]
    first[0].token_ids.append(7)  # a run appends its outputs to its prompt's array
    assert len(again[0].token_ids) == 4
    same_size = replay(tmp_path, "arrival_time,prompt_len,output_len\n0.0,4,2\n2.0,4,3\n")  # at once: one mtime
    assert [(r.arrival_time, r.max_tokens) for r in same_size] == [(0.0, 2), (2.0, 3)]
