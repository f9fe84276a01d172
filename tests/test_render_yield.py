"""Wyoming renders give way to an alarm: two real synthesizers on the tiny voice, sharing its
session, a phrase cache and one urgent gate. The main one holds the gate through an urgent
request; the render worker waits before each inference while it is held.

Overlap is made deterministic with the step marker (a real injection point of `Synthesizer`):
the main synthesizer is held inside its first inference step of a request until the test lets
it go, and a render can be held in its `put`. Every wait has a generous deadline; no test
judges speed.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.core.messages import Event, Priority, SpeakRequest, SynthesisDone
from agent.formats.chunk import Chunk
from agent.link.wyoming.render import DeskFullError, RenderDesk
from agent.speech.phrase_cache import PhraseCache
from agent.speech.synthesizer import Synthesizer, VoiceChoice
from agent.speech.urgent import UrgentGate, is_urgent
from agent.speech.voice import Voice
from harness import wait_until
from tests.tiny_voice import write_tiny_voice

DEADLINE = 60.0
ANSWER = " ".join(
    f"Part {n} of the long answer goes on, with a clause or two, and it ends." for n in range(30)
)
"""A long render (many sentences, several clause groups each)."""
ALARM = " ".join(f"Alarm {n}, the pump in hall {n} has stopped, leave the hall." for n in range(30))


@dataclass
class Timeline:
    """Every chunk the synthesizers hand over, and marks, in one order, with their times."""

    entries: list[tuple[str, Chunk | None, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, who: str, chunk: Chunk | None = None) -> None:
        with self.lock:
            self.entries.append((who, chunk, time.perf_counter()))

    def snapshot(self) -> list[tuple[str, Chunk | None, float]]:
        with self.lock:
            return list(self.entries)

    def speech(self, who: str) -> int:
        """How many chunks of audio `who` has handed over so far."""
        return sum(1 for w, c, _ in self.snapshot() if w == who and c is not None and not c.end)

    def end(self, who: str) -> tuple[Chunk, float]:
        """The end chunk `who` handed over, and when."""
        ends = [(c, t) for w, c, t in self.snapshot() if w == who and c is not None and c.end]
        assert len(ends) == 1, ends
        return ends[0]


class HeldSteps:
    """A step marker that keeps the synthesizer inside the first inference step of the request
    `request_id` until `go` is set (marking the timeline as it enters)."""

    def __init__(self, request_id: str, timeline: Timeline, who: str) -> None:
        self.request_id = request_id
        self.timeline = timeline
        self.who = who
        self.inside = threading.Event()
        self.go = threading.Event()

    @contextlib.contextmanager
    def step(self, request_id: str, step: str) -> Iterator[None]:
        if request_id == self.request_id and step.startswith("infer") and not self.inside.is_set():
            self.timeline.add(f"{self.who} inside")
            self.inside.set()
            self.go.wait(DEADLINE)
        yield


@dataclass
class Worker:
    synthesizer: Synthesizer
    events: queue.Queue[Event]

    def done(self, job: int) -> SynthesisDone:
        """Wait for the worker's report that activation `job` is done."""
        while True:
            event = self.events.get(timeout=DEADLINE)
            if isinstance(event, SynthesisDone) and event.job == job:
                return event


@dataclass
class Node:
    """The node's two synthesizers over one voice, one phrase cache and one gate."""

    voice: Voice
    gate: UrgentGate
    timeline: Timeline
    make: Callable[..., Worker]


@pytest.fixture(scope="module")
def voice(tiny_voice: Path) -> Voice:
    """One loaded voice for the module's tests (its session, shared as the node shares it)."""
    return Voice.load(tiny_voice, threads=1, cache_dir=None)


@pytest.fixture
def node(voice: Voice) -> Iterator[Node]:
    cache = PhraseCache(None, 10**8, 0)
    gate = UrgentGate()
    timeline = Timeline()
    made: list[Synthesizer] = []

    def make(
        who: str,
        *,
        put: Callable[[Chunk], bool] | None = None,
        steps: HeldSteps | None = None,
        urgent: UrgentGate | None = None,
        yields_to: UrgentGate | None = None,
    ) -> Worker:
        def record(chunk: Chunk) -> bool:
            timeline.add(who, chunk)
            return True

        events: queue.Queue[Event] = queue.Queue()
        choice = VoiceChoice("default", voice, voice.default_params)
        synthesizer = Synthesizer(
            {"default": choice},
            cache,
            (20, 80),
            put or record,
            events.put,
            steps=steps,
            urgent=urgent,
            yields_to=yields_to,
        )
        synthesizer.start()
        made.append(synthesizer)
        return Worker(synthesizer, events)

    yield Node(voice, gate, timeline, make)
    for synthesizer in made:
        synthesizer.stop()


