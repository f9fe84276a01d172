"""A Piper voice's text side: text to phonemes per clause and sentence (espeak-ng, through
piper-tts's bridge), and phonemes to the model's input ids.

Phonemizing is bounded: a text goes to espeak-ng in pieces of at most `text.PIECE_CHARS`
characters (cut at a sentence end, clause end or space), each call under a millisecond under
the interpreter lock and never a clause long enough to crash espeak-ng, and stops once the
phonemes pass the bound it was asked within. espeak-ng's
voice is one global of the library: `set_voice` and the `get_phonemes` after it are one step
under `ESPEAK_LOCK`, so a synthesizer on another thread never switches the language under it.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from typing import Final

from piper import espeakbridge
from piper.config import PiperConfig
from piper.phoneme_ids import phonemes_to_ids
from piper.phonemize_espeak import ESPEAK_DATA_DIR, _merge_known_vowel_clusters

from agent.formats.text import pieces

_LANGUAGE_FLAG: Final = re.compile(r"\([^()]+\)")
"""espeak-ng's language switch flags, `(en)` (from one parenthesis to the next: linear)."""
ESPEAK_LOCK: Final = threading.Lock()
"""Held around each `set_voice` and the `get_phonemes` that follows it (espeak-ng's voice is
global state, and two synthesizers phonemize on their own threads)."""
_ESPEAK_VOICE: dict[str, str] = {}
"""The voice espeak-ng was last set to (`"set"`) and the data it was initialized with (`"data"`),
read and written under ESPEAK_LOCK: each `set_voice` keeps ~1.2 KB that espeak-ng never gives
back (1.65 MiB per 1,000 sentences phonemized, measured; every request is phonemized, cached or
not), so it is called only when the voice changes (docs/memory.md). espeak-ng is initialized
once: initializing again reloads its phoneme data under the voice in use, which then reads freed
tables ("Invalid instruction ... for phoneme", then SIGSEGV: a health check loads two voices,
an update or a rollback one more in the engine), and a voice set before is set again.
`Phonemizer` is the only caller of `initialize` and `set_voice` in the node's processes; code
that uses espeak-ng any other way (piper's own phonemizer, in tests and tools) calls
`forget_espeak_voice` after it."""


def forget_espeak_voice() -> None:
    """espeak-ng was initialized or its voice set outside `Phonemizer`: the next voice loaded
    initializes it again, and the next phonemizing sets its voice again."""
    with ESPEAK_LOCK:
        _ESPEAK_VOICE.clear()


Clause = tuple[str, ...]
"""The phonemes of one clause, its punctuation included (as piper-tts makes them)."""


class TooManyPhonemesError(ValueError):
    """A text's phonemes passed the bound asked for: phonemizing stopped there, the rest of the
    text was not phonemized."""


class Phonemizer:
    """A voice's phonemes (its espeak-ng voice, vowel clusters) and phoneme ids."""

    def __init__(self, config: PiperConfig) -> None:
        self._config = config
        with ESPEAK_LOCK:  # a voice loaded (a model update) while another thread phonemizes
            if _ESPEAK_VOICE.get("data") != str(ESPEAK_DATA_DIR):
                espeakbridge.initialize(str(ESPEAK_DATA_DIR))
                _ESPEAK_VOICE.clear()  # no voice is set after an initialize
                _ESPEAK_VOICE["data"] = str(ESPEAK_DATA_DIR)

    def sentences(self, text: str, max_phonemes: int | None = None) -> list[list[Clause]]:
        """Phonemes per clause, grouped by sentence; espeak-ng decides both boundaries.

        Joined, a sentence's clauses are exactly the phonemes piper-tts makes for it, so
        synthesizing clause groups changes where the model is run, not what is said. A text
        longer than `text.PIECE_CHARS` is phonemized in pieces (cut where `text.pieces` cuts;
        a sentence cut inside goes on in the next piece: a long clause can crash espeak-ng);
        with `max_phonemes`, phonemizing stops with TooManyPhonemesError after the piece that
        passes it.
        """
        sentences: list[list[Clause]] = []
        current: list[Clause] = []
        count = 0
        cuts = pieces(text)
        for index, cut in enumerate(cuts):
            with ESPEAK_LOCK:  # the voice set and the phonemes read in one hold (issue 34)
                if _ESPEAK_VOICE.get("set") != self._config.espeak_voice:
                    espeakbridge.set_voice(self._config.espeak_voice)
                    _ESPEAK_VOICE["set"] = self._config.espeak_voice
                clauses = espeakbridge.get_phonemes(cut.text)
            goes_on = not cut.sentence and index < len(cuts) - 1  # its sentence continues
            for number, (phonemes, terminator, sentence_end) in enumerate(clauses, 1):
                clause = self._clause(phonemes, terminator)
                count += len(clause)
                if clause:
                    current.append(tuple(clause))
                if sentence_end and current and not (goes_on and number == len(clauses)):
                    sentences.append(current)
                    current = []
            if max_phonemes is not None and count > max_phonemes:
                raise TooManyPhonemesError(f"over {max_phonemes} phonemes")
        if current:
            sentences.append(current)
        return sentences

    def ids(self, clauses: list[Clause]) -> list[int]:
        """Model input ids for consecutive clauses (BOS, each phoneme then a pad, EOS)."""
        return phonemes_to_ids(
            [p for clause in clauses for p in clause], self._config.phoneme_id_map
        )

    def _clause(self, phonemes: str, terminator: str) -> list[str]:
        """One clause of espeak-ng's output as piper-tts makes it: language flags out, its
        punctuation kept (a space after a comma, colon or semicolon), decomposed."""
        marked = _LANGUAGE_FLAG.sub("", phonemes) + terminator
        if terminator in (",", ":", ";"):
            marked += " "
        clause = list(unicodedata.normalize("NFD", marked))
        if self._config.vowel_clusters:
            clause = _merge_known_vowel_clusters(clause, self._config.vowel_clusters)
        return clause
