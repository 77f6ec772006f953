"""Two hazards of buying on Vast that a renter must guard against itself, armed by hand for the
next create of one ask (``POST /sandbox/inject`` ``{"action": "double-sell" | "create-timeout",
"arg": ASK_ID}``, ``sandbox inject double-sell ASK_ID``). The market weather does not draw them:
they are about the API, not the machines.

- ``double-sell``: the ask is sold again although a renter holds it. Two parallel buyers of one
  offer were both accepted by Vast (skypilot#9117), so a renter that races its own creates
  must never send two on one ask. The next create of the ask is accepted as if it were free.
- ``create-timeout``: the next create of the ask makes its instance, but the answer is lost:
  a create that timed out may still have created a machine (skypilot#10171). The sandbox answers
  504 once the instance exists, which a client can only read as an unknown outcome: a retry
  must look for the instance by its label before it creates again.

Each arming covers one create; arming again adds one. They live in the state file, like the
asks ``refuse-ask`` refuses.
"""

from __future__ import annotations

from sandbox.engine.core import EngineCore
from sandbox.errors import ApiError

DOUBLE_SELL = "double-sell"
CREATE_TIMEOUT = "create-timeout"
BUYER_HAZARDS = (DOUBLE_SELL, CREATE_TIMEOUT)


class BuyerHazards(EngineCore):
    """Arming a hazard for an ask, and a create taking one."""

    def arm_hazard(self, kind: str, ask_id: int) -> int:
        """One more create of ASK_ID meets KIND; returns how many are armed now."""
        if kind not in BUYER_HAZARDS:
            raise ApiError(400, "invalid_args", f"unknown hazard {kind!r}")
        if self.market.get(ask_id) is None:
            raise ApiError(404, "no_such_ask", f"no ask {ask_id} in the market", ask_id=ask_id)
        with self.store.tx():
            self.store.run(
                "INSERT INTO buyer_hazards (ask_id, kind, armed) VALUES (?, ?, 1)"
                " ON CONFLICT (ask_id, kind) DO UPDATE SET armed = armed + 1",
                (ask_id, kind),
            )
            return self._armed(kind, ask_id)

    def take_hazard(self, kind: str, ask_id: int) -> bool:
        """Whether this create of ASK_ID meets KIND (one arming is used up if so). Called
        inside the create's store transaction: an arming is taken by exactly one create."""
        with self.store.tx():
            if self._armed(kind, ask_id) <= 0:
                return False
            self.store.run(
                "UPDATE buyer_hazards SET armed = armed - 1 WHERE ask_id = ? AND kind = ?",
                (ask_id, kind),
            )
            return True

    def _armed(self, kind: str, ask_id: int) -> int:
        found = self.store.row(
            "SELECT armed FROM buyer_hazards WHERE ask_id = ? AND kind = ?", (ask_id, kind)
        )
        return int(found["armed"]) if found else 0


def lost_answer(ask_id: int) -> ApiError:
    """What a create whose answer was lost reads as: a gateway timeout, after the instance
    exists (its id is in the sandbox's event log, never in the answer)."""
    return ApiError(504, "gateway_timeout", f"upstream timed out while renting ask {ask_id}")