def main_and_renderer(
    node: Node, held: str, render_put: Callable[[Chunk], bool] | None = None
) -> tuple[Worker, HeldSteps, Worker]:
    """The main synthesizer (held inside request `held`'s first inference) and the render
    worker."""
    steps = HeldSteps(held, node.timeline, "main")
    main = node.make("main", steps=steps, urgent=node.gate)
    render = node.make("render", put=render_put, yields_to=node.gate)
    return main, steps, render


@pytest.mark.parametrize("priority", [Priority.ALARM, Priority.CRITICAL])
def test_no_render_inference_runs_while_an_alarm_is_synthesized(
    node: Node, priority: Priority
) -> None:
    first_render_chunk, render_go = threading.Event(), threading.Event()

    def render_put(chunk: Chunk) -> bool:  # the render holds in its first chunk's put
        node.timeline.add("render", chunk)
        if not first_render_chunk.is_set():
            first_render_chunk.set()
            render_go.wait(DEADLINE)
        return True

    main, steps, render = main_and_renderer(node, "alarm", render_put)
    try:
        render.synthesizer.submit(SpeakRequest("answer", ANSWER), 1)
        assert first_render_chunk.wait(DEADLINE)  # the render is under way, and long
        main.synthesizer.submit(SpeakRequest("alarm", ALARM, priority=priority), 1)
        assert steps.inside.wait(DEADLINE)  # the alarm is being synthesized
        assert node.gate.held
        render_go.set()
        wait_until(lambda: node.gate.waiters == 1, DEADLINE, "the render waiting for the alarm")
        steps.go.set()
        main.done(1)
        render.done(1)
    finally:
        render_go.set()
        steps.go.set()

    entries = node.timeline.snapshot()
    whos = [who for who, _, _ in entries]
    inside = whos.index("main inside")
    alarm_end = next(i for i, (w, c, _) in enumerate(entries) if w == "main" and c and c.end)
    assert "main" in whos[inside + 1 : alarm_end]  # the alarm was said
    assert "render" not in whos[inside:alarm_end]  # and nothing rendered meanwhile
    end, _ = node.timeline.end("render")
    assert end.error is None
    assert end.info["sentences"] == 30  # the render went on after the alarm, to its end
    assert "render" in whos[alarm_end:]


def test_renders_give_way_to_a_long_alarm_without_a_held_step(node: Node) -> None:
    """No step is held: the overlap is made by the two puts. The render is held in its first
    chunk's put until the alarm hands over its first chunk; the alarm goes on once the render
    waits for the gate. From then until the alarm's last chunk no render chunk is made, and
    the render, still long, finishes after it."""
    render_in_put, render_go = threading.Event(), threading.Event()

    def render_put(chunk: Chunk) -> bool:
        node.timeline.add("render", chunk)
        if not render_in_put.is_set():
            render_in_put.set()
            render_go.wait(DEADLINE)
        return True

    def main_put(chunk: Chunk) -> bool:
        node.timeline.add("main", chunk)
        if not render_go.is_set():  # the alarm's first chunk: let the render go on
            render_go.set()
            wait_until(lambda: node.gate.waiters == 1, DEADLINE, "the render waiting")
        return True

    main = node.make("main", put=main_put, urgent=node.gate)
    render = node.make("render", put=render_put, yields_to=node.gate)
    try:
        render.synthesizer.submit(SpeakRequest("answer", ANSWER), 1)
        assert render_in_put.wait(DEADLINE)  # the render is under way, and long
        main.synthesizer.submit(SpeakRequest("alarm", ALARM, priority=Priority.ALARM), 1)
        main.done(1)
        render.done(1)
    finally:
        render_go.set()
    whos = [who for who, _, _ in node.timeline.snapshot()]
    first, last = whos.index("main"), len(whos) - 1 - whos[::-1].index("main")
    assert whos[first:last].count("render") == 0
    assert whos[last:].count("render") > 1  # the render was still long when the alarm began
    end, _ = node.timeline.end("render")
    assert (end.error, end.info["sentences"]) == (None, 30)


