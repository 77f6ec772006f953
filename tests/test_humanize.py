"""One rule for how long something took, one for how a loss reads and one for how money
reads, wherever a person reads them: pages, messages, feeds and the CLI (which keeps its own
copies)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.templatetags.finance import register as finance_filters
from nomadgpu.humanize import duration, loss, money, percent_of, share
from nomadgpu_cli import render
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
    assert render.duration(seconds) == text


def test_the_page_filters_are_that_one_rule():
    assert portal_filters.filters["duration"] is duration
    assert status_filters.filters["duration"] is duration


def test_an_unknown_duration_says_so_in_the_words_of_its_place():
    assert duration(None) == "—"
    assert duration(None, "no data") == "no data"
    assert render.duration(None) == "-"


LOSSES = [
    (1.351361815509973e-05, "1.351e-05"),
    (0.6931471805599453, "0.6931"),
    (2.302585092994046, "2.303"),
    (12.345678, "12.35"),
    (0.0, "0"),
    (1.0, "1"),
    (0.00012345, "0.0001234"),
]


@pytest.mark.parametrize(("value", "text"), LOSSES)
def test_a_loss_reads_the_same_on_the_job_page_and_in_the_cli(value, text):
    assert loss(value) == text
    assert render.loss(value) == text


def test_the_page_filter_is_the_loss_rule():
    assert portal_filters.filters["loss"] is loss


def test_an_unknown_loss_says_so():
    assert loss(None) == "—"
    assert render.loss(None) == "-"


MONEY = [
    (0, "$0.00"),
    (0.19, "$0.190"),
    (0.019084, "$0.0191"),  # the job: API 0.019084, admin 0.0191, page $0.019
    (0.018, "$0.0180"),
    (0.0177, "$0.0177"),  # recorded and billed stay distinct: not both "$0.02"
    (0.0082, "$0.00820"),
    (0.01, "$0.0100"),
    (0.0158, "$0.0158"),
    (0.00045, "$0.000450"),
    (0.0000012, "$0.000001"),  # kept to the micro-dollar
    (0.0000004, "$0.00"),
    (0.9996, "$1.00"),  # decided on the rounded amount: cents from $1
    (0.09996, "$0.100"),
    (1, "$1.00"),
    (1.728, "$1.73"),
    (2.403, "$2.40"),
    (1234.567, "$1,234.57"),
    (-0.05, "-$0.0500"),
    (-0.0000001, "$0.00"),  # no "-$0.00"
    (Decimal("0.080"), "$0.0800"),
]


@pytest.mark.parametrize(("usd", "text"), MONEY)
def test_an_amount_reads_the_same_on_pages_messages_the_api_and_the_cli(usd, text):
    assert money(usd) == text
    assert render.money(usd) == text
    assert render.money(float(usd)) == text  # what the CLI gets from the API's JSON


def test_any_amount_under_a_dollar_shows_three_significant_digits_and_is_never_zero():
    for usd in (0.000001, 0.00123, 0.0456, 0.789, 0.999):
        text = money(usd)
        digits = text.lstrip("$0.")
        assert len(digits) == 3 or usd < 0.00001, text
        assert Decimal(text.lstrip("$")) > 0


def test_a_price_per_hour_follows_the_same_rule():
    assert money(0.35, per_hour=True) == "$0.350/h"
    assert money(1.728, per_hour=True) == "$1.73/h"


def test_the_page_and_finance_filters_are_the_money_rule():
    assert portal_filters.filters["money"](0.0177) == money(0.0177)
    assert portal_filters.filters["money"](None) == "-"  # a figure an old decision lacks
    assert finance_filters.filters["usd"](0.0177) == money(0.0177) == "$0.0177"
    assert finance_filters.filters["usd"](None) == "-"


@pytest.mark.parametrize(
    ("part", "whole", "text"),
    [
        (0.0082, 0.01, "82 %"),  # "82 % of the job limit $0.0100 used ($0.00820)"
        (0.0792, 0.08, "99 %"),  # the banner: 99 %, not "80 % reached"
        (0.00045, 0.001, "45 %"),
        (0.0799, 0.08, "99 %"),  # rounded down: a limit is not reached before it is
        (0.08, 0.08, "100 %"),
        (1, 0, "—"),
    ],
)
def test_a_percentage_is_computed_from_the_amounts_as_shown(part, whole, text):
    assert share(part, whole) == text
    if text != "—":
        shown = Decimal(money(part).lstrip("$")) / Decimal(money(whole).lstrip("$")) * 100
        assert int(shown) == percent_of(part, whole)
