"""NVIDIA XID errors: what they mean, and whether the program or the machine is to blame.

The driver logs an XID when a GPU hits an error; node-problem-detector plugins turn them into
Node conditions (``XIDErrors``, with the codes in the message) and dcgm-exporter reports the
last one per GPU (``DCGM_FI_DEV_XID_ERRORS``). A run that fails on a node with a machine XID
is a ``node_failure`` (retried elsewhere by default); the XIDs a faulty program causes itself
(an illegal memory access, a kernel that hangs) stay the user's, with the meaning in the
hint, so nobody cordons a healthy node for a bug in a training script.

Meanings follow NVIDIA's XID catalogue, in words a researcher can act on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Xid:
    code: int
    meaning: str
    #: The program running on the GPU usually causes it (not the machine).
    user_caused: bool = False

    def sentence(self) -> str:
        return f"XID {self.code}: {self.meaning}"


XIDS: Final[dict[int, Xid]] = {
    xid.code: xid
    for xid in (
        Xid(13, "graphics engine exception (often an out-of-range access by a kernel)", True),
        Xid(31, "GPU memory page fault (the program accessed memory it does not own)", True),
        Xid(43, "the GPU stopped the program's work (a faulting or hung kernel)", True),
        Xid(45, "the driver cleaned up after earlier errors"),
        Xid(48, "double-bit ECC error: GPU memory is corrupt"),
        Xid(61, "internal micro-controller breakpoint (driver or firmware fault)"),
        Xid(62, "internal micro-controller halt (driver or firmware fault)"),
        Xid(63, "ECC page retirement or row remapping recorded"),
        Xid(64, "ECC page retirement or row remapping failed"),
        Xid(74, "NVLink error"),
        Xid(79, "GPU has fallen off the bus"),
        Xid(92, "high single-bit ECC error rate"),
        Xid(94, "contained ECC error (the affected program was stopped)"),
        Xid(95, "uncontained ECC error: GPU memory cannot be trusted"),
        Xid(119, "GSP firmware did not answer in time"),
        Xid(120, "GSP firmware error"),
        Xid(140, "unrecovered ECC error"),
    )
}

#: "XID 79", "Xid (PCI:0000:3b:00): 48" (the kernel log's form), "XIDErrors: 13", "xid=31".
_XID_IN_TEXT = re.compile(
    r"\bxid(?:s|errors?)?\b\s*(?:\([^)]*\))?[^0-9\n]{0,24}?(\d{1,4})\b", re.IGNORECASE
)


def describe(code: int) -> Xid:
    """The XID ``code``, with its meaning; an unknown code is a machine fault."""
    return XIDS.get(code) or Xid(code, "GPU error (not in TauGrid's XID table)")


def xids_in(text: str) -> list[int]:
    """The XID codes a message names, in order, once each ("XID 79", "Xid (PCI:…): 48",
    "XID errors: 13, 31" only finds the first after each "XID")."""
    found: list[int] = []
    for match in _XID_IN_TEXT.finditer(text or ""):
        code = int(match.group(1))
        if code not in found:
            found.append(code)
    return found


def worst(codes: Iterable[int]) -> Xid | None:
    """The XID to report of several: a machine fault before a program's, else the first."""
    described = [describe(code) for code in codes]
    for xid in described:
        if not xid.user_caused:
            return xid
    return described[0] if described else None
