"""``python -m paged_bench.validate`` (issue 35): the registry of published cases loads and names
its sources, one cheap case runs end to end and prints ratio = simulated / published, a bad
case file is refused in one line, and docs/validation.md is what the command writes: every
registry figure in its table, its summary line computed from its own rows, the cheap case's
simulated figure the one a run makes now, and each file's notes under their headings, quoting
the table's figures."""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

from paged_bench.errors import ConfigError
from paged_bench.validate.bursts import burst_bounds, is_burst
from paged_bench.validate.cases import FIGURE_REF, load_file, load_registry
from paged_bench.validate.simulate import DRAWS_AT_ONCE, draw_seeds, run_case
from paged_bench.validate.workloads import arrival_times, request_lengths
from tests.tracking_support import call_cli

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "validation.md"
CHEAP = "h200-8b-latency-bs8"  # one batch of 8 requests: a fraction of a second


@pytest.fixture(scope="module")
def direct():
    """The cheap case, simulated here (in-process, as the command does)."""
    (row,) = run_case(_cases()[CHEAP], time_limit_s=60)
    return row


def _cases():
    return {c.name: c for f in load_registry() for c in f.cases}


def test_every_case_names_its_source_engine_and_how_each_figure_was_read():
    files = load_registry()
    assert len(files) >= 3 and sum(len(f.cases) for f in files) >= 20
    for f in files:
        s = f.source
        assert s.url or (s.repository and s.path), f.name
        assert s.title and s.published and f.engine
        for case in f.cases:
            assert all(fig.read and fig.published > 0 for fig in case.figures), case.name


def test_a_case_runs_end_to_end_and_prints_simulated_over_published(tmp_path, direct):
    ran = call_cli(tmp_path, "--case", CHEAP, module="paged_bench.validate")
    assert ran.returncode == 0, ran.stderr
    row = next(line.split() for line in ran.stdout.splitlines() if line.startswith(CHEAP))
    _, metric, unit, published, simulated, ratio = row
    assert (metric, unit) == ("duration_ms", "ms")
    assert float(published) == pytest.approx(direct.figure.published, rel=1e-3)
    assert float(simulated.replace(",", "")) == pytest.approx(direct.simulated, rel=1e-3)
    assert ratio == f"{direct.simulated / direct.figure.published:.2f}"
    assert "1 figure: " in ran.stdout and "median absolute error" in ran.stdout
    within = int(abs(direct.ratio - 1) <= 0.15)
    assert f"  duration_ms: {within} of 1 within 15%, median ratio {direct.ratio:.2f}\n" in ran.stdout


def test_a_bad_case_file_is_one_line_naming_the_file_and_key(tmp_path):
    good = (ROOT / "conf" / "validation" / "shared_vllm_ci_latency_h200.yaml").read_text()
    (tmp_path / "bad.yaml").write_text(good.replace("unit: ms", "unit: s", 1))
    ran = call_cli(tmp_path, "--registry", str(tmp_path), module="paged_bench.validate")
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.count("\n") == 1
    assert ran.stderr.startswith("error: bad.yaml: cases[0].figures[0].unit='s' is not allowed: 'ms'")
    bad_note = good.replace("  Kernels and CPU: >-", "  Kernels: [1]\n  Kernels and CPU: >-", 1)
    (tmp_path / "bad.yaml").write_text(bad_note)
    ran = call_cli(tmp_path, "--registry", str(tmp_path), module="paged_bench.validate")
    assert ran.returncode == 2 and ran.stderr.startswith("error: bad.yaml: notes.Kernels=[1] is not allowed: a non-")
    bad_quote = good.replace("8B {ratio:h200-8b-latency-bs8:duration_ms}", "{ratio:h200-8b:duration_ms}")
    (tmp_path / "bad.yaml").write_text(bad_quote)
    ran = call_cli(tmp_path, "--registry", str(tmp_path), module="paged_bench.validate")
    assert ran.returncode == 2 and ran.stderr.count("\n") == 1
    assert ran.stderr.startswith("error: bad.yaml: notes.Kernels and CPU='{ratio:h200-8b:duration_ms}' is not allowed")
    ran = call_cli(tmp_path, "--case", "no-such-case", module="paged_bench.validate")
    assert ran.returncode == 2 and "--case='no-such-case' is not allowed: one of " in ran.stderr


