"""The weightless Llama-8B-shaped model folder for the GPU-bound lab rig (specgate.serve.model_prep):
its config and files from a stand-in SmolLM2 folder, and the CLI that writes it."""

import json

import pytest

from specgate.errors import SpecgateError
from specgate_lab.cli import main
from specgate_lab.model_shapes import LLAMA8B_SHAPE, write_dummy_llama

pytestmark = pytest.mark.fast

SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "head_dim": 64,
    "vocab_size": 49152, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16",
    "max_position_embeddings": 8192, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
}


@pytest.fixture
def smollm2(tmp_path):
    source = tmp_path / "smollm2-135m"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        (source / name).write_text(f"{name} of smollm2\n")
    (source / "model.safetensors").write_bytes(b"weights")
    return source


def test_dummy_llama_has_the_8b_shape_and_smollm2s_vocabulary_and_tokenizer(smollm2, tmp_path):
    out = write_dummy_llama(smollm2, tmp_path / "llama8b-dummy")
    config = json.loads((out / "config.json").read_text())
    assert {k: config[k] for k in LLAMA8B_SHAPE} == {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "head_dim": 128}
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    # The draft (SmolLM2) and the target must share the vocabulary; an 8B model unties its head.
    assert (config["vocab_size"], config["eos_token_id"], config["tie_word_embeddings"]) == (49152, 2, False)
    assert config["dtype"] == "bfloat16" and config["max_position_embeddings"] >= 4096
    assert sorted(p.name for p in out.iterdir()) == ["chat_template.jinja", "config.json", "generation_config.json",
                                                     "tokenizer.json", "tokenizer_config.json"]
    assert (out / "tokenizer.json").read_text() == "tokenizer.json of smollm2\n"


