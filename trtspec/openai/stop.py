"""Stop strings on streamed text: the text returned ends before the first stop string.

The loop also stops on the stop strings' token ids (`stop_words`), but it keeps the stop tokens in its output,
as TensorRT-LLM does, and a stop string may be tokenized differently in context than alone. So the text is
matched here too: text that could be the start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""  # received but not yet released
        self.stopped = False

    def feed(self, text: str) -> str:
        """Text that is safe to release; after a stop string (see `stopped`) nothing more is released."""
        if self.stopped:
            return ""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self.pending = self.pending[:cut], ""
            return out
        hold = max((n for s in self.stops for n in range(1, len(s)) if self.pending.endswith(s[:n])), default=0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        """At the end of the generation: what was held back (it turned out not to start a stop string)."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out