def test_an_override_reaches_every_case_and_a_bad_one_is_one_line(tmp_path):
    def simulated(*extra):
        ran = call_cli(tmp_path, "--case", "h200-70b-tp4-latency-bs8", *extra, module="paged_bench.validate")
        assert ran.returncode == 0, ran.stderr
        return float(next(line.split() for line in ran.stdout.splitlines() if line.startswith("h200-70b"))[4]
                     .replace(",", ""))  # fmt: skip

    # 160 all-reduces a step of 8 tokens: NCCL's alone (vLLM --disable-custom-all-reduce) is dearer
    assert simulated("--override", "backend.all_reduce=nccl") > 1.1 * simulated()
    for argv, message in ((["--override", "nokey"], "--override='nokey' is not allowed: KEY=VALUE"),
                          (["--write", str(tmp_path / "v.md"), "--override", "backend.all_reduce=nccl"],
                           "leave out --override to write it")):  # fmt: skip
        ran = call_cli(tmp_path, *argv, module="paged_bench.validate")
        assert ran.returncode == 2 and ran.stderr.count("\n") == 1 and message in ran.stderr
    assert not (tmp_path / "v.md").exists()
    ran = call_cli(tmp_path, "--case", CHEAP, "--override", "backend.nope=1", module="paged_bench.validate")
    assert ran.returncode == 1 and "Traceback" not in ran.stderr  # the case's row fails, in one line
    assert f"error: {CHEAP}: backend.nope=1 is not allowed: not a key of the backend section" in ran.stdout


def _doc_rows() -> list[list[str]]:
    text = DOC.read_text()
    table = text[text.index("## Results") : text.index("## Where the simulator")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[4:] if line.startswith("|")]


def test_the_doc_is_what_the_command_writes(direct):
    rows = _doc_rows()
    cases = _cases()
    expected = [(c.name, f"{f.metric} ({f.unit})") for c in cases.values() for f in c.figures]
    assert [(r[0], r[5]) for r in rows] == expected  # every figure of the registry, in its order
    for r in rows:
        published, simulated = (float(v.replace(",", "")) for v in r[6:8])
        ratio, spread = _ratio_cell(r[8])
        assert ratio == pytest.approx(simulated / published, abs=0.011 + 0.01 * ratio), r
        assert (spread is not None) == (f"{DRAWS_AT_ONCE} draws" in r[4]), r  # a range where there are draws
        assert spread is None or spread[0] - 0.005 <= ratio <= spread[1] + 0.005, r
    errors = sorted(abs(_ratio_cell(r[8])[0] - 1) for r in rows)
    doc = DOC.read_text()
    line = re.search(r"\*\*(\d+ figures?: .*)\.\*\*", doc).group(1)
    n_within = int(line.split(": ")[1].split(" ")[0])
    # the cells are rounded: a ratio printed 0.85 or 1.15 may lie either side of the bar
    surely, maybe = sum(e < 0.145 for e in errors), sum(e <= 0.155 for e in errors)
    assert line.startswith(f"{len(rows)} figures: ") and surely <= n_within <= maybe
    (mine,) = [r for r in rows if r[0] == CHEAP]
    assert float(mine[7].replace(",", "")) == pytest.approx(direct.simulated, rel=2e-3), "make validate"
    for f in load_registry():
        assert f.source.citation in doc
        notes = doc[doc.index(f"### Notes on {f.name}") :] if f.notes else ""
        for note in f.notes:  # each section under its heading, the file's own, quoting the table's figures
            text = (f"**{note.heading}.** " if note.heading else "") + _quoting(note.text, rows)
            assert text in notes.split("\n### ")[0], note


