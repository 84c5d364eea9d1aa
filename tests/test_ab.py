"""A/B sides (upgrade and config gating): what a side changes in the server's command and
environment, and how the --specgate-ab-* options are read."""

import argparse
import json
import sys
from pathlib import Path

import pytest

from specgate.config.rig import Side, load_rig
from specgate.plugin.options import parse_env_assignment, parse_spec_assignment
from specgate.serve.server import spec_for_mode

pytestmark = pytest.mark.fast

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(scope="module")
def rig():
    return load_rig("cpu-smollm2", FIXTURES)


def _spec_config(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_a_candidate_side_changes_python_args_env_and_speculative_keys(rig, tmp_path):
    side = Side(python="/venvs/next/bin/python", extra_args=("--max-num-seqs", "8"),
                env={"SPECGATE_SLOWDOWN": "0.1"}, speculative={"num_speculative_tokens": 3})
    spec = spec_for_mode(rig, rig.mode("ngram"), log_dir=tmp_path, side=side, side_name="candidate")
    assert spec.argv[0] == "/venvs/next/bin/python"
    # after the rig's own --max-num-seqs 16: vLLM's parser keeps the last one
    values = [spec.argv[i + 1] for i, a in enumerate(spec.argv) if a == "--max-num-seqs"]
    assert values == ["16", "8"]
    assert spec.env["SPECGATE_SLOWDOWN"] == "0.1"
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the rig's own environment stays
    assert _spec_config(spec.argv) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert (spec.label, spec.log_path.name) == ("ngram@candidate", "server-ngram-candidate.log")


def test_speculative_keys_leave_the_mode_without_speculation_alone(rig, tmp_path):
    side = Side(speculative={"num_speculative_tokens": 3})
    spec = spec_for_mode(rig, rig.mode("no_spec"), log_dir=tmp_path, side=side, side_name="candidate")
    assert "--speculative-config" not in spec.argv


def test_the_reference_side_runs_the_rig_as_it_is(rig, tmp_path):
    plain = spec_for_mode(rig, rig.mode("ngram"), log_dir=tmp_path)
    ref = spec_for_mode(rig, rig.mode("ngram"), log_dir=tmp_path, side=Side(), side_name="reference")
    assert ref.argv == plain.argv and ref.argv[0] == sys.executable
    assert _spec_config(ref.argv) == rig.mode("ngram").speculative_config


def test_a_side_describes_every_change():
    side = Side(env={"SPECGATE_SLOWDOWN": "0.1"}, speculative={"synthetic_acceptance_length": 2.85})
    assert side.describe() == "env SPECGATE_SLOWDOWN=0.1; speculative synthetic_acceptance_length=2.85"
    assert Side().describe() == "the rig as it is"


@pytest.mark.parametrize(("text", "parsed"), [
    ("num_speculative_tokens=5", ("num_speculative_tokens", 5)),
    ("synthetic_acceptance_length=2.85", ("synthetic_acceptance_length", 2.85)),
    ("synthetic_acceptance_rates=[1, 0.5]", ("synthetic_acceptance_rates", [1, 0.5])),
    ("model=/heads/eagle3-v2", ("model", "/heads/eagle3-v2")),
])
def test_spec_assignments_read_json_values_else_strings(text, parsed):
    assert parse_spec_assignment(text) == parsed


@pytest.mark.parametrize("parse", [parse_spec_assignment, parse_env_assignment])
@pytest.mark.parametrize("text", ["no-equals", "=5", "bad key=1"])
def test_malformed_assignments_are_refused_with_an_example(parse, text):
    with pytest.raises(argparse.ArgumentTypeError, match=rf"{text!r} is not .*=VALUE, e\.g\. "):
        parse(text)

