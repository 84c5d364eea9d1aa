"""Tests for specgate.config.rig: the shipped fixtures load, and every broken file is reported with
the file and the dotted key, without the loader touching the file."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgate.config.rig import list_rigs, load_prompt_classes, load_rig
from specgate.errors import ConfigError

pytestmark = pytest.mark.fast

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHIPPED_RIGS = ("cpu-smollm2", "h200-smollm2", "kimi-k25-int4-8x-rtx6000")
SIX_CLASSES = {"coding", "math", "structured_json", "explanatory", "extraction", "summarization"}
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}


# --------------------------------------------------------------------------- shipped fixtures


def test_every_shipped_rig_is_listed() -> None:
    assert set(SHIPPED_RIGS) <= set(list_rigs(FIXTURES))


@pytest.mark.parametrize("name", list_rigs(FIXTURES))
def test_every_shipped_rig_loads(name: str, tmp_path: Path) -> None:
    rig = load_rig(name, FIXTURES, model_cache=tmp_path)
    assert rig.name == name
    assert rig.path == FIXTURES / "rigs" / f"{name}.toml"
    assert rig.modes and rig.prompt_classes
    reference = rig.mode(rig.reference_mode)
    assert not reference.is_speculative
    assert reference.method == "none"
    # Every placeholder was substituted.
    for text in (rig.model, *rig.argv_prefix, *rig.env.values()):
        assert "${" not in text, text
    for mode in rig.modes:
        for value in (mode.speculative_config or {}).values():
            assert "${" not in str(value)


def test_cpu_rig_has_no_spec_and_the_seed_ngram(tmp_path: Path) -> None:
    rig = load_rig("cpu-smollm2", FIXTURES, model_cache=tmp_path)
    assert rig.tier == "cpu"
    assert [m.name for m in rig.modes] == ["no_spec", "ngram"]
    assert rig.reference_mode == "no_spec"
    assert rig.mode("no_spec").speculative_config is None
    ngram = rig.mode("ngram")
    assert ngram.speculative_config == NGRAM
    assert ngram.is_speculative and ngram.method == "ngram"
    # ${model_cache} and ${python} were substituted with the given cache and this interpreter.
    assert rig.model == f"{tmp_path}/smollm2-135m"
    assert rig.argv_prefix[0] == sys.executable
    assert rig.served_model_name == "smollm2-135m"
    assert rig.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    # No `classes` key: every class of the prompt file is measured.
    assert {c.name for c in rig.prompt_classes} == SIX_CLASSES


def test_cpu_rig_mode_lookup_names_the_known_modes(tmp_path: Path) -> None:
    rig = load_rig("cpu-smollm2", FIXTURES, model_cache=tmp_path)
    with pytest.raises(ConfigError, match=r"no mode 'eagle3' \(it has: no_spec, ngram\)"):
        rig.mode("eagle3")


def test_h200_rig_resolves_draft_model_modes() -> None:
    rig = load_rig("h200-smollm2", FIXTURES)
    draft_l6 = rig.mode("draft_l6")
    draft_self = rig.mode("draft_self")
    assert draft_l6.speculative_config == {
        "method": "draft_model", "num_speculative_tokens": 3, "model": "/root/models/smollm2-135m-draft-l6"}
    assert draft_self.speculative_config == {
        "method": "draft_model", "num_speculative_tokens": 3, "model": "/root/models/smollm2-135m"}
    # The rig's own description wins over the library's.
    assert "first 6 of 30 layers" in draft_l6.description
    assert rig.mode("ngram").speculative_config == NGRAM
    assert rig.gpus_per_server == 1


def test_kimi_rig_runs_tensor_parallel_8_on_four_classes() -> None:
    rig = load_rig("kimi-k25-int4-8x-rtx6000", FIXTURES)
    argv = list(rig.argv_prefix)
    i = argv.index("--tensor-parallel-size")
    assert argv[i + 1] == "8"
    assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]  # ${python}: --specgate-ab-*-python replaces it
    assert rig.gpus_per_server == 8
    assert rig.served_model_name == "kimi-k2.5"
    assert [c.name for c in rig.prompt_classes] == ["coding", "math", "structured_json", "explanatory"]
    assert rig.env == {"NCCL_P2P_LEVEL": "PHB"}


def test_prompt_file_has_six_classes_of_at_least_five_prompts() -> None:
    classes = load_prompt_classes(FIXTURES / "prompts.toml")
    assert set(classes) >= SIX_CLASSES
    for name, prompt_class in classes.items():
        assert prompt_class.name == name
        assert len(prompt_class.prompts) >= 5, name
        ids = [p.id for p in prompt_class.prompts]
        assert len(set(ids)) == len(ids)
        assert all(p.text.strip() for p in prompt_class.prompts)


# --------------------------------------------------------------------------- broken copies


@pytest.fixture
def fx(tmp_path: Path) -> Path:
    """A private copy of fixtures/ to corrupt."""
    return copy_fixtures(tmp_path / "fixtures")


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text + "\n")


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} no longer contains {old!r}: update this test"
    path.write_text(text.replace(old, new))


def _load_fails(fx: Path, rig: str = "cpu-smollm2") -> ConfigError:
    """Load must fail with ConfigError and leave every file byte-for-byte as it was."""
    before = _snapshot(fx)
    with pytest.raises(ConfigError) as info:
        load_rig(rig, fx, model_cache=fx / "cache")
    assert _snapshot(fx) == before
    return info.value


def test_invalid_toml_names_the_file(fx: Path) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _append(rig_file, "[protocol\nmax_tokens = = 3")
    err = _load_fails(fx)
    assert err.path == str(rig_file)
    assert str(rig_file) in str(err)
    assert "not valid TOML" in str(err)


def test_invalid_toml_in_prompt_file_names_the_prompt_file(fx: Path) -> None:
    _append(fx / "prompts.toml", 'id = "unterminated')
    err = _load_fails(fx)
    assert err.path == str(fx / "prompts.toml")
    assert "not valid TOML" in str(err)


def test_a_prompt_file_that_is_not_utf8_names_the_file(fx: Path) -> None:
    prompts = fx / "prompts.toml"
    prompts.write_bytes(prompts.read_bytes().replace(b"a", b"\xe9", 1))  # Latin-1, as a Windows editor may save
    err = _load_fails(fx)
    assert err.path == str(prompts)
    assert "not UTF-8 text" in str(err)


def test_a_changed_prompt_file_is_read_again(fx: Path) -> None:
    prompts = fx / "prompts.toml"
    before = load_rig("cpu-smollm2", fx)
    prompts.write_text(prompts.read_text().replace('\ntext = """', '\ntext = """Changed. ', 1))
    after = load_rig("cpu-smollm2", fx)
    changed = [(a.text, b.text) for ca, cb in zip(before.prompt_classes, after.prompt_classes, strict=True)
               for a, b in zip(ca.prompts, cb.prompts, strict=True) if a.text != b.text]
    assert len(changed) == 1 and changed[0][1] == "Changed. " + changed[0][0]


@pytest.mark.parametrize(("text", "key"), [
    ("bogus_key = 1", "bogus_key"),
    ("[protocol.extra]\nx = 1", "protocol.extra"),
    ("[gates.classes.coding]\nthroughput_tolerence = 0.1", "gates.classes.coding.throughput_tolerence"),
])
def test_unknown_key_in_rig_names_file_and_key(fx: Path, text: str, key: str) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    if text.startswith("bogus"):  # a top-level key must come before the first table
        rig_file.write_text(text + "\n" + rig_file.read_text())
    else:
        _append(rig_file, text)
    err = _load_fails(fx)
    assert err.path == str(rig_file)
    assert err.key == key
    assert f"{rig_file}: {key}: " in str(err)
    assert "Extra inputs are not permitted" in str(err)


def test_wrong_type_names_the_key(fx: Path) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _replace(rig_file, "startup_timeout_s = 600", 'startup_timeout_s = "x"')
    err = _load_fails(fx)
    assert err.key == "startup_timeout_s"
    assert str(rig_file) in str(err)
    assert "number" in str(err)


@pytest.mark.parametrize(("line", "replacement", "key"), [
    ("throughput_tolerance = 0.04", "throughput_tolerance = 1.5", "gates.throughput_tolerance"),
    ("start_noise = 0.10", "start_noise = -0.1", "gates.start_noise"),
    ("ab_tolerance = 0.03", "ab_tolerance = 1.0", "gates.ab_tolerance"),
    ("ab_tolerance = 0.03", "ab_tolerance = 0.03\nhost_pace_tolerance = 0", "gates.host_pace_tolerance"),
    ("backfire_follow_up_repeats = 8", "backfire_follow_up_repeats = -1", "protocol.backfire_follow_up_repeats"),
])
def test_out_of_range_value_names_the_nested_key(fx: Path, line: str, replacement: str, key: str) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _replace(rig_file, line, replacement)
    err = _load_fails(fx)
    assert err.key == key
    assert str(rig_file) in str(err)


def test_unknown_mode_lists_the_library(fx: Path) -> None:
    _append(fx / "rigs" / "cpu-smollm2.toml", "[modes.warp_drive]")
    err = _load_fails(fx)
    assert err.key == "modes.warp_drive"
    assert "unknown mode 'warp_drive'" in str(err)
    assert "draft_model, eagle, eagle3, mtp, ngram, no_spec, suffix" in str(err)


def test_unknown_from_mode(fx: Path) -> None:
    _append(fx / "rigs" / "cpu-smollm2.toml", '[modes.fast]\nfrom = "nope"')
    err = _load_fails(fx)
    assert err.key == "modes.fast"
    assert "unknown mode 'nope'" in str(err)


def test_draft_model_without_model_names_the_speculative_config(fx: Path) -> None:
    _append(fx / "rigs" / "cpu-smollm2.toml",
            '[modes.my_draft]\nfrom = "draft_model"\nspeculative_config = { num_speculative_tokens = 2 }')
    err = _load_fails(fx)
    assert err.key == "modes.my_draft.speculative_config"
    assert str(fx / "rigs" / "cpu-smollm2.toml") in str(err)
    assert "needs model" in str(err)


@pytest.mark.parametrize("where", ["model", "extra_args", "env", "speculative_config"])
def test_unknown_placeholder_names_key_and_known_ones(fx: Path, where: str) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    text = rig_file.read_text()
    if where == "model":
        text = text.replace('model = "${model_cache}/smollm2-135m"', 'model = "${nope}/smollm2-135m"')
        key = "model"
    elif where == "extra_args":
        text = text.replace('"--enforce-eager",', '"--enforce-eager", "${nope}",')
        key = "extra_args"
    elif where == "env":
        text = text.replace('HF_HUB_OFFLINE = "1"', 'HF_HUB_OFFLINE = "${nope}"')
        key = "env.HF_HUB_OFFLINE"
    else:
        text = text.replace("[modes.ngram]", '[modes.ngram]\nspeculative_config = { note = "${nope}" }')
        key = "modes.ngram.speculative_config.note"
    rig_file.write_text(text)
    err = _load_fails(fx)
    assert err.key == key
    assert "${nope}" in str(err)
    assert "${model_cache}" in str(err) and "${python}" in str(err) and "${fixtures}" in str(err)


def test_unknown_prompt_class_in_classes(fx: Path) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    rig_file.write_text('classes = ["coding", "poetry"]\n' + rig_file.read_text())
    err = _load_fails(fx)
    assert err.key == "classes"
    assert "'poetry'" in str(err)
    assert "coding" in str(err) and "summarization" in str(err)


def test_unknown_prompt_class_in_gate_override(fx: Path) -> None:
    _append(fx / "rigs" / "cpu-smollm2.toml", "[gates.classes.poetry]\nmin_speedup = 0.9")
    err = _load_fails(fx)
    assert err.key == "gates.classes.poetry"


def test_declared_backfire_of_unknown_mode(fx: Path) -> None:
    _append(fx / "rigs" / "cpu-smollm2.toml", '[[declared_backfire]]\nmode = "eagle3"\nreason = "x"')
    err = _load_fails(fx)
    assert err.key == "declared_backfire[1].mode"  # [0] is the shipped ngram declaration


def test_duplicate_prompt_id_names_prompt_file_and_class(fx: Path) -> None:
    _append(fx / "prompts.toml",
            '[[classes.coding.prompts]]\nid = "bst-insert-delete"\ntext = "again"')
    err = _load_fails(fx)
    assert err.path == str(fx / "prompts.toml")
    assert err.key == "classes.coding.prompts"
    assert "duplicate prompt id 'bst-insert-delete'" in str(err)


def test_bad_prompt_id_names_the_prompt(fx: Path) -> None:
    _append(fx / "prompts.toml", '[[classes.math.prompts]]\nid = "Bad Id"\ntext = "x"')
    err = _load_fails(fx)
    assert err.key is not None and err.key.startswith("classes.math.prompts.") and err.key.endswith(".id")


@pytest.mark.parametrize(("reference", "message"), [
    ("ngram", "'ngram' must have no speculative_config"),  # a speculative mode cannot be the reference
    ("plain", "'plain' is not among the modes"),
])
def test_bad_reference_mode_is_refused(fx: Path, reference: str, message: str) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _replace(rig_file, 'reference_mode = "no_spec"', f'reference_mode = "{reference}"')
    err = _load_fails(fx)
    assert err.key == "reference_mode"
    assert message in str(err)


# ------------------------------------------------- the no-speculation mode's old name, "baseline"


@pytest.mark.parametrize(("old", "new", "key", "fix"), [
    # the rig still lists the library mode by its old name (and names it as the reference)
    ('reference_mode = "no_spec"', 'reference_mode = "baseline"', "modes.baseline",
     "rename [modes.baseline] to [modes.no_spec]"),
    # ... or only lists it by its old name, with the reference left at the default
    ('reference_mode = "no_spec"\n', "", "modes.baseline", "rename [modes.baseline] to [modes.no_spec]"),
])
def test_a_rig_naming_the_library_mode_baseline_is_told_its_new_name(fx: Path, old: str, new: str, key: str,
                                                                     fix: str) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _replace(rig_file, old, new)
    _replace(rig_file, "[modes.no_spec]", "[modes.baseline]")
    err = _load_fails(fx)
    assert (err.path, err.key) == (str(rig_file), key)
    assert "the library's no-speculation mode is now called 'no_spec' (it was 'baseline')" in str(err)
    assert fix in str(err)


def test_a_mode_derived_from_baseline_is_told_its_new_name(fx: Path) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _append(rig_file, '[modes.aa]\nfrom = "baseline"')
    err = _load_fails(fx)
    assert (err.path, err.key) == (str(rig_file), "modes.aa.from")
    assert "now called 'no_spec'" in str(err) and 'set from = "no_spec"' in str(err)


def test_an_old_reference_mode_is_told_its_new_name(fx: Path) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _replace(rig_file, 'reference_mode = "no_spec"', 'reference_mode = "baseline"')
    err = _load_fails(fx)
    assert (err.path, err.key) == (str(rig_file), "reference_mode")
    assert 'now called \'no_spec\' (it was \'baseline\'): set reference_mode = "no_spec"' in str(err)


def test_a_rig_without_the_default_reference_says_so(fx: Path) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _replace(rig_file, 'reference_mode = "no_spec"\n', "")
    _replace(rig_file, "[modes.no_spec]", '[modes.plain]\nfrom = "no_spec"')
    err = _load_fails(fx)
    assert err.key == "reference_mode" and "not set, and the default 'no_spec'" in str(err)


@pytest.mark.parametrize("entry", ['from = "no_spec"', 'from = "ngram"'])
def test_a_rig_may_still_define_its_own_mode_named_baseline(fx: Path, entry: str) -> None:
    """Only the library's mode was renamed: a rig's own, fully defined mode may be called baseline."""
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _append(rig_file, f"[modes.baseline]\n{entry}")
    rig = load_rig("cpu-smollm2", fx, model_cache=fx / "cache")
    assert [m.name for m in rig.modes] == ["no_spec", "ngram", "baseline"]
    assert rig.mode("baseline").is_speculative == (entry == 'from = "ngram"')
    if entry == 'from = "no_spec"':  # ... and be the reference
        _replace(rig_file, 'reference_mode = "no_spec"', 'reference_mode = "baseline"')
        assert load_rig("cpu-smollm2", fx, model_cache=fx / "cache").reference_mode == "baseline"


def test_a_library_that_still_has_baseline_keeps_it(fx: Path) -> None:
    """A user's own fixtures folder whose modes.toml was not updated: its rigs still load."""
    _replace(fx / "modes.toml", "[modes.no_spec]", "[modes.baseline]")
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    _replace(rig_file, 'reference_mode = "no_spec"', 'reference_mode = "baseline"')
    _replace(rig_file, "[modes.no_spec]", "[modes.baseline]")
    rig = load_rig("cpu-smollm2", fx, model_cache=fx / "cache")
    assert rig.reference_mode == "baseline" and not rig.mode("baseline").is_speculative


