"""A rule-based Hanabi player for two-player `classic/hanabi_v5`, read from its canonical observation.

PettingZoo's Hanabi is OpenSpiel's game, observed through the Hanabi Learning Environment's canonical
encoder: a card is one of `colors * ranks` identities, `color * ranks + rank` (colours R Y G W B,
ranks from 0 for a 1), and the vector holds, in order, the partner's hand, which hands miss a card, the
deck size (unary), the fireworks (one-hot of the top rank per colour), the hint and life tokens
(unary), the discard pile (per identity, a thermometer of its copies), the last move, and then the
card knowledge of every card in every hand (the observer's own first): which identities the hints so
far leave possible, and which colour and rank were revealed. Cards are numbered oldest first: a drawn
card joins the end of the hand. Actions are the discards of each position, then the plays, then the
reveals of a colour and of a rank to the next player.

The rules (first that applies): play a card the hints prove playable; give a hint that proves one of
the partner's playable cards playable (or, failing that, tells it the most); save the card the partner
would discard next when it is the last copy of a card still needed; discard a card the hints prove
useless, else the oldest card no hint touched, else the oldest; with every hint token in hand (no
discard allowed), give the hint that tells the partner the most. Hints are sound, so the player never
plays a card it does not know to be playable and never loses a life of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from marl_ppo.eval.evaluate import EvalError


@dataclass(frozen=True)
class HanabiLayout:
    """Where each part of the canonical observation lies, for a two-player game of these settings."""

    colors: int = 5
    ranks: int = 5
    hand_size: int = 5
    max_information_tokens: int = 8
    max_life_tokens: int = 3
    players: int = field(default=2, init=False)

    @property
    def identities(self) -> int:
        """The distinct cards: colours times ranks."""
        return self.colors * self.ranks

    @property
    def copies(self) -> np.ndarray:
        """Per rank, the copies of each card of a colour: three of the lowest, one of the highest, two else."""
        copies = np.full(self.ranks, 2)
        copies[0], copies[-1] = 3, 1
        return copies

    @property
    def deck_size(self) -> int:
        """The cards in a full deck."""
        return self.colors * int(self.copies.sum())

    def sizes(self) -> dict[str, int]:
        """The parts of the observation in order, with their lengths."""
        card, players, hand = self.identities, self.players, self.hand_size
        last_move = players + 4 + players + self.colors + self.ranks + 2 * hand + card + 2
        return {
            "partner_hand": (players - 1) * hand * card,
            "missing": players,
            "deck": self.deck_size - players * hand,
            "fireworks": card,
            "information": self.max_information_tokens,
            "life": self.max_life_tokens,
            "discards": self.deck_size,
            "last_move": last_move,
            "knowledge": players * hand * (card + self.colors + self.ranks),
        }

    def offsets(self) -> dict[str, slice]:
        """Each part's slice of the observation."""
        slices, start = {}, 0
        for name, size in self.sizes().items():
            slices[name] = slice(start, start + size)
            start += size
        return slices

    @property
    def size(self) -> int:
        """The observation's length."""
        return sum(self.sizes().values())

    def num_actions(self) -> int:
        """Discard and play each position, reveal each colour and rank to the partner."""
        return 2 * self.hand_size + self.colors + self.ranks


@dataclass(frozen=True)
class HanabiView:
    """One player's view of the game, decoded from its observation."""

    partner_hand: np.ndarray
    """`(hand_size,)` identity of each partner card, -1 where the hand misses one."""
    fireworks: np.ndarray
    """`(colors,)` cards played of each colour."""
    information_tokens: int
    life_tokens: int
    discarded: np.ndarray
    """`(colors, ranks)` copies of each card in the discard pile."""
    mine: np.ndarray
    """`(hand_size, identities)` bool: the identities the hints leave possible for each own card."""
    mine_hinted: np.ndarray
    """`(hand_size,)` bool: some hint revealed the card's colour or rank."""
    theirs: np.ndarray
    """The partner's knowledge of its own cards, as `mine` is."""
    theirs_hinted: np.ndarray


def decode(observation: np.ndarray, layout: HanabiLayout) -> HanabiView:
    """The view of the player whose canonical observation this is."""
    obs = np.asarray(observation).reshape(-1) > 0.5
    if obs.size != layout.size:
        raise EvalError(
            f"scripted/hanabi reads two-player Hanabi's canonical observation of {layout.size} values "
            f"({layout}); this one has {obs.size}: play classic/hanabi_v5 with its default settings, or "
            "give HanabiRules the layout of yours"
        )
    part = {name: obs[where] for name, where in layout.offsets().items()}
    cards = part["partner_hand"].reshape(layout.hand_size, layout.identities)
    partner_hand = np.where(cards.any(axis=1), cards.argmax(axis=1), -1)
    fireworks = part["fireworks"].reshape(layout.colors, layout.ranks)
    played = np.where(fireworks.any(axis=1), fireworks.argmax(axis=1) + 1, 0)
    thermometer = part["discards"].reshape(layout.colors, -1)
    bounds = np.concatenate([[0], np.cumsum(layout.copies)])
    discarded = np.stack(
        [thermometer[:, bounds[r] : bounds[r + 1]].sum(axis=1) for r in range(layout.ranks)], axis=1
    )
    knowledge = part["knowledge"].reshape(layout.players, layout.hand_size, -1)
    possible = knowledge[..., : layout.identities]
    hinted = np.asarray(knowledge[..., layout.identities :].any(axis=-1))
    return HanabiView(
        partner_hand=partner_hand,
        fireworks=played,
        information_tokens=int(part["information"].sum()),
        life_tokens=int(part["life"].sum()),
        discarded=discarded,
        mine=possible[0],
        mine_hinted=hinted[0],
        theirs=possible[1],
        theirs_hinted=hinted[1],
    )


