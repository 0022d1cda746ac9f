"""The supervised warm start learns the prompts GRPO shows: the same rendering (template, chat template, system
prompt), the loss on the target and EOS only."""

from __future__ import annotations

import lightning as L
import torch

from lit_rlft.data import GSM8KTask
from lit_rlft.lightning.sft import SFTDataModule, SFTModule
from lit_rlft.models.tiny import TinyConfig
from tests.conftest import TINY_SMALL

#: A chat template of the ChatML kind (SmolLM2's, Qwen's), small enough for the character tokenizer.
CHATML = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}#{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_sft_renders_prompts_with_the_chat_template_and_trains_on_the_reply_only(tmp_path):
    rows = tmp_path / "g.jsonl"
    rows.write_text('{"question": "2+3?", "answer": "2+3 = <<2+3=5>>5\\n#### 5"}\n'
                    '{"question": "4*2?", "answer": "4*2 = <<4*2=8>>8\\n#### 8"}\n')
    data = SFTDataModule(GSM8KTask(str(rows)), prompt_field="question", target_field="solution", batch_size=2,
                         chat_template=True, system_prompt="be brief")
    module = SFTModule(model="tiny", tiny=TinyConfig(**TINY_SMALL), output_dir=str(tmp_path / "out"))
    module.tokenizer.chat_template = CHATML
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    module.trainer = trainer
    trainer.datamodule = data
    data.setup("fit")
    prompts, targets = data.dataset[0]
    assert (prompts, targets) == ("2+3?", "2+3 = 5\n#### 5")  # the calculator annotations stripped
    rendered = data.rendered([prompts], module.tokenizer)[0]
    assert rendered == "<system>be brief#<user>2+3?#<assistant>"
    ids, attn, labels = module._encode([prompts], [targets])
    n_prompt = len(module.tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert (labels[0, :n_prompt] == -100).all()  # no loss on the rendered prompt
    target_ids = module.tokenizer(targets, add_special_tokens=False)["input_ids"] + [module.tokenizer.eos_token_id]
    assert labels[0, n_prompt:n_prompt + len(target_ids)].tolist() == target_ids
    assert torch.equal(ids[0, :n_prompt], torch.tensor(module.tokenizer(rendered, add_special_tokens=False)["input_ids"]))
