"""Model sources fail early in one line: a missing path (naming the SFT run that writes it), a directory that is not
a model, and a hub name that cannot be fetched offline; a real model directory still loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rlft.models import loading
from lit_rlft.models.loading import ModelSourceError, check_model_source, load_model, load_tokenizer_for
from lit_rlft.models.tiny import TinyConfig, save_tiny_policy
from tests.conftest import REPO, TINY_SMALL


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_missing_local_path_is_not_sent_to_the_hub(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(ModelSourceError) as err:
        load_model(str(missing))
    assert _one_line(err) == f"model path '{missing}' does not exist"


@pytest.mark.parametrize("name", ["./model", "~/no/such/model", "a/b/c", "not a hub id"])
def test_path_shapes_are_local(name):
    with pytest.raises(ModelSourceError, match=rf"^model path '{name}' does not exist"):
        check_model_source(name)


def test_org_name_whose_first_part_exists_is_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ModelSourceError, match=r"^model path 'checkpoints/final' does not exist$"):
        load_tokenizer_for("checkpoints/final")


def test_the_demo_config_before_its_warm_start_names_the_sft_command(monkeypatch):
    # configs/countdown_tiny.yaml loads runs/sft/model, which configs/sft_countdown_tiny.yaml writes.
    monkeypatch.chdir(REPO)
    if Path("runs/sft/model").exists():
        pytest.skip("the SFT warm start has been run in this checkout")
    with pytest.raises(ModelSourceError) as err:
        load_tokenizer_for("runs/sft/model")
    assert _one_line(err) == ("model path 'runs/sft/model' does not exist: it is written by the SFT warm start; "
                              "run `lit-rlft sft --config configs/sft_countdown_tiny.yaml` first")


def test_an_sft_looking_path_gets_the_generic_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError) as err:
        load_model("out/sft/model")
    assert _one_line(err) == ("model path 'out/sft/model' does not exist: it looks like the output of `lit-rlft sft` "
                              "(model.output_dir); run the SFT warm start first")


def test_a_directory_without_config_json_names_what_is_missing(tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelSourceError) as err:
        load_model(str(folder))
    assert _one_line(err) == (f"model directory '{folder}' has no config.json or adapter_config.json: not a Hugging "
                              "Face model directory (save_pretrained and `lit-rlft sft` write one; it holds "
                              "model.safetensors)")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSourceError, match=r"has no config.json or adapter_config.json: .*; it is empty\)$"):
        load_tokenizer_for(str(empty))


def test_a_file_is_not_a_model_directory(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ModelSourceError, match=r"^model path '.*model.gguf' is a file: give the directory that "
                                               r"holds config.json or adapter_config.json and the weights"):
        load_model(str(path))


HUB_ERROR = ("cannot load model 'org-that-is-not-cached/model-x' from the Hugging Face hub (offline, not found or "
             "gated): download it first (huggingface-cli download) or pass a local directory")


def test_offline_hub_name_fails_at_once_naming_the_model(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "_hub_reachable", lambda: pytest.fail("no network probe when offline"))
    with pytest.raises(ModelSourceError) as err:
        load_tokenizer_for("org-that-is-not-cached/model-x")
    assert _one_line(err) == HUB_ERROR
    assert isinstance(err.value, FileNotFoundError)  # callers catching OSError keep working


def test_unreachable_hub_fails_without_retrying(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(loading, "_hub_offline", lambda: False)
    monkeypatch.setattr(loading, "_hub_reachable", lambda: False)
    with pytest.raises(ModelSourceError) as err:
        load_model("org-that-is-not-cached/model-x")
    assert _one_line(err) == HUB_ERROR


def test_transformers_hub_failure_becomes_the_one_line(monkeypatch):
    """Reachable but not loadable (a 404, a gated repo): transformers' multi-line OSError, as one line."""
    import transformers

    monkeypatch.setattr(loading, "_hub_cached", lambda name: False)
    monkeypatch.setattr(loading, "_hub_offline", lambda: False)
    monkeypatch.setattr(loading, "_hub_reachable", lambda: True)

    def fail(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files...\nCheck your connection")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(ModelSourceError) as err:
        load_model("org-that-is-not-cached/model-x")
    assert _one_line(err) == HUB_ERROR
    assert "couldn't connect" in str(err.value.__cause__)  # the cause is kept


def test_a_saved_model_directory_still_loads(tmp_path):
    folder = save_tiny_policy(tmp_path / "tiny", TinyConfig(**TINY_SMALL))
    model = load_model(str(folder))
    tok = load_tokenizer_for(str(folder))
    assert model.config.hidden_size == TINY_SMALL["hidden_size"] and tok.padding_side == "left"
    check_model_source(folder)  # a pathlib.Path is accepted too


def test_a_model_directory_without_weights_is_one_line(tmp_path):
    folder = save_tiny_policy(tmp_path / "tiny", TinyConfig(**TINY_SMALL))
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ModelSourceError) as err:
        load_model(str(folder))
    assert _one_line(err).startswith(f"model directory '{folder}' cannot be loaded: Error no file named "
                                     "model.safetensors")