class HanabiRules:
    """`scripted/hanabi`: the rules of the module's docstring, for a two-player game of `layout`."""

    def __init__(self, layout: HanabiLayout | None = None) -> None:
        self.layout = layout or HanabiLayout()
        ranks = np.arange(self.layout.ranks)
        self._rank_of = np.tile(ranks, self.layout.colors)
        self._color_of = np.repeat(np.arange(self.layout.colors), self.layout.ranks)

    def __call__(self, observation: np.ndarray, action_mask: np.ndarray | None, agent: str) -> int:
        """The action of the first rule that applies, among the allowed ones."""
        layout = self.layout
        legal = np.ones(layout.num_actions(), bool) if action_mask is None else np.asarray(action_mask, bool)
        if legal.size != layout.num_actions():
            raise EvalError(
                f"scripted/hanabi plays classic/hanabi_v5's {layout.num_actions()} actions (discard, play, "
                f"reveal a colour or a rank); this env has {legal.size}: play it on classic/hanabi_v5"
            )
        view = decode(observation, layout)
        playable, useless, critical = self._card_classes(view)
        hand, colors = layout.hand_size, layout.colors
        for position in range(hand):  # a card the hints prove playable
            if _certain(view.mine[position], playable) and legal[hand + position]:
                return hand + position
        hints = [a for a in range(2 * hand, 2 * hand + colors + layout.ranks) if legal[a]]
        if hints:
            choice = self._hint_for_playable(view, playable, hints)
            if choice is None:
                choice = self._save(view, useless, critical, hints)
            if choice is not None:
                return choice
        discards = [position for position in range(hand) if legal[position]]
        if discards:
            return self._discard(view.mine, view.mine_hinted, useless, discards)
        if hints:
            return max(hints, key=lambda action: self._information(view, action))
        return int(np.flatnonzero(legal)[0])

    def _card_classes(self, view: HanabiView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per identity: playable now; useless (played, or a lower card of its colour all discarded);
        critical (needed, and every other copy discarded)."""
        fireworks = view.fireworks[self._color_of]
        playable = self._rank_of == fireworks
        lost = view.discarded >= self.layout.copies  # (colors, ranks): every copy gone
        blocked = np.greater(np.cumsum(lost, axis=1) - lost, 0)  # some lower rank of the colour is all gone
        useless = (self._rank_of < fireworks) | blocked.reshape(-1)
        critical = ~useless & (view.discarded.reshape(-1) == self.layout.copies[self._rank_of] - 1)
        return playable, useless, critical

    def _revealed(self, action: int) -> np.ndarray:
        """Per identity, whether a card of it is touched by the reveal `action` (its colour or rank)."""
        first = 2 * self.layout.hand_size
        if action < first + self.layout.colors:
            return self._color_of == action - first
        return self._rank_of == action - first - self.layout.colors

    def _hint_for_playable(self, view: HanabiView, playable: np.ndarray, hints: list[int]) -> int | None:
        """A hint about the partner's oldest playable card it does not know is playable: one that
        proves it playable if there is one, else the one that leaves it the fewest possibilities."""
        known = {
            int(view.partner_hand[p])
            for p in range(self.layout.hand_size)
            if _certain(view.theirs[p], playable)
        }
        for position, identity in enumerate(view.partner_hand):
            if identity < 0 or not playable[identity] or _certain(view.theirs[position], playable):
                continue
            if int(identity) in known:
                continue  # the partner already knows another copy is playable
            touching = [a for a in hints if self._revealed(a)[identity]]
            if not touching:
                continue
            after = {a: view.theirs[position] & self._revealed(a) for a in touching}
            proving = [a for a in touching if _certain(after[a], playable)]
            if proving:
                return proving[0]
            return min(touching, key=lambda a: int(after[a].sum()))
        return None

    def _save(
        self, view: HanabiView, useless: np.ndarray, critical: np.ndarray, hints: list[int]
    ) -> int | None:
        """A hint on the card the partner would discard next, when that card is critical."""
        present = [p for p in range(self.layout.hand_size) if view.partner_hand[p] >= 0]
        if not present:
            return None
        chop = self._discard(view.theirs, view.theirs_hinted, useless, present)
        identity = int(view.partner_hand[chop])
        if not critical[identity]:
            return None
        touching = [a for a in hints if self._revealed(a)[identity]]
        ranks = [a for a in touching if a >= 2 * self.layout.hand_size + self.layout.colors]
        chosen = ranks or touching  # a rank hint first: it marks a 5 as one
        return chosen[0] if chosen else None

    @staticmethod
    def _discard(possible: np.ndarray, hinted: np.ndarray, useless: np.ndarray, positions: list[int]) -> int:
        """The card to discard among `positions`: proven useless, else the oldest no hint touched, else
        the oldest."""
        for position in positions:
            if _certain(possible[position], useless):
                return position
        untouched = [p for p in positions if not hinted[p]]
        return (untouched or positions)[0]

    def _information(self, view: HanabiView, action: int) -> int:
        """How many possibilities the reveal `action` removes from the partner's knowledge of its hand."""
        revealed = self._revealed(action)
        removed = 0
        for position, identity in enumerate(view.partner_hand):
            if identity >= 0:  # a touched card keeps the revealed identities, an untouched one the rest
                keep = revealed if revealed[identity] else ~revealed
                removed += int((view.theirs[position] & ~keep).sum())
        return removed


def _certain(possible: np.ndarray, kind: np.ndarray) -> bool:
    """Every identity still possible for a card is of `kind` (and the card is there: some is possible)."""
    return bool(possible.any() and not (possible & ~kind).any())


hanabi = HanabiRules()
"""`scripted/hanabi`: the rules for the default two-player Hanabi-Full."""