def test_the_docs_glance_sums_the_results_table_by_metric():
    rows = _doc_rows()
    doc = DOC.read_text()
    glance = doc[doc.index("## At a glance") : doc.index("## Results")]
    table = [[c.strip() for c in line.strip("|").split("|")] for line in glance.splitlines() if line.startswith("|")]
    by_metric = {line[0]: line[1:] for line in table[2:]}
    metrics = {r[5].split(" (")[0] for r in rows}
    assert set(by_metric) == metrics, "a row for every metric of the results table"
    for metric, (figures, within, _error, median) in by_metric.items():
        ratios = [_ratio_cell(r[8])[0] for r in rows if r[5].split(" (")[0] == metric]
        assert int(figures) == len(ratios), metric
        surely, maybe = sum(abs(x - 1) < 0.145 for x in ratios), sum(abs(x - 1) <= 0.155 for x in ratios)
        assert surely <= int(within) <= maybe, metric
        assert float(median) == pytest.approx(statistics.median(ratios), abs=0.011), metric


def test_the_doc_lists_every_figure_outside_15_percent_the_shared_cases_first():
    rows = _doc_rows()
    doc = DOC.read_text()
    part = doc[doc.index("outside ±15%, the shared README's cases first:") :].split("\n\n")[1]
    listed = [[c.strip() for c in line.strip("|").split("|")] for line in part.splitlines()[2:]]
    assert listed, "the doc's table of figures outside 15% is empty"
    by_figure, cases = {(r[0], r[5]): r for r in rows}, _cases()
    for file, case, metric, published, simulated, ratio in listed:  # each is the results table's row
        r = by_figure[(case, metric)]
        assert (published, simulated, ratio) == (r[6], r[7], r[8]) and file.strip("`") == cases[case].file
    errors = {(r[0], r[5]): abs(_ratio_cell(r[8])[0] - 1) for r in rows}
    shown = {(case, metric) for _, case, metric, *_ in listed}
    assert {k for k, e in errors.items() if e > 0.155} <= shown  # the printed ratio is rounded: 0.85 and
    assert not {k for k, e in errors.items() if e < 0.145} & shown  # 1.15 may lie either side of the bar
    shared = [row[0].strip("`").startswith("shared_") for row in listed]
    assert shared == sorted(shared, reverse=True), "the shared README's cases come first"


def _quoting(text: str, rows: list[list[str]]) -> str:
    """A note with the figures it quotes ({ratio:...}, {simulated:...}, {ratios:...}) read off the doc's table."""
    table = {(r[0], r[5].split(" (")[0]): r for r in rows}

    def value(ref: re.Match[str]) -> str:
        if ref[1] == "simulated":
            return table[(ref[2], ref[3])][7]
        cases = [(ref[2], ref[3])] if ref[1] else [(case, ref[4]) for case in ref[5].split(",")]
        ratios = [_ratio_cell(table[key][8])[0] for key in cases]
        return f"{min(ratios):.2f}x" + (f" to {max(ratios):.2f}x" if len(ratios) > 1 else "")

    return FIGURE_REF.sub(value, text)


def _ratio_cell(cell: str) -> tuple[float, tuple[float, float] | None]:
    """ "1.01 (0.87-1.12)": the ratio and its range over the draws; "0.95": a ratio alone."""
    m = re.fullmatch(r"([\d.]+)(?: \(([\d.]+)-([\d.]+)\))?", cell)
    assert m, cell
    return float(m[1]), ((float(m[2]), float(m[3])) if m[2] else None)


