"""Checkpoint files: atomic writes (a failed save leaves no partial file), and one-line errors naming the path for
missing, truncated, unfinished or foreign checkpoints, without torch's advice to load with weights_only=False."""

from __future__ import annotations

import zipfile
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit_rlft.lightning import checkpointing
from lit_rlft.lightning.checkpointing import (
    AtomicCheckpointIO,
    CheckpointError,
    atomic_save,
    check_checkpoint,
    use_atomic_checkpoint_io,
)
from tests.conftest import countdown_dm, tiny_config, tiny_trainer

STATE = {"state_dict": {"w": torch.arange(1000, dtype=torch.float32)}, "global_step": 3}


def _saved(tmp_path: Path, name: str = "good.ckpt") -> Path:
    path = tmp_path / name
    AtomicCheckpointIO().save_checkpoint(STATE, path)
    return path


def _truncated(tmp_path: Path) -> Path:
    data = _saved(tmp_path, "full.ckpt").read_bytes()
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(data[: len(data) // 2])
    return path


def test_a_normal_save_loads_back_and_leaves_no_temporary_file(tmp_path):
    path = _saved(tmp_path / "nested")  # the folder is created
    loaded = AtomicCheckpointIO().load_checkpoint(path)
    assert torch.equal(loaded["state_dict"]["w"], STATE["state_dict"]["w"]) and loaded["global_step"] == 3
    assert sorted(p.name for p in path.parent.iterdir()) == ["good.ckpt"]


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    before = path.read_bytes()
    real_save = torch.save

    def save_then_die(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")  # some bytes reach the file, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing.torch, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, path)
    monkeypatch.setattr(checkpointing.torch, "save", real_save)
    assert path.read_bytes() == before  # the old checkpoint is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.ckpt"]  # no .tmp-<pid> left
    with pytest.raises(OSError):
        atomic_save({"x": 1}, tmp_path / "good.ckpt" / "inside")  # a file as folder: fails, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.ckpt"]


def test_truncated_checkpoint_is_one_line_naming_the_file(tmp_path):
    path = _truncated(tmp_path)
    size = path.stat().st_size
    expected = (f"checkpoint '{path}' is not a lit_rlft / Lightning checkpoint, or is truncated (no zip "
                f"end-of-archive record in its {size} bytes)")
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(path)
    assert str(err.value) == expected
    with pytest.raises(CheckpointError) as err:
        AtomicCheckpointIO().load_checkpoint(path)
    assert str(err.value) == expected


@pytest.mark.parametrize(("content", "reason"), [
    (b"", "the file is empty"),
    (b"hello, not a checkpoint", "no zip end-of-archive record in its 23 bytes"),
])
def test_empty_and_foreign_files(tmp_path, content, reason):
    path = tmp_path / "x.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(str(path))
    assert str(err.value) == f"checkpoint '{path}' is not a lit_rlft / Lightning checkpoint, or is truncated ({reason})"


def test_a_zip_that_is_not_a_torch_file(tmp_path):
    path = tmp_path / "archive.ckpt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hi")
    with pytest.raises(CheckpointError, match=r"truncated \(a zip archive without torch's data.pkl\)$"):
        check_checkpoint(path)


def test_missing_path_and_unfinished_distributed_checkpoint(tmp_path):
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(tmp_path / "nope.ckpt")
    assert str(err.value) == f"checkpoint '{tmp_path / 'nope.ckpt'}' does not exist"
    folder = tmp_path / "step=10.ckpt"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"shard")
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(folder)
    assert str(err.value) == (f"checkpoint directory '{folder}' has no .metadata file: not a Lightning distributed "
                              "(FSDP2 / DCP) checkpoint, or its save did not finish")
    (folder / ".metadata").write_bytes(b"written by torch.distributed.checkpoint after every shard")
    with pytest.raises(CheckpointError, match=r"has no meta.pt file: not a Lightning distributed"):
        check_checkpoint(folder)  # Lightning's rank 0 writes meta.pt last
    (folder / "meta.pt").write_bytes(_saved(tmp_path).read_bytes()[:100])
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(folder)
    assert str(err.value) == (f"checkpoint '{folder}/meta.pt' is not a lit_rlft / Lightning checkpoint, or is "
                              "truncated (no zip end-of-archive record in its 100 bytes)")
    (folder / "meta.pt").write_bytes(_saved(tmp_path).read_bytes())
    check_checkpoint(folder)  # a finished one passes


class _Custom:
    pass


def test_corrupt_inside_and_custom_objects_never_advise_weights_only_false(tmp_path):
    custom = tmp_path / "custom.ckpt"
    torch.save({"obj": _Custom()}, custom)
    with pytest.raises(CheckpointError) as err:
        AtomicCheckpointIO().load_checkpoint(custom, weights_only=True)
    assert str(err.value) == (f"checkpoint '{custom}' holds a tests.lightning.test_checkpointing._Custom object, which a "
                              "weights-only load refuses: it was not written by lit_rlft (a callback or module that "
                              "stores custom objects in its state?)")
    corrupt = tmp_path / "corrupt.ckpt"
    data = bytearray(_saved(tmp_path).read_bytes())
    start = data.index(b"data.pkl") + 40  # inside the pickle: the archive's directory stays intact
    data[start : start + 20] = b"\xff" * 20
    corrupt.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        AtomicCheckpointIO().load_checkpoint(corrupt)
    text = str(err.value)
    assert text.startswith(f"checkpoint '{corrupt}' is not a lit_rlft / Lightning checkpoint, or is truncated (")
    assert "\n" not in text and "weights_only" not in text


def test_install_on_trainer_and_fabric_strategies_keeps_custom_io(tmp_path):
    trainer = tiny_trainer(tmp_path)
    assert type(trainer.strategy.checkpoint_io) is TorchCheckpointIO
    use_atomic_checkpoint_io(trainer.strategy)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)

    class MyIO(TorchCheckpointIO):
        pass

    custom = tiny_trainer(tmp_path, plugins=[MyIO()])
    use_atomic_checkpoint_io(custom.strategy)
    assert type(custom.strategy.checkpoint_io) is MyIO
    ddp = tiny_trainer(tmp_path, strategy="ddp", devices=2)
    use_atomic_checkpoint_io(ddp.strategy)
    assert isinstance(ddp.strategy.checkpoint_io, AtomicCheckpointIO)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    use_atomic_checkpoint_io(fabric.strategy)
    assert isinstance(fabric.strategy.checkpoint_io, AtomicCheckpointIO)
    from lightning.fabric.strategies import ModelParallelStrategy

    use_atomic_checkpoint_io(ModelParallelStrategy(lambda model, mesh: model))  # writes DCP folders itself: left alone, no error


def test_fabric_loop_writes_atomically_and_refuses_a_truncated_checkpoint(tmp_path):
    from lit_rlft.lightning.fabric import FabricLoop

    fabric = L.Fabric(accelerator="cpu", devices=1)
    fabric.launch()
    loop = FabricLoop(fabric, max_steps=1, checkpoint_dir=str(tmp_path), checkpoint_every_n_steps=1)
    assert isinstance(fabric.strategy.checkpoint_io, AtomicCheckpointIO)
    loop.fit(tiny_config(), countdown_dm(size=8, batch_size=4))
    saved = tmp_path / "step=1.ckpt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=1.ckpt"]
    saved.write_bytes(saved.read_bytes()[:1000])
    fresh = FabricLoop(L.Fabric(accelerator="cpu", devices=1), max_steps=2)
    with pytest.raises(CheckpointError, match=rf"^checkpoint '{saved}' is not a lit_rlft / Lightning checkpoint, or "
                                              r"is truncated \(no zip end-of-archive record in its 1000 bytes\)$"):
        fresh.fit(tiny_config(), countdown_dm(size=8, batch_size=4), ckpt_path=str(saved))
