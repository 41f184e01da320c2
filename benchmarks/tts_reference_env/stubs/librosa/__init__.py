"""Stand-in for librosa (and sox) on the GPU machine: qwen-tts imports them, reading text aloud with a named
speaker never calls them (they load and resample reference audio); calling anything raises."""


def __getattr__(name):
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{__name__}.{name} is not available in this benchmark environment")

    return unavailable