def test_a_sharegpt_burst_is_the_mean_over_its_draws():
    """With every request at once a ShareGPT run lasts until its longest request ends, so such a
    case runs on several draws: each figure their mean, with their least and greatest."""
    cases = _cases()
    case = cases["h100-70b-tp4-sharegpt-inf"]
    assert draw_seeds(case) == range(DRAWS_AT_ONCE) and len(draw_seeds(cases["h100-70b-tp4-sharegpt-qps2"])) == 1
    assert len(draw_seeds(cases["h100-8b-prefill-heavy-inf"])) == 1  # fixed lengths: every draw the same
    small = dataclasses.replace(case, workload=dataclasses.replace(case.workload, num_requests=40))
    singles = [run_case(small, 60, seeds=[seed]) for seed in (0, 1, 2)]
    for i, row in enumerate(run_case(small, 60, seeds=[0, 1, 2])):
        values = [rows[i].simulated for rows in singles]
        assert len(set(values)) > 1 and row.draws == 3
        assert row.simulated == pytest.approx(statistics.fmean(values))
        assert (row.low, row.high) == (min(values), max(values))
        assert row.ratio_range == (min(values) / row.figure.published, max(values) / row.figure.published)


def test_a_bursts_bounds_are_the_published_figures_arithmetic():
    """500 prompts of 462 tokens, 59 req/s, mean TTFT 4,950 ms (the 0.6.0 post's H100 8B
    prefill-heavy cell): D = 500 / 59 = 8.475 s, so the requests reached the engine at least
    2 x 4.95 - 8.475 = 1.425 s late, and it prefilled at least 231,000 / (2 x 3.525) = 32,769 tokens/s."""
    b = burst_bounds(500, 462, 59.0, 4950.0)
    assert b.start_floor_s == pytest.approx(1.4254, abs=1e-4) and b.prefill_floor == pytest.approx(32_769, abs=1)
    assert burst_bounds(500, 462, 31.0, 4800.0).start_floor_s < 0  # decode-heavy: no bound on the delay
    cases = _cases()
    assert is_burst(cases["h100-8b-prefill-heavy-inf"]) and not is_burst(cases["h100-8b-sharegpt-inf"])


def test_poisson_arrivals_are_the_ones_vllms_client_draws():
    """benchmark_serving.py (v0.6.0): np.random.seed(args.seed) in main(), then get_request sends a
    request and sleeps np.random.exponential(1 / rate) before the next; nothing else draws from
    numpy's global generator first for the ShareGPT and sonnet datasets."""
    state = np.random.get_state()
    try:
        np.random.seed(0)
        sent, t = [], 0.0
        for _ in range(50):
            sent.append(t)
            t += np.random.exponential(1.0 / 32)
    finally:
        np.random.set_state(state)
    assert arrival_times(50, 32.0, 0) == pytest.approx(sent, abs=1e-12)
    assert arrival_times(50, 32.0, 1) != pytest.approx(sent)  # --seed 1 is another draw
    assert (arrival_times(7, math.inf, 0) == 0).all()


LAMBDA = "h100-8b-lambda-sharegpt320"


def test_a_listed_workload_sends_the_published_requests():
    """A source that lists each request's tokens (Lambda's result files) is replayed request by
    request: the registry holds the file's counts (their totals are the file's), and a reply of 0
    tokens (the model ended at once) is one generated token."""
    totals = {  # total_output_tokens of each result file
        "h100-8b-lambda-sharegpt10": 1_867, "h100-8b-lambda-sharegpt40": 7_692, "h100-8b-lambda-sharegpt160": 32_114,
        LAMBDA: 65_331, "h100-8b-tp2-lambda-sharegpt320": 65_649, "h100-8b-tp4-lambda-sharegpt320": 65_375,
        "h100-8b-tp8-lambda-sharegpt320": 65_853, "h100-70b-tp4-lambda-sharegpt320": 56_543,
        "h100-70b-tp8-lambda-sharegpt320": 55_791, "a100-8b-lambda-sharegpt320": 65_374,
        "a100-8b-tp2-lambda-sharegpt320": 65_784, "a100-8b-tp4-lambda-sharegpt320": 64_905,
        "a100-8b-tp8-lambda-sharegpt320": 65_441, "a100-70b-tp4-lambda-sharegpt320": 55_641,
        "a100-70b-tp8-lambda-sharegpt320": 56_599,
    }  # fmt: skip
    cases = _cases()
    assert {name for name in cases if "lambda" in name} == set(totals)
    for name, outputs in totals.items():
        w = cases[name].workload
        prompts = {10: 1_369, 40: 8_595, 160: 34_050, 320: 65_578}[w.num_requests]  # the first N of the same 320
        assert (w.dataset, sum(w.prompt_lens), sum(w.output_lens)) == ("listed", prompts, outputs)
        lengths = request_lengths(w, 0)
        assert lengths[:, 0].tolist() == list(w.prompt_lens)
        assert lengths[:, 1].tolist() == [max(n, 1) for n in w.output_lens]
        assert len(draw_seeds(cases[name])) == 1  # the published requests: no draws


