"""The entrypoints the launcher runs for ``gymnasium:ID`` and ``textarena:GAME`` targets (``python <app>.py``)."""