@pytest.mark.parametrize("priority", [Priority.CHAT, Priority.INFO, Priority.WARNING])
def test_a_lower_class_does_not_hold_the_renders(node: Node, priority: Priority) -> None:
    main, steps, render = main_and_renderer(node, "note")
    try:
        main.synthesizer.submit(SpeakRequest("note", ALARM, priority=priority), 1)
        assert steps.inside.wait(DEADLINE)
        assert not node.gate.held
        render.synthesizer.submit(SpeakRequest("answer", ANSWER), 1)
        render.done(1)  # rendered whole while the announcement is in its synthesis
        assert not steps.go.is_set()
    finally:
        steps.go.set()
    main.done(1)
    end, _ = node.timeline.end("render")
    assert (end.error, end.info["sentences"]) == (None, 30)


def test_a_render_waiting_for_an_alarm_is_cancelled(node: Node) -> None:
    main, steps, render = main_and_renderer(node, "alarm")
    try:
        main.synthesizer.submit(SpeakRequest("alarm", ALARM, priority=Priority.ALARM), 1)
        assert steps.inside.wait(DEADLINE)
        render.synthesizer.submit(SpeakRequest("answer", ANSWER), 1)
        wait_until(lambda: node.gate.waiters == 1, DEADLINE, "the render waiting for the alarm")
        render.synthesizer.cancel(1)
        render.done(1)  # while the alarm still holds the gate
        assert node.gate.held
        end, _ = node.timeline.end("render")
        assert end.error is None
        assert node.timeline.speech("render") == 0  # it waited before its first inference
    finally:
        steps.go.set()
    main.done(1)
    render.synthesizer.submit(SpeakRequest("next", "The next answer."), 2)  # free for the next
    assert render.done(2).job == 2
    assert node.timeline.speech("render") > 0


def test_a_render_waiting_for_an_alarm_stops(node: Node) -> None:
    main, steps, render = main_and_renderer(node, "alarm")
    try:
        main.synthesizer.submit(SpeakRequest("alarm", ALARM, priority=Priority.ALARM), 1)
        assert steps.inside.wait(DEADLINE)
        render.synthesizer.submit(SpeakRequest("answer", ANSWER), 1)
        wait_until(lambda: node.gate.waiters == 1, DEADLINE, "the render waiting for the alarm")
        render.synthesizer.stop()
        assert isinstance(render.events.get_nowait(), SynthesisDone)  # it left the wait
        assert not render.synthesizer._thread.is_alive()
        assert node.gate.held
        assert node.gate.waiters == 0
        end, _ = node.timeline.end("render")
        assert end.error is None
    finally:
        steps.go.set()
    main.done(1)


def test_the_time_a_render_waits_is_not_counted_as_synthesis(node: Node) -> None:
    """Every inference of the render lies between its submit and its end, outside the window
    in which it was seen waiting; so its synthesis time is at most that span less the window."""
    main, steps, render = main_and_renderer(node, "alarm")
    try:
        main.synthesizer.submit(SpeakRequest("alarm", ALARM, priority=Priority.ALARM), 1)
        assert steps.inside.wait(DEADLINE)
        submitted = time.perf_counter()
        render.synthesizer.submit(SpeakRequest("answer", "A short answer. Then another."), 1)
        wait_until(lambda: node.gate.waiters == 1, DEADLINE, "the render waiting for the alarm")
        seen_waiting = time.perf_counter()
    finally:
        steps.go.set()  # the alarm is synthesized (real work) while the render waits
    main.done(1)
    render.done(1)
    _, alarm_end = node.timeline.end("main")  # handed over before the gate was released
    end, render_end = node.timeline.end("render")
    waited = alarm_end - seen_waiting
    seconds = end.info["synthesis_seconds"]
    assert isinstance(seconds, float)
    assert 0 < seconds <= render_end - submitted - waited


def test_a_cached_sentence_does_not_wait(node: Node) -> None:
    render = node.make("render", yields_to=node.gate)
    render.synthesizer.submit(SpeakRequest("first", "The answer is four."), 1)
    render.done(1)
    runs = node.voice.inferences
    with node.gate.holding():
        render.synthesizer.submit(SpeakRequest("again", "The answer is four."), 2)
        render.done(2)
    assert node.voice.inferences == runs
    end = node.timeline.snapshot()[-1][1]
    assert end is not None
    assert end.info == {"sentences": 1, "cached_sentences": 1}


def test_a_synthesizer_cannot_yield_to_the_gate_it_holds(node: Node) -> None:
    with pytest.raises(ValueError, match="yield to the gate it holds"):
        node.make("both", urgent=node.gate, yields_to=node.gate)


# ---- the gate -------------------------------------------------------------------------------


