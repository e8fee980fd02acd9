"""trtspec tune: the choice per band and the schedule (synthetic bench results), the config it writes (atomic,
refusals), and one real tune of the llmapi flavour on its CPU stand-in whose output the next build accepts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.bench.tune import (
    BandChoice,
    TuneError,
    apply_schedule,
    best_k_per_band,
    check_writable,
    output_paths,
    schedule_from_bands,
    sweep_variant,
    write_config,
)
from trtspec.cli import cli
from trtspec.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[1]


def _cell(conc, k, speedup=None, policy="fixed"):
    base = k == 0 and policy != "ensemble"
    return {"concurrency": conc, "num_draft_tokens": k, "endpoint": "baseline" if base else "ensemble",
            "speculative": k > 0, "draft_length_policy": None if base else policy,
            "speedup": None if base else {"output_tokens_per_s": speedup}}


def _results(*cells):
    return {"cells": list(cells)}


# ---------------------------------------------------------------------------------------------- the choice


def test_best_k_per_band_takes_the_fastest_fixed_k_or_the_baseline():
    res = _results(_cell(1, 0), _cell(1, 1, 1.10), _cell(1, 3, 1.25), _cell(1, 6, 1.2),
                   _cell(1, 6, 1.9, policy="adaptive"),  # not a fixed k: never chosen
                   _cell(4, 0), _cell(4, 1, 1.02), _cell(4, 3, 0.9),
                   _cell(8, 0), _cell(8, 1, 0.97), _cell(8, 3, 0.7),
                   _cell(16, 0), _cell(16, 0, 0.99, policy="ensemble"))  # no k > 0 at 16: no band
    bands = best_k_per_band([res])
    assert [(b.concurrency, b.k) for b in bands] == [(1, 3), (4, 1), (8, 0)]
    assert bands[0].speedups == {0: 1.0, 1: 1.10, 3: 1.25, 6: 1.2} and bands[2].speedup == 1.0


def test_best_k_per_band_over_one_run_per_k():
    """llmapi: each k in a run of its own, each judged against its own run's baseline."""
    runs = [_results(_cell(1, 0), _cell(1, 2, 1.3), _cell(2, 0), _cell(2, 2, 0.95)),
            _results(_cell(1, 0), _cell(1, 4, 1.2), _cell(2, 0), _cell(2, 4, 1.01))]
    assert [(b.concurrency, b.k) for b in best_k_per_band(runs)] == [(1, 2), (2, 4)]


def test_a_tie_goes_to_the_smaller_k():
    bands = best_k_per_band([_results(_cell(1, 0), _cell(1, 2, 1.0), _cell(2, 0), _cell(2, 1, 1.2), _cell(2, 3, 1.2))])
    assert [b.k for b in bands] == [0, 1]


def _bands(pairs):
    return [BandChoice(c, k, 1.0, {}) for c, k in pairs]


def test_schedule_starts_at_one_and_keeps_only_the_changes():
    assert schedule_from_bands(_bands([(1, 4), (2, 4), (4, 2), (8, 0), (16, 0)])) == {1: 4, 4: 2, 8: 0}
    assert schedule_from_bands(_bands([(2, 3), (8, 1)])) == {1: 3, 8: 1}  # the lowest level covers 1 too
    assert schedule_from_bands(_bands([(1, 0), (4, 0)])) == {1: 0}
    with pytest.raises(TuneError, match="nothing to tune"):
        schedule_from_bands([])


def test_schedule_means_what_the_loop_reads():
    """The written schedule, read by trtspec.spec.speculative.scheduled_draft_len, gives each level its best k."""
    from trtspec.spec.speculative import scheduled_draft_len

    best = [(1, 4), (2, 4), (4, 2), (8, 0)]
    schedule = schedule_from_bands(_bands(best))
    for level, k in best:
        assert scheduled_draft_len(schedule, level, 8) == k
    assert scheduled_draft_len(schedule, 3, 8) == 4 and scheduled_draft_len(schedule, 30, 8) == 0


# ---------------------------------------------------------------------------------------------- the config


def _demo():
    return yaml.safe_load((ROOT / "build_configs" / "demo.yaml").read_text())


