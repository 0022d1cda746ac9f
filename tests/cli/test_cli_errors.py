"""condense_parser_error on jsonargparse's messages as it prints them (lit_rlft.cli.errors): the class the user named,
the option, and the reason, in one line."""

from __future__ import annotations

from lit_rlft.cli.errors import condense_parser_error

UNION_DUMP = """Parser key "trainer.callbacks":
  Does not validate against any of the Union subtypes
  Subtypes: [list[lightning.pytorch.callbacks.callback.Callback], <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'lit_rlft.callbacks.DOTSCallback':
        Option 'predictor.bogus' is not accepted
    - Not a valid subclass of Callback
      Subclass types expect one of:
      - a class path (str)
    - Expected a <class 'NoneType'>
  Given value type: <class 'list'>
  Given value: [{'class_path': 'lit_rlft.callbacks.DOTSCallback'}]"""


def test_the_users_class_and_a_nested_option():
    assert condense_parser_error(UNION_DUMP) == (
        "trainer.callbacks (lit_rlft.callbacks.DOTSCallback): unknown option 'predictor.bogus'")


def test_a_class_that_does_not_import():
    message = UNION_DUMP.replace("DOTSCallback", "NoSuch").replace(
        "Option 'predictor.bogus' is not accepted", "module 'lit_rlft.callbacks' has no attribute 'NoSuch'")
    assert condense_parser_error(message) == (
        "trainer.callbacks (lit_rlft.callbacks.NoSuch): module 'lit_rlft.callbacks' has no attribute 'NoSuch'")


def test_the_first_useful_line_when_nothing_is_recognised():
    message = 'Parser key "data.val":\n  Does not validate against any of the Union subtypes\n  - something odd'
    assert condense_parser_error(message) == "data.val: something odd"


def test_one_line_messages_get_the_closest_option_and_the_help_pointer():
    options = ["model.num_generations", "model.lora.r", "trainer.max_steps"]
    assert condense_parser_error("Subcommand 'fit' does not accept option 'trainer.max_step'", "lit-rlft fit",
                                 options) == ("Subcommand 'fit' does not accept option 'trainer.max_step': did you mean "
                                              "'trainer.max_steps'? (see `lit-rlft fit --help`)")
    assert condense_parser_error("unrecognized arguments: --zzz", "lit-rlft fit", options) == (
        "unrecognized arguments: --zzz (see `lit-rlft fit --help`)")
    assert condense_parser_error("Configuration check failed", "lit-rlft fit", options) == "Configuration check failed"
