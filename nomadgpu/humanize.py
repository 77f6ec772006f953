"""How numbers read to people, the same on every page, message and feed.

Money has one rule (``money``), written here and in docs/budgets-and-costs.md (*A job's cost, and
how money reads*):

- from $1: cents, "$1.24", "$1,234.56";
- under $1: three significant digits, "$0.190", "$0.0191", "$0.00820": a short run costs
  fractions of a cent, and at cents two different costs (or a cost and the limit it is
  measured against) would read the same, or "$0.00";
- amounts are kept to the micro-dollar, so at most six decimals ("$0.000001"); nothing
  smaller is shown, and zero reads "$0.00";
- a price per hour follows the same rule, "$0.350/h", "$1.73/h".

A breakdown is written at its total's precision (``money_places`` of the total) so that the
parts shown add up to the total shown (``billing.cost``). A percentage beside an amount is
computed from the amounts as shown (``share``), so "82 % of $0.0100 ($0.00820)" agrees with
itself.

``nomadgpu_cli.render`` keeps copies of ``duration``, ``loss`` and ``money`` (the CLI installs
without the server); ``tests/test_humanize.py`` holds each pair to the same texts.
"""

from __future__ import annotations

from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal

MICRO_PLACES = 6  # amounts are kept to the micro-dollar (``billing.cost``)
SIGNIFICANT = 3
TIMES = "\u00d7"  # the multiplication sign the pages write GPU counts with ("4x RTX 4090")


def duration(seconds: float | None, none: str = "—") -> str:
    """Seconds as people say them: "45 s", "1 min 30 s" (under ten minutes the seconds still
    matter: a recovery's downtime), "12 min", "1 h", "2 h 05 min"; NONE when unknown.
    Minutes round half up, so 12 min 30 s reads "13 min"."""
    if seconds is None:
        return none
    whole = int(seconds + 0.5)
    if whole < 60:
        return f"{whole} s"
    if whole < 600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    minutes = (whole + 30) // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"


def _decimal(usd) -> Decimal:
    # Through str: a float reads as its shortest repr (0.019084, not 0.01908399999...), so the
    # server's Decimal and the float the API sends format alike.
    return usd if isinstance(usd, Decimal) else Decimal(str(usd))


def _places_for(amount: Decimal) -> int:
    if amount >= 1 or amount == 0:
        return 2
    return min(SIGNIFICANT - 1 - amount.adjusted(), MICRO_PLACES)


def _rounded(amount: Decimal, places: int) -> Decimal:
    return amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


def money_places(usd) -> int:
    """How many decimals the money rule writes USD with (module docstring): 2 from $1 (and
    for zero), else three significant digits, at most six. Decided on the rounded amount,
    so $0.9996 reads "$1.00", not "$1.000"."""
    amount = abs(_decimal(usd))
    places = _places_for(amount)
    return _places_for(_rounded(amount, places))


def money_value(usd, *, places: int | None = None) -> Decimal:
    """USD as the money rule shows it (at PLACES decimals when given): what a percentage
    beside it is computed from."""
    amount = _decimal(usd)
    return _rounded(amount, money_places(amount) if places is None else places)


def money(usd, *, per_hour: bool = False, places: int | None = None) -> str:
    """Dollars by the one rule: "$1.24", "$0.0191", "-$0.0500", "$0.00"; "$0.350/h" with
    PER_HOUR; at PLACES decimals for the parts of a breakdown (its total's places)."""
    amount = _decimal(usd)
    places = money_places(amount) if places is None else places
    shown = _rounded(abs(amount), places)
    sign = "-" if amount < 0 and shown else ""  # no "-$0.00"
    text = f"{sign}${shown:,.{places}f}"
    return f"{text}/h" if per_hour else text


def instance_price(usd, num_gpus: int | None = 1) -> str:
    """An instance's $/h as every offers table and rental sentence writes it: Vast prices the
    whole instance (``hosts.vast.parsing``), so that is the figure; for several GPUs the
    per-GPU price follows, which is what hosts on Vast compare by: "$1.60/h (4 x $0.400)",
    with the multiplication sign for the x."""
    whole = money(usd, per_hour=True)
    count = int(num_gpus or 1)
    if count <= 1:
        return whole
    return f"{whole} ({count} {TIMES} {money(_decimal(usd) / count)})"


def percent_of(part, whole) -> int | None:
    """PART as a whole percentage of WHOLE, computed from both as ``money`` shows them (so a
    sentence agrees with its own amounts) and rounded down, as a share of a limit is read
    (99 at $0.0792 of $0.0800, not 100); None for no WHOLE."""
    shown_whole = money_value(whole)
    if shown_whole <= 0:
        return None
    return int((money_value(part) / shown_whole * 100).to_integral_value(rounding=ROUND_FLOOR))


def share(part, whole) -> str:
    """``percent_of`` as written beside an amount: "82 %"; "—" for no WHOLE."""
    pct = percent_of(part, whole)
    return "—" if pct is None else f"{pct} %"


def loss(value: float | None, none: str = "—") -> str:
    """A training loss to four significant digits: "0.6931", "2.303", "1.351e-05" (a loss
    near zero keeps its digits instead of reading "0.0000"); NONE when unknown."""
    if value is None:
        return none
    return f"{value:.4g}"