def _demo_llmapi():
    return yaml.safe_load((ROOT / "build_configs" / "demo-llmapi.yaml").read_text())


def test_reference_config_gets_the_canonical_schedule():
    doc = _demo()
    doc["speculative"].update(max_concurrency=4, num_draft_tokens=3)  # a user's caps, which the schedule replaces
    tuned = apply_schedule(doc, {1: 4, 4: 2, 8: 0})
    spec = tuned.doc["speculative"]
    assert tuned.section == "speculative" and spec["draft_len_schedule"] == {1: 4, 4: 2, 8: 0}
    assert spec["num_draft_tokens"] == 4 and "max_concurrency" not in spec  # a cap cannot raise k
    assert doc["speculative"]["max_concurrency"] == 4  # the input is not changed
    assert any("num_draft_tokens: 3 -> 4" in n for n in tuned.notes)
    cfg = parse_config(tuned.doc)
    assert cfg.speculative.draft_len_schedule == {1: 4, 4: 2, 8: 0}


def test_llmapi_config_gets_its_schedule_and_max_draft_len():
    tuned = apply_schedule(_demo_llmapi(), {1: 3, 4: 4, 8: 0})
    assert tuned.section == "llmapi" and tuned.schedule == {1: 3, 4: 3, 8: 0}
    assert tuned.doc["speculative"]["max_draft_len"] == 3 and tuned.doc["llmapi"]["draft_len_schedule"] == {1: 3, 4: 3, 8: 0}
    assert any("lowered" in n for n in tuned.notes)
    cfg = parse_config(tuned.doc)  # TensorRT-LLM's rule schedule[1] == max_draft_len holds
    assert cfg.llmapi.draft_len_schedule == {1: 3, 4: 3, 8: 0}


def test_llmapi_tune_never_writes_a_band_of_0_for_a_one_engine_drafter():
    """EAGLE-3 one-model and MTP on TensorRT-LLM 1.2.x (no min_runtime_draft_len): a k=0 band would stop the drafter
    and its stale state collapses acceptance when it resumes (trtspec.llmapi.draft_floor); tune writes 1 there and
    says why. With llmapi.eagle3_two_model the band of 0 stays: the two-model drafter catches up."""
    doc = _demo_llmapi()
    doc["speculative"]["method"] = "eagle3"
    tuned = apply_schedule(doc, {1: 3, 4: 2, 8: 0})
    assert tuned.schedule == {1: 3, 4: 2, 8: 1} and tuned.doc["llmapi"]["draft_len_schedule"] == {1: 3, 4: 2, 8: 1}
    assert any("draft 1 token instead" in n and "PR #16888" in n for n in tuned.notes)
    doc["llmapi"]["eagle3_two_model"] = True
    assert apply_schedule(doc, {1: 3, 4: 2, 8: 0}).schedule == {1: 3, 4: 2, 8: 0}


def test_llmapi_with_nothing_paying_at_one_request_turns_speculation_off():
    doc = _demo_llmapi()
    doc["llmapi"]["draft_len_schedule"] = {1: 4, 8: 2}
    tuned = apply_schedule(doc, {1: 0})
    assert tuned.doc["llmapi"]["max_concurrency"] == 0 and "draft_len_schedule" not in tuned.doc["llmapi"]
    assert parse_config(tuned.doc).llmapi.max_concurrency == 0


def test_sweep_variant_lifts_the_load_caps():
    ref = sweep_variant(_demo())
    assert "max_concurrency" not in ref["speculative"] and ref["speculative"]["max_draft_len"] == 8
    doc = _demo_llmapi()
    doc["llmapi"].update(max_concurrency=4, draft_len_schedule={1: 4, 4: 1}, baseline_endpoint=False)
    v = sweep_variant(doc, 2)
    assert v["speculative"]["max_draft_len"] == 2 and v["llmapi"] == {"baseline_endpoint": True}
    parse_config(v)