def test_vllms_client_counts_an_empty_replys_ttft_as_0():
    """benchmark_serving.py (v0.6.0) takes TTFT at the first chunk carrying text; a reply that ends
    at its first token carries none, keeps TTFT 0.0, and is averaged in. Three prompts of one step:
    each first token at the same time t, so the mean is 2t/3 with one empty reply, the median t, and
    t the first TTFT of a reply with text."""
    case = _cases()[LAMBDA]
    tiny = dataclasses.replace(case, workload=dataclasses.replace(
        case.workload, num_requests=3, prompt_lens=(100, 100, 100), output_lens=(5, 0, 5)))  # fmt: skip
    rows = {r.figure.metric: r.simulated for r in run_case(tiny, 60)}
    mean, median, tpot = rows["mean_ttft_ms"], rows["median_ttft_ms"], rows["mean_tpot_ms"]
    assert median > 0 and mean == pytest.approx(2 * median / 3, rel=1e-9)
    assert rows["first_ttft_ms"] == pytest.approx(median)
    full = dataclasses.replace(tiny, workload=dataclasses.replace(tiny.workload, output_lens=(5, 1, 5)))
    silent = dataclasses.replace(tiny, workload=dataclasses.replace(tiny.workload, output_lens=(0, 0, 0)))
    (error,) = {r.error for r in run_case(silent, 60)}  # no reply with text (nor of two tokens): no crash
    assert error == "the run gives no mean_tpot_ms, median_tpot_ms, first_ttft_ms"
    again = {r.figure.metric: r.simulated for r in run_case(full, 60)}
    assert again["mean_ttft_ms"] == pytest.approx(median) and again["median_ttft_ms"] == pytest.approx(median)
    assert again["mean_tpot_ms"] == pytest.approx(tpot)  # a one-token reply has no TPOT either way


@pytest.mark.parametrize(("edit", "message"), [
    (lambda w: w.replace("num_requests: 320", "num_requests: 321", 1),
     "cases[3].workload.prompt_lens='a list of 320' is not allowed: a list of num_requests=321 lengths"),
    (lambda w: w.replace("output_lens: [120,", "output_lens: [-1,", 1),
     "cases[0].workload.output_lens[0]=-1 is not allowed: an integer >= 0"),
    (lambda w: w.replace("prompt_lens: &sharegpt320 [13,", "prompt_lens: &sharegpt320 [0,", 1),
     "cases[3].workload.prompt_lens[0]=0 is not allowed: an integer >= 1"),
    (lambda w: w.replace("dataset: listed", "dataset: fixed", 1),
     "cases[0].workload.prompt_lens="),
])  # fmt: skip
def test_a_bad_listed_workload_is_refused_naming_the_request(tmp_path, edit, message):
    good = (ROOT / "conf" / "validation" / "lambda_vllm060_sharegpt.yaml").read_text()
    (tmp_path / "bad.yaml").write_text(edit(good))
    with pytest.raises(ConfigError) as e:
        load_file(tmp_path / "bad.yaml")
    assert str(e.value).startswith(f"bad.yaml: {message}"), str(e.value)[:300]
    assert "\n" not in str(e.value)
