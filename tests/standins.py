"""Stand-in vLLM servers for the fast tier: answer like the recorded real server of a mode (its SSE
stream, its /metrics before and after) through an httpx.MockTransport, logging every request into a
shared journal, so tests can check the order a window sent its requests in."""

import asyncio
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from specgate.decide.settings import window_settings
from specgate.measure.protocol import ClassMeasurement

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "cpu"


class StandInServer:
    """Answers like the recorded vLLM server of ``mode``: its SSE stream for every generation,
    its /metrics before and after; logs every request into the shared ``journal``."""

    def __init__(self, mode: str, journal: list):
        self.label, self.base_url, self.api_key = mode, f"http://{mode}.test", None
        self.stream = (RECORDED / f"{mode}-chat-stream.sse").read_bytes()
        self.metrics = [gzip.decompress((RECORDED / f"{mode}-metrics-{w}.txt.gz").read_bytes()).decode()
                        for w in ("before", "after")]
        self.metric_calls = 0
        self.journal = journal
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            text = self.metrics[min(self.metric_calls, 1)]
            self.metric_calls += 1
            return httpx.Response(200, text=text)
        body = json.loads(request.content)
        self.journal.append(("start", self.label, body["messages"][0]["content"][:20]))

        async def events():
            for event in self.stream.split(b"\n\n"):
                if event:
                    await asyncio.sleep(0)
                    yield event + b"\n\n"
            self.journal.append(("end", self.label, None))

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    def check_alive(self):
        pass

    def log_tail(self, lines=20):
        return ""


def gate_settings(rig, window):
    """The gate settings of ``window`` on ``rig`` at the rig's own confidence, with no gating (what a
    session resolves once per window: specgate.decide.settings)."""
    return window_settings(rig, window.mode, window.prompt_class, window.concurrency)


def window_side(side: str) -> dict:
    """ClassMeasurement's role and A/B side for the older one-word ``side`` these tests speak:
    "subject", "partner" (a duet's no-speculation partner) or "reference" (an A/B's reference side)."""
    return {"role": "subject" if side == "subject" else "partner",
            "ab_side": "reference" if side == "reference" else None}


@dataclass
class LevelWindow(ClassMeasurement):
    """A window whose every request decoded at ``level`` tok/s (the level gate reads its median)."""

    level: float = 100.0

    @property
    def decode_tokens_per_s(self) -> list[float]:
        return [self.level] * 12


def level_window(rig, level: float) -> LevelWindow:
    """A no-speculation coding window at concurrency 1 on ``rig`` whose every request decoded at ``level``."""
    return LevelWindow(rig=rig.name, mode="no_spec", prompt_class="coding", concurrency=1, records=[],
                       acceptance=None, server_decode_tokens_per_s=None, server_metric_source=None, wall_s=0.0,
                       level=level)
