"""A rollout in waves that survives its own death: plan, offer, judge, soak, halt, roll back.

The plan and every step live in the state file (`ota.rollout_state`). Offers carry the wave's
offer id, and each node is recorded as `offering` before its offer is published and `offered`
once the broker acknowledged it. On `--resume`, a node with no recorded answer is first looked
up (its retained state's `last_update`, and the update events the rollout's persistent session
kept while the tool was down); only a node whose offer may never have left (`offering`) and that
shows no sign of it is sent the offer again, with the same id (a node ignores the running offer
delivered again, and answers one it installed `already_installed`). No node that answered is
ever offered again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Final

from agent.core.states import FINAL_PHASES, UpdatePhase
from agent.protocol.manifest import MAX_ENVELOPE_BYTES
from ota import rollout_state as store
from ota import waves as plans
from ota.fleet import Fleet, UpdateEvent, offer_body
from ota.inventory import DEFAULT_STALE_AFTER
from ota.rollout_state import NodeProgress, Rollout, Status, Step, Wave
from ota.safe_text import escaped, say

TICK: Final = 0.2
"""Seconds between two looks at events, timeouts and the control file."""
SAVE_EVERY: Final = 1.0
"""Answers are written at most this often (seconds); offers are written before publishing."""
RESUME_GRACE: Final = 5.0
"""Seconds a resumed rollout waits for a sign that an unconfirmed offer arrived."""
RETAINED_EVERY: Final = 1.0
"""Seconds between two looks at the nodes' retained `last_update`."""
PROGRESS_EVERY: Final = 2.0
"""Seconds between progress lines while nothing changes."""


