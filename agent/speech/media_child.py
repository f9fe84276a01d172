"""The decoder child (`python -m agent.speech.media_child`): the one place where untrusted sound
files are decoded (URL sounds, sounds of `audio.media`, Hermes playBytes, chime files).

Started by `media_decoder` with a pipe on stdin and stdout; it lowers its own CPU priority and
limits itself (address space, CPU time per sound, no file written, no core dump, few file
descriptors: set here, since the agent that starts it has threads), then says it is ready and
decodes one sound after another. Every message is a length-prefixed frame (4 bytes, little
endian): a JSON object, then for a sound its bytes; the answer is a JSON object, then for a
decoded sound its samples (16-bit little-endian PCM, mono, at the rate asked for). Nothing is
pickled: the parent trusts this process less than itself. It ends at the end of its input.
A file that makes it crash, spin or run out of memory kills only this process: the parent
kills what overruns its deadline and starts another.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import struct
import sys
from typing import BinaryIO, Final

from agent.core.reasons import Reason
from agent.formats.media import MediaError, decode_audio

FRAME: Final = struct.Struct("<I")
"""The length of the frame that follows (bytes)."""
MAX_HEADER_BYTES: Final = 64 * 1024
"""Largest JSON frame either side accepts."""
MAX_SOUND_BYTES: Final = 64 * 1024 * 1024
"""Largest sound frame accepted (the most `audio.max_media_bytes` allows)."""
OUT_OF_MEMORY: Final = 3
"""Exit status after an answer `too_large` for memory (marked `last`: the process ends)."""
FILE_DESCRIPTORS: Final = 16
"""Most file descriptors it may hold (the pipes; libsndfile reads from memory)."""


def read_frame(stream: BinaryIO, most: int) -> bytes | None:
    """One frame, None at the end of input; ValueError for a frame over `most` bytes or cut."""
    head = stream.read(FRAME.size)
    if not head:
        return None
    if len(head) < FRAME.size:
        raise ValueError("input ended inside a frame header")
    (length,) = FRAME.unpack(head)
    if length > most:
        raise ValueError(f"a frame of {length} bytes, at most {most}")
    body = stream.read(length)
    if len(body) < length:
        raise ValueError("input ended inside a frame")
    return body


def write_frames(stream: BinaryIO, *bodies: bytes) -> None:
    """Frames, flushed."""
    for body in bodies:
        stream.write(FRAME.pack(len(body)))
        stream.write(body)
    stream.flush()


def limit_self(memory_mb: int, niceness: int) -> None:
    """Lower this process's CPU priority and set its limits (CPU time is set per sound)."""
    os.nice(niceness)
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_DESCRIPTORS, FILE_DESCRIPTORS))


def limit_cpu(seconds: float) -> None:
    """At most `seconds` more of CPU time from now (SIGXCPU ends the process beyond)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(spent + seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def serve(stdin: BinaryIO, stdout: BinaryIO) -> int:
    """Decode sounds until the input ends; the exit status."""
    write_frames(stdout, json.dumps({"ready": True, "pid": os.getpid()}).encode())
    while True:
        header = read_frame(stdin, MAX_HEADER_BYTES)
        if header is None:
            return 0
        job = json.loads(header)
        data = read_frame(stdin, MAX_SOUND_BYTES)
        if data is None:
            return 0
        limit_cpu(float(job["cpu_seconds"]))
        try:
            decoded = decode_audio(
                data,
                int(job["rate"]),
                max_bytes=int(job["max_bytes"]),
                max_seconds=float(job["max_seconds"]),
                max_samples=int(job["max_samples"]),
            )
        except MediaError as err:
            answer = {"ok": False, "reason": str(err.reason), "detail": err.detail}
            write_frames(stdout, json.dumps(answer).encode())
            continue
        except MemoryError:
            detail = "ran out of the decoder's memory"
            answer = {"ok": False, "reason": str(Reason.TOO_LARGE), "detail": detail}
            write_frames(stdout, json.dumps({**answer, "last": True}).encode())
            return OUT_OF_MEMORY
        except Exception as err:  # noqa: BLE001 - whatever a file does, it is refused
            detail = f"the decoder failed: {type(err).__name__}"
            answer = {"ok": False, "reason": str(Reason.UNSUPPORTED_AUDIO), "detail": detail}
            write_frames(stdout, json.dumps(answer).encode())
            continue
        samples = decoded.samples.astype("<i2", copy=False)
        answer = {
            "ok": True,
            "samples": len(samples),
            "format": decoded.source_format,
            "subtype": decoded.source_subtype,
            "source_rate": decoded.source_rate,
            "source_channels": decoded.source_channels,
        }
        write_frames(stdout, json.dumps(answer).encode(), samples.tobytes())
        del decoded, samples, data


def main() -> int:
    """Limit this process, then serve the pipe."""
    parser = argparse.ArgumentParser(description="The agent's decoder of sound files.")
    parser.add_argument("--memory-mb", type=int, required=True, help="address-space limit")
    parser.add_argument("--nice", type=int, default=10, help="CPU priority lowered by this")
    args = parser.parse_args()
    limit_self(args.memory_mb, args.nice)
    return serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
