"""The one refusal type: something a node will not or cannot do, with a reason from an enum
(the one its event carries: `Reason` for announcements, `UpdateReason` for updates, `FetchReason`
for a download) and a detail safe to publish. Every edge raises it, or a kind of it that adds
what only that edge knows (a fetch's status, an SSML position); every `rejected` and `failed`
event and every update report carries its reason and detail."""

from __future__ import annotations

from enum import StrEnum
from typing import Generic, TypeVar

R = TypeVar("R", bound=StrEnum)


class Refused(Exception, Generic[R]):  # noqa: N818 - a refusal is an answer, not a fault
    """A refusal: `reason` for the event, `detail` safe to publish."""

    def __init__(self, reason: R, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: R = reason
        self.detail = detail