def test_missing_rig_lists_known_rigs(fx: Path) -> None:
    err = _load_fails(fx, rig="h100-nope")
    assert "no rig named 'h100-nope'" in str(err)
    for name in SHIPPED_RIGS:
        assert name in str(err)


def test_missing_mode_library_names_the_file(fx: Path) -> None:
    (fx / "modes.toml").unlink()
    err = _load_fails(fx)
    assert err.path == str(fx / "modes.toml")
    assert "file not found" in str(err)


def test_several_problems_are_counted(fx: Path) -> None:
    rig_file = fx / "rigs" / "cpu-smollm2.toml"
    rig_file.write_text("bogus_a = 1\nbogus_b = 2\n" + rig_file.read_text())
    err = _load_fails(fx)
    assert re.search(r"and 1 more problem", str(err))


# --------------------------------------------------------------------------- properties

ident = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(min_value=1, max_value=64), lookup=st.integers(min_value=1, max_value=16), name=ident)
def test_rig_overrides_merge_over_the_library(fx: Path, k: int, lookup: int, name: str) -> None:
    """A rig's override replaces only the keys it sets; `from` derives a new mode under any name."""
    rig_file = fx / "rigs" / "prop.toml"
    rig_file.write_text(
        'tier = "cpu"\nmodel = "/m/x"\n'
        "[modes.no_spec]\n"
        f"[modes.ngram]\nspeculative_config = {{ num_speculative_tokens = {k} }}\n"
        + (f'[modes.{name}_d]\nfrom = "ngram"\nspeculative_config = {{ prompt_lookup_max = {lookup} }}\n'))
    rig = load_rig("prop", fx)
    assert rig.mode("ngram").speculative_config == {**NGRAM, "num_speculative_tokens": k}
    assert rig.mode(f"{name}_d").speculative_config == {**NGRAM, "prompt_lookup_max": lookup}
    assert rig.served_model_name == "x"


