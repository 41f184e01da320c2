"""A padded-batch view of the paged KV cache with its indices built on the host: the plain reference the
fixed-shape views (pipelines/kv_views.py) and the paged decode kernel are checked against."""

from __future__ import annotations

import torch

from pipelines.kv_cache import PagedKVCache, sdpa


class BatchKV:
    """A padded batch: row r has past_r cached tokens and n_r new ones. Indices are built on the host per step."""

    def __init__(self, cache: PagedKVCache, rows: list[tuple[str, int]]) -> None:
        self.cache = cache
        dev = cache.layout.device
        past = [cache.length(s) for s, _ in rows]
        new = [n for _, n in rows]
        t, total = max(new), max(p + n for p, n in zip(past, new, strict=True))
        self.write_slots = torch.cat([cache.slots(s, p, p + n) for (s, n), p in zip(rows, past, strict=True)]).to(dev)
        qpos = torch.arange(t)
        valid = qpos[None, :] < torch.tensor(new)[:, None]  # [B, T]
        self.new_rows = valid.reshape(-1).nonzero().squeeze(1).to(dev)  # flat [B*T] index of real tokens
        read = torch.zeros(len(rows), total, dtype=torch.long)
        for r, ((s, n), p) in enumerate(zip(rows, past, strict=True)):
            read[r, : p + n] = cache.slots(s, 0, p + n)
            read[r, p + n :] = read[r, 0]  # padding reads the row's own slot: another row's NaN never leaks in
        self.read_slots = read.to(dev)
        kpos = torch.arange(total)[None, None, :]
        query_at = torch.tensor(past)[:, None, None] + qpos[None, :, None]
        lengths = torch.tensor([p + n for p, n in zip(past, new, strict=True)])[:, None, None]
        self.mask = ((kpos <= query_at) & (kpos < lengths))[:, None].to(dev)  # [B, 1, T, L]
        self.positions = (torch.tensor(past)[:, None] + qpos[None, :]).to(dev)  # [B, T]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        kc, vc = self.cache.k[layer], self.cache.v[layer]
        b, t = q.shape[:2]
        kc[self.write_slots] = k.reshape(b * t, *k.shape[2:])[self.new_rows].to(kc.dtype)
        vc[self.write_slots] = v.reshape(b * t, *v.shape[2:])[self.new_rows].to(vc.dtype)
        return sdpa(q, kc[self.read_slots].to(q.dtype), vc[self.read_slots].to(q.dtype), self.mask, scale)
