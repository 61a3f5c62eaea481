"""tidelog: a replicated, durable message log.

The package root owns what every component shares: configuration helpers, the typed errors
(`tidelog.errors`), the wire definitions (`tidelog.proto`) and the `tide` command line
(`tidelog.cli`). Components live in subpackages mapped from the repository's top-level
folders: `tidelog.commitlog`, `tidelog.ha`, `tidelog.controller`, `tidelog.broker`,
`tidelog.ledger`, `tidelog.client`, `tidelog.spark`.
"""

__version__ = "0.1.0"
