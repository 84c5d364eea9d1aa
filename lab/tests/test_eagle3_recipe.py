"""The EAGLE-3 recipe's pure-Python parts: training prompts from the templates file, and the head's
shape and vLLM config derived from the target's config (no torch needed)."""

import json

import pytest

from specgate.errors import SpecgateError
from specgate_lab.eagle3 import HeadShape
from specgate_lab.eagle3_train import CORPUS_TEMPLATES, expand_prompts

pytestmark = pytest.mark.fast

SMOLLM2 = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "hidden_size": 576, "intermediate_size": 1536, "vocab_size": 49152,
           "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 100000.0}, "max_position_embeddings": 8192,
           "bos_token_id": 1, "eos_token_id": 2}


def test_shipped_templates_give_distinct_seeded_prompts_in_every_genre():
    prompts = expand_prompts(CORPUS_TEMPLATES, 300, seed=0)
    assert len(prompts) == 300
    assert len({p["text"] for p in prompts}) == 300
    assert {p["genre"] for p in prompts} >= {"coding", "math", "structured_json", "explanatory",
                                             "extraction", "summarization"}
    assert expand_prompts(CORPUS_TEMPLATES, 300, seed=0) == prompts
    assert expand_prompts(CORPUS_TEMPLATES, 300, seed=1) != prompts


def test_training_prompts_are_not_the_measured_prompts():
    import tomllib

    measured = tomllib.loads((CORPUS_TEMPLATES.parent.parent / "prompts.toml").read_text())
    texts = {p["text"].strip() for c in measured["classes"].values() for p in c["prompts"]}
    assert not texts & {p["text"] for p in expand_prompts(CORPUS_TEMPLATES, 600)}


def test_a_template_slot_missing_from_slots_names_the_file_template_and_slot(tmp_path):
    f = tmp_path / "corpus.toml"
    f.write_text('[[templates]]\ngenre = "math"\ntext = "add {a} and {b}"\n[slots]\na = ["1"]\n')
    with pytest.raises(SpecgateError, match=r"corpus\.toml: templates\[0\] \(math\) uses \{b\}, which \[slots\] "
                                            r"does not define"):
        expand_prompts(f, 3)


def test_small_template_space_stops_at_the_distinct_prompts_it_has(tmp_path):
    f = tmp_path / "corpus.toml"
    f.write_text('[[templates]]\ntext = "say {w}"\n[slots]\nw = ["a", "b"]\n')
    assert sorted(p["text"] for p in expand_prompts(f, 10)) == ["say a", "say b"]


def test_head_shape_follows_the_target_and_vllms_default_aux_layers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    shape = HeadShape.from_target(tmp_path, 4096)
    assert (shape.hidden, shape.heads, shape.kv_heads, shape.head_dim) == (576, 9, 3, 64)
    assert shape.aux_layers == (2, 15, 27)
    cfg = shape.hf_config(bos=1, eos=2)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (cfg["num_hidden_layers"], cfg["draft_vocab_size"], cfg["vocab_size"]) == (1, 4096, 49152)
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert cfg["rope_theta"] == 100000.0


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "qwen3"}, r"model_type 'qwen3'; the EAGLE-3 recipe handles Llama-shaped targets only"),
    ({}, r"draft vocabulary 60000 must be within 1\.\.49152"),
])
def test_head_shape_refuses_what_it_cannot_build(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2, **change}))
    with pytest.raises(SpecgateError, match=message):
        HeadShape.from_target(tmp_path, 60000 if not change else 4096)


def test_a_missing_target_config_names_the_file(tmp_path):
    with pytest.raises(SpecgateError, match=r"config\.json: cannot read the target's config"):
        HeadShape.from_target(tmp_path, 4096)


def test_a_resumed_run_records_the_corpus_it_reused_not_the_arguments(tmp_path, monkeypatch, capsys):
    from specgate_lab import eagle3_train

    target, work = tmp_path / "smollm2", tmp_path / "work"
    target.mkdir()
    work.mkdir()
    (target / "config.json").write_text(json.dumps(SMOLLM2))
    (work / "corpus.jsonl").write_text("{}\n")
    (work / "corpus-made-with.json").write_text(json.dumps({"prompts": 2700, "max_tokens": 96, "seed": 0}))
    monkeypatch.setattr(eagle3_train, "features", lambda *a, **k: (work / "features.pt").write_text(""))
    monkeypatch.setattr(eagle3_train, "train", lambda *a, meta, **k: meta)
    monkeypatch.setattr(eagle3_train.subprocess, "run", lambda *a, **k: pytest.fail("regenerated the corpus"))

    meta = eagle3_train.run_recipe(target, tmp_path / "head", work, prompts=600, max_tokens=64, draft_vocab=4096,
                                   minutes=1, device="cpu", dtype="float32", seed=3, lr=1e-3, batch_tokens=512)
    assert (meta["corpus_prompts"], meta["max_tokens"], meta["corpus_seed"], meta["seed"]) == (2700, 96, 0, 3)
    out = capsys.readouterr().out
    assert "reusing" in out and "'prompts': 2700" in out and "delete the work folder" in out