def in_thread(call: Callable[[], bool]) -> Callable[[], bool | None]:
    """Run `call` on a thread of its own; the returned function waits for its answer."""
    answers: queue.Queue[bool] = queue.Queue()
    thread = threading.Thread(target=lambda: answers.put(call()), daemon=True)
    thread.start()

    def answer() -> bool | None:
        thread.join(DEADLINE)
        return None if thread.is_alive() else answers.get_nowait()

    return answer


def test_urgent_is_alarm_and_critical() -> None:
    assert [p for p in Priority if is_urgent(p)] == [Priority.ALARM, Priority.CRITICAL]


def test_holds_are_counted_and_a_release_without_a_hold_is_an_error() -> None:
    gate = UrgentGate()
    assert not gate.held
    gate.hold()
    with gate.holding():
        assert gate.held
    assert gate.held  # the outer hold is still there
    gate.release()
    assert not gate.held
    with pytest.raises(RuntimeError, match="without a hold"):
        gate.release()
    with pytest.raises(KeyError), gate.holding():
        raise KeyError("boom")
    assert not gate.held  # released however the work ends


def test_wait_clear_returns_at_once_when_nothing_is_held() -> None:
    gate = UrgentGate()
    assert in_thread(lambda: gate.wait_clear(lambda: False, poll=3600))() is True


def test_wait_clear_returns_when_the_last_hold_ends() -> None:
    gate = UrgentGate()
    gate.hold()
    gate.hold()
    answer = in_thread(lambda: gate.wait_clear(threading.Event(), poll=3600))
    wait_until(lambda: gate.waiters == 1, DEADLINE, "the wait")
    gate.release()
    assert gate.waiters == 1  # one hold left: still waiting
    gate.release()
    assert answer() is True
    assert gate.waiters == 0


@pytest.mark.parametrize("wake", [False, True])
def test_wait_clear_returns_when_cancelled(wake: bool) -> None:
    gate = UrgentGate()
    gate.hold()
    cancelled = threading.Event()
    poll = 3600 if wake else 0.01  # a long poll: only the wake can end it in time
    answer = in_thread(lambda: gate.wait_clear(cancelled, poll=poll))
    wait_until(lambda: gate.waiters == 1, DEADLINE, "the wait")
    cancelled.set()
    if wake:
        gate.wake()
    assert answer() is False
    assert gate.held  # a cancelled wait leaves the hold alone
    flag = [True]
    assert gate.wait_clear(lambda: flag[0], poll=0.01) is False  # a callable works too


def test_wait_clear_needs_a_positive_poll() -> None:
    with pytest.raises(ValueError, match="positive"):
        UrgentGate().wait_clear(lambda: False, poll=0)


# ---- the render desk (issue 34.8) ---------------------------------------------------------


def test_voice_switches_during_a_render_never_fill_the_render_synthesizers_queue(
    node: Node,
) -> None:
    """An install and then a rollback (and more) while a render runs: the desk hands them over
    between requests, the render synthesizer's two-command queue never overflows (it raised
    queue.Full in the desk's thread before, and every later client waited forever), and the
    requests after them are rendered with the voice switched."""
    first_chunk, go = threading.Event(), threading.Event()
    got: dict[str, list[Chunk]] = {}

    def sink_for(name: str) -> Callable[[Chunk], bool]:
        def sink(chunk: Chunk) -> bool:
            got.setdefault(name, []).append(chunk)
            if name == "first" and not first_chunk.is_set():
                first_chunk.set()
                go.wait(DEADLINE)  # the render holds here while the switches arrive
            return True

        return sink

    desk: RenderDesk[VoiceChoice] = RenderDesk(8, lambda c: c.id)
    render = node.make("render", put=desk.put)
    desk.bind(render.synthesizer)
    desk.start()
    try:
        first = desk.render(SpeakRequest("first", ANSWER), sink_for("first"))
        assert first_chunk.wait(DEADLINE)
        other = Voice.load(node.voice.path, threads=1, cache_dir=None)
        for voice in (other, node.voice, other, node.voice, other):  # install, rollback, ...
            desk.use_voice(VoiceChoice("default", voice, voice.default_params))
        desk.use_voice(VoiceChoice("second", other, other.default_params))
        then = [
            desk.render(SpeakRequest(f"then{n}", "Then this.", voice=v), sink_for(f"then{n}"))
            for n, v in enumerate(["default", "second", "default"])  # "second" came by a switch
        ]
        go.set()
        assert first.wait(DEADLINE)
        for done in then:
            assert done.wait(DEADLINE)
    finally:
        go.set()
        desk.stop()
    for name in ("first", "then0", "then1", "then2"):
        end = got[name][-1]
        assert end.end, (name, end)
        assert end.error is None, (name, end)
        assert any(c.pcm is not None and len(c.pcm) for c in got[name]), name


