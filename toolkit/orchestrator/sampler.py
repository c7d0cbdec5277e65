"""Which training env and which task the next group uses: ratio sampling of envs, epoch-shuffled tasks.

Envs are drawn independently with probability ``ratio_e / sum(ratio)`` (ratios are relative weights; no ratio
on any env = equal weights). Within an env, tasks are visited in a fresh permutation per epoch, so every task is
used once before any is repeated. Everything is a function of the run seed and the number of draws, and the whole
state (env RNG plus each env's epoch and position) is JSON, saved with checkpoints and restored on resume.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any


def _epoch_order(seed: int, env: str, epoch: int, n: int) -> list[int]:
    # A str seed is hashed with SHA-512 by random.Random, so the permutation is stable across processes/versions.
    order = list(range(n))
    random.Random(f"srl-sampler:{seed}:{env}:{epoch}").shuffle(order)
    return order


class EnvSampler:
    """Draws ``(env_name, example_id)`` pairs.

    ``example_ids`` maps env name -> the env's selectable example ids (non-empty); ``ratios`` maps env name ->
    positive weight (missing or None = 1.0). Raises ValueError on an env without examples or a ratio <= 0.
    """

    def __init__(
        self,
        example_ids: Mapping[str, Sequence[int]],
        ratios: Mapping[str, float | None] | None = None,
        *,
        seed: int = 0,
    ) -> None:
        if not example_ids:
            raise ValueError("EnvSampler needs at least one env")
        self.names = list(example_ids)
        self.example_ids = {k: list(v) for k, v in example_ids.items()}
        for name, ids in self.example_ids.items():
            if not ids:
                raise ValueError(f"env {name!r} has no examples to sample (check taskset.select)")
        ratios = dict(ratios or {})
        self.weights = [float(ratios.get(n) if ratios.get(n) is not None else 1.0) for n in self.names]
        if any(w <= 0 for w in self.weights):
            raise ValueError(f"env ratios must be > 0, got {dict(zip(self.names, self.weights, strict=True))}")
        self.seed = seed
        self._rng = random.Random(seed)
        self._epoch = {n: 0 for n in self.names}
        self._pos = {n: 0 for n in self.names}
        self._order: dict[str, list[int]] = {}
        self.draws = 0

    def next_env(self) -> str:
        """Draw an env by ratio."""
        if len(self.names) == 1:
            return self.names[0]
        return self._rng.choices(self.names, weights=self.weights, k=1)[0]

    def next_example(self, env: str) -> int:
        """The env's next example id in its current epoch's permutation (a new permutation each epoch)."""
        ids = self.example_ids[env]
        if env not in self._order:
            self._order[env] = _epoch_order(self.seed, env, self._epoch[env], len(ids))
        if self._pos[env] >= len(ids):
            self._epoch[env] += 1
            self._pos[env] = 0
            self._order[env] = _epoch_order(self.seed, env, self._epoch[env], len(ids))
        example = ids[self._order[env][self._pos[env]]]
        self._pos[env] += 1
        return example

    def draw(self) -> tuple[str, int]:
        """One ``(env_name, example_id)``."""
        env = self.next_env()
        self.draws += 1
        return env, self.next_example(env)

    # -- checkpoint state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: RNG, per-env epoch/position, number of draws."""
        version, internal, gauss = self._rng.getstate()
        return {
            "seed": self.seed,
            "draws": self.draws,
            "rng": [version, list(internal), gauss],
            "epoch": dict(self._epoch),
            "pos": dict(self._pos),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output. Envs absent from the state start fresh; envs no longer configured
        are ignored. Raises ValueError if the state belongs to another seed."""
        if int(state["seed"]) != self.seed:
            raise ValueError(f"sampler state was saved with seed {state['seed']}, this run uses {self.seed}")
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self.draws = int(state.get("draws", 0))
        for name in self.names:
            self._epoch[name] = int(state.get("epoch", {}).get(name, 0))
            self._pos[name] = int(state.get("pos", {}).get(name, 0))
        self._order = {}