def new_id() -> str:
    """A rollout id: UTC time and a random suffix (names its session, offers and files)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def new_rollout(
    rollout_id: str,
    fleet: Fleet,
    nodes: list[str],
    envelope: bytes,
    base_url: str,
    *,
    release: int,
    version: str,
    model_sha256: str,
    target: str,
    waves_spec: str,
    success_threshold: float,
    error_threshold: float,
    soak_s: float,
    node_timeout_s: float,
    rollback_on_halt: bool,
    session_expiry_s: int,
    stale_after: float = DEFAULT_STALE_AFTER,
) -> Rollout:
    """The plan: nodes online now first (sorted), then the others, split into waves."""
    if len(envelope) > MAX_ENVELOPE_BYTES:
        raise ValueError(f"the signed manifest is over {MAX_ENVELOPE_BYTES} bytes")
    now = time.time()
    known = {r.node: r for r in fleet.inventory.records()}

    def online_first(node: str) -> tuple[int, str]:
        record = known.get(node)
        up = record is not None and record.presence(now, stale_after) == "online"
        return (0 if up else 1, node)

    ordered = sorted(set(nodes), key=online_first)
    split = plans.split(ordered, waves_spec)
    waves = [Wave(i, members, f"{rollout_id}-w{i + 1}") for i, members in enumerate(split)]
    progress = {n: NodeProgress(w.index) for w in waves for n in w.nodes}
    return Rollout(
        id=rollout_id,
        created_at=now,
        broker={
            "host": fleet.settings.host,
            "port": fleet.settings.port,
            "prefix": fleet.settings.prefix,
        },
        release=release,
        version=version,
        model_sha256=model_sha256,
        envelope=envelope.decode(),
        base_url=base_url,
        target=target,
        waves_spec=waves_spec,
        success_threshold=success_threshold,
        error_threshold=error_threshold,
        soak_s=soak_s,
        node_timeout_s=node_timeout_s,
        rollback_on_halt=rollback_on_halt,
        session_expiry_s=session_expiry_s,
        waves=waves,
        nodes=progress,
    )


class Runner:
    """Carries a rollout forward from whatever its state file says, until it ends."""

    def __init__(
        self,
        fleet: Fleet,
        rollout: Rollout,
        path: Path,
        *,
        progress: Callable[[str], None] = say,
        stale_after: float = DEFAULT_STALE_AFTER,
        resumed: bool = False,
    ) -> None:
        self.fleet = fleet
        self.rollout = rollout
        self.path = path
        self._progress = progress
        self._stale_after = stale_after
        self._dirty = False
        self._saved_at = 0.0
        self._shown = ""
        self._shown_at = 0.0
        self._control_seen = rollout.control_at or 0.0
        self._retained_at = 0.0
        self._resumed_at = time.time() if resumed else None
        if resumed:
            rollout.resumed_at.append(self._resumed_at or time.time())
        offers = {w.offer_id: w for w in rollout.waves}
        offers |= {w.rollback_id: w for w in rollout.waves if w.rollback_id}
        self._offers = offers

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> str:
        """Run to the end (done, halted or aborted); the final status."""
        rollout = self.rollout
        self._save()
        while rollout.status not in Status.ENDED:
            self._pump()
            if rollout.status in Status.ENDED:
                break
            wave = next((w for w in rollout.waves if w.outcome is None), None)
            halting = next((w for w in rollout.waves if w.outcome == "halting"), None)
            if halting is not None:
                self._halt_step(halting)
            elif wave is None:
                rollout.status = Status.DONE
                self._say("every wave passed")
            elif wave.started_at is None:
                if rollout.status == Status.RUNNING and self._soaked():
                    self._start(wave)
            else:
                self._watch(wave)
            self._save(force=rollout.status in Status.ENDED)
            if rollout.status not in Status.ENDED:
                time.sleep(TICK)
        rollout.finished_at = rollout.finished_at or time.time()
        self._save(force=True)
        return rollout.status

    def _soaked(self) -> bool:
        previous = [w for w in self.rollout.waves if w.ended_at is not None]
        if not previous or previous[-1].soak_until is None:
            return True
        left = previous[-1].soak_until - time.time()
        if left > 0:
            self._show(f"soaking wave {previous[-1].index + 1}: {left:.0f} s left")
            return False
        return True

    # ---- events, control, saving -------------------------------------------------------------

    def _pump(self) -> None:
        for event in self.fleet.drain():
            self._apply(event)
        self._read_retained()
        self._read_control()

    def _apply(self, event: UpdateEvent) -> None:
        wave = self._offers.get(event.offer)
        progress = self.rollout.nodes.get(event.node)
        if wave is None or progress is None or progress.wave != wave.index:
            return
        if event.offer == wave.rollback_id:
            if event.final:
                progress.rollback = event.state
                self.rollout.note(event.node, f"rollback:{event.state}", event.at)
                self._dirty = True
            return
        if progress.first_event_at is None:
            progress.first_event_at = event.at
        if progress.step == Step.OFFERING:
            progress.step = Step.OFFERED  # it arrived
        if not event.final:
            return
        if progress.step == Step.ANSWERED and progress.state == event.state:
            return  # delivered again
        if event.state == UpdatePhase.BUSY and progress.step == Step.ANSWERED:
            return
        self._answer(
            event.node,
            progress,
            state=event.state,
            reason=event.reason,
            detail=event.detail,
            at=event.at,
        )

    def _answer(
        self,
        node: str,
        progress: NodeProgress,
        *,
        state: str,
        reason: str | None,
        detail: str | None,
        at: float,
    ) -> None:
        late = progress.step == Step.ANSWERED
        progress.step = Step.ANSWERED
        progress.state, progress.reason, progress.detail = state, reason, detail
        progress.answered_at = progress.answered_at if late else at
        self.rollout.note(node, state, at)
        self._dirty = True
        if late:
            self._say(f"{escaped(node)}: later {state}" + (f" ({reason})" if reason else ""))
            self._rejudge(self.rollout.waves[progress.wave])

    def _read_retained(self) -> None:
        """Answers the events did not bring: the final result in a node's retained state."""
        if time.monotonic() - self._retained_at < RETAINED_EVERY:
            return
        self._retained_at = time.monotonic()
        for wave in self.rollout.waves:
            if wave.started_at is None or wave.outcome not in {None, "halting"}:
                continue
            for node in wave.nodes:
                progress = self.rollout.nodes[node]
                if progress.step not in {Step.OFFERING, Step.OFFERED, Step.NO_ANSWER}:
                    continue
                record = self.fleet.inventory.get(node)
                last = record.last_update if record else None
                if last is None or last.id != wave.offer_id:
                    continue
                if last.state in FINAL_PHASES:
                    self._answer(
                        node,
                        progress,
                        state=last.state,
                        reason=escaped(last.reason) if last.reason is not None else None,
                        detail=None,
                        at=time.time(),
                    )

    def _read_control(self) -> None:
        command = store.read_control(self.path)
        if command is None or command[1] <= self._control_seen:
            return
        name, at = command
        self._control_seen = at
        rollout = self.rollout
        rollout.control, rollout.control_at = name, at
        self._dirty = True
        if name == "abort":
            rollout.status = Status.ABORTED
            rollout.halt_reason = "aborted by the operator"
            for wave in rollout.waves:
                if wave.started_at is not None and wave.outcome is None:
                    wave.outcome, wave.ended_at = "aborted", time.time()
            self._say("aborted: no further offers (updates already running finish on the nodes)")
        elif name == "pause" and rollout.status == Status.RUNNING:
            rollout.status = Status.PAUSED
            self._say("paused: no new wave starts until `rollout-control ... resume`")
        elif name == "resume" and rollout.status == Status.PAUSED:
            rollout.status = Status.RUNNING
            self._say("resumed")

    def _save(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or (self._dirty and now - self._saved_at >= SAVE_EVERY):
            store.save(self.path, self.rollout)
            self._dirty = False
            self._saved_at = now

    def _say(self, line: str) -> None:
        """A progress line (node ids and reasons in it are escaped where they are written)."""
        self._progress(line)
        self._shown = line
        self._shown_at = time.monotonic()

    def _show(self, line: str) -> None:
        """A progress line: when it changed (at most every PROGRESS_EVERY s), or as a heartbeat."""
        elapsed = time.monotonic() - self._shown_at
        if (line != self._shown and elapsed >= PROGRESS_EVERY) or elapsed >= 30 * PROGRESS_EVERY:
            self._say(line)

    # ---- a wave ------------------------------------------------------------------------------

    def _start(self, wave: Wave) -> None:
        rollout, now = self.rollout, time.time()
        wave.started_at = now
        offered: list[str] = []
        for node in wave.nodes:
            progress = rollout.nodes[node]
            record = self.fleet.inventory.get(node)
            presence = record.presence(now, self._stale_after) if record else "unknown"
            if presence in {"offline", "unknown"}:
                progress.step, progress.presence = Step.OFFLINE, presence
                rollout.note(node, "offline", now)
                continue
            progress.step, progress.offered_at = Step.OFFERING, now
            rollout.note(node, "offered", now)
            offered.append(node)
        self._save(force=True)  # recorded before a single offer leaves
        self._publish_offers(wave, offered)
        wave.offered_at = time.time()
        self._save(force=True)
        skipped = len(wave.nodes) - len(offered)
        self._say(
            f"wave {wave.index + 1}/{len(rollout.waves)} ({wave.offer_id}): offered to "
            f"{len(offered)} node(s)" + (f", {skipped} offline (not offered)" if skipped else "")
        )

    def _publish_offers(self, wave: Wave, nodes: list[str]) -> None:
        body = offer_body(self.rollout.envelope.encode(), self.rollout.base_url, wave.offer_id)
        self.fleet.send((node, body) for node in nodes)
        for node in nodes:
            progress = self.rollout.nodes[node]
            if progress.step == Step.OFFERING:
                progress.step = Step.OFFERED

    def _deadline(self, progress: NodeProgress) -> float:
        start = max(progress.offered_at or 0.0, self._resumed_at or 0.0)
        return start + self.rollout.node_timeout_s

    def _watch(self, wave: Wave) -> None:
        """Resolve unconfirmed offers, time out silent nodes, judge the wave."""
        now = time.time()
        unconfirmed = [n for n in wave.nodes if self.rollout.nodes[n].step == Step.OFFERING]
        if unconfirmed and now - (self._resumed_at or 0.0) >= RESUME_GRACE:
            self._say(f"{len(unconfirmed)} offer(s) with no sign of arrival: sent again (same id)")
            self._publish_offers(wave, unconfirmed)
            self._dirty = True
        for node in wave.nodes:
            progress = self.rollout.nodes[node]
            if progress.step == Step.OFFERED and now > self._deadline(progress):
                record = self.fleet.inventory.get(node)
                progress.step = Step.NO_ANSWER
                progress.presence = record.presence(now, self._stale_after) if record else None
                self.rollout.note(node, "no_answer", now)
                self._dirty = True
        counts = self._tally(wave)
        self._show(self._line(wave, counts))
        halt = plans.verdict(counts, self.rollout.success_threshold, self.rollout.error_threshold)
        if halt is not None:
            self._begin_halt(wave, halt)
        elif counts.pending == 0 and not unconfirmed:
            wave.outcome, wave.ended_at = "passed", now
            last = wave.index == len(self.rollout.waves) - 1
            wave.soak_until = None if last else now + self.rollout.soak_s
            self._dirty = True
            self._say(f"wave {wave.index + 1} passed: {self._line(wave, counts)}")

    def _tally(self, wave: Wave) -> plans.Tally:
        nodes = self.rollout.nodes
        offline = {n for n in wave.nodes if nodes[n].step == Step.OFFLINE}
        answers = {
            n: (str(nodes[n].state), nodes[n].reason)
            for n in wave.nodes
            if nodes[n].step == Step.ANSWERED
        }
        silent = {n for n in wave.nodes if nodes[n].step == Step.NO_ANSWER}
        return plans.tally(wave.nodes, offline, answers, silent)

    def _line(self, wave: Wave, counts: plans.Tally) -> str:
        states = ", ".join(f"{s} {c}" for s, c in sorted(counts.states.items()))
        return (
            f"wave {wave.index + 1}/{len(self.rollout.waves)}: {counts.nodes} nodes, "
            f"{counts.offered} offered, {states or 'no answer yet'}, {counts.offline} offline, "
            f"{counts.no_answer} no answer, {counts.pending} pending"
        )

    def _rejudge(self, wave: Wave) -> None:
        """A late answer (e.g. a node that rolled back by itself while the next waves ran)."""
        if wave.outcome != "passed" or self.rollout.status in Status.ENDED:
            return
        counts = self._tally(wave)
        halt = plans.verdict(counts, self.rollout.success_threshold, self.rollout.error_threshold)
        if halt is None:
            return
        reason = f"wave {wave.index + 1}, later: {halt}"
        running = next(
            (w for w in self.rollout.waves if w.started_at is not None and w.outcome is None),
            None,
        )
        if running is not None:  # stop it and (if asked) roll back what it installed
            self._begin_halt(running, reason)
        else:  # between waves: no further wave starts
            self.rollout.halt_reason = reason
            wave.halt_reason = reason
            self._end_halt(wave)

    # ---- halting -----------------------------------------------------------------------------

    def _begin_halt(self, wave: Wave, reason: str) -> None:
        self.rollout.halt_reason = reason
        if wave.outcome is None:
            wave.outcome = "halting"
        wave.halt_reason = reason
        self._dirty = True
        self._say(f"halting at wave {wave.index + 1}: {reason}")

    def _halt_step(self, wave: Wave) -> None:
        """Wait for the wave's running updates to end (or time out), roll back, stop."""
        now = time.time()
        for node in wave.nodes:
            progress = self.rollout.nodes[node]
            if progress.step == Step.OFFERED and now > self._deadline(progress):
                progress.step = Step.NO_ANSWER
                self.rollout.note(node, "no_answer", now)
                self._dirty = True
        counts = self._tally(wave)
        if counts.pending:
            self._show(f"halting: waiting for {counts.pending} running update(s) to end")
            return
        if not self.rollout.rollback_on_halt:
            self._end_halt(wave)
            return
        if wave.rollback_id is None:
            wave.rollback_id = f"{wave.offer_id}-rollback"
            self._offers[wave.rollback_id] = wave
        targets = [
            n
            for n in wave.nodes
            if self.rollout.nodes[n].state == UpdatePhase.INSTALLED
            and self.rollout.nodes[n].rollback in {None, "sending"}
        ]
        if targets:
            for node in targets:
                self.rollout.nodes[node].rollback = "sending"
                self.rollout.nodes[node].rollback_at = now
            self._save(force=True)
            body = {"id": wave.rollback_id, "rollback": True}
            self.fleet.send((node, body) for node in targets)
            for node in targets:
                self.rollout.nodes[node].rollback = "sent"
                self.rollout.note(node, "rollback:sent", now)
            self._save(force=True)
            self._say(f"rolling back {len(targets)} node(s) of wave {wave.index + 1}")
            return
        waiting = [
            n
            for n in wave.nodes
            if self.rollout.nodes[n].rollback == "sent"
            and now < (self.rollout.nodes[n].rollback_at or now) + self.rollout.node_timeout_s
        ]
        if waiting:
            self._show(f"rollback: waiting for {len(waiting)} node(s)")
            return
        self._end_halt(wave)

    def _end_halt(self, wave: Wave) -> None:
        now = time.time()
        if wave.outcome == "halting":
            wave.outcome, wave.ended_at = "halted", now
        self.rollout.status = Status.HALTED
        self.rollout.finished_at = now
        back = [n for n in wave.nodes if self.rollout.nodes[n].rollback == UpdatePhase.ROLLED_BACK]
        self._say(
            f"halted at wave {wave.index + 1}: {self.rollout.halt_reason}"
            + (f"; rolled back: {', '.join(escaped(n) for n in back)}" if back else "")
        )
        self._dirty = True
