"""The audio edge: the ALSA writer thread."""
