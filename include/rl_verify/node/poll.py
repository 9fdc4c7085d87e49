"""What one poll of a detached training job says (``sh/job_poll.sh``, or a launcher's poll in its shape): the header
line and the log's bytes after it. Pure: the trigger that polls (``orchestration.triggers``) reads it through these."""

from __future__ import annotations

from rl_verify.node import launcher as launchers


def parse_poll(output: bytes) -> tuple[int | None, int, int, str, int]:
    """Split the output of the ``job_poll`` script: (exit code, start offset, log size, text, new offset).

    The first line is ``<exit code or -> <start offset> <log size> [<seconds since start>]``; the rest
    is the log's bytes from the start offset (see :func:`poll_elapsed` for the fourth field). While
    the job runs only whole lines are taken (a partial last line, or a UTF-8 character cut by the
    chunk limit, waits for the next poll); once it has exited, all.
    """
    head, _, chunk = output.partition(b"\n")
    fields = head.decode(errors="replace").split()
    if len(fields) not in (3, 4, 5) or not (fields[1].isdigit() and fields[2].isdigit()):
        raise ValueError(f"unexpected job poll output: {head[:200]!r}")
    exit_code = None if fields[0] == "-" else int(fields[0])
    start, size = int(fields[1]), int(fields[2])
    if exit_code is None or start + len(chunk) < size:
        whole_lines = chunk[: chunk.rfind(b"\n") + 1]
        # A line longer than a whole chunk is passed on in pieces (never cutting a character).
        chunk = whole_lines or (_utf8_prefix(chunk) if start + len(chunk) < size else b"")
    return exit_code, start, size, chunk.decode("utf-8", errors="replace"), start + len(chunk)


def poll_elapsed(output: bytes) -> float | None:
    """Seconds since the job started, from the ``job_poll`` header (None when absent)."""
    fields = output.partition(b"\n")[0].split()
    return float(fields[3]) if len(fields) >= 4 and fields[3].lstrip(b"-").isdigit() else None


def poll_scheduler(output: bytes) -> dict[str, str] | None:
    """What the scheduler said of the job, from the ``job_poll`` header's fifth field (a Slurm launcher's poll:
    ``{"state": "pending", "detail": "Resources"}``); None for a job no scheduler holds."""
    fields = output.partition(b"\n")[0].split()
    return launchers.scheduler_of(fields[4].decode(errors="replace")) if len(fields) == 5 else None


def pending_too_long(scheduler: dict[str, str] | None, waited_s: float, limit_s: int) -> bool:
    """Whether a job the scheduler still holds in its queue has waited past the limit (0: no limit)."""
    return bool(scheduler and scheduler["state"] == "pending" and limit_s and waited_s >= limit_s)


def _utf8_prefix(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut at its end."""
    for cut in range(min(4, len(data)) + 1):
        try:
            (data[: len(data) - cut]).decode("utf-8")
            return data[: len(data) - cut]
        except UnicodeDecodeError:
            continue
    return data
