"""Data formats, pure: text clean-up, SSML, where streaming cuts a sentence, PCM chunks, sound
file bytes to PCM. No I/O, no clock, no threads."""