def test_dummy_llama_refuses_a_source_that_is_not_a_llama_folder(tmp_path, smollm2):
    with pytest.raises(SpecgateError, match=r"config\.json: cannot read"):
        write_dummy_llama(tmp_path / "missing", tmp_path / "out")
    (smollm2 / "config.json").write_text(json.dumps({**SMOLLM2_CONFIG, "model_type": "qwen2"}))
    with pytest.raises(SpecgateError, match="model_type 'qwen2', expected 'llama'"):
        write_dummy_llama(smollm2, tmp_path / "out")
    (smollm2 / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    (smollm2 / "tokenizer.json").unlink()
    with pytest.raises(SpecgateError, match="no tokenizer files"):
        write_dummy_llama(smollm2, tmp_path / "out")


def test_prepare_model_cli_writes_the_dummy_folder(smollm2, tmp_path, capsys):
    out = tmp_path / "llama8b-dummy"
    assert main(["prepare-shape", "--dummy-llama8b", str(out), "--source", str(smollm2)]) == 0
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 32
    assert str(out) in capsys.readouterr().out
    assert main(["prepare-shape", "--dummy-llama8b", str(out), "--source", str(tmp_path / "nowhere")]) == 1
    assert "cannot read the source model's config" in capsys.readouterr().err


def test_prepare_model_writes_the_target_and_its_4_layer_draft_of_one_vocabulary(smollm2, tmp_path, capsys):
    from specgate_lab.cli import main

    target, draft = tmp_path / "llama8b-dummy", tmp_path / "llama8b-dummy-draft4l"
    assert main(["prepare-shape", "--dummy-llama8b", str(target), "--dummy-llama8b-draft", str(draft),
                 "--source", str(smollm2)]) == 0
    target_config = json.loads((target / "config.json").read_text())
    draft_config = json.loads((draft / "config.json").read_text())
    assert (target_config["num_hidden_layers"], draft_config["num_hidden_layers"]) == (32, 4)
    # Everything but the depth is the target's: vLLM's draft_model method needs the same vocabulary.
    assert {k: v for k, v in draft_config.items() if k not in ("num_hidden_layers", "_specgate")} == {
        k: v for k, v in target_config.items() if k not in ("num_hidden_layers", "_specgate")}
    assert not list(draft.glob("*.safetensors"))
    assert "(4 layers) written" in capsys.readouterr().out


def test_prepare_model_writes_a_deeper_draft_and_refuses_an_impossible_depth(smollm2, tmp_path, capsys):
    from specgate_lab.cli import main

    draft = tmp_path / "llama8b-dummy-draft16l"
    assert main(["prepare-shape", "--dummy-llama8b-draft", str(draft), "--draft-layers", "16",
                 "--source", str(smollm2)]) == 0
    config = json.loads((draft / "config.json").read_text())
    assert config["num_hidden_layers"] == 16 and config["hidden_size"] == LLAMA8B_SHAPE["hidden_size"]
    assert "(16 layers) written" in capsys.readouterr().out
    assert main(["prepare-shape", "--dummy-llama8b-draft", str(tmp_path / "x"), "--draft-layers", "33",
                 "--source", str(smollm2)]) == 1
    assert "--draft-layers 33" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_prepare_model_writes_an_8b_shaped_eagle3_head_without_weights(smollm2, tmp_path, capsys):
    from specgate_lab.cli import main

    target, head = tmp_path / "llama8b-dummy", tmp_path / "llama8b-dummy-eagle3"
    assert main(["prepare-shape", "--dummy-llama8b", str(target), "--dummy-llama8b-eagle3", str(head),
                 "--source", str(smollm2)]) == 0
    config = json.loads((head / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert (config["hidden_size"], config["target_hidden_size"]) == (4096, 4096)
    assert (config["vocab_size"], config["draft_vocab_size"]) == (49152, 32000)
    # vLLM's default auxiliary layers for a 32-layer Llama: after layers 2, 16 and 29
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    assert not list(head.glob("*.safetensors"))
    assert "dummy EAGLE-3 head" in capsys.readouterr().out
    # a head needs its target
    assert main(["prepare-shape", "--dummy-llama8b-eagle3", str(tmp_path / "h2"), "--source", str(smollm2)]) == 1
    assert "--dummy-llama8b-eagle3 needs --dummy-llama8b" in capsys.readouterr().err
    assert not (tmp_path / "h2").exists()


def test_prepare_model_writes_the_wide_shape_and_its_1_layer_draft(smollm2, tmp_path, capsys):
    target, draft = tmp_path / "wide15b-dummy", tmp_path / "wide15b-dummy-draft1l"
    assert main(["prepare-shape", "--shape", "wide15b", "--dummy-llama8b", str(target), "--dummy-llama8b-draft",
                 str(draft), "--draft-layers", "1", "--source", str(smollm2)]) == 0
    target_config = json.loads((target / "config.json").read_text())
    draft_config = json.loads((draft / "config.json").read_text())
    assert {k: target_config[k] for k in LLAMA8B_SHAPE} == {
        "hidden_size": 6144, "num_hidden_layers": 32, "num_attention_heads": 48, "num_key_value_heads": 8,
        "intermediate_size": 20480, "head_dim": 128}
    # a valid Llama attention: heads x head_dim is the width, the KV heads divide the heads
    assert target_config["num_attention_heads"] * target_config["head_dim"] == target_config["hidden_size"]
    assert target_config["num_attention_heads"] % target_config["num_key_value_heads"] == 0
    # the draft is the target cut to one layer, nothing else changed
    assert draft_config["num_hidden_layers"] == 1
    assert {k: v for k, v in draft_config.items() if k not in ("num_hidden_layers", "_specgate")} == {
        k: v for k, v in target_config.items() if k not in ("num_hidden_layers", "_specgate")}
    assert "shape wide15b with 32 layers" in target_config["_specgate"]
    out = capsys.readouterr().out
    assert "dummy wide15b-shaped model (1 layers) written" in out and "(32 layers) written" in out


def test_the_wide_shape_is_15_5_b_parameters_about_twice_the_8b():
    # The rig's notes and the lab visit's memory figures rest on these counts (SmolLM2's vocabulary,
    # untied head): 28.9 GiB of bf16 weights, 30.87 GiB with its 1-layer draft ("Model loading took
    # 30.87 GiB" in lab visit 17's draft server).
    from specgate_lab.model_shapes import SHAPES

    def params(shape: dict, vocab: int = 49152) -> int:
        h, kv = shape["hidden_size"], shape["num_key_value_heads"] * shape["head_dim"]
        layer = 2 * h * h + 2 * h * kv + 3 * h * shape["intermediate_size"] + 2 * h
        return 2 * vocab * h + shape["num_hidden_layers"] * layer + h

    wide, llama8b = SHAPES["wide15b"], SHAPES["llama8b"]
    assert round(params(wide) / 1e9, 1) == 15.5 and round(params(llama8b) / 1e9, 2) == 7.38
    assert round(params(wide) * 2 / 2**30, 1) == 28.9
    assert round((params(wide) + params({**wide, "num_hidden_layers": 1})) * 2 / 2**30, 2) == 30.87


def test_prepare_model_refuses_a_depth_or_a_shape_flag_it_cannot_use(smollm2, tmp_path, capsys):
    target = tmp_path / "wide15b-dummy"
    assert main(["prepare-shape", "--shape", "wide15b", "--dummy-llama8b", str(target), "--dummy-llama8b-draft",
                 str(tmp_path / "x"), "--draft-layers", "40", "--source", str(smollm2)]) == 1
    assert "a draft of the wide15b shape has 1 to 32 layers" in capsys.readouterr().err
    assert not target.exists() and not (tmp_path / "x").exists()  # nothing written
    assert main(["prepare-shape", "--shape", "wide15b"]) == 1
    assert "--shape wide15b needs --dummy-llama8b or --dummy-llama8b-draft" in capsys.readouterr().err
