"""Renting an ask (``PUT /asks/{id}/``): whether it can be rented, the row a new instance
starts as, and its scratch folder (the fake ``nvidia-smi``, the onstart script, the slow factor).

Exactly one of concurrent renters wins: the checks and the insert are one store transaction.
"""

from __future__ import annotations

import json
import secrets

from sandbox import billing, gpu
from sandbox.engine.buyer_hazards import CREATE_TIMEOUT, DOUBLE_SELL, BuyerHazards, lost_answer
from sandbox.engine.create_body import container_script, validated_config
from sandbox.errors import ApiError
from sandbox.market import HOURS_PER_MONTH, public
from sandbox.state import log_event


class Create(BuyerHazards):
    """Renting: the ask checked, the new row, its first status (and the buyer hazards armed
    for it: ``buyer_hazards.py``)."""

    def refuse_ask(self, ask_id: int) -> None:
        """Sandbox-only (``inject refuse-ask ASK_ID``): from now on a create of ASK_ID is
        refused with the 403 Vast documents for an offer the renter may not rent; the ask stays
        listed. Any other refusal of that one offer reads the same to a renter."""
        if self.market.get(ask_id) is None:
            raise ApiError(404, "no_such_ask", f"no ask {ask_id} in the market", ask_id=ask_id)
        self.store.run(
            "INSERT OR IGNORE INTO refused_asks (ask_id, at) VALUES (?, ?)", (ask_id, self.clock())
        )

    def create(self, account_id: int, ask_id: int, body: dict) -> dict:
        """``PUT /asks/{id}/``: rent an ask. Exactly one of concurrent renters wins."""
        config = validated_config(body)
        now = self.clock()
        with self.store.tx():
            offer = self._available_offer(ask_id)
            if config["disk"] > float(offer.get("disk_space", 0)):
                raise ApiError(
                    400,
                    "invalid_args",
                    f"disk {config['disk']} GB exceeds the offer's {offer['disk_space']} GB",
                )
            if billing.credit(self.store, account_id, now) <= 0:
                # Vast's generated spec: create answers 400 invalid_args "for billing issues".
                raise ApiError(
                    400,
                    "invalid_args",
                    "Your account has a billing issue: no credit left. Add credit to rent.",
                )
            inst_id = self._insert(account_id, ask_id, offer, config, now)
            self._prepare_scratch(inst_id, offer, config)
            inst = self._initial_status(inst_id, offer, config, now)
            answer_lost = self.take_hazard(CREATE_TIMEOUT, ask_id)
            if answer_lost:
                log_event(self.store, inst_id, now, "answer lost", "create-timeout: 504 sent")
        if answer_lost:
            raise lost_answer(ask_id)
        return {
            "success": inst["status"] != "stopped" or inst["intended"] != "stopped",
            "new_contract": inst_id,
            "instance_api_key": inst["api_key"],
        }

    def _available_offer(self, ask_id: int) -> dict:
        """The offer behind ASK_ID, or the 404 Vast gives for a gone one. Its two sources
        disagree on the code, so both are served: an ask that was never there or left the
        market answers `no_such_ask` (the generated spec), one rented meanwhile `invalid_args`
        with "no_such_ask" in the message (the hand-written create_instance example)."""
        offer = self.market.get(ask_id)
        text = f"error 404/3603: no_such_ask  Instance type by id {ask_id} is not available."
        if offer is None or ask_id in self.gone_asks():
            raise ApiError(404, "no_such_ask", text, ask_id=ask_id)
        taken = ask_id in self.rented_asks() or ask_id in self.market.taken_by_others
        if taken and not self.take_hazard(DOUBLE_SELL, ask_id):
            raise ApiError(404, "invalid_args", text, ask_id=ask_id)
        if self.store.row("SELECT 1 AS x FROM refused_asks WHERE ask_id = ?", (ask_id,)):
            # The hand-written create_instance.yaml's 403, word for word: a host-only account
            # renting another host's offer. A refusal of this one offer, not of the key.
            refused = (
                f"error 403/3586: Offer {ask_id} is not your own. "
                "Hosts can only rent their own machines."
            )
            raise ApiError(403, "invalid_args", refused, ask_id=ask_id)
        return offer

    def _insert(self, account_id: int, ask_id: int, offer: dict, config: dict, now: float) -> int:
        is_bid = config["price"] is not None
        gpu_rate = float(config["price"] if is_bid else offer["dph_base"])
        disk_rate = float(offer.get("storage_cost", 0.0)) * config["disk"] / HOURS_PER_MONTH
        return self.store.run(
            "INSERT INTO instances (account_id, ask_id, offer, config, api_key, label, created_at,"
            " status, intended, is_bid, gpu_rate, disk_rate, down_rate, up_rate, image_bytes)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 'created', 'running', ?, ?, ?, ?, ?, ?)",
            (
                account_id,
                ask_id,
                json.dumps(public(offer)),
                json.dumps(config),
                secrets.token_hex(32),
                config["label"],
                now,
                int(is_bid),
                gpu_rate,
                disk_rate,
                float(offer.get("inet_down_cost", 0.0)),
                float(offer.get("inet_up_cost", 0.0)),
                self.timing.image_bytes(config["image"]),
            ),
        )

    def _initial_status(self, inst_id: int, offer: dict, config: dict, now: float) -> dict:
        log_event(self.store, inst_id, now, "created", f"ask {offer['id']}")
        self._draw_fate(inst_id, offer)  # weather_fates.py: none in weather `none`
        if config["target_state"] == "stopped":
            return self._update(inst_id, now, status="stopped", intended="stopped")
        floor = self.bids.floor(int(offer["id"]), now)
        if config["price"] is not None and config["price"] < floor:
            # A bid under the floor is created stopped, like an outbid one, and the create
            # answers success: false with its new_contract (Vast's generated create spec:
            # "false if it started in stopped state"; dstack's api_client.py relies on it).
            # It starts once its bid wins: a raised bid, or a min_bid that falls below it.
            self._record_outbid(self.get(inst_id), now, "below min_bid at create", floor)
            return self._update(
                inst_id,
                now,
                status="stopped",
                intended="stopped",
                outbid=1,
                outbid_resume=1,
                status_msg="outbid: bid below min_bid",
            )
        fate = self.fate_of(self.get(inst_id))
        if fate is not None and fate.never_ready == "created":
            log_event(self.store, inst_id, now, "market weather", "the host never picks it up")
        deadline = self._created_until(inst_id, fate, now)
        return self._update(inst_id, now, status="created", deadline=deadline)

    def _prepare_scratch(self, inst_id: int, offer: dict, config: dict) -> None:
        scratch = self.scratch(inst_id)
        scratch.mkdir(parents=True, exist_ok=True)
        gpu.install(scratch, inst_id, offer)
        (scratch / "onstart.sh").write_text(container_script(config))
        self._write_slow(inst_id, 1.0)

    def _write_slow(self, inst_id: int, injected: float) -> None:
        inst = self.get(inst_id)
        factor = injected * self.market.speed_factor(inst["ask_id"]) if inst else injected
        (self.scratch(inst_id) / "slow").write_text(f"{factor:.4f}\n")
