"""What the command line says about a bad input: one message, keys by their full path, the nearest valid key or
option, settings that would do nothing refused; bugs keep their traceback (snntrain.errors, snntrain.cli)."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException

from snntrain.checkpoint import CheckpointError, read_checkpoint
from snntrain.cli import build_trainer, refuse_idle_run, run
from snntrain.data.common import BadDataError, open_image
from snntrain.errors import MAX_LINES, UnavailableError, describe, is_user_error, qualify


def composition_error(compose_run, *overrides: str) -> Exception:
    with pytest.raises((ConfigCompositionException, MissingConfigException)) as err:
        compose_run(None, *overrides)
    assert is_user_error(err.value)
    return err.value


@pytest.mark.parametrize("override, expected", [
    ("model.dept=18", "model.dept=18: model has no key 'dept'; did you mean model.depth=18?"),
    ("modle.depth=18", "modle.depth=18: the config has no top-level key 'modle'; did you mean model.depth=18?"),
    ("model.neuron.tua=3", "did you mean model.neuron.tau=3?"),
    ("data.bach_size=8", "did you mean data.batch_size=8?"),
])
def test_an_unknown_key_gets_the_nearest_valid_one(compose_run, override, expected):
    message = describe(composition_error(compose_run, override))
    assert expected in message and "+" not in message and "\n" not in message


def test_an_unknown_key_with_nothing_near_lists_the_keys(compose_run):
    message = describe(composition_error(compose_run, "model.qqqqqq=1"))
    assert message.startswith("model.qqqqqq=1: model has no key 'qqqqqq'")
    assert "depth, width" in message and "+model.qqqqqq=1" in message and len(message.splitlines()) <= MAX_LINES


def test_a_typo_in_a_group_option_names_the_options(compose_run):
    message = describe(composition_error(compose_run, "backend=trition"))
    assert message == ("Could not find 'backend/trition'; available options in 'backend': auto, torch, triton "
                       "(did you mean backend=triton?)")


def test_an_override_that_does_not_parse_is_named(compose_run):
    from hydra.errors import OverrideParseException

    with pytest.raises(OverrideParseException) as err:
        compose_run(None, "T=[1")
    message = describe(err.value)
    assert message.startswith("T=[1: ") and "\n" not in message and is_user_error(err.value)


@pytest.mark.parametrize("override, expected", [
    ("data.batch_size=-1", "data.batch_size=-1 must be a positive integer"),
    ("model.neuron.tau=0.5", "model.neuron.tau=0.5 must be > 1"),
    ("data.image_size=0", "data.image_size=0 must be a positive integer"),
])
def test_bad_values_are_named_by_their_full_key(compose_run, tmp_path, override, expected):
    cfg = compose_run(tmp_path, "debug=tiny", override)
    with pytest.raises(ValueError) as err:
        run(cfg)
    assert is_user_error(err.value)
    assert describe(err.value, cfg).startswith(expected)


def test_qualify_leaves_ambiguous_and_full_keys_alone():
    cfg = {"data": {"batch_size": 4}, "predict": {"batch_size": 4}, "model": {"depth": 18}}
    assert qualify("batch_size=4 is odd", cfg) == "batch_size=4 is odd"  # two keys fit
    assert qualify("depth=18 is odd", cfg) == "model.depth=18 is odd"
    assert qualify("depth=34 is odd", cfg) == "depth=34 is odd"  # not the config's value
    assert qualify("model.depth=18 is odd", cfg) == "model.depth=18 is odd"


def test_bad_files_and_checkpoints_are_user_errors(tmp_path):
    (tmp_path / "bad.ckpt").write_text("not a checkpoint")
    for call, kind in ((lambda: read_checkpoint(tmp_path / "bad.ckpt"), CheckpointError),
                       (lambda: read_checkpoint(tmp_path / "missing.ckpt"), CheckpointError),
                       (lambda: open_image(tmp_path / "bad.ckpt"), BadDataError),
                       (lambda: open_image(tmp_path / "missing.png"), FileNotFoundError)):
        with pytest.raises(kind) as err:
            call()
        assert is_user_error(err.value), err.value
        assert len(describe(err.value).splitlines()) <= MAX_LINES


def test_data_errors_raised_in_a_loader_process_are_user_errors(tmp_path):
    """An error in a DataLoader worker reaches the training process as PyTorch raises it again there (its message
    holds the worker's traceback); it is still the data's fault, and its message is the worker's."""
    from torch._utils import ExceptionWrapper

    (tmp_path / "bad.png").write_bytes(b"not an image")
    try:
        open_image(tmp_path / "bad.png")
    except BadDataError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(BadDataError) as err:
        wrapped.reraise()
    assert is_user_error(err.value)
    assert describe(err.value).startswith(f"image {tmp_path / 'bad.png'} cannot be read")


def test_bugs_are_not_user_errors():
    def foreign() -> None:
        int("x")  # a ValueError raised outside snntrain's code

    for call in (foreign, lambda: torch.zeros(2) @ torch.zeros(3), lambda: {}["key"]):
        with pytest.raises(Exception) as err:
            call()
        assert not is_user_error(err.value), err.value


def test_what_the_machine_lacks_is_a_user_error(monkeypatch):
    from snntrain.backend import resolve_backend

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UnavailableError) as err:
        resolve_backend("triton", cuda=False)
    assert is_user_error(err.value) and isinstance(err.value, RuntimeError)


