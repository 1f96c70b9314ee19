"""Feature + label skew: a multi-domain data set split domain by domain (IMA §7, Table VII).

Each domain d of the data set (Digit-Five's five digit sets, PACS's four styles) is split
on its own into ``clients_per_domain`` clients by a label scheme — #C = k shards, Dir(α) or
IID — so a client holds one domain's images (feature skew) with that scheme's label skew.
IMA: 20 clients per domain. Partition ids run domain by domain: clients
d·m … (d + 1)·m − 1 hold domain d (the d-th smallest domain id), m = ``clients_per_domain``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from partitions.base import LabelPartitioner


class DomainPartitioner(LabelPartitioner):
    """A label partitioner applied inside each domain.

    Parameters
    ----------
    clients_per_domain : int
        Clients m per domain; K = m × the number of domains.
    within_domain : Callable[[int, int], LabelPartitioner]
        Builds the label partitioner of one domain from (m, seed); domain d uses seed + d.
    num_domains : int
        The number of domains the data set has (K = m × num_domains).
    seed : int
        The partition's seed.
    partition_by, domain_by : str
        Label and domain columns when used through flwr-datasets.
    """

    def __init__(
        self, clients_per_domain: int, within_domain: Callable[[int, int], LabelPartitioner], num_domains: int,
        seed: int = 0, partition_by: str = "label", domain_by: str = "domain",
    ):
        if not isinstance(clients_per_domain, int) or clients_per_domain < 1:
            raise ValueError(f"clients_per_domain must be an integer >= 1, got {clients_per_domain!r}")
        super().__init__(clients_per_domain * num_domains, seed, partition_by)
        self.clients_per_domain = clients_per_domain
        self.num_domains = num_domains
        self.within_domain = within_domain
        self.side_columns = {"domain": domain_by}

    def assign(self, labels: np.ndarray, columns: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        labels = np.asarray(labels)
        domains = self.required_column(columns, "domain")
        present = np.unique(domains)
        if len(present) != self.num_domains:
            raise ValueError(f"the data set has {len(present)} domains, the partition expects {self.num_domains}")
        parts: list[np.ndarray] = []
        for offset, domain in enumerate(present):
            members = np.flatnonzero(domains == domain)
            inner = self.within_domain(self.clients_per_domain, self._seed + offset)
            try:
                local = inner.assign(labels[members])
            except ValueError as error:
                raise ValueError(f"domain {domain} ({len(members)} samples): {error}") from None
            parts.extend(members[part] for part in local)
        return parts
