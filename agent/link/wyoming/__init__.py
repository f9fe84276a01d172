"""The Wyoming servers: text to speech, the announce target, their discovery."""