@pytest.mark.parametrize("setting, value, train, expected", [
    ("max_epochs", 0, True, "trainer.max_epochs=0 trains nothing"),
    ("max_steps", 0, True, "trainer.max_steps=0 trains nothing"),
    ("limit_train_batches", 0, True, "trainer.limit_train_batches=0 trains nothing"),
    ("limit_train_batches", 0.0, True, "trainer.limit_train_batches=0 trains nothing"),
    ("limit_val_batches", 0, False, "trainer.limit_val_batches=0 validates nothing"),
])
def test_settings_that_do_nothing_are_refused(compose_run, setting, value, train, expected):
    trainer = dict(compose_run(None).trainer, **{setting: value})
    with pytest.raises(ValueError, match=expected):
        refuse_idle_run(trainer, train)


def test_useful_settings_are_not_refused(compose_run):
    trainer = dict(compose_run(None).trainer)
    for changes in ({}, {"max_epochs": -1, "max_steps": 10}, {"limit_val_batches": 0}, {"limit_train_batches": 0.5}):
        refuse_idle_run({**trainer, **changes}, True)  # training without validation is a choice, not a no-op
    refuse_idle_run(trainer, False)


def test_resuming_a_finished_run_is_refused_with_the_setting_that_continues_it():
    epoch_end = {"global_step": 69, "loops": {"fit_loop": {"epoch_progress": {"current": {"processed": 3}}}}}
    with pytest.raises(ValueError, match=r"trainer.max_epochs=3 is reached already.*trainer.max_epochs=6"):
        refuse_idle_run({"max_epochs": 3, "max_steps": -1}, True, epoch_end, "last.ckpt")
    with pytest.raises(ValueError, match="trainer.max_steps=50 is reached already"):
        refuse_idle_run({"max_epochs": 9, "max_steps": 50}, True, epoch_end, "last.ckpt")
    refuse_idle_run({"max_epochs": 4, "max_steps": -1}, True, epoch_end, "last.ckpt")


def test_a_trainer_argument_typo_gets_the_nearest_argument():
    with pytest.raises(ValueError, match=r"trainer.max_epoch is not a Trainer argument; did you mean trainer.max_epochs"):
        build_trainer(max_epoch=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match="trainer settings: .*precision"):
        build_trainer(precision="47-bits", logger=False, enable_checkpointing=False)
