"""One rule for how long something took, wherever a person reads it."""

from __future__ import annotations

import pytest

from nomadgpu.humanize import duration
from nomadgpu_cli import cli
from portal.templatetags.portal_tags import register as portal_filters
from statuspage.templatetags.status_tags import register as status_filters

CASES = [
    (0.4, "0 s"),
    (45.4, "45 s"),
    (59.6, "1 min"),
    (60, "1 min"),
    (89, "1 min 29 s"),
    (90, "1 min 30 s"),
    (303, "5 min 3 s"),
    (599.4, "9 min 59 s"),
    (720, "12 min"),
    (750, "13 min"),  # minutes round half up
    (2700, "45 min"),
    (3570, "1 h"),
    (3600, "1 h"),
    (3900, "1 h 05 min"),
    (7500, "2 h 05 min"),
]


@pytest.mark.parametrize(("seconds", "text"), CASES)
def test_a_duration_reads_the_same_on_pages_messages_feeds_and_the_cli(seconds, text):
    assert duration(seconds) == text
    assert cli.duration(seconds) == text


def test_the_page_filters_are_that_one_rule():
    assert portal_filters.filters["duration"] is duration
    assert status_filters.filters["duration"] is duration


def test_an_unknown_duration_says_so_in_the_words_of_its_place():
    assert duration(None) == "—"
    assert duration(None, "no data") == "no data"
    assert cli.duration(None) == "-"