def test_output_paths_and_refusals(tmp_path):
    cfg = tmp_path / "my.yaml"
    cfg.write_text("x: 1\n")
    assert output_paths(cfg, None, False) == (tmp_path / "my.tuned.yaml", None)
    assert output_paths(cfg, None, True) == (cfg, tmp_path / "my.yaml.bak")
    with pytest.raises(TuneError, match="not both"):
        output_paths(cfg, tmp_path / "o.yaml", True)
    check_writable(tmp_path / "my.tuned.yaml", None, force=False)
    with pytest.raises(TuneError, match="exists: choose another --output, or pass --force"):
        check_writable(cfg, None, force=False)
    check_writable(cfg, None, force=True)
    (tmp_path / "my.yaml.bak").write_text("old")
    with pytest.raises(TuneError, match="my.yaml.bak exists"):
        check_writable(cfg, tmp_path / "my.yaml.bak", force=False)
    with pytest.raises(TuneError, match="no such folder"):
        check_writable(tmp_path / "nope" / "t.yaml", None, force=False)


def test_write_config_in_place_keeps_a_backup(tmp_path):
    cfg = tmp_path / "demo.yaml"
    original = (ROOT / "build_configs" / "demo.yaml").read_text()
    cfg.write_text(original)
    tuned = apply_schedule(yaml.safe_load(original), {1: 2, 4: 0})
    write_config(cfg, tuned.doc, "# tuned\n", backup=tmp_path / "demo.yaml.bak", validate=load_config)
    assert (tmp_path / "demo.yaml.bak").read_text() == original
    assert cfg.read_text().startswith("# tuned\n")
    assert load_config(cfg).speculative.draft_len_schedule == {1: 2, 4: 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.yaml", "demo.yaml.bak"]  # no temp file left


def test_a_config_the_build_would_refuse_is_never_written(tmp_path):
    dest = tmp_path / "demo.tuned.yaml"
    dest.write_text("previous\n")
    bad = apply_schedule(_demo(), {1: 2}).doc
    bad["speculative"]["draft_len_schedule"] = {1: 99}  # above max_draft_len
    with pytest.raises(ConfigError, match="draft_len_schedule"):
        write_config(dest, bad, "# tuned\n", validate=load_config)
    assert dest.read_text() == "previous\n"
    assert [p.name for p in tmp_path.iterdir()] == ["demo.tuned.yaml"]


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    dest = tmp_path / "t.yaml"

    def interrupted(path):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_config(dest, _demo(), "", validate=interrupted)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- the command


def test_help_teaches():
    out = CliRunner().invoke(cli, ["tune", "--help"]).output
    for word in ("draft_len_schedule", "llmapi", "--in-place", "CONFIG.bak", "Examples", "--fixed-k", "band"):
        assert word in out, word


@pytest.mark.parametrize("args, words", [
    (["--draft-tokens", "0,9"], "--draft-tokens 9: larger than this config's speculative.max_draft_len (8)"),
    (["--draft-tokens", "0"], "give at least one k > 0"),
    (["--concurrency", "0"], "--concurrency: values must be >= 1"),
    (["--in-place", "--output", "x.yaml"], "not both"),
])
def test_bad_options_are_refused_before_anything_runs(tmp_path, args, words):
    cfg = tmp_path / "demo.yaml"
    cfg.write_text((ROOT / "build_configs" / "demo.yaml").read_text())
    res = CliRunner().invoke(cli, ["tune", str(cfg), "--results", str(tmp_path / "r"), *args])
    assert res.exit_code != 0 and words in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output and sorted(p.name for p in tmp_path.iterdir()) == ["demo.yaml"]


def test_existing_output_is_refused_before_measuring(tmp_path):
    cfg = tmp_path / "demo.yaml"
    cfg.write_text((ROOT / "build_configs" / "demo.yaml").read_text())
    (tmp_path / "demo.tuned.yaml").write_text("mine\n")
    res = CliRunner().invoke(cli, ["tune", str(cfg), "--results", str(tmp_path / "r")])
    assert res.exit_code != 0 and "demo.tuned.yaml exists" in " ".join(res.output.split())
    assert (tmp_path / "demo.tuned.yaml").read_text() == "mine\n" and not (tmp_path / "r").exists()


def test_flavour_rules(tmp_path):
    llm = tmp_path / "l.yaml"
    llm.write_text((ROOT / "build_configs" / "demo-llmapi.yaml").read_text())
    res = CliRunner().invoke(cli, ["tune", str(llm), "--url", "localhost:1"])
    assert res.exit_code != 0 and "leave --url out" in " ".join(res.output.split())
    trt = tmp_path / "t.yaml"
    trt.write_text("engine: tensorrt_llm\ntarget: {checkpoint: 'demo:target'}\ndraft: {checkpoint: 'demo:draft'}\n")
    res = CliRunner().invoke(cli, ["tune", str(trt)])
    assert res.exit_code != 0 and "--url HOST:PORT" in " ".join(res.output.split())


def test_unreachable_url_is_a_clear_error_and_writes_nothing(tmp_path):
    cfg = tmp_path / "demo.yaml"
    cfg.write_text((ROOT / "build_configs" / "demo.yaml").read_text())
    res = CliRunner().invoke(cli, ["tune", str(cfg), "--url", "127.0.0.1:1", "--results", str(tmp_path / "r"),
                                   "--draft-tokens", "0,1", "--concurrency", "1"])
    assert res.exit_code != 0 and "cannot reach Triton" in " ".join(res.output.split())
    assert "Traceback" not in res.output
    assert not (tmp_path / "demo.tuned.yaml").exists()


# ---------------------------------------------------------------------------------------------- real Triton


@pytest.mark.slow
def test_tune_llmapi_on_the_cpu_standin_writes_a_schedule_the_next_build_accepts(tmp_path):
    """The llmapi flavour: one deployment for k=1 (with its baseline), concurrency 1 and 2, then `trtspec build`
    of the tuned config writes a model.yaml carrying the choice."""
    cfg = tmp_path / "demo-llmapi.yaml"
    cfg.write_text((ROOT / "build_configs" / "demo-llmapi.yaml").read_text())
    results = tmp_path / "results"
    res = CliRunner().invoke(cli, ["tune", str(cfg), "--draft-tokens", "0,1", "--concurrency", "1,2", "--requests", "2",
                                   "--warmup", "0", "--max-tokens", "4", "--num-prompts", "2", "--results", str(results)])
    assert res.exit_code == 0, res.output
    tuned_path = tmp_path / "demo-llmapi.tuned.yaml"
    assert "llmapi.draft_len_schedule" in res.output and str(tuned_path) in " ".join(res.output.split())
    summary = json.loads((results / "tune.json").read_text())
    assert [b["concurrency"] for b in summary["bands"]] == [1, 2]
    for b in summary["bands"]:
        assert set(b["speedups"]) == {"0", "1"} and b["num_draft_tokens"] == max(
            (0, 1), key=lambda k: (b["speedups"][str(k)], -k))
    assert (results / "k1" / "results.json").is_file()

    tuned = load_config(tuned_path)
    assert tuned_path.read_text().startswith("# Tuned by `trtspec tune demo-llmapi.yaml`")
    first = summary["bands"][0]["num_draft_tokens"]
    schedule = summary["schedule"]["llmapi.draft_len_schedule"]
    if first == 0:
        assert tuned.llmapi.max_concurrency == 0 and tuned.llmapi.draft_len_schedule is None and schedule == {}
    else:
        assert tuned.speculative.max_k == 1
        assert {str(b): k for b, k in tuned.llmapi.draft_len_schedule.items()} == schedule
    assert (cfg.read_text() == (ROOT / "build_configs" / "demo-llmapi.yaml").read_text())  # the input is kept

    out = tmp_path / "build"
    built = CliRunner().invoke(cli, ["build", str(tuned_path), "-o", str(out)])
    assert built.exit_code == 0, built.output
    model = yaml.safe_load((out / "model_repository" / "ensemble" / "1" / "model.yaml").read_text())
    spec = model["speculative_config"]
    if first == 0:
        assert spec["max_concurrency"] == 0
    else:
        assert spec["max_draft_len"] == 1 and spec.get("draft_len_schedule")
    assert os.path.isfile(out / "model_repository" / "baseline" / "1" / "model.yaml")