def test_an_alternation_block_that_is_not_a_multiple_of_every_concurrency_level_is_refused(fx: Path) -> None:
    # the plan would divide the window by it before anything starts, and measure every level with it
    rig_file = fx / "rigs" / "h200-wide15b-alternate.toml"
    _replace(rig_file, "concurrency = [1]", "concurrency = [1, 3]\nalternation_block = 4")
    err = _load_fails(fx, "h200-wide15b-alternate")
    assert err.key == "protocol" and str(rig_file) in str(err)
    assert "alternation_block = 4 must be a multiple of every concurrency [1, 3]" in str(err)


def test_a_rig_whose_windows_can_never_reach_six_pairs_is_refused(fx: Path) -> None:
    # 3 prompts x 1 repeat = 3 pairs per window: every paired gate would stay undecided (specgate.decide.paired)
    _append(fx / "prompts.toml", "[classes.tiny]\ndescription = \"three prompts\"\n" + "".join(
        f'[[classes.tiny.prompts]]\nid = "p{i}"\ntext = "Write a long story number {i}."\n' for i in range(3)))
    rig_file = fx / "rigs" / "cpu-smollm2-quick.toml"
    _replace(rig_file, 'classes = ["extraction", "summarization"]', 'classes = ["extraction", "tiny"]')
    err = _load_fails(fx, "cpu-smollm2-quick")
    assert err.path == str(rig_file) and err.key == "protocol.repeats"
    assert "tiny (3 prompt(s) x 1 = 3 pairs)" in str(err) and "coding" not in str(err).split("window of")[1]
    assert "set repeats = 2 or more" in str(err) and str(fx / "prompts.toml") in str(err)
    _replace(rig_file, "repeats = 1\n", "repeats = 2\n")
    assert load_rig("cpu-smollm2-quick", fx, model_cache=fx / "cache").protocol.repeats == 2