def test_a_render_desk_that_stops_ends_every_wait(node: Node) -> None:
    """The desk's stop ends the waits of the request being rendered and of those queued: no
    client waits on a desk that no longer runs (the server also checks it is alive)."""
    first_chunk, go = threading.Event(), threading.Event()

    def held(chunk: Chunk) -> bool:
        if not first_chunk.is_set():
            first_chunk.set()
            go.wait(DEADLINE)
        return True

    desk: RenderDesk[VoiceChoice] = RenderDesk(8, lambda c: c.id)
    render = node.make("render", put=desk.put)
    desk.bind(render.synthesizer)
    desk.start()
    try:
        running = desk.render(SpeakRequest("running", ANSWER), held)
        assert first_chunk.wait(DEADLINE)
        queued = [desk.render(SpeakRequest(f"q{n}", "Queued."), lambda _c: True) for n in range(3)]
        desk.stop()
        assert running.wait(DEADLINE)
        assert all(done.wait(DEADLINE) for done in queued)
    finally:
        go.set()
    wait_until(lambda: not desk.alive, DEADLINE, "the desk's thread to end")


def test_a_full_render_desk_refuses_at_once(node: Node) -> None:
    desk: RenderDesk[VoiceChoice] = RenderDesk(2, lambda c: c.id)  # not started: nothing leaves
    desk.render(SpeakRequest("a", "A."), lambda _c: True)
    desk.render(SpeakRequest("b", "B."), lambda _c: True)
    with pytest.raises(DeskFullError):
        desk.render(SpeakRequest("c", "C."), lambda _c: True)


# ---- espeak-ng's global voice (issue 34.8) -------------------------------------------------


def test_two_threads_phonemizing_in_two_languages_each_get_their_own(
    tmp_path: Path, voice: Voice
) -> None:
    """espeak-ng's voice is one global of the library: `set_voice` and `get_phonemes` are one
    step under the lock, so a German render beside an English alarm never switches the
    alarm's language (without the lock, the two threads' phonemes mix within a few rounds)."""
    german = Voice.describe(write_tiny_voice(tmp_path, espeak_voice="de"), None)
    texts = {
        "en": (voice, "The pump in hall three has stopped, leave the hall now."),
        "de": (german, "Die Pumpe in Halle drei ist stehen geblieben, verlassen Sie die Halle."),
    }
    expected = {lang: v.sentences(text) for lang, (v, text) in texts.items()}
    assert expected["en"] != expected["de"]
    wrong: list[str] = []
    start = threading.Barrier(2)

    def phonemize(lang: str) -> None:
        v, text = texts[lang]
        start.wait(DEADLINE)
        for _ in range(300):
            if v.sentences(text) != expected[lang]:
                wrong.append(lang)

    threads = [threading.Thread(target=phonemize, args=(lang,)) for lang in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    assert not wrong, f"{len(wrong)} phonemizations in the other language: {wrong[:4]}"


def test_each_peer_has_its_turn_at_the_render_desk(node: Node) -> None:
    """A host with many requests waiting delays another's by one of its own at most: the next
    request is the oldest of the peer served least recently (issue 33: a budget per Wyoming
    peer)."""
    first_chunk, go = threading.Event(), threading.Event()
    order: list[str] = []
    lock = threading.Lock()

    def sink_for(name: str) -> Callable[[Chunk], bool]:
        def sink(chunk: Chunk) -> bool:
            if chunk.end:
                with lock:
                    order.append(name)
            elif name == "a1" and not first_chunk.is_set():
                first_chunk.set()
                go.wait(DEADLINE)
            return True

        return sink

    desk: RenderDesk[VoiceChoice] = RenderDesk(16, lambda c: c.id)
    render = node.make("render", put=desk.put)
    desk.bind(render.synthesizer)
    desk.start()
    try:
        done = [desk.render(SpeakRequest("a1", "One."), sink_for("a1"), "10.0.0.1")]
        assert first_chunk.wait(DEADLINE)
        for name in ("a2", "a3", "a4"):
            done.append(desk.render(SpeakRequest(name, "More."), sink_for(name), "10.0.0.1"))
        done.append(desk.render(SpeakRequest("b1", "Mine."), sink_for("b1"), "10.0.0.2"))
        go.set()
        assert all(d.wait(DEADLINE) for d in done)
    finally:
        go.set()
        desk.stop()
    assert order == ["a1", "a2", "b1", "a3", "a4"], order
