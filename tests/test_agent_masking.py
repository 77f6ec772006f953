"""Secret values masked before output leaves the agent (agent/masking.py): in a stream of
chunks that may split a value anywhere, and in the agent's own log records."""

from __future__ import annotations

import io
import logging

import pytest

from agent.logs import LogTail, OutputPump, RotatingFile
from agent.masking import MaskFilter, SecretMask

SECRET = "hf_Sup3rSecretValue42"


def through_stream(mask: SecretMask, chunks: list[str]) -> str:
    stream = mask.stream()
    return "".join(stream.feed(chunk) for chunk in chunks) + stream.flush()


def test_it_masks_values_of_four_characters_or_more_only():
    mask = SecretMask([SECRET, "abcd", "xyz", ""])
    assert mask.apply(f"a {SECRET} b abcd c xyz") == "a *** b *** c xyz"


def test_a_value_split_at_any_point_between_chunks_is_still_masked():
    mask = SecretMask([SECRET])
    text = f"before {SECRET} between {SECRET}after\n"
    for cut in range(len(text) + 1):
        assert through_stream(mask, [text[:cut], text[cut:]]) == "before *** between ***after\n"
    one_by_one = through_stream(mask, list(text))
    assert one_by_one == "before *** between ***after\n"


def test_a_beginning_that_turns_out_not_to_be_a_secret_is_let_through_unchanged():
    mask = SecretMask([SECRET])
    stream = mask.stream()
    assert stream.feed("token: hf_Sup") == "token: "  # could still become the secret
    assert stream.feed("per\n") == "hf_Supper\n"


@pytest.mark.parametrize(
    ("values", "chunks", "expected"),
    [
        (["abcd", "abcdef"], ["xx abcd", "ef yy"], "xx *** yy"),  # the longer one wins
        (["abcd", "abcdef"], ["xx abcd", " yy"], "xx *** yy"),
        (["abcd", "cdxy"], ["abcdx", "z"], "***xz"),  # a match overlapping a held tail
        (["abcd", "cdxy"], ["ab", "cdxy"], "***xy"),
    ],
)
def test_overlapping_values_are_masked_without_leaking_either(values, chunks, expected):
    assert through_stream(SecretMask(values), chunks) == expected


def test_without_secrets_the_stream_holds_nothing_back():
    stream = SecretMask().stream()
    assert stream.feed("hf_Sup") == "hf_Sup"


def test_the_pump_masks_the_log_file_the_echo_and_the_tail(tmp_path, capfdbinary):
    mask = SecretMask([SECRET])
    tail = LogTail()
    source = io.BufferedReader(io.BytesIO(f"step 1\ntoken={SECRET}\n".encode()))
    pump = OutputPump(source, RotatingFile(tmp_path / "train.log"), tail, mask)
    pump.start()
    pump.join(5)

    assert tail.text() == "step 1\ntoken=***"
    assert (tmp_path / "train.log").read_text() == "step 1\ntoken=***\n"
    assert SECRET.encode() not in capfdbinary.readouterr().out


def test_the_log_filter_masks_the_message_its_arguments_and_the_traceback():
    mask = SecretMask([SECRET])
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Keep()
    handler.addFilter(MaskFilter(mask))
    logger = logging.getLogger("test-masking")
    logger.addHandler(handler)
    logger.propagate = False
    # A level of its own: an in-process Celery worker (tests/test_staging.py) sets the root
    # logger's to ERROR for the rest of the process, and the warning would never be made.
    logger.setLevel(logging.INFO)
    try:
        logger.warning("git said %s", f"https://user:{SECRET}@example.com")
        try:
            raise RuntimeError(f"bad token {SECRET}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)

    assert records[0] == "git said https://user:***@example.com"
    assert "RuntimeError: bad token ***" in records[1]
    assert all(SECRET not in line for line in records)
