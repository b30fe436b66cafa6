"""Task domains: what a row of data is, how a prompt asks for it, how a response is graded and what the
reward monitor looks for. One module per domain (:mod:`graft.domains.math`, :mod:`graft.domains.code`),
one line per domain in :data:`graft.registry.DOMAINS`; ``reward.domain`` picks one."""

from graft.domains.base import Domain, load_domain

__all__ = ["Domain", "load_domain"]
