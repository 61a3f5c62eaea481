"""A broker's open-file limit, and the consume queues' descriptor bound that fits under it.

With more active queues than `cq_max_open_files`, a checkpoint writes each queue whose descriptor
the pool closed through one opened for that write alone: an open, a write and a close per queue a
checkpoint, most of a checkpoint's cost (bench.scale's 10,000-queue run). The default bound
therefore covers 16,384 queues, and a broker raises its soft limit of open files (`ulimit -n`,
often 1,024) towards the hard limit at its start, as servers commonly do (Go's runtime does it
for every program). Where the hard limit is lower than the bound and what else a broker holds
(`RESERVE`: segments, index files, connections), the bound used is lowered to fit, with a warning
that says what to raise: the pool then never runs the broker into the limit.
"""

from __future__ import annotations

import logging
import resource

from tidelog.commitlog.log import MIN_CQ_OPEN_FILES

log = logging.getLogger(__name__)

#: descriptors kept for everything but the consume queues: the log's segments and index files,
#: client, data-port and replication connections, a checkpoint's own
RESERVE = 1024
UNLIMITED = 1 << 31  # what `raise_open_files` answers for a soft limit of RLIM_INFINITY


def raise_open_files(want: int) -> int:
    """Raise this process's soft limit of open files to `want` (at most the hard limit; never
    lowered); the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:  # no limit (Linux never reports it for open files)
        return UNLIMITED
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a sandbox that refuses: keep what we have
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


def cq_bound(configured: int, soft_limit: int) -> int:
    """The consume queues' descriptor bound to use: `configured`, lowered to leave `RESERVE`
    under `soft_limit`, never below `MIN_CQ_OPEN_FILES`."""
    return max(MIN_CQ_OPEN_FILES, min(configured, soft_limit - RESERVE))


def fit_cq_bound(configured: int) -> int:
    """Raise the open-file limit for `configured` descriptors plus `RESERVE`, and the bound that
    fits (a warning when it had to be lowered)."""
    soft = raise_open_files(configured + RESERVE)
    bound = cq_bound(configured, soft)
    if bound < configured:
        log.warning(
            "cq_max_open_files %d lowered to %d to fit the open-file limit of %d (keeping %d for "
            "the rest): raise the hard limit (ulimit -Hn, LimitNOFILE=) to at least %d, or set "
            "cq_max_open_files to %d",
            configured,
            bound,
            soft,
            RESERVE,
            configured + RESERVE,
            bound,
        )
    return bound
